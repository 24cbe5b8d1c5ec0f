#!/usr/bin/env python3
"""Vendor the OpenAPI v3 schemas `pipectl lint` validates against, from upstream Go modules.

The CRDs come from the modules' own manifests (fetched with `go mod download` through the Go
module proxy); descriptions are stripped to keep the files small. Run `make schemas` to refresh;
the output under pipelines/pipectl/pipelines/schemas/ is committed, so lint needs neither Go nor a network.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

OUT = Path(__file__).resolve().parents[1] / "pipelines" / "pipectl" / "pipelines" / "schemas"

# (module, version, path of the CRD inside the module, CRD version)
CRDS = [
    ("github.com/argoproj/argo-workflows/v4", "v4.0.5", "manifests/base/crds/full/argoproj.io_workflowtemplates.yaml", "v1alpha1"),
    ("github.com/argoproj/argo-workflows/v4", "v4.0.5", "manifests/base/crds/full/argoproj.io_cronworkflows.yaml", "v1alpha1"),
    ("github.com/argoproj/argo-workflows/v4", "v4.0.5", "manifests/base/crds/full/argoproj.io_workflows.yaml", "v1alpha1"),
    ("volcano.sh/volcano", "v1.10.0", "config/crd/volcano/bases/batch.volcano.sh_jobs.yaml", "v1alpha1"),
    ("volcano.sh/volcano", "v1.10.0", "config/crd/volcano/bases/scheduling.volcano.sh_queues.yaml", "v1beta1"),
    ("github.com/kubeflow/training-operator", "v1.8.1", "manifests/base/crds/kubeflow.org_pytorchjobs.yaml", "v1"),
    ("sigs.k8s.io/karpenter", "v1.13.0", "pkg/apis/crds/karpenter.sh_nodepools.yaml", "v1"),
    ("github.com/prometheus-operator/prometheus-operator", "v0.80.1", "example/prometheus-operator-crd-full/monitoring.coreos.com_prometheusrules.yaml", "v1"),
    ("github.com/prometheus-operator/prometheus-operator", "v0.80.1", "example/prometheus-operator-crd-full/monitoring.coreos.com_podmonitors.yaml", "v1"),
]


# Kubernetes built-in kinds: (OpenAPI v3 file in k8s.io/kubernetes api/openapi-spec/v3, apiVersion, kind, schema name)
K8S_MODULE = ("k8s.io/kubernetes", "v1.34.4")
K8S_KINDS = [
    ("api__v1_openapi.json", "v1", "Namespace", "io.k8s.api.core.v1.Namespace"),
    ("api__v1_openapi.json", "v1", "ServiceAccount", "io.k8s.api.core.v1.ServiceAccount"),
    ("api__v1_openapi.json", "v1", "ConfigMap", "io.k8s.api.core.v1.ConfigMap"),
    ("api__v1_openapi.json", "v1", "Secret", "io.k8s.api.core.v1.Secret"),
    ("api__v1_openapi.json", "v1", "ResourceQuota", "io.k8s.api.core.v1.ResourceQuota"),
    ("api__v1_openapi.json", "v1", "LimitRange", "io.k8s.api.core.v1.LimitRange"),
    ("api__v1_openapi.json", "v1", "Pod", "io.k8s.api.core.v1.Pod"),
    ("apis__rbac.authorization.k8s.io__v1_openapi.json", "rbac.authorization.k8s.io/v1", "Role", "io.k8s.api.rbac.v1.Role"),
    ("apis__rbac.authorization.k8s.io__v1_openapi.json", "rbac.authorization.k8s.io/v1", "RoleBinding", "io.k8s.api.rbac.v1.RoleBinding"),
    ("apis__scheduling.k8s.io__v1_openapi.json", "scheduling.k8s.io/v1", "PriorityClass", "io.k8s.api.scheduling.v1.PriorityClass"),
    ("apis__apps__v1_openapi.json", "apps/v1", "Deployment", "io.k8s.api.apps.v1.Deployment"),
    ("apis__admissionregistration.k8s.io__v1_openapi.json", "admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy",
     "io.k8s.api.admissionregistration.v1.ValidatingAdmissionPolicy"),
    ("apis__admissionregistration.k8s.io__v1_openapi.json", "admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding",
     "io.k8s.api.admissionregistration.v1.ValidatingAdmissionPolicyBinding"),
]


def module_dir(module: str, version: str) -> Path:
    out = subprocess.run(["go", "mod", "download", "-json", f"{module}@{version}"], check=True, capture_output=True, text=True)
    info = json.loads(out.stdout)
    if "Error" in info:
        sys.exit(f"go mod download {module}@{version}: {info['Error']}")
    return Path(info["Dir"])


def strip(node):
    """Drop schema ``description`` annotations (strings), keep properties named "description"."""
    if isinstance(node, dict):
        return {k: strip(v) for k, v in node.items() if not (k == "description" and isinstance(v, str))}
    if isinstance(node, list):
        return [strip(v) for v in node]
    return node


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for module, version, path, crd_version in CRDS:
        crd = yaml.safe_load((module_dir(module, version) / path).read_text())
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        (schema,) = [v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"] if v["name"] == crd_version]
        doc = {"x-pipectl-source": f"{module}@{version}/{path}", "apiVersion": f"{group}/{crd_version}", "kind": kind, "schema": strip(schema)}
        target = OUT / f"{group}_{crd_version}_{kind}.json"
        target.write_text(json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n")
        print(f"{target.relative_to(OUT.parents[1])}: {target.stat().st_size // 1024} KiB from {module}@{version}")
    k8s = module_dir(*K8S_MODULE)
    for filename, api_version, kind, name in K8S_KINDS:
        spec = json.loads((k8s / "api" / "openapi-spec" / "v3" / filename).read_text())
        components = strip(spec["components"]["schemas"])
        needed = _closure(components, name)
        schema = {"$ref": f"#/components/schemas/{name}", "components": {"schemas": {k: components[k] for k in sorted(needed)}}}
        doc = {"x-pipectl-source": f"{K8S_MODULE[0]}@{K8S_MODULE[1]}/api/openapi-spec/v3/{filename}", "apiVersion": api_version, "kind": kind, "schema": schema}
        group = api_version.rsplit("/", 1)[0] if "/" in api_version else "core"
        target = OUT / f"{group}_{api_version.rsplit('/', 1)[-1]}_{kind}.json"
        target.write_text(json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n")
        print(f"{target.relative_to(OUT.parents[1])}: {target.stat().st_size // 1024} KiB")


def _closure(components: dict, root: str) -> set[str]:
    """Names of every schema reachable from ``root`` through $ref."""
    seen: set[str] = set()
    stack = [root]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        text = json.dumps(components[name])
        for ref in set(__import__("re").findall(r'#/components/schemas/([^"]+)"', text)):
            stack.append(ref)
    return seen


if __name__ == "__main__":
    main()
