// argoexpr evaluates Argo Workflows retryStrategy expressions exactly as the workflow
// controller does (argo-workflows v4 workflow/controller/operator.go: buildRetryStrategyLocalScope
// + util/expr/env.GetFuncMap + util/expr/argoexpr.EvalBool), for pipectl's tests.
//
// It also evaluates resource-template success/failure conditions as argoexec does
// (workflow/executor/resource.go: labels.Parse + gjson lookups, failure checked first).
//
// And it substitutes parameters into a template as the controller does (util/template.Replace on
// the template's JSON, values escaped as JSON strings), for the parameter-injection tests (C15).
//
// stdin: one JSON object per line, one of
//   {"expression": "...", "scope": {"retries": "1", "lastRetry.exitCode": "1", ...}}
//   {"success": "...", "failure": "...", "object": {...}}
//   {"template": {...}, "params": {"inputs.parameters.model-name": "...", ...}, "strict": false}
//     (strict: unresolved tags are errors, as for metrics: operator.go computeMetrics)
// stdout: one JSON object per line {"result": true|false, "state": "succeeded|failed|waiting",
//   "template": {...}, "error": "..."}
package main

import (
	"bufio"
	"encoding/json"
	"os"

	"github.com/argoproj/argo-workflows/v4/util/expr/argoexpr"
	"github.com/argoproj/argo-workflows/v4/util/expr/env"
	"github.com/argoproj/argo-workflows/v4/util/logging"
	"github.com/argoproj/argo-workflows/v4/util/template"
	"github.com/tidwall/gjson"
	"k8s.io/apimachinery/pkg/labels"
)

// gjsonLabels: argoexec's labels.Labels over a JSON object.
type gjsonLabels struct{ json []byte }

func (g gjsonLabels) Has(label string) bool  { return gjson.GetBytes(g.json, label).Exists() }
func (g gjsonLabels) Get(label string) string { return gjson.GetBytes(g.json, label).String() }

func requirements(cond string) (labels.Requirements, error) {
	if cond == "" {
		return nil, nil
	}
	sel, err := labels.Parse(cond)
	if err != nil {
		return nil, err
	}
	reqs, _ := sel.Requirements()
	return reqs, nil
}

// state mirrors argoexec's matchConditions.
func state(success, failure string, object []byte) (string, error) {
	succ, err := requirements(success)
	if err != nil {
		return "", err
	}
	fail, err := requirements(failure)
	if err != nil {
		return "", err
	}
	ls := gjsonLabels{json: object}
	for _, req := range fail {
		if req.Matches(ls) {
			return "failed", nil
		}
	}
	matched := 0
	for _, req := range succ {
		if req.Matches(ls) {
			matched++
		}
	}
	if matched >= len(succ) {
		return "succeeded", nil
	}
	return "waiting", nil
}

type request struct {
	Expression string            `json:"expression"`
	Scope      map[string]string `json:"scope"`
	Success    string            `json:"success"`
	Failure    string            `json:"failure"`
	Object     json.RawMessage   `json:"object"`
	Template   json.RawMessage   `json:"template"`
	Params     map[string]string `json:"params"`
	Strict     bool              `json:"strict"`
}

type response struct {
	Result bool   `json:"result"`
	State    string          `json:"state,omitempty"`
	Template json.RawMessage `json:"template,omitempty"`
	Error  string `json:"error,omitempty"`
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<24)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var req request
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			_ = out.Encode(response{Error: err.Error()})
			continue
		}
		if req.Template != nil {
			replaced, err := template.Replace(logging.InitLoggerInContext(), string(req.Template), req.Params, !req.Strict)
			resp := response{}
			if err != nil {
				resp.Error = err.Error()
			} else {
				resp.Template = json.RawMessage(replaced)
			}
			_ = out.Encode(resp)
			continue
		}
		if req.Object != nil {
			st, err := state(req.Success, req.Failure, req.Object)
			resp := response{State: st}
			if err != nil {
				resp.Error = err.Error()
			}
			_ = out.Encode(resp)
			continue
		}
		scope := map[string]interface{}{}
		for k, v := range req.Scope {
			scope[k] = v
		}
		ok, err := argoexpr.EvalBool(req.Expression, env.GetFuncMap(scope))
		resp := response{Result: ok}
		if err != nil {
			resp.Error = err.Error()
		}
		_ = out.Encode(resp)
	}
}
