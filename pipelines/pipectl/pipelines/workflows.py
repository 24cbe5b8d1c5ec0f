"""The Workflow objects the CLI sends: a submission of a WorkflowTemplate, a CronWorkflow run now,
and a resubmission of an earlier workflow. Pure; :mod:`pipectl.pipelines.backends.kube` sends them,
``--dry-run`` prints them.
"""

from __future__ import annotations

from typing import Any

from pipectl.components.contracts import TrainingParameters
from pipectl.components.names import LANE_LABEL, PART_OF
from pipectl.pipelines.policy import LANES

GROUP, VERSION = "argoproj.io", "v1alpha1"
TEMPLATE_LABEL = "workflows.argoproj.io/workflow-template"
CRON_LABEL = "workflows.argoproj.io/cron-workflow"
"""Argo's own labels: the template a workflow came from, the CronWorkflow that started it."""
RETRY_OF_LABEL = "pipectl.io/retry-of"
RESUBMITTED_FIELDS = ("workflowTemplateRef", "arguments", "priority")


def workflow_for(template_name: str, namespace: str, parameters: TrainingParameters) -> dict[str, Any]:
    """The Workflow ``pipectl submit`` creates: a reference to the WorkflowTemplate with every
    typed parameter, the lane's Argo ``spec.priority`` (orders the controller's queues) and labels."""
    lane = LANES[parameters.lane]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Workflow",
        "metadata": {
            "generateName": template_name.rsplit("-v", 1)[0] + "-",
            "namespace": namespace,
            "labels": {**PART_OF, LANE_LABEL: parameters.lane.value, TEMPLATE_LABEL: template_name},
        },
        "spec": {
            "workflowTemplateRef": {"name": template_name},
            "priority": lane.argo_priority,
            "arguments": {"parameters": [{"name": k, "value": v} for k, v in parameters.as_arguments().items()]},
        },
    }


def cron_trigger_workflow(cron: dict[str, Any]) -> dict[str, Any]:
    """One Workflow from a CronWorkflow's ``workflowSpec``, labelled as Argo labels cron runs."""
    name = cron["metadata"]["name"]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Workflow",
        "metadata": {
            "generateName": f"{name}-",
            "namespace": cron["metadata"]["namespace"],
            "labels": {CRON_LABEL: name, **PART_OF},
        },
        "spec": cron["spec"]["workflowSpec"],
    }


def resubmit_workflow(old: dict[str, Any], namespace: str) -> dict[str, Any]:
    """A new Workflow with ``old``'s template, arguments and priority, labelled ``retry-of``."""
    name = old["metadata"]["name"]
    return {
        "apiVersion": old["apiVersion"], "kind": "Workflow",
        "metadata": {"generateName": old["metadata"].get("generateName") or f"{name}-", "namespace": namespace,
                     "labels": {**old["metadata"].get("labels", {}), RETRY_OF_LABEL: name}},
        "spec": {k: v for k, v in old["spec"].items() if k in RESUBMITTED_FIELDS},
    }
