"""The exit handler's run(): the in-cluster API client, then :func:`~pipectl.components.gang.core.release`."""

from __future__ import annotations

from pipectl.components.contracts import ReleaseInput, ReleaseOutput, StoreSettings
from pipectl.components.gang.core import JobKind, release
from pipectl.components.runtime import StepError


def _api_client():
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()  # outside a pod: the caller's kubeconfig
    return client.ApiClient()


def run(inp: ReleaseInput, settings: StoreSettings) -> ReleaseOutput:
    if inp.workflow_status == "Succeeded":  # the gang completed: its job and pods stay for their logs
        print(f"workflow {inp.workflow_name} succeeded: nothing to release")
        return ReleaseOutput()
    try:
        deleted = release(_api_client(), inp.namespace, inp.workflow_name, [JobKind.parse(inp.job_kind)], timeout_s=inp.timeout_s)
    except TimeoutError as e:
        raise StepError(f"the gang of workflow {inp.workflow_name} is not gone after {inp.timeout_s:g} s: {e}",
                        "check the pods' nodes (a node that stopped reporting keeps its pods Terminating)",
                        transient=True) from e
    print(f"workflow {inp.workflow_name}: gang jobs deleted: {', '.join(deleted) or 'none'}; no gang pod left")
    return ReleaseOutput()
