"""Volcano ``batch.volcano.sh/v1alpha1`` Job: one task ``worker`` of ``workers`` pods, gang-scheduled."""

from __future__ import annotations

from typing import Any

from pipectl.components.contracts import ExitCode
from pipectl.components.names import lane_object_name
from pipectl.pipelines.launchers.base import (
    MASTER_PORT,
    GangConfig,
    Launcher,
    ReplicaGroup,
    dump_manifest,
    integer,
    job_metadata,
    pod_template,
    text,
)

# the label Volcano's job controller puts on every pod of a job (volcano.sh/apis batch.JobNameKey)
JOB_NAME_FIELD = "metadata.labels['volcano.sh/job-name']"

# Volcano Job lifecycle policies (volcano.sh docs, "Job lifecycle policies"; first match wins,
# job_controller_util.go applyPolicies): what broke the infrastructure restarts the WHOLE gang
# (DDP cannot continue with a replaced member; every pod resumes from the last checkpoint), what
# broke the code ends the job at once, so Argo's failureCondition sees it and does not retry.
#
# A policy can only see the event and the exit code of the pod's FIRST container
# (job_controller_handler.go updatePod; 0 when the container has no terminated state), never the
# pod's reason. So the rule is keyed on the one code the code can produce: the launcher maps every
# failure of the training code to exit 1 (components/pipectl/components/train/launch.py), and
# every OTHER way a gang pod can fail is the infrastructure's (field case C07):
#   - kubelet node-pressure eviction: the pod stays, phase Failed, reason Evicted, its container
#     137 (SIGKILL) or with no terminated state at all — Volcano's PodEvicted is raised only for
#     deleted pods, so a policy keyed on it never sees this one;
#   - preemption or eviction that outlives its grace period (newer Volcano reports PodFailed, 137);
#   - graceful node shutdown: reason Terminated, 143 (the launcher's SIGTERM) or 137;
#   - the kubelet's admission rejection after a node restart (UnexpectedAdmissionError, OutOf<gpu>):
#     no container ever ran, no exit code;
#   - 75 (EX_TEMPFAIL, declared transient by the step: ExitCode in components/contracts.py).
# Retries are bounded by maxRetry (see max_retry: infra_limit + 1); a command the image cannot
# run at all (126/127, a runtime StartError 128) is the spec's fault and ends the job.
CODE_FAILURE_EXIT_CODES = (1, 126, 127, 128)
# 76: the gang preflight found a slow link (components/pipectl/components/train/preflight.py). A
# restart of this job would put its pods back on the same nodes, so the job ends instead; the train
# step's next attempt is a new job placed away from the nodes the pod named (gang-avoid, training.py).
AVOID_NODES_EXIT_CODE = int(ExitCode.AVOID_NODES)


def max_retry(infra_limit: int) -> int:
    """Volcano's ``maxRetry`` for a gang that survives exactly ``infra_limit`` infrastructure losses
    (C17). Volcano counts runs, not restarts: a ``RestartJob`` increments ``retryCount`` and the job
    fails once ``retryCount >= maxRetry`` (controllers/job/state running.go, restarting.go, v1.10),
    and its admission webhook turns ``maxRetry: 0`` into 3. So n losses need ``n + 1``, and
    ``infra_limit: 0`` writes 1: the first loss ends the job."""
    return infra_limit + 1
VOLCANO_POLICIES = [
    # preempted by an urgent lane (reclaim/preempt), drained, scaled down, node deleted: the pod was deleted
    {"event": "PodEvicted", "action": "RestartJob"},
    # the training code failed (exit 1), or the image cannot run its command: end the job now
    *({"exitCode": code, "action": "TerminateJob"} for code in CODE_FAILURE_EXIT_CODES),
    # a slow link named by the gang preflight: end the job; the next attempt avoids those nodes
    {"exitCode": AVOID_NODES_EXIT_CODE, "action": "TerminateJob"},
    # any other failed pod (143, 137, 75, no exit code): the infrastructure's; restart the gang
    {"event": "PodFailed", "action": "RestartJob"},
]


class VolcanoJob(Launcher):
    """``replicas = minAvailable = workers``: all pods bind or none. The ``svc`` plugin gives pods
    DNS names ``<job>-worker-<i>.<job>``; the ``env`` plugin sets ``VC_TASK_INDEX`` (volcano.sh
    docs, "Job plugins")."""

    name = "volcano"
    description = "a Volcano Job (gang: minAvailable = workers; whole-gang restart on infrastructure loss)"
    api_version = "batch.volcano.sh/v1alpha1"
    kind = "Job"
    resource = "jobs"
    # Volcano Job phases: Pending, Aborting, Aborted, Running, Restarting, Completing, Completed,
    # Terminating, Terminated, Failed. Only the terminal ones appear in a condition (C02).
    success_condition = "status.state.phase == Completed"
    failure_condition = "status.state.phase in (Failed, Aborted, Terminated)"

    def manifest(self, cfg: GangConfig) -> str:
        # the pods read the job's name (JOB_NAME) from the label Volcano puts on them; Kubernetes
        # expands $(VAR) of earlier variables in an env value
        env = [
            {"name": "PIPECTL_GANG_JOB", "valueFrom": {"fieldRef": {"fieldPath": JOB_NAME_FIELD}}},
            {"name": "MASTER_ADDR", "value": "$(PIPECTL_GANG_JOB)-worker-0.$(PIPECTL_GANG_JOB)"},
            {"name": "MASTER_PORT", "value": str(MASTER_PORT)},
        ]
        lane_objects = text(lane_object_name("{lane}"))  # the PriorityClass
        return dump_manifest({
            "apiVersion": self.api_version,
            "kind": self.kind,
            "metadata": job_metadata(),
            "spec": {
                "schedulerName": "volcano",
                "minAvailable": integer("workers"),
                "queue": cfg.queue(),
                "priorityClassName": lane_objects,
                "maxRetry": max_retry(cfg.max_restarts),
                "policies": VOLCANO_POLICIES,
                "plugins": {"svc": [], "env": []},
                "tasks": [{"name": "worker", "replicas": integer("workers"),
                           "template": pod_template(cfg, "$(VC_TASK_INDEX)", env)}],
            },
        })

    def replica_groups(self, job: dict) -> list[ReplicaGroup]:
        return [ReplicaGroup(t["name"], t.get("replicas", 1), t["template"]["spec"]) for t in job["spec"].get("tasks", [])]

    def gang_fields(self, job: dict) -> tuple[Any, Any]:
        return job["spec"].get("minAvailable"), job["spec"].get("queue")

    def pod_fields(self, job: str) -> dict[str, str]:
        return {JOB_NAME_FIELD: job}

    def local_env(self, group: str, index: int, rank: int, pods: int, master_port: str) -> dict[str, str]:
        return {"VC_TASK_INDEX": str(index), "VK_TASK_INDEX": str(index)}

    def local_gang_restarts(self, job: dict, exit_code: int) -> int:
        """The job's ``policies`` as Volcano applies them to a pod that failed with ``exit_code``
        (first match wins: an ``exitCode`` rule, then the ``PodFailed`` event; a process that
        ended is never a deleted pod, so ``PodEvicted`` does not apply): ``RestartJob`` allows
        ``maxRetry - 1`` restarts (Volcano counts runs, see :func:`max_retry`; its webhook's default
        is 3), anything else none."""
        for policy in job["spec"].get("policies") or []:
            events = [policy.get("event"), *(policy.get("events") or [])]
            if policy.get("exitCode") == exit_code or "PodFailed" in events:
                if policy.get("action") != "RestartJob":
                    return 0
                return max(0, int(job["spec"].get("maxRetry") or 3) - 1)
        return 0
