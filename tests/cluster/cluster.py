"""A real Kubernetes control plane with Argo Workflows and Volcano on 127.0.0.1, pods by KWOK.

Upstream binaries only (built from Go modules and cached by tests/cluster/build.sh under
``${PIPECTL_CACHE_DIR:-~/.cache/pipectl}/cluster-bin/<component>-<version>/<component>``):

  etcd                      data in run_dir/etcd, --unsafe-no-fsync (throwaway)
  kube-apiserver            TLS + client-certificate auth (a local CA made with `cryptography`),
                            ECDSA service-account signing key, RBAC, default admission plugins
  kube-controller-manager   every default controller except the cloud ones (ServiceAccounts,
                            namespaces, GC, node lifecycle, ...)
  kube-scheduler            the default scheduler
  kwok                      fake nodes (annotation kwok.x-k8s.io/node=fake) and pod lifecycles,
                            driven by Stage objects read from the API server (--enable-crds=Stage)
  workflow-controller       Argo, off-cluster, namespace argo, executor image pull policy Never,
                            DEFAULT_REQUEUE_TIME=1s (as Argo's own test setup; env
                            PIPECTL_ARGO_REQUEUE_TIME overrides)
  argo server               only with argo_server=True: auth mode server, plain http
  vc-scheduler              Volcano scheduler (optional: its failure is recorded, not fatal)
  vc-controller-manager     Volcano controllers (optional, same)
  argoexec-stand-in         a small Python watcher (this file, `taskresults` command) doing what
                            Argo's executor would for pods that never run: it writes each ended
                            pod's WorkflowTaskResult (Argo >= 3.5 keeps a workflow Running until
                            every pod's result is reported), with output parameters the TEST
                            supplies (ConfigMap pipectl-test-outputs), and runs resource templates
                            (creates the manifest, evaluates the success/failure conditions with
                            argoexec's own code, ends the pod). See run_taskresult_reporter().

Pod lifecycle on fake nodes (Stages created by this file, see POD_STAGES):
  Pending -> Running (every container running) -> Succeeded (every container exit 0);
  a pod annotated ``pipectl.io/fail: MESSAGE`` goes Running -> Failed instead: its containers
  other than Argo's ``wait`` terminate with exit code ``pipectl.io/exit-code`` (default 1),
  reason Error and MESSAGE as the termination message. With ``pipectl.io/fail-reason: REASON``
  also set, the pod itself gets ``status.reason: REASON`` and ``status.message: MESSAGE`` (what a
  node shutdown or eviction looks like; Argo then shows MESSAGE as the step's message). Running
  time: ``pipectl.io/run-duration`` (a Go duration such as ``30s``; default 1s); Pending -> Running
  takes 200 ms after the pod is bound. Fake nodes: ``kwok-node-N``, label ``type=kwok``, each
  cpu 32, memory 256Gi, nvidia.com/gpu 8, pods 110, no taints (see fake_node()).

Every component authenticates with the one admin client certificate (group system:masters).
Volcano's admission webhook (vc-webhook-manager) is not run: Volcano Jobs must set what it would
default (queue, minAvailable, schedulerName). Components are started through ``setpriv
--pdeathsig KILL`` so that they die with the Python process that started them (not for ``up``).

Usage::

    from tests.cluster.cluster import TestCluster
    with TestCluster(tmp_path / "k8s") as c:
        api = c.api_client()            # kubernetes.client.ApiClient (admin, system:masters)
        print(c.kubeconfig, c.timings)  # timings: s since start at which each step was ready;
        print(c.durations, c.errors)    # durations: s from a component's spawn to ready

Command line (used by scripts/cluster-up.sh and scripts/cluster-down.sh)::

    python tests/cluster/cluster.py up RUN_DIR [--nodes N] [--no-volcano] [--argo-server]
    python tests/cluster/cluster.py down RUN_DIR
    python tests/cluster/cluster.py check        # exit 1 naming what is missing
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

K8S_VERSION = "v1.34.4"
VERSIONS = {
    "etcd": "v3.6.16",
    "kube-apiserver": K8S_VERSION,
    "kube-controller-manager": K8S_VERSION,
    "kube-scheduler": K8S_VERSION,
    "workflow-controller": "v4.0.5",
    "argo": "v4.0.5",
    "vc-scheduler": "v1.10.0",
    "vc-controller-manager": "v1.10.0",
    "kwok": "v0.8.0",
    "kubectl": K8S_VERSION,  # only for `kubectl apply -k argo/` as a user would
}
# Go modules whose manifests (CRDs, stages) are applied: module@version -> files inside it
MODULES = {
    "argo": "github.com/argoproj/argo-workflows/v4@" + VERSIONS["workflow-controller"],
    "volcano": "volcano.sh/volcano@" + VERSIONS["vc-scheduler"],
    "kwok": "sigs.k8s.io/kwok@" + VERSIONS["kwok"],
}
CRD_GLOBS = {
    "kwok": ["kustomize/crd/bases/kwok.x-k8s.io_stages.yaml"],
    "argo": ["manifests/base/crds/full/argoproj.io_*.yaml"],
    "volcano": ["config/crd/volcano/bases/*.yaml", "config/crd/jobflow/bases/*.yaml"],
}
REQUIRED_COMPONENTS = ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
                       "kwok", "workflow-controller"]
OPTIONAL_COMPONENTS = ["vc-scheduler", "vc-controller-manager"]
AUDIT_POLICY = Path(__file__).resolve().parent / "audit-policy.yaml"
STOP_ORDER = ["argoexec-stand-in", "argo-server", "workflow-controller", "vc-controller-manager", "vc-scheduler",
              "kwok", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"]
STATE_FILE = "cluster.json"
EXECUTOR_IMAGE = "quay.io/argoproj/argoexec:" + VERSIONS["workflow-controller"]
FAKE_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
NODE_CAPACITY = {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": "8", "pods": "110",
                 "ephemeral-storage": "1Ti"}
SERVICE_CIDR = "10.96.0.0/16"
POD_CIDR = "10.244.0.0/16"


class ClusterNotAvailable(RuntimeError):
    """A binary or Go module the cluster needs is not in the cache (see `missing()`)."""


class ClusterStartError(RuntimeError):
    pass


# -- locating binaries and modules --------------------------------------------------------------


def cache_root() -> Path:
    return Path(os.environ.get("PIPECTL_CACHE_DIR", Path.home() / ".cache" / "pipectl"))


def binary(component: str) -> Path:
    v = VERSIONS[component]
    return cache_root() / "cluster-bin" / f"{component}-{v}" / component


def gomodcache() -> Path:
    if os.environ.get("GOMODCACHE"):
        return Path(os.environ["GOMODCACHE"])
    for go in (shutil.which("go"), "/usr/local/go/bin/go"):
        if go and os.path.exists(go):
            try:
                out = subprocess.run([go, "env", "GOMODCACHE"], capture_output=True, text=True,
                                     timeout=20, check=False).stdout.strip()
            except (OSError, subprocess.TimeoutExpired):
                out = ""
            if out:
                return Path(out)
    return Path(os.environ.get("GOPATH", Path.home() / "go")) / "pkg" / "mod"


def module_dir(name: str) -> Path:
    return gomodcache() / MODULES[name]


def crd_files(name: str) -> list[Path]:
    d = module_dir(name)
    return sorted(p for g in CRD_GLOBS[name] for p in d.glob(g))


def missing(volcano: bool = True) -> list[str]:
    """What the cluster needs and cannot find: binaries in the cache, module CRDs."""
    out = []
    for c in REQUIRED_COMPONENTS + (OPTIONAL_COMPONENTS if volcano else []):
        if not os.access(binary(c), os.X_OK):
            out.append(f"binary {binary(c)} (run tests/cluster/build.sh {c})")
    for m in ["kwok", "argo"] + (["volcano"] if volcano else []):
        if not crd_files(m):
            out.append(f"CRDs of Go module {MODULES[m]} under {gomodcache()} "
                       f"(run: go mod download {MODULES[m]})")
    return out


def ensure_available(volcano: bool = True) -> None:
    m = missing(volcano)
    if m:
        raise ClusterNotAvailable("test cluster components missing: " + "; ".join(m))


# -- small helpers --------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _free_ports(n: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < n:
        p = _free_port()
        if p not in ports:
            ports.append(p)
    return ports


def _kill_group(pgid: int, timeout_s: float = 0.0) -> None:
    try:
        os.killpg(pgid, signal.SIGTERM if timeout_s else signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _load_yaml_docs(path: Path) -> list[dict]:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: 10x faster on Argo's CRDs
    return [d for d in yaml.load_all(path.read_text(), Loader=loader) if d]


# -- certificates -------------------------------------------------------------------------------


def _write_pki(pki: Path) -> None:
    """CA, API server serving cert, admin client cert (system:masters), service-account key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    pki.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=5)
    later = now + datetime.timedelta(days=365)

    def key():
        return ec.generate_private_key(ec.SECP256R1())

    def write_key(k, name):
        (pki / name).write_bytes(k.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))
        os.chmod(pki / name, 0o600)

    def name(cn, org=None):
        attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
        if org:
            attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
        return x509.Name(attrs)

    ca_key = key()
    ca = (x509.CertificateBuilder().subject_name(name("pipectl-test-ca"))
          .issuer_name(name("pipectl-test-ca")).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(later)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    (pki / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    write_key(ca_key, "ca.key")

    def leaf(fname, cn, org=None, server=False):
        k = key()
        b = (x509.CertificateBuilder().subject_name(name(cn, org)).issuer_name(ca.subject)
             .public_key(k.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now).not_valid_after(later)
             .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
             .add_extension(x509.ExtendedKeyUsage(
                 [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
                 critical=False))
        if server:
            b = b.add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.DNSName("kubernetes"),
                x509.DNSName("kubernetes.default"), x509.DNSName("kubernetes.default.svc"),
                x509.DNSName("kubernetes.default.svc.cluster.local"),
                x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                x509.IPAddress(ipaddress.ip_address("10.96.0.1")),
            ]), critical=False)
        cert = b.sign(ca_key, hashes.SHA256())
        (pki / f"{fname}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        write_key(k, f"{fname}.key")

    leaf("apiserver", "kube-apiserver", server=True)
    leaf("admin", "pipectl-admin", org="system:masters")
    sa = key()
    write_key(sa, "sa.key")
    (pki / "sa.pub").write_bytes(sa.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))


# -- KWOK stages --------------------------------------------------------------------------------

NODE_HEARTBEAT_STAGE = """
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: node-heartbeat
spec:
  resourceRef: {apiGroup: v1, kind: Node}
  selector:
    matchExpressions:
    - key: '.status.phase'
      operator: 'In'
      values: ['Running']
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'In'
      values: ['True']
  delay:
    durationMilliseconds: 10000
    jitterDurationMilliseconds: 5000
  next:
    statusTemplate: |
      {{ $now := Now }}
      {{ $lastTransitionTime := or .metadata.creationTimestamp $now }}
      conditions:
      {{ range NodeConditions }}
      - lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $lastTransitionTime | Quote }}
        message: {{ .message | Quote }}
        reason: {{ .reason | Quote }}
        status: {{ .status | Quote }}
        type: {{ .type | Quote }}
      {{ end }}
  immediateNextStage: true
"""

_POD_IPS = """
      {{ $hostIPs := NodeIPsWith .spec.nodeName }}
      {{ with $hostIPs }}
      hostIP: {{ index . 0 | Quote }}
      hostIPs:
      {{ range . }}
      - ip: {{ . | Quote }}
      {{ end }}
      {{ end }}
      {{ $podIPs := PodIPsWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) }}
      {{ with $podIPs }}
      podIP: {{ index . 0 | Quote }}
      podIPs:
      {{ range . }}
      - ip: {{ . | Quote }}
      {{ end }}
      {{ end }}
"""

POD_STAGES = """
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-ready
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values: ['Pending']
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'NotIn'
      values: ['True']
  delay:
    durationMilliseconds: 200
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: Initialized
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: Ready
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: ContainersReady
      {{ range .spec.readinessGates }}
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: {{ .conditionType | Quote }}
      {{ end }}
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: true
        restartCount: 0
        started: true
        state:
          running:
            startedAt: {{ $now | Quote }}
      {{ end }}
      initContainerStatuses:
      {{ range .spec.initContainers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: true
        restartCount: 0
        {{ if eq .restartPolicy "Always" }}
        started: true
        state:
          running:
            startedAt: {{ $now | Quote }}
        {{ else }}
        state:
          terminated:
            exitCode: 0
            finishedAt: {{ $now | Quote }}
            reason: Completed
            startedAt: {{ $now | Quote }}
        {{ end }}
      {{ end }}
__POD_IPS__
      phase: Running
      startTime: {{ $now | Quote }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-complete
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values: ['Running']
    - key: '.metadata.annotations["pipectl.io/fail"]'
      operator: 'DoesNotExist'
    # Argo resource-template pods (`argoexec resource ...`) stay Running: the argoexec stand-in
    # creates their manifest and ends the pod when argoexec would (success/failure condition).
    # (`/var/run/argo/argoexec emissary -- argoexec resource apply ...`; the main container is not
    # always the first: with archiveLogs Argo adds a wait container before it)
    - key: '[.spec.containers[] | (.command // []) | join(" ")] | join(";") | test("(^| )argoexec resource ")'
      operator: 'NotIn'
      values: ['true']
  delay:
    durationMilliseconds: 1000
    durationFrom:
      expressionFrom: '.metadata.annotations["pipectl.io/run-duration"]'
  next:
    statusTemplate: |
      {{ $now := Now }}
      {{ $started := or .status.startTime $now }}
      conditions:
      - lastTransitionTime: {{ $now | Quote }}
        status: "False"
        reason: PodCompleted
        type: Ready
      - lastTransitionTime: {{ $now | Quote }}
        status: "False"
        reason: PodCompleted
        type: ContainersReady
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: false
        restartCount: 0
        started: false
        state:
          terminated:
            exitCode: 0
            finishedAt: {{ $now | Quote }}
            reason: Completed
            startedAt: {{ $started | Quote }}
      {{ end }}
      phase: Succeeded
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-fail
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values: ['Running']
    - key: '.metadata.annotations["pipectl.io/fail"]'
      operator: 'Exists'
  delay:
    durationMilliseconds: 1000
    durationFrom:
      expressionFrom: '.metadata.annotations["pipectl.io/run-duration"]'
  next:
    statusTemplate: |
      {{ $now := Now }}
      {{ $started := or .status.startTime $now }}
      {{ $annotations := or .metadata.annotations dict }}
      {{ $message := index $annotations "pipectl.io/fail" }}
      {{ $exitCode := or ( index $annotations "pipectl.io/exit-code" ) "1" }}
      {{ $podReason := or ( index $annotations "pipectl.io/fail-reason" ) "" }}
      conditions:
      - lastTransitionTime: {{ $now | Quote }}
        status: "False"
        reason: PodFailed
        type: Ready
      - lastTransitionTime: {{ $now | Quote }}
        status: "False"
        reason: PodFailed
        type: ContainersReady
      containerStatuses:
      {{ range .spec.containers }}
      {{ if eq .name "wait" }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: false
        restartCount: 0
        started: false
        state:
          terminated:
            exitCode: 0
            finishedAt: {{ $now | Quote }}
            reason: Completed
            startedAt: {{ $started | Quote }}
      {{ else }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: false
        restartCount: 0
        started: false
        state:
          terminated:
            exitCode: {{ $exitCode }}
            finishedAt: {{ $now | Quote }}
            reason: Error
            message: {{ $message | Quote }}
            startedAt: {{ $started | Quote }}
      {{ end }}
      {{ end }}
      {{ if $podReason }}
      reason: {{ $podReason | Quote }}
      message: {{ $message | Quote }}
      {{ end }}
      phase: Failed
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-delete
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'Exists'
    - key: '.metadata.finalizers'
      operator: 'DoesNotExist'
  next:
    delete: true
""".replace("__POD_IPS__", _POD_IPS.strip("\n"))

def fake_node(name: str, labels: dict | None = None, taints: list | None = None,
              capacity: dict | None = None) -> dict:
    cap = dict(NODE_CAPACITY, **(capacity or {}))
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {FAKE_NODE_ANNOTATION[0]: FAKE_NODE_ANNOTATION[1],
                            "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {"type": "kwok", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                       "kubernetes.io/arch": "amd64", "kubernetes.io/role": "agent",
                       "nvidia.com/gpu.present": "true", **(labels or {})},
        },
        "spec": {"taints": taints or []},
        "status": {"capacity": cap, "allocatable": cap},
    }


# -- the cluster ------------------------------------------------------------------------------


class TestCluster:
    """Loopback Kubernetes + Argo (+ Volcano) with KWOK nodes; a context manager."""

    __test__ = False  # not a pytest test class

    def __init__(self, run_dir: Path, *, nodes: int = 4, volcano: bool = True,
                 argo_server: bool = False, start_timeout_s: float = 180.0,
                 remove_on_stop: bool = True, verbose: bool = True,
                 die_with_parent: bool = True) -> None:
        self.run_dir = Path(run_dir).absolute()
        self.nodes = nodes
        self.volcano = volcano
        self.argo_server = argo_server
        self.start_timeout_s = start_timeout_s
        self.remove_on_stop = remove_on_stop
        self.verbose = verbose
        # SIGKILL each component if this Python process dies without stop() (a killed pytest);
        # the detached `up` command turns it off.
        self.die_with_parent = die_with_parent
        self.pki = self.run_dir / "pki"
        self.kubeconfig = self.run_dir / "kubeconfig"
        self.logs = self.run_dir / "logs"
        self.procs: dict[str, subprocess.Popen] = {}
        self.ports: dict[str, int] = {}
        self.timings: dict[str, float] = {}   # seconds since start() at which each step was done
        self.durations: dict[str, float] = {}  # component: seconds from its spawn to ready
        self._spawned_at: dict[str, float] = {}
        self.errors: dict[str, str] = {}      # optional components that failed, and why
        self.startup_s: float | None = None
        self._t0 = 0.0
        self._created_run_dir = False

    # -- public API ---------------------------------------------------------------------------

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    @property
    def argo_server_url(self) -> str:
        """http URL of `argo server` (auth mode server, no TLS); "" unless argo_server=True."""
        return f"http://127.0.0.1:{self.ports['argo-server']}" if self.argo_server else ""

    @property
    def volcano_ok(self) -> bool:
        return self.volcano and not any(k.startswith("vc-") for k in self.errors)

    def api_client(self):
        """A fresh kubernetes.client.ApiClient for this cluster (admin credentials)."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def dynamic_client(self):
        from kubernetes.dynamic import DynamicClient

        return DynamicClient(self.api_client(),
                             cache_file=str(self.run_dir / f"discovery-{time.time_ns()}.json"))

    def env(self) -> dict[str, str]:
        return {"KUBECONFIG": str(self.kubeconfig)}

    def start(self) -> TestCluster:
        ensure_available(volcano=False)
        if self.argo_server and not os.access(binary("argo"), os.X_OK):
            raise ClusterNotAvailable(f"binary {binary('argo')} missing "
                                      "(run tests/cluster/build.sh argo)")
        if self.run_dir.exists() and any(self.run_dir.iterdir()):
            raise ClusterStartError(f"run_dir {self.run_dir} is not empty; refusing to use it")
        self._created_run_dir = not self.run_dir.exists()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        self._t0 = time.monotonic()
        try:
            self._start()
        except BaseException:
            self._log(f"start failed; logs in {self.logs}")
            self.stop(remove=False)
            raise
        self.startup_s = round(time.monotonic() - self._t0, 3)
        self._save_state()
        self._log(f"cluster up in {self.startup_s:.1f}s; ready at (s since start): "
                  + json.dumps(self.timings) + "; start-to-ready per component (s): "
                  + json.dumps(self.durations))
        if self.errors:
            self._log("optional components failed: " + json.dumps(self.errors))
        return self

    def stop(self, remove: bool | None = None) -> None:
        """Kill every component's process group (SIGKILL: the cluster is throwaway)."""
        names = [n for n in STOP_ORDER if n in self.procs] + [
            n for n in self.procs if n not in STOP_ORDER]
        for n in names:
            _kill_group(self.procs[n].pid)
        for p in self.procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.procs.clear()
        if (self.run_dir / STATE_FILE).exists():
            (self.run_dir / STATE_FILE).unlink()
        if remove is None:
            remove = self.remove_on_stop
        if remove and self._created_run_dir and self.run_dir.exists():
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def __enter__(self) -> TestCluster:  # noqa: PYI034
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def apply(self, docs: list[dict], field_manager: str = "pipectl-test") -> list[dict]:
        """Server-side apply each document (like `kubectl apply --server-side`)."""
        dyn = self.dynamic_client()
        out = []
        for doc in docs:
            res = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
            ns = doc["metadata"].get("namespace") if res.namespaced else None
            if res.namespaced and not ns:
                ns = "default"
            obj = res.server_side_apply(body=doc, name=doc["metadata"]["name"], namespace=ns,
                                        field_manager=field_manager, force_conflicts=True)
            out.append(obj.to_dict())
        return out

    def audit_events(self, name: str | None = None) -> list[dict]:
        """Audit events of writes to gang jobs (tests/cluster/audit-policy.yaml), oldest first;
        only those for the object ``name`` when given. Each: verb, objectRef, responseStatus.code,
        user.username, userAgent, requestReceivedTimestamp."""
        path = self.run_dir / "audit.log"
        events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
        return [e for e in events if name is None or e.get("objectRef", {}).get("name") == name]

    def wait_for(self, what: str, fn, timeout_s: float = 60.0, interval_s: float = 0.2):
        deadline = time.monotonic() + timeout_s
        last: object = None
        while True:
            try:
                v = fn()
                if v:
                    return v
                last = v
            except Exception as e:  # noqa: BLE001 - keep polling, report the last error
                last = e
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not true within {timeout_s}s (last: {last!r})")
            time.sleep(interval_s)

    # -- internals ----------------------------------------------------------------------------

    def _log(self, msg: str) -> None:
        if self.verbose:
            print(f"[cluster +{time.monotonic() - self._t0:6.2f}s] {msg}", file=sys.stderr,
                  flush=True)

    def _mark(self, what: str) -> None:
        now = time.monotonic()
        self.timings[what] = round(now - self._t0, 3)
        if what in self._spawned_at:
            self.durations[what] = round(now - self._spawned_at[what], 3)
            self._log(f"{what} ready ({self.durations[what]:.2f}s after its start)")
        else:
            self._log(f"{what} done")

    def _spawn(self, name: str, argv: list[str], env: dict | None = None) -> subprocess.Popen:
        setpriv = shutil.which("setpriv")  # util-linux; no preexec_fn: we fork beside threads
        if self.die_with_parent and setpriv:
            # Linux SIGKILLs the component when the thread that started it ends (a killed pytest).
            argv = [setpriv, "--pdeathsig", "KILL", "--", *argv]
        with open(self.logs / f"{name}.log", "ab") as log:
            p = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, cwd=self.run_dir,
                env={**os.environ, **(env or {})},
            )
        self.procs[name] = p
        self._spawned_at[name] = time.monotonic()
        self._save_state()
        return p

    def _tail(self, name: str, n: int = 3000) -> str:
        f = self.logs / f"{name}.log"
        return f.read_text(errors="replace")[-n:] if f.exists() else ""

    def _check_alive(self, names=None) -> None:
        for name, p in list(self.procs.items()):
            if names is not None and name not in names:
                continue
            if p.poll() is not None:
                msg = f"{name} exited with rc={p.returncode}; log tail:\n{self._tail(name)}"
                if name in OPTIONAL_COMPONENTS:
                    self.errors.setdefault(name, msg)
                    continue
                raise ClusterStartError(msg)

    def _save_state(self) -> None:
        state = {
            "run_dir": str(self.run_dir),
            "kubeconfig": str(self.kubeconfig),
            "server": self.server if "apiserver" in self.ports else "",
            "argo_server_url": self.argo_server_url if self.ports else "",
            "pgids": {n: p.pid for n, p in self.procs.items()},
            "timings": self.timings,
            "durations": self.durations,
            "errors": self.errors,
            "startup_s": self.startup_s,
        }
        tmp = self.run_dir / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.run_dir / STATE_FILE)

    def _write_kubeconfig(self) -> None:
        import yaml

        kc = {
            "apiVersion": "v1", "kind": "Config", "current-context": "pipectl-test",
            "clusters": [{"name": "pipectl-test", "cluster": {
                "server": self.server, "certificate-authority": str(self.pki / "ca.crt")}}],
            "users": [{"name": "admin", "user": {
                "client-certificate": str(self.pki / "admin.crt"),
                "client-key": str(self.pki / "admin.key")}}],
            "contexts": [{"name": "pipectl-test", "context": {
                "cluster": "pipectl-test", "user": "admin", "namespace": "default"}}],
        }
        self.kubeconfig.write_text(yaml.safe_dump(kc))

    def _wait(self, what: str, fn, timeout_s: float | None = None, procs=None) -> None:
        deadline = time.monotonic() + (timeout_s or self.start_timeout_s)
        last: object = None
        while True:
            self._check_alive(procs)
            try:
                if fn():
                    return
            except Exception as e:  # noqa: BLE001
                last = e
            if time.monotonic() > deadline:
                raise ClusterStartError(f"{what} not ready within {timeout_s or self.start_timeout_s}s"
                                        f" (last error: {last!r}); logs in {self.logs}")
            time.sleep(0.1)

    def _start(self) -> None:
        names = ["etcd", "etcd-peer", "apiserver", "argo-metrics", "argo-server", "vc-sched-http",
                 "vc-sched-healthz", "vc-cm-healthz"]
        self.ports = dict(zip(names, _free_ports(len(names))))
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(1) as bg:
            self._crd_future = bg.submit(self._crd_bodies)
            self._start_inner()

    def _crd_bodies(self) -> list[tuple[str, str, bytes]]:
        out = []
        for m in ["kwok", "argo"] + (["volcano"] if self.volcano else []):
            for f in crd_files(m):
                for doc in _load_yaml_docs(f):
                    if doc.get("kind") == "CustomResourceDefinition":
                        out.append((doc["metadata"]["name"], str(f),
                                    json.dumps(doc, separators=(",", ":")).encode()))
        return out

    def _https_request(self, method: str, path: str, body: bytes | None = None,
                       timeout: float = 10.0) -> tuple[int, str]:
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        req = urllib.request.Request(self.server + path, data=body, method=method,
                                     headers={"Content-Type": "application/json"} if body else {})
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=ctx) as resp:
                return resp.status, resp.read().decode(errors="replace")
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")

    def _start_inner(self) -> None:
        r = self.run_dir
        _write_pki(self.pki)
        self._write_kubeconfig()
        self._mark("certificates")

        # etcd
        ep, pp = self.ports["etcd"], self.ports["etcd-peer"]
        self._spawn("etcd", [
            str(binary("etcd")), "--name", "default", "--data-dir", str(r / "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{ep}",
            "--advertise-client-urls", f"http://127.0.0.1:{ep}",
            "--listen-peer-urls", f"http://127.0.0.1:{pp}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{pp}",
            "--initial-cluster", f"default=http://127.0.0.1:{pp}",
            "--unsafe-no-fsync", "--quota-backend-bytes", str(4 << 30),
            "--log-level", "warn",
        ])

        def etcd_ok():
            with urllib.request.urlopen(f"http://127.0.0.1:{ep}/health", timeout=2) as resp:
                return json.loads(resp.read()).get("health") == "true"
        self._wait("etcd", etcd_ok)
        self._mark("etcd")

        # kube-apiserver
        pki = self.pki
        self._spawn("kube-apiserver", [
            str(binary("kube-apiserver")),
            "--etcd-servers", f"http://127.0.0.1:{ep}",
            "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
            "--secure-port", str(self.ports["apiserver"]),
            "--endpoint-reconciler-type", "none",
            "--cert-dir", str(pki),
            "--tls-cert-file", str(pki / "apiserver.crt"),
            "--tls-private-key-file", str(pki / "apiserver.key"),
            "--client-ca-file", str(pki / "ca.crt"),
            "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
            "--service-account-key-file", str(pki / "sa.pub"),
            "--service-account-signing-key-file", str(pki / "sa.key"),
            "--service-cluster-ip-range", SERVICE_CIDR,
            "--authorization-mode", "Node,RBAC",
            "--allow-privileged=true",
            "--profiling=false",
            # as kubeadm: reach kubelets (logs, exec) by IP; a real node's name needs no DNS
            "--kubelet-preferred-address-types", "InternalIP,ExternalIP,Hostname",
            # every write to a gang job, kept with the run (audit_events)
            "--audit-policy-file", str(AUDIT_POLICY), "--audit-log-path", str(r / "audit.log"),
            "--audit-log-mode", "blocking",
        ])
        self._wait("kube-apiserver /readyz", lambda: self._https_request("GET", "/readyz")[0] == 200)
        self._mark("kube-apiserver")

        kc = str(self.kubeconfig)
        self._spawn("kube-controller-manager", [
            str(binary("kube-controller-manager")), "--kubeconfig", kc,
            "--bind-address", "127.0.0.1", "--secure-port", "0",
            "--leader-elect=true",
            "--controllers", ("*,-cloud-node-lifecycle-controller,-service-lb-controller,"
                              "-node-route-controller,-node-ipam-controller"),
            "--service-account-private-key-file", str(pki / "sa.key"),
            "--root-ca-file", str(pki / "ca.crt"),
            "--cluster-signing-cert-file", str(pki / "ca.crt"),
            "--cluster-signing-key-file", str(pki / "ca.key"),
            "--use-service-account-credentials=false",
            "--concurrent-gc-syncs", "5",
        ])
        self._spawn("kube-scheduler", [
            str(binary("kube-scheduler")), "--kubeconfig", kc,
            "--bind-address", "127.0.0.1", "--secure-port", "0", "--leader-elect=true",
        ])

        from kubernetes import client

        api = self.api_client()
        core = client.CoreV1Api(api)
        ext = client.ApiextensionsV1Api(api)
        coord = client.CoordinationV1Api(api)
        custom = client.CustomObjectsApi(api)

        # CRDs: KWOK Stage, Argo (full schemas), Volcano (v1 bases + jobflow). Parsed while etcd
        # and the API server start; POSTed as raw JSON in parallel (the Python client's recursive
        # serialisation of Argo's 2.5 MB schemas costs seconds).
        crds = self._crd_future.result()
        crd_names = [n for n, _, _ in crds]

        def post_crd(item):
            name, src, body = item
            status, text = self._https_request("POST", "/apis/apiextensions.k8s.io/v1/"
                                               "customresourcedefinitions", body, timeout=60)
            if status not in (201, 409):
                raise ClusterStartError(f"CRD {name} from {src} rejected: {status} {text[:2000]}")

        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(post_crd, sorted(crds, key=lambda c: -len(c[2]))))
        self._mark("crds-created")

        def lease_held(ns, name):
            def f():
                lease = coord.read_namespaced_lease(name, ns)
                return bool(lease.spec.holder_identity)
            return f

        # polled while the CRDs settle, so their start-to-ready times are measured, not hidden
        early = {"kube-controller-manager": lease_held("kube-system", "kube-controller-manager"),
                 "kube-scheduler": lease_held("kube-system", "kube-scheduler")}

        def poll_early():
            for name in list(early):
                try:
                    if early[name]():
                        del early[name]
                        self._mark(name)
                except Exception:  # noqa: BLE001, S110 - not yet; the final wait reports it
                    pass

        def crds_established():
            poll_early()
            for n in crd_names:
                c = ext.read_custom_resource_definition(n)
                conds = {x.type: x.status for x in (c.status.conditions or [])}
                if conds.get("Established") != "True":
                    return False
            return True
        self._wait("CRDs established", crds_established)
        self._mark("crds")

        for ns in ["argo"] + (["volcano-system"] if self.volcano else []):
            try:
                core.create_namespace({"metadata": {"name": ns}})
            except client.ApiException as e:
                if e.status != 409:
                    raise
        mport = self.ports["argo-metrics"]
        from pipectl.pipelines.manifests import controller_config
        from pipectl.pipelines.training import CompileConfig

        core.create_namespaced_config_map("argo", {
            "metadata": {"name": "workflow-controller-configmap", "namespace": "argo"},
            "data": {
                "metricsConfig": f"enabled: true\nport: {mport}\n",
                "telemetryConfig": f"enabled: false\nport: {mport}\n",
                # the product's executor settings (requests; restricted securityContext: the
                # pipectl namespace enforces the restricted Pod Security Standard)
                "executor": controller_config(CompileConfig())[0]["data"]["executor"],
            },
        })

        # KWOK stages and fake nodes first, so KWOK finds them on its first list.
        for doc in _load_yaml_docs(module_dir("kwok") / "kustomize/stage/node/fast/node-initialize.yaml"):
            custom.create_cluster_custom_object("kwok.x-k8s.io", "v1alpha1", "stages", doc)
        import yaml

        for text in (NODE_HEARTBEAT_STAGE, POD_STAGES):
            for doc in yaml.safe_load_all(text):
                custom.create_cluster_custom_object("kwok.x-k8s.io", "v1alpha1", "stages", doc)
        for i in range(self.nodes):
            core.create_node(fake_node(f"kwok-node-{i}"))
        self._spawn("kwok", [
            str(binary("kwok")), "--kubeconfig", kc, "-c", str(self._write_kwok_config()),
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={FAKE_NODE_ANNOTATION[0]}={FAKE_NODE_ANNOTATION[1]}",
            "--enable-crds=Stage", "--cidr", POD_CIDR, "--node-ip", "10.255.0.1",
        ])
        self._spawn("workflow-controller", [
            str(binary("workflow-controller")), "--kubeconfig", kc, "--namespace", "argo",
            "--executor-image", EXECUTOR_IMAGE, "--executor-image-pull-policy", "Never",
            "--configmap", "workflow-controller-configmap", "--loglevel", "info",
        ], env={"LEADER_ELECTION_IDENTITY": f"{socket.gethostname()}-{os.getpid()}",
                # as Argo's own `make start` for tests: re-check workflows every 1 s, not 10 s
                "DEFAULT_REQUEUE_TIME": os.environ.get("PIPECTL_ARGO_REQUEUE_TIME", "1s")})
        if self.argo_server:
            # `argo server` has no bind-address flag: it listens on all interfaces.
            self._spawn("argo-server", [
                str(binary("argo")), "server", "--kubeconfig", kc, "--namespace", "argo",
                "--auth-mode", "server", "--secure=false", "--port", str(self.ports["argo-server"]),
                "--loglevel", "info",
            ])
        self._spawn("argoexec-stand-in", [sys.executable, str(Path(__file__).absolute()),
                                          "taskresults", kc])
        if self.volcano:
            conf = r / "volcano-scheduler.conf"
            # the configuration the project ships (argo/volcano/volcano-scheduler-configmap.yaml)
            from pipectl.pipelines.manifests import volcano_scheduler_config

            conf.write_text(volcano_scheduler_config()[0]["data"]["volcano-scheduler.conf"])
            for c in OPTIONAL_COMPONENTS:
                if not os.access(binary(c), os.X_OK):
                    self.errors[c] = f"binary {binary(c)} missing"
            if "vc-scheduler" not in self.errors:
                self._spawn("vc-scheduler", [
                    str(binary("vc-scheduler")), "--kubeconfig", kc, "--scheduler-conf", str(conf),
                    "--scheduler-name", "volcano", "--leader-elect=false",
                    "--listen-address", f"127.0.0.1:{self.ports['vc-sched-http']}",
                    "--healthz-address", f"127.0.0.1:{self.ports['vc-sched-healthz']}",
                    "--default-queue", "default", "--cache-dumper=false", "--logtostderr",
                ])
            if "vc-controller-manager" not in self.errors:
                self._spawn("vc-controller-manager", [
                    str(binary("vc-controller-manager")), "--kubeconfig", kc,
                    "--leader-elect=true", "--leader-elect-resource-namespace", "volcano-system",
                    "--healthz-address", f"127.0.0.1:{self.ports['vc-cm-healthz']}",
                    "--scheduler-name", "volcano", "--logtostderr",
                ])

        # Readiness of everything, each marked when it first becomes true.
        def nodes_ready():
            nodes = core.list_node(label_selector="type=kwok").items
            ok = [n for n in nodes if any(c.type == "Ready" and c.status == "True"
                                          for c in (n.status.conditions or []))
                  and not any(t.key.startswith("node.kubernetes.io/") for t in (n.spec.taints or []))]
            return len(ok) == self.nodes

        def default_sa():
            core.read_namespaced_service_account("default", "default")
            core.read_namespaced_service_account("default", "argo")
            return True

        def default_queue():
            custom.get_cluster_custom_object("scheduling.volcano.sh", "v1beta1", "queues", "default")
            return True

        checks = {
            **early,
            "serviceaccounts": default_sa,
            "workflow-controller": lease_held("argo", "workflow-controller"),
            "kwok": nodes_ready,  # fake nodes Ready and untainted
        }
        if self.argo_server:
            def argo_server_ok():
                url = self.argo_server_url + "/api/v1/version"
                with urllib.request.urlopen(url, timeout=2) as resp:
                    return resp.status == 200
            checks["argo-server"] = argo_server_ok
        if self.volcano:
            if "vc-scheduler" not in self.errors:
                checks["vc-scheduler"] = default_queue
            if "vc-controller-manager" not in self.errors:
                checks["vc-controller-manager"] = lease_held("volcano-system",
                                                             "vc-controller-manager")
        pending = dict(checks)
        deadline = time.monotonic() + self.start_timeout_s
        last: dict[str, object] = {}
        while pending:
            self._check_alive()
            for name in list(pending):
                if name in self.errors:  # optional component died
                    del pending[name]
                    continue
                try:
                    if pending[name]():
                        del pending[name]
                        self._mark(name)
                except Exception as e:  # noqa: BLE001
                    last[name] = e
            if not pending:
                break
            if time.monotonic() > deadline:
                required = [n for n in pending if not n.startswith("vc-")]
                for n in pending:
                    if n.startswith("vc-"):
                        self.errors[n] = f"not ready within {self.start_timeout_s}s " \
                                         f"(last: {last.get(n)!r}); log tail:\n{self._tail(n)}"
                if required:
                    what = ", ".join(f"{n} (last: {last.get(n)!r})" for n in required)
                    raise ClusterStartError(f"not ready within {self.start_timeout_s}s: {what}; "
                                            f"logs in {self.logs}")
                break
            time.sleep(0.2)
        api.close()

    def _write_kwok_config(self) -> Path:
        p = self.run_dir / "kwok.yaml"
        # Every option spelled out: kwok v0.8 leaves options missing from a config file at zero
        # (parallelism 0 makes its controllers refuse to start).
        p.write_text(f"""\
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  cidr: {POD_CIDR}
  nodeIP: 10.255.0.1
  manageAllNodes: false
  manageNodesWithAnnotationSelector: {FAKE_NODE_ANNOTATION[0]}={FAKE_NODE_ANNOTATION[1]}
  enableCRDs: [Stage]
  podPlayStageParallelism: 8
  nodePlayStageParallelism: 4
  nodeLeaseParallelism: 4
  podsOnNodeSyncParallelism: 2
  enablePodsOnNodeSyncListPager: true
  enablePodsOnNodeSyncStreamWatch: false
  enableDebuggingHandlers: false
  enableProfilingHandler: false
  enableContentionProfiling: false
""")
        return p


# -- argoexec stand-in: report WorkflowTaskResults for pods KWOK ended ---------------------------

WF_LABEL = "workflows.argoproj.io/workflow"
NODE_ID_ANNOTATION = "workflows.argoproj.io/node-id"
COMPLETED_LABEL = "workflows.argoproj.io/report-outputs-completed"


TEST_OUTPUTS_CONFIGMAP = "pipectl-test-outputs"


def _argo_template(pod) -> dict:
    """The template Argo gave this pod (env ARGO_TEMPLATE of its containers), or {}."""
    for c in list(pod.spec.containers or []) + list(pod.spec.init_containers or []):
        for e in c.env or []:
            if e.name == "ARGO_TEMPLATE" and e.value:
                return json.loads(e.value)
    return {}


def _is_resource_pod(pod) -> bool:
    """True for the pod of a resource template: ``... emissary -- argoexec resource <action>`` in
    its main container (with archiveLogs a wait container comes first)."""
    for c in pod.spec.containers or []:
        cmd = c.command or []
        if any(cmd[i:i + 2] == ["argoexec", "resource"] for i in range(len(cmd))):
            return True
    return False


def _pod_templates(obj: dict) -> list[dict]:
    """Pod templates inside a Volcano Job / PyTorchJob / batch Job manifest."""
    spec = obj.get("spec", {})
    if "tasks" in spec:
        return [t["template"] for t in spec["tasks"]]
    if "pytorchReplicaSpecs" in spec:
        return [r["template"] for r in spec["pytorchReplicaSpecs"].values()]
    return [spec["template"]] if "template" in spec else []


def run_taskresult_reporter(kubeconfig: str) -> None:
    """Do what Argo's executor (argoexec) would do for pods on KWOK nodes, which run nothing:

    * container templates: when KWOK ends the pod, create the node's WorkflowTaskResult labelled
      report-outputs-completed=true, as argoexec's `wait` container does. Output parameters are
      those the TEST supplies in the ConfigMap ``pipectl-test-outputs`` of the pod's namespace
      (key: template name, value: JSON object parameter -> value); only parameters the template
      declares are reported, so a template whose outputs the test does not supply stays without
      them (and Argo fails the dependent substitution, as it would for a real step).
      Key ``<template>.pod-annotations`` (JSON object) adds annotations to the pods of the
      resource a resource template creates: KWOK's directions (``pipectl.io/run-duration``,
      ``pipectl.io/fail``...), nothing the scheduler or Volcano reads.
    * resource templates (`argoexec resource create`): create the manifest Argo put in the
      template (owner reference included), then evaluate the template's successCondition /
      failureCondition on the live object with argoexec's own condition code (tests/tools/argoexpr,
      built from the Argo module) every 0.5 s, and end the pod as argoexec would: exit 0, or exit 1
      with the reason as termination message. Pods annotated ``pipectl.io/fail`` are left to KWOK.

    Runs forever (a component of TestCluster)."""
    import threading

    from kubernetes import client, config, dynamic, watch

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.tools.argo import ArgoExpr

    api = config.new_client_from_config(config_file=kubeconfig)
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    dyn = dynamic.DynamicClient(api)
    argoexpr = ArgoExpr()
    done: set[tuple[str, str]] = set()
    # (namespace, pod name, pod uid) -> {"api": resource api, "name": object name, "tmpl": template}
    running: dict[tuple[str, str], dict] = {}
    lock = threading.Lock()

    def supplied_outputs(pod, tmpl: dict) -> dict:
        declared = [x["name"] for x in (tmpl.get("outputs") or {}).get("parameters", [])]
        if not declared:
            return {}
        try:
            cm = core.read_namespaced_config_map(TEST_OUTPUTS_CONFIGMAP, pod.metadata.namespace)
        except client.ApiException:
            return {}
        values = json.loads((cm.data or {}).get(tmpl.get("name", ""), "{}"))
        params = [{"name": n, "value": str(values[n])} for n in declared if n in values]
        return {"parameters": params} if params else {}

    def test_pod_annotations(pod, tmpl: dict) -> dict:
        try:
            cm = core.read_namespaced_config_map(TEST_OUTPUTS_CONFIGMAP, pod.metadata.namespace)
        except client.ApiException:
            return {}
        return json.loads((cm.data or {}).get(tmpl.get("name", "") + ".pod-annotations", "{}"))

    def write_result(pod, outputs: dict) -> None:
        ann = pod.metadata.annotations or {}
        node_id = ann[NODE_ID_ANNOTATION]
        wf = pod.metadata.labels[WF_LABEL]
        owner = next((o for o in (pod.metadata.owner_references or []) if o.kind == "Workflow"), None)
        body = {
            "apiVersion": "argoproj.io/v1alpha1", "kind": "WorkflowTaskResult",
            "metadata": {"name": node_id, "namespace": pod.metadata.namespace,
                         "labels": {WF_LABEL: wf, COMPLETED_LABEL: "true"}},
            "outputs": outputs,
        }
        if owner is not None:
            body["metadata"]["ownerReferences"] = [{"apiVersion": "argoproj.io/v1alpha1",
                                                    "kind": "Workflow", "name": owner.name,
                                                    "uid": owner.uid}]
        try:
            custom.create_namespaced_custom_object("argoproj.io", "v1alpha1",
                                                   pod.metadata.namespace, "workflowtaskresults",
                                                   body)
        except client.ApiException as e:
            if e.status != 409:
                raise
            custom.patch_namespaced_custom_object(
                "argoproj.io", "v1alpha1", pod.metadata.namespace, "workflowtaskresults", node_id,
                {"metadata": {"labels": {COMPLETED_LABEL: "true"}}, "outputs": outputs})

    def report(pod) -> None:
        ann = pod.metadata.annotations or {}
        if not ann.get(NODE_ID_ANNOTATION) or not (pod.metadata.labels or {}).get(WF_LABEL):
            return
        key = (pod.metadata.namespace, pod.metadata.name, pod.metadata.uid)
        if key in done:
            return
        if (_is_resource_pod(pod) and "pipectl.io/fail" not in ann
                and pod.status.phase == "Running"):
            with lock:
                if key not in running:
                    start_resource(pod)
            return
        if pod.status.phase not in ("Succeeded", "Failed"):
            return
        tmpl = _argo_template(pod)
        outputs = supplied_outputs(pod, tmpl) if pod.status.phase == "Succeeded" else {}
        try:
            write_result(pod, outputs)
        except client.ApiException as e:
            print(f"taskresult {key}: {e.status} {e.body}", flush=True)
            return
        done.add(key)
        print(f"reported {key} ({pod.status.phase}) outputs={outputs}", flush=True)

    def start_resource(pod) -> None:
        key = (pod.metadata.namespace, pod.metadata.name, pod.metadata.uid)
        tmpl = _argo_template(pod)
        res = tmpl.get("resource") or {}
        import yaml

        obj = yaml.safe_load(res.get("manifest", "")) or {}
        ns = obj.get("metadata", {}).get("namespace") or pod.metadata.namespace
        extra = test_pod_annotations(pod, tmpl)
        if extra:  # KWOK directions only (run time, simulated failure): the manifest is Argo's
            for t in _pod_templates(obj):
                t.setdefault("metadata", {}).setdefault("annotations", {}).update(extra)
        try:
            action = res.get("action")
            if action not in ("create", "apply"):
                raise ValueError(f"stand-in supports actions create and apply only, not {action!r}")
            rapi = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
            flags = res.get("flags") or []
            if action == "apply" and "--server-side" in flags:
                # `kubectl apply --server-side`: one PATCH that creates or re-applies (as kubectl)
                manager = next((f.split("=", 1)[1] for f in flags if f.startswith("--field-manager=")), "kubectl")
                rapi.server_side_apply(body=obj, namespace=ns, field_manager=manager,
                                       force_conflicts="--force-conflicts" in flags)
            else:
                try:
                    rapi.create(body=obj, namespace=ns)
                except Exception as e:  # noqa: BLE001
                    # client-side `kubectl apply` of the same manifest onto the object that exists
                    # changes nothing and waits for it; `kubectl create` fails with AlreadyExists.
                    if action != "apply" or getattr(e, "status", None) != 409:
                        raise
        except Exception as e:  # noqa: BLE001 - argoexec fails the step the same way
            reason = getattr(e, "reason", "") or type(e).__name__
            finish(pod, 1, f"{reason}: {getattr(e, 'body', '') or e}"[:500])
            return
        running[key] = {"api": rapi, "name": obj["metadata"]["name"], "ns": ns, "tmpl": tmpl,
                        "pod": pod}
        print(f"resource {key}: created {obj['kind']} {ns}/{obj['metadata']['name']}", flush=True)

    def finish(pod, exit_code: int, message: str) -> None:
        key = (pod.metadata.namespace, pod.metadata.name, pod.metadata.uid)
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        started = pod.status.start_time.strftime("%Y-%m-%dT%H:%M:%SZ") if pod.status.start_time else now
        term = {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error",
                "startedAt": started, "finishedAt": now}
        if message:
            term["message"] = message
        phase = "Succeeded" if exit_code == 0 else "Failed"
        try:
            write_result(pod, {})
            core.patch_namespaced_pod_status(pod.metadata.name, pod.metadata.namespace, {"status": {
                "phase": phase,
                "containerStatuses": [{"name": c.name, "image": c.image, "ready": False,
                                       "restartCount": 0, "state": {"terminated": term}}
                                      for c in pod.spec.containers]}})
        except client.ApiException as e:
            if e.status != 404:
                print(f"finish {key}: {e.status} {e.body}", flush=True)
                return
        done.add(key)
        running.pop(key, None)
        print(f"resource {key}: {phase} {message}", flush=True)

    def poll_resources() -> None:
        while True:
            time.sleep(0.5)
            with lock:
                items = list(running.items())
            for key, r in items:
                try:
                    try:
                        if core.read_namespaced_pod(key[1], key[0]).metadata.uid != key[2]:
                            raise client.ApiException(status=404)
                    except client.ApiException as e:
                        if e.status == 404:  # the pod went away: stop, as argoexec would
                            running.pop(key, None)
                            done.add(key)
                            continue
                        raise
                    try:
                        obj = r["api"].get(name=r["name"], namespace=r["ns"]).to_dict()
                    except client.ApiException as e:
                        if e.status != 404:
                            raise
                        with lock:
                            finish(r["pod"], 1, f"{r['name']} was deleted")
                        continue
                    res = r["tmpl"]["resource"]
                    state = argoexpr.resource_state(res.get("successCondition", ""),
                                                    res.get("failureCondition", ""), obj)
                    if state == "succeeded":
                        with lock:
                            finish(r["pod"], 0, "")
                    elif state == "failed":
                        with lock:
                            finish(r["pod"], 1, f"{obj['kind']} {r['name']} failed condition "
                                                f"{res.get('failureCondition')!r}")
                except Exception as e:  # noqa: BLE001 - keep polling the others
                    print(f"poll {key}: {e!r}", flush=True)

    threading.Thread(target=poll_resources, daemon=True).start()

    while True:
        try:
            pods = core.list_pod_for_all_namespaces(label_selector=WF_LABEL)
            for p in pods.items:
                report(p)
            w = watch.Watch()
            for ev in w.stream(core.list_pod_for_all_namespaces, label_selector=WF_LABEL,
                               resource_version=pods.metadata.resource_version,
                               timeout_seconds=300):
                if ev["type"] in ("ADDED", "MODIFIED"):
                    report(ev["object"])
        except Exception as e:  # noqa: BLE001 - API restarts, expired resource versions
            print(f"watch error: {e!r}", flush=True)
            time.sleep(1)


# -- command line -----------------------------------------------------------------------------


def _state(run_dir: Path) -> dict | None:
    p = run_dir / STATE_FILE
    return json.loads(p.read_text()) if p.exists() else None


def _group_alive(pgid: int, run_dir: Path) -> bool:
    try:
        cmdline = Path(f"/proc/{pgid}/cmdline").read_bytes()
    except OSError:
        return False
    return str(run_dir).encode() in cmdline


def _cli_down(run_dir: Path) -> int:
    run_dir = run_dir.absolute()
    st = _state(run_dir)
    if st is None:
        print(f"no {STATE_FILE} in {run_dir}: nothing running", file=sys.stderr)
        if run_dir.exists():
            shutil.rmtree(run_dir, ignore_errors=True)
        return 0
    pgids = st.get("pgids", {})
    for name in STOP_ORDER + [n for n in pgids if n not in STOP_ORDER]:
        pgid = pgids.get(name)
        if pgid and _group_alive(pgid, run_dir):
            _kill_group(pgid)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(
            _group_alive(p, run_dir) for p in pgids.values()):
        time.sleep(0.05)
    shutil.rmtree(run_dir, ignore_errors=True)
    print(f"cluster in {run_dir} stopped", file=sys.stderr)
    return 0


def _print_exports(st: dict) -> None:
    print(f"export KUBECONFIG={st['kubeconfig']}")
    print(f"export PIPECTL_CLUSTER_DIR={st['run_dir']}")
    print(f"export PIPECTL_CLUSTER_SERVER={st['server']}")
    if st.get("argo_server_url"):
        print(f"export ARGO_SERVER={st['argo_server_url'].split('://', 1)[1]}")
        # auth mode server ignores the token, but the argo CLI refuses to run without one
        print("export ARGO_SECURE=false ARGO_HTTP1=true ARGO_TOKEN='Bearer unused'")


def _cli_up(run_dir: Path, nodes: int, volcano: bool, argo_server: bool) -> int:
    run_dir = run_dir.absolute()
    st = _state(run_dir)
    if st is not None:
        alive = [n for n, p in st["pgids"].items() if _group_alive(p, run_dir)]
        dead = [n for n in st["pgids"] if n not in alive and n not in st.get("errors", {})]
        if not dead and st.get("startup_s"):
            print(f"cluster already running in {run_dir} ({', '.join(sorted(alive))})",
                  file=sys.stderr)
            _print_exports(st)
            return 0
        print(f"stale cluster in {run_dir} (not running: {', '.join(dead)}): restarting it",
              file=sys.stderr)
        _cli_down(run_dir)
    elif run_dir.exists() and any(run_dir.iterdir()):
        print(f"{run_dir} exists and holds no cluster state: removing it", file=sys.stderr)
        shutil.rmtree(run_dir)
    c = TestCluster(run_dir, nodes=nodes, volcano=volcano, argo_server=argo_server,
                    remove_on_stop=False, die_with_parent=False)
    c.start()
    c.procs.clear()  # detach: `down` finds the process groups through cluster.json
    st = _state(run_dir)
    _print_exports(st)
    print(f"# cluster up in {c.startup_s:.1f}s; ready at (s since start): "
          f"{json.dumps(c.timings)}; start-to-ready (s): {json.dumps(c.durations)}",
          file=sys.stderr)
    if c.errors:
        print("# optional components failed: " + json.dumps(c.errors)[:4000], file=sys.stderr)
    return 0


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="cluster.py")
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up")
    up.add_argument("run_dir", type=Path)
    up.add_argument("--nodes", type=int, default=4)
    up.add_argument("--no-volcano", action="store_true")
    up.add_argument("--argo-server", action="store_true")
    down = sub.add_parser("down")
    down.add_argument("run_dir", type=Path)
    sub.add_parser("check")
    tr = sub.add_parser("taskresults")
    tr.add_argument("kubeconfig")
    a = ap.parse_args(argv)
    if a.cmd == "up":
        return _cli_up(a.run_dir, a.nodes, not a.no_volcano, a.argo_server)
    if a.cmd == "down":
        return _cli_down(a.run_dir)
    if a.cmd == "taskresults":
        run_taskresult_reporter(a.kubeconfig)
        return 0
    m = missing()
    for x in m:
        print("missing:", x, file=sys.stderr)
    return 1 if m else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
