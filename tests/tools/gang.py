"""The train step's gang-job manifest with its tags and Argo expressions evaluated as Argo would.

Cluster tests that create the product's gang job themselves (a lane's batch gangs, a re-sent
write, a fresh run beside an evicted one) build it here, through the local backend's
substitution (:func:`pipectl.pipelines.substitution.substitute`): every parameter reaches the job
through an expression, so replacing tags in the text is not enough.
"""

from __future__ import annotations

from collections.abc import Mapping

import yaml


def gang_job_text(manifest: str, *, workflow: str, inputs: Mapping[str, str],
                  workflow_parameters: Mapping[str, str] | None = None, retries: int = 0) -> str:
    """``manifest`` (a resource template's text) for a workflow named ``workflow`` whose step got
    ``inputs`` (kebab names) and whose workflow arguments are ``workflow_parameters``."""
    from pipectl.pipelines.substitution import substitute

    values = {f"inputs.parameters.{k}": str(v) for k, v in inputs.items()}
    values.update({f"workflow.parameters.{k}": str(v) for k, v in (workflow_parameters or {}).items()})
    values.update({"workflow.name": workflow, "retries": str(retries)})
    return substitute(manifest, values, where=f"gang job of {workflow}")


def gang_job(manifest: str, *, workflow: str, inputs: Mapping[str, str], namespace: str,
             workflow_parameters: Mapping[str, str] | None = None) -> dict:
    """:func:`gang_job_text` parsed, in ``namespace``."""
    job = yaml.safe_load(gang_job_text(manifest, workflow=workflow, inputs=inputs,
                                       workflow_parameters=workflow_parameters))
    job["metadata"]["namespace"] = namespace
    return job


def template_defaults(wt: dict) -> dict[str, str]:
    """A WorkflowTemplate's (or a Workflow's) arguments with their values (kebab names); {} when
    it has none."""
    return {p["name"]: str(p.get("value", "")) for p in wt["spec"].get("arguments", {}).get("parameters", [])}
