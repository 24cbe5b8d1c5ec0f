"""Gang-scheduled training jobs: one Volcano Job or one Kubeflow PyTorchJob per attempt.

Every pod of the gang runs the same ``torchrun`` line, through pipectl's wrapper that keeps the
workers' exit code (torchrun itself exits 1 for any failure: components/train/launch.py)::

    python -m pipectl.components.train.launch --nnodes=<workers> --node-rank=<pod index>
             --nproc-per-node=<processes per worker> --master-addr=$(MASTER_ADDR)
             --master-port=$(MASTER_PORT) -m pipectl.components.train ...

so torchrun gives each process WORLD_SIZE = workers x processes per worker and
RANK = node_rank x processes per worker + local_rank (field case C04), and every pod agrees on
the rank-0 pod as master. Kubernetes expands ``$(VAR)`` in commands from the container's env.

Replica counts and minAvailable are written unquoted, so after Argo's substitution the YAML
scalars are integers (C03), whichever way the workflow was submitted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import yaml

from pipectl.components.contracts import OUTPUTS_DIR, lane_object_name
from pipectl.pipelines.policy import TMP_VOLUME, restricted_container_security_context, restricted_pod_security_context

STORE_CONFIGMAP = "pipectl-store"
STORE_SECRET = "pipectl-s3-credentials"
MASTER_PORT = 29500
P = "{{inputs.parameters.%s}}"
JOB_NAME = "{{workflow.name}}-train-{{retries}}"
TRAIN_ARGS = ("shards-uri", "run-uri", "model-name", "epochs", "batch-size", "learning-rate", "checkpoint-every-steps", "seed")


@dataclass(frozen=True)
class GangConfig:
    """Compile-time settings of the gang's pods."""

    image: str
    service_account: str
    """ServiceAccount of the gang's pods (no Role; its token is not mounted)."""
    shm_gib: int
    lane_taint_key: str
    max_restarts: int = 6
    """Whole-gang restarts for infrastructure failures (Volcano ``maxRetry``): the retry policy's
    ``infra_limit``."""


# Volcano Job lifecycle policies (volcano.sh docs, "Job lifecycle policies"; first match wins,
# job_controller_util.go applyPolicies): what broke the infrastructure restarts the WHOLE gang
# (DDP cannot continue with a replaced member; every pod resumes from the last checkpoint), what
# broke the code ends the job at once, so Argo's failureCondition sees it and does not retry.
VOLCANO_POLICIES = [
    # preempted by an urgent lane (reclaim/preempt), drained, scaled down: the pod was deleted
    {"event": "PodEvicted", "action": "RestartJob"},
    # EX_TEMPFAIL from the step (a transient store/tracking failure: DESIGN.md exit codes)
    {"exitCode": 75, "action": "RestartJob"},
    # SIGTERM from the kubelet (graceful node shutdown, spot reclaim notice): the launcher's 128+15
    {"exitCode": 143, "action": "RestartJob"},
    # anything else that failed a pod is the code's (exit 1, OOM kill 137): fail the job now
    {"event": "PodFailed", "action": "TerminateJob"},
]


def _int(name: str) -> str:
    return f"__INT__{name}__"


def _unquote_ints(text: str) -> str:
    """Turn ``'__INT__x__'`` placeholders into bare ``{{...}}`` tags (integers after substitution)."""
    import re

    return re.sub(r"'?__INT__(.+?)__'?", lambda m: m.group(1), text)


def pod_template(cfg: GangConfig, node_rank: str, env: list[dict]) -> dict:
    """Pod of the gang: torchrun, store settings from ConfigMap/Secret, GPUs, /dev/shm (C06)."""
    command = [
        "python",
        "-m",
        "pipectl.components.train.launch",
        f"--nnodes={P % 'workers'}",
        f"--node-rank={node_rank}",
        f"--nproc-per-node={P % 'processes-per-worker'}",
        "--master-addr=$(MASTER_ADDR)",
        "--master-port=$(MASTER_PORT)",
        "-m",
        "pipectl.components.train",
    ]
    for name in TRAIN_ARGS:
        command += [f"--{name}", P % name]
    command += ["--workflow-name", "{{workflow.name}}", "--outputs-dir", OUTPUTS_DIR]
    return {
        "metadata": {
            "labels": {"workflows.argoproj.io/workflow": "{{workflow.name}}", "pipectl.io/step": "train"},
            "annotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"},
        },
        "spec": {
            "restartPolicy": "Never",
            "serviceAccountName": cfg.service_account,
            # training code never calls the Kubernetes API: no token in the pods (issue 13)
            "automountServiceAccountToken": False,
            "securityContext": restricted_pod_security_context(),
            "priorityClassName": lane_object_name(P % "lane"),
            "tolerations": [{"key": cfg.lane_taint_key, "operator": "Equal", "value": P % "lane", "effect": "NoSchedule"}],
            "containers": [
                {
                    "name": "pytorch",
                    "image": cfg.image,
                    "command": command,
                    "env": env,
                    "envFrom": [
                        {"configMapRef": {"name": STORE_CONFIGMAP, "optional": True}},
                        {"secretRef": {"name": STORE_SECRET, "optional": True}},
                    ],
                    "ports": [{"name": "pytorchjob-port", "containerPort": MASTER_PORT}],
                    # requests = limits: Guaranteed QoS, never BestEffort (the kubelet's first eviction
                    # victims under node pressure, field case C07); values checked by `validate`
                    "resources": {
                        "requests": {"cpu": P % "cpu-per-worker", "memory": P % "memory-gib-per-worker" + "Gi"},
                        "limits": {"cpu": P % "cpu-per-worker", "memory": P % "memory-gib-per-worker" + "Gi",
                                   "nvidia.com/gpu": _int(P % "gpus-per-worker")},
                    },
                    "securityContext": restricted_container_security_context(),
                    "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}, {"name": TMP_VOLUME["name"], "mountPath": "/tmp"}],
                }
            ],
            "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{cfg.shm_gib}Gi"}}, dict(TMP_VOLUME)],
        },
    }


def volcano_job(cfg: GangConfig) -> str:
    """Volcano ``batch.volcano.sh/v1alpha1`` Job (YAML text with Argo tags).

    One task ``worker`` with ``replicas = minAvailable = workers``: all bind or none. The ``svc``
    plugin gives pods DNS names ``<job>-worker-<i>.<job>``; the ``env`` plugin sets
    ``VC_TASK_INDEX`` (volcano.sh docs, "Job plugins").
    """
    env = [
        {"name": "MASTER_ADDR", "value": f"{JOB_NAME}-worker-0.{JOB_NAME}"},
        {"name": "MASTER_PORT", "value": str(MASTER_PORT)},
    ]
    manifest = {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": JOB_NAME, "labels": {"workflows.argoproj.io/workflow": "{{workflow.name}}", "pipectl.io/step": "train"}},
        "spec": {
            "schedulerName": "volcano",
            "minAvailable": _int(P % "workers"),
            "queue": lane_object_name(P % "lane"),
            "priorityClassName": lane_object_name(P % "lane"),
            "maxRetry": cfg.max_restarts,
            "policies": VOLCANO_POLICIES,
            "plugins": {"svc": [], "env": []},
            "tasks": [{"name": "worker", "replicas": _int(P % "workers"), "template": pod_template(cfg, "$(VC_TASK_INDEX)", env)}],
        },
    }
    return _unquote_ints(yaml.safe_dump(manifest, sort_keys=False))


def pytorch_job(cfg: GangConfig) -> str:
    """Kubeflow ``kubeflow.org/v1`` PyTorchJob (YAML text with Argo tags).

    Master (1) + Worker (workers - 1); the training operator sets ``MASTER_ADDR``/``MASTER_PORT``
    (the master's Service and ``pytorchjob-port``) and ``RANK`` = pod index (master 0). Gang:
    ``runPolicy.schedulingPolicy`` with ``minAvailable = workers`` for the Volcano gang scheduler.
    """
    pod = pod_template(cfg, "$(RANK)", [])
    manifest = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": JOB_NAME, "labels": {"workflows.argoproj.io/workflow": "{{workflow.name}}", "pipectl.io/step": "train"}},
        "spec": {
            "runPolicy": {
                "cleanPodPolicy": "None",
                "backoffLimit": 0,
                "schedulingPolicy": {
                    "minAvailable": _int(P % "workers"),
                    "queue": lane_object_name(P % "lane"),
                    "priorityClass": lane_object_name(P % "lane"),
                },
            },
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "restartPolicy": "Never", "template": pod},
                "Worker": {"replicas": _int("{{=asInt(inputs.parameters.workers) - 1}}"), "restartPolicy": "Never", "template": pod},
            },
        },
    }
    return _unquote_ints(yaml.safe_dump(manifest, sort_keys=False))


@dataclass(frozen=True)
class Launcher:
    """One kind of gang job: its manifest, Argo's success/failure conditions on it, and the API
    group/resource the train step's ServiceAccount may create, get and patch (and nothing else)."""

    manifest: Callable[[GangConfig], str]
    success_condition: str
    failure_condition: str
    api_group: str
    resource: str


LAUNCHERS: dict[str, Launcher] = {
    # Volcano Job phases: Pending, Aborting, Aborted, Running, Restarting, Completing, Completed,
    # Terminating, Terminated, Failed. Only the terminal ones appear in a condition (C02).
    "volcano": Launcher(volcano_job, "status.state.phase == Completed", "status.state.phase in (Failed, Aborted, Terminated)",
                        "batch.volcano.sh", "jobs"),
    # PyTorchJob: picking a condition by type out of status.conditions[] is not expressible (C02);
    # the master's replica counters are.
    "pytorchjob": Launcher(pytorch_job, "status.replicaStatuses.Master.succeeded > 0", "status.replicaStatuses.Master.failed > 0",
                           "kubeflow.org", "pytorchjobs"),
}
