"""A real Kubernetes control plane with Argo Workflows and Volcano on 127.0.0.1, pods by KWOK.

Upstream binaries only (binaries.py; built by tests/cluster/build.sh):

  etcd                      data in run_dir/etcd, --unsafe-no-fsync (throwaway)
  kube-apiserver            TLS + client-certificate auth (pki.py), ECDSA service-account signing
                            key, RBAC, default admission plugins, audit log of gang-job writes
                            (tests/cluster/audit-policy.yaml)
  kube-controller-manager   every default controller except the cloud ones (ServiceAccounts,
                            namespaces, GC, node lifecycle, ...)
  kube-scheduler            the default scheduler
  kwok                      fake nodes and pod lifecycles, driven by Stage objects read from the
                            API server (kwok.py, manifests/kwok-*.yaml)
  workflow-controller       Argo, off-cluster, namespace argo, executor image pull policy Never,
                            DEFAULT_REQUEUE_TIME=1s (as Argo's own test setup; env
                            PIPECTL_ARGO_REQUEUE_TIME overrides); manifests/workflow-controller-configmap.yaml
  argo server               only with argo_server=True: auth mode server, plain http
  vc-scheduler              Volcano scheduler (optional: its failure is recorded, not fatal), /metrics
                            on the ``vc-sched-http`` port
  vc-controller-manager     Volcano controllers (optional, same)
  karpenter                 only with autoscaler=True: Karpenter with its KWOK cloud provider
                            (karpenter.py); NodeClaims become KWOK nodes after
                            ``node_registration_delay_s``. The test applies the NodePools.
  argoexec-stand-in         argoexec.py: writes each ended pod's WorkflowTaskResult and runs
                            resource templates, as Argo's executor would for pods that never run

Every component authenticates with the one admin client certificate (group system:masters).
Volcano's admission webhook (vc-webhook-manager) is not run: Volcano Jobs must set what it would
default (queue, minAvailable, schedulerName). Components are started through ``setpriv
--pdeathsig KILL`` so that they die with the Python process that started them (not for ``up``).
Processes are started and stopped by components.py on the product's process supervisor.

Usage::

    from tests.harness.controlplane import TestCluster
    with TestCluster(tmp_path / "k8s") as c:
        api = c.api_client()            # kubernetes.client.ApiClient (admin, system:masters)
        print(c.kubeconfig, c.timings)  # timings: s since start at which each step was ready;
        print(c.durations, c.errors)    # durations: s from a component's spawn to ready
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
import types
import urllib.error
import urllib.request
from pathlib import Path

from tests.harness import karpenter, kwok
from tests.harness.binaries import (OPTIONAL_COMPONENTS, VERSIONS, ClusterNotAvailable, binary, crd_files,
                                    ensure_available, load_yaml_docs)
from tests.harness.components import Components
from tests.harness.pki import write_kubeconfig, write_pki
from pipectl.pipelines.backends.processes import ProcessError, free_ports, http_ok

AUDIT_POLICY = Path(__file__).resolve().parents[1] / "cluster" / "audit-policy.yaml"
ARGOEXEC_STAND_IN = Path(__file__).resolve().parent / "argoexec.py"
CONTROLLER_CONFIGMAP = kwok.MANIFESTS / "workflow-controller-configmap.yaml"
STOP_ORDER = ["karpenter", "argoexec-stand-in", "argo-server", "workflow-controller", "vc-controller-manager", "vc-scheduler",
              "kwok", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"]
STATE_FILE = "cluster.json"
EXECUTOR_IMAGE = "quay.io/argoproj/argoexec:" + VERSIONS["workflow-controller"]
SERVICE_CIDR = "10.96.0.0/16"
PORT_NAMES = ["etcd", "etcd-peer", "apiserver", "argo-metrics", "argo-server", "vc-sched-http",
              "vc-sched-healthz", "vc-cm-healthz", "karpenter-metrics", "karpenter-health"]


class ClusterStartError(ProcessError):
    """A required component exited or did not become ready in time (the message says which)."""


class TestCluster:
    """Loopback Kubernetes + Argo (+ Volcano) with KWOK nodes; a context manager."""

    __test__ = False  # not a pytest test class

    def __init__(self, run_dir: Path, *, nodes: int = 4, volcano: bool = True,
                 argo_server: bool = False, argo_links: str | None = None, start_timeout_s: float = 180.0,
                 remove_on_stop: bool = True, verbose: bool = True,
                 die_with_parent: bool = True, autoscaler: bool = False,
                 node_registration_delay_s: int = 5, node_heartbeat_s: float | None = None) -> None:
        self.run_dir = Path(run_dir).absolute()
        self.nodes = nodes
        self.node_heartbeat_s = node_heartbeat_s  # None: manifests/kwok-node-heartbeat.yaml's 10-15 s
        self.volcano = volcano
        self.argo_server = argo_server
        self.argo_links = argo_links  # the controller config's `links` (YAML); None: the product's
        self.autoscaler = autoscaler
        self.node_registration_delay_s = node_registration_delay_s
        self.start_timeout_s = start_timeout_s
        self.remove_on_stop = remove_on_stop
        self.verbose = verbose
        self.pki = self.run_dir / "pki"
        self.kubeconfig = self.run_dir / "kubeconfig"
        self.logs = self.run_dir / "logs"
        # SIGKILL each component if this Python process dies without stop() (a killed pytest);
        # the detached `up` command turns it off.
        self.components = Components(self.logs, cwd=self.run_dir, die_with_parent=die_with_parent,
                                     on_change=self._save_state)
        self.ports: dict[str, int] = {}
        self.timings: dict[str, float] = {}   # seconds since start() at which each step was done
        self.durations: dict[str, float] = {}  # component: seconds from its spawn to ready
        self._spawned_at: dict[str, float] = {}
        self.errors: dict[str, str] = {}      # optional components that failed, and why
        self.startup_s: float | None = None
        self._t0 = 0.0
        self._created_run_dir = False
        self._early: dict[str, object] = {}

    # -- public API ---------------------------------------------------------------------------

    @property
    def procs(self) -> dict[str, subprocess.Popen]:
        """Running components: name -> process (its pid is its process group id)."""
        return self.components.procs

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
        """Bring every component up (see the module docstring); returns self. Raises
        ClusterNotAvailable (a binary or CRD missing) or ClusterStartError; stops what it started."""
        ensure_available(volcano=False)
        if self.autoscaler:
            ensure_available(volcano=False, autoscaler=True)
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
        """Kill every component with its process tree (SIGKILL: the cluster is throwaway)."""
        self.components.stop_all(STOP_ORDER)
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
        """Poll ``fn()`` until it returns something true and return that; TimeoutError after
        ``timeout_s`` seconds naming ``what`` and the last value or error."""
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

    # -- bookkeeping --------------------------------------------------------------------------

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
        self._spawned_at[name] = time.monotonic()
        return self.components.start(name, argv, env)

    def _required(self) -> list[str]:
        return [n for n in self.procs if n not in OPTIONAL_COMPONENTS]

    def _record_optional_exits(self) -> None:
        """An optional component (Volcano) that exited is recorded in ``errors``, not raised."""
        for name in self.components.exited(OPTIONAL_COMPONENTS):
            self.errors.setdefault(name, self.components.describe_exit(name))

    def _wait(self, what: str, fn, timeout_s: float | None = None) -> None:
        """Wait for ``fn()``; ClusterStartError when a required component exits or on timeout."""
        def ready() -> bool:
            self._record_optional_exits()
            return bool(fn())
        self.components.wait(what, ready, timeout_s or self.start_timeout_s, error=ClusterStartError,
                             watch=self._required(), poll_s=0.1)

    def _save_state(self) -> None:
        if not self.run_dir.exists():
            return
        state = {
            "run_dir": str(self.run_dir),
            "kubeconfig": str(self.kubeconfig),
            "server": self.server if "apiserver" in self.ports else "",
            "argo_server_url": self.argo_server_url if self.ports else "",
            "pgids": self.components.pgids(),
            "timings": self.timings,
            "durations": self.durations,
            "errors": self.errors,
            "startup_s": self.startup_s,
        }
        tmp = self.run_dir / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.run_dir / STATE_FILE)

    def _https_request(self, method: str, path: str, body: bytes | None = None,
                       timeout: float = 10.0) -> tuple[int, str]:
        """One request to the API server with the admin certificate: (status, body text)."""
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        req = urllib.request.Request(self.server + path, data=body, method=method,
                                     headers={"Content-Type": "application/json"} if body else {})
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=ctx) as resp:
                return resp.status, resp.read().decode(errors="replace")
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")

    # -- bring-up, in order -------------------------------------------------------------------

    def _start(self) -> None:
        self.ports = dict(zip(PORT_NAMES, free_ports(len(PORT_NAMES))))
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(1) as bg:
            # the CRDs are parsed while etcd and the API server start
            crds = bg.submit(self._crd_bodies)
            write_pki(self.pki)
            write_kubeconfig(self.kubeconfig, self.server, self.pki)
            self._mark("certificates")
            self._start_etcd()
            self._start_apiserver()
            self._start_controllers()
            k = self._clients()
            self._create_crds(crds.result(), k)
            self._create_argo_config(k)
            self._start_kwok(k)
            self._start_argo()
            if self.volcano:
                self._start_volcano()
            if self.autoscaler:
                self._start_karpenter(k)
            self._wait_ready(self._readiness_checks(k))
            k.api.close()

    def _crd_bodies(self) -> list[tuple[str, str, bytes]]:
        """(name, source file, JSON body) of every CRD: KWOK Stage, Argo (full schemas), Volcano."""
        out = []
        for m in ["kwok", "argo"] + (["volcano"] if self.volcano else []) + (["karpenter"] if self.autoscaler else []):
            for f in crd_files(m):
                for doc in load_yaml_docs(f):
                    if doc.get("kind") == "CustomResourceDefinition":
                        out.append((doc["metadata"]["name"], str(f),
                                    json.dumps(doc, separators=(",", ":")).encode()))
        return out

    def _start_etcd(self) -> None:
        ep, pp = self.ports["etcd"], self.ports["etcd-peer"]
        self._spawn("etcd", [
            str(binary("etcd")), "--name", "default", "--data-dir", str(self.run_dir / "etcd"),
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

    def _start_apiserver(self) -> None:
        pki, r = self.pki, self.run_dir
        self._spawn("kube-apiserver", [
            str(binary("kube-apiserver")),
            "--etcd-servers", f"http://127.0.0.1:{self.ports['etcd']}",
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

    def _start_controllers(self) -> None:
        """kube-controller-manager and kube-scheduler; their leases are polled later (`_early`)."""
        kc, pki = str(self.kubeconfig), self.pki
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
            *self._node_grace_args(),
        ])
        self._spawn("kube-scheduler", [
            str(binary("kube-scheduler")), "--kubeconfig", kc,
            "--bind-address", "127.0.0.1", "--secure-port", "0", "--leader-elect=true",
        ])

    def _clients(self) -> types.SimpleNamespace:
        """The Kubernetes API clients of the bring-up: api, core, ext, coord, custom."""
        from kubernetes import client

        api = self.api_client()
        return types.SimpleNamespace(api=api, core=client.CoreV1Api(api), ext=client.ApiextensionsV1Api(api),
                                     coord=client.CoordinationV1Api(api), custom=client.CustomObjectsApi(api))

    @staticmethod
    def _lease_held(k, ns: str, name: str):
        def held() -> bool:
            return bool(k.coord.read_namespaced_lease(name, ns).spec.holder_identity)
        return held

    def _create_crds(self, crds: list[tuple[str, str, bytes]], k) -> None:
        """POST the CRDs as raw JSON, 4 at a time (the Python client's recursive serialisation of
        Argo's 2.5 MB schemas costs seconds), and wait until each is Established. The controller
        and scheduler leases are polled meanwhile, so their start-to-ready times are measured."""
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
        self._early = {n: self._lease_held(k, "kube-system", n)
                       for n in ("kube-controller-manager", "kube-scheduler")}

        def crds_established():
            self._poll_early()
            for n, _, _ in crds:
                conds = {x.type: x.status for x in (k.ext.read_custom_resource_definition(n).status.conditions or [])}
                if conds.get("Established") != "True":
                    return False
            return True
        self._wait("CRDs established", crds_established)
        self._mark("crds")

    def _poll_early(self) -> None:
        for name in list(self._early):
            try:
                if self._early[name]():
                    del self._early[name]
                    self._mark(name)
            except Exception:  # noqa: BLE001, S110 - not yet; the final wait reports it
                pass

    def _create_argo_config(self, k) -> None:
        """Namespaces argo (and volcano-system) and Argo's controller ConfigMap."""
        from kubernetes import client

        from pipectl.pipelines.manifests import controller_config
        from pipectl.pipelines.training import CompileConfig

        for ns in ["argo"] + (["volcano-system"] if self.volcano else []):
            try:
                k.core.create_namespace({"metadata": {"name": ns}})
            except client.ApiException as e:
                if e.status != 409:
                    raise
        # the product's own configuration (the executor's requests and restricted securityContext,
        # the UI's links), with this cluster's metrics port
        cm = load_yaml_docs(CONTROLLER_CONFIGMAP)[0]
        for key in ("metricsConfig", "telemetryConfig"):
            cm["data"][key] = cm["data"][key].replace("METRICS_PORT", str(self.ports["argo-metrics"]))
        product = controller_config(CompileConfig())[0]["data"]
        cm["data"] = {**product, **cm["data"]}
        # a test may point the UI's links (workflow -> its MLflow run) elsewhere
        if self.argo_links is not None:
            cm["data"]["links"] = self.argo_links
        k.core.create_namespaced_config_map("argo", cm)

    def _start_kwok(self, k) -> None:
        """KWOK's Stages and the fake nodes first, so KWOK finds them on its first list."""
        for doc in kwok.stages(self.node_heartbeat_s):
            k.custom.create_cluster_custom_object("kwok.x-k8s.io", "v1alpha1", "stages", doc)
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=8) as pool:  # a thousand nodes: one request each, in parallel
            list(pool.map(lambda i: k.core.create_node(kwok.fake_node(f"kwok-node-{i}")), range(self.nodes)))
        self._spawn("kwok", kwok.argv(str(self.kubeconfig)))

    def _start_argo(self) -> None:
        """The workflow controller, `argo server` (when asked) and the argoexec stand-in."""
        kc = str(self.kubeconfig)
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
        self._spawn("argoexec-stand-in", [sys.executable, str(ARGOEXEC_STAND_IN), kc])

    def _node_grace_args(self) -> list[str]:
        """With slow node heartbeats (``node_heartbeat_s``, large benchmark clusters), a grace period
        well above them: at 30-36 s and the controller's default grace, nodes whose renewal waited
        in KWOK's queue were marked NotReady mid-scenario, and a gang that needs every schedulable
        node could not be whole again."""
        if self.node_heartbeat_s is None:
            return []
        return ["--node-monitor-grace-period", f"{max(60, int(self.node_heartbeat_s * 5))}s"]

    def _start_volcano(self) -> None:
        """vc-scheduler with the configuration the project ships
        (argo/cluster/volcano/volcano-scheduler-configmap.yaml) and vc-controller-manager; optional."""
        from pipectl.pipelines.manifests import volcano_scheduler_config

        kc, conf = str(self.kubeconfig), self.run_dir / "volcano-scheduler.conf"
        conf.write_text(volcano_scheduler_config()[0]["data"]["volcano-scheduler.conf"])
        for c in OPTIONAL_COMPONENTS:
            if not os.access(binary(c), os.X_OK):
                self.errors[c] = f"binary {binary(c)} missing"
        if "vc-scheduler" not in self.errors:
            self._spawn("vc-scheduler", [
                str(binary("vc-scheduler")), "--kubeconfig", kc, "--scheduler-conf", str(conf),
                "--scheduler-name", "volcano", "--leader-elect=false",
                # /metrics on the listen address only with --enable-metrics (cmd/scheduler/app/server.go);
                # tests/cluster/test_monitoring.py scrapes it (C12)
                "--enable-metrics", "--listen-address", f"127.0.0.1:{self.ports['vc-sched-http']}",
                "--healthz-address", f"127.0.0.1:{self.ports['vc-sched-healthz']}",
                "--default-queue", "default", "--cache-dumper=false", "--logtostderr", *self._volcano_verbosity(),
            ])
        if "vc-controller-manager" not in self.errors:
            self._spawn("vc-controller-manager", [
                str(binary("vc-controller-manager")), "--kubeconfig", kc,
                "--leader-elect=true", "--leader-elect-resource-namespace", "volcano-system",
                "--healthz-address", f"127.0.0.1:{self.ports['vc-cm-healthz']}",
                "--scheduler-name", "volcano", "--logtostderr", *self._volcano_verbosity(),
            ])

    @staticmethod
    def _volcano_verbosity() -> list[str]:
        """``PIPECTL_TEST_VOLCANO_V=3``: Volcano's components log at klog level 3 (each job sync and
        why it failed, each scheduling cycle's decisions); unset: their default."""
        level = os.environ.get("PIPECTL_TEST_VOLCANO_V", "")
        return [f"-v={int(level)}"] if level.strip() else []

    def _start_karpenter(self, k) -> None:
        """Its namespace and the KWOKNodeClass, then Karpenter (karpenter.py)."""
        k.core.create_namespace({"metadata": {"name": karpenter.NAMESPACE}})
        k.custom.create_cluster_custom_object("karpenter.kwok.sh", "v1alpha1", "kwoknodeclasses",
                                              karpenter.node_class(self.node_registration_delay_s))
        self._spawn("karpenter", karpenter.argv(), env=karpenter.env(
            str(self.kubeconfig), self.ports["karpenter-metrics"], self.ports["karpenter-health"]))

    def _readiness_checks(self, k) -> dict:
        """name -> check (true when ready) of everything still to come up."""
        def nodes_ready():
            nodes = k.core.list_node(label_selector="type=kwok").items
            ok = [n for n in nodes if any(c.type == "Ready" and c.status == "True"
                                          for c in (n.status.conditions or []))
                  and not any(t.key.startswith("node.kubernetes.io/") for t in (n.spec.taints or []))]
            return len(ok) == self.nodes

        def default_sa():
            k.core.read_namespaced_service_account("default", "default")
            k.core.read_namespaced_service_account("default", "argo")
            return True

        def default_queue():
            k.custom.get_cluster_custom_object("scheduling.volcano.sh", "v1beta1", "queues", "default")
            return True

        def argo_server_ok():
            with urllib.request.urlopen(self.argo_server_url + "/api/v1/version", timeout=2) as resp:
                return resp.status == 200

        checks = {**self._early, "serviceaccounts": default_sa,
                  "workflow-controller": self._lease_held(k, "argo", "workflow-controller"),
                  "kwok": nodes_ready}  # fake nodes Ready and untainted
        if self.argo_server:
            checks["argo-server"] = argo_server_ok
        if self.autoscaler:
            checks["karpenter"] = lambda: http_ok(karpenter.health_url(self.ports["karpenter-health"]))
        if self.volcano and "vc-scheduler" not in self.errors:
            checks["vc-scheduler"] = default_queue
        if self.volcano and "vc-controller-manager" not in self.errors:
            checks["vc-controller-manager"] = self._lease_held(k, "volcano-system", "vc-controller-manager")
        return checks

    def _wait_ready(self, checks: dict) -> None:
        """Poll every check, marking each when it first becomes true. After start_timeout_s an
        optional (Volcano) component still pending is recorded in ``errors``; a required one
        raises ClusterStartError."""
        pending, last = dict(checks), {}

        def all_ready() -> bool:
            self._record_optional_exits()
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
            return not pending
        try:
            self.components.wait("components ready", all_ready, self.start_timeout_s,
                                 error=ClusterStartError, watch=self._required(), poll_s=0.2)
        except ClusterStartError:
            if self.components.exited(self._required()):
                raise
            for n in [n for n in pending if n.startswith("vc-")]:
                self.errors[n] = (f"not ready within {self.start_timeout_s}s "
                                  f"(last: {last.get(n)!r}); log tail:\n{self.components.tail(n)}")
            required = [n for n in pending if not n.startswith("vc-")]
            if required:
                what = ", ".join(f"{n} (last: {last.get(n)!r})" for n in required)
                raise ClusterStartError(f"not ready within {self.start_timeout_s}s: {what}; "
                                        f"logs in {self.logs}") from None
