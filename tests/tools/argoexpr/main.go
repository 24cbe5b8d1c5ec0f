// argoexpr evaluates Argo Workflows retryStrategy expressions exactly as the workflow
// controller does (argo-workflows v4 workflow/controller/operator.go: buildRetryStrategyLocalScope
// + util/expr/env.GetFuncMap + util/expr/argoexpr.EvalBool), for pipectl's tests.
//
// stdin: one JSON object per line {"expression": "...", "scope": {"retries": "1", "lastRetry.exitCode": "1", ...}}
// stdout: one JSON object per line {"result": true|false, "error": "..."}
package main

import (
	"bufio"
	"encoding/json"
	"os"

	"github.com/argoproj/argo-workflows/v4/util/expr/argoexpr"
	"github.com/argoproj/argo-workflows/v4/util/expr/env"
)

type request struct {
	Expression string            `json:"expression"`
	Scope      map[string]string `json:"scope"`
}

type response struct {
	Result bool   `json:"result"`
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
