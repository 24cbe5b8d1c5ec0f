"""A real Kubernetes node on top of the loopback control plane (tests/harness/controlplane.py): pods run.

Part 1 (the control plane) fakes nodes with KWOK; this module adds one node whose pods really run:

  containerd          Debian's 1.6 (CRI v1), its own config, socket and state under run_dir; its
                      image store (root) is cached in ${PIPECTL_CACHE_DIR:-~/.cache/pipectl}/containerd
                      so the GB-sized step images are imported once per content, not per run
  runc                Debian's, cgroupfs driver (these machines have cgroup v1)
  CNI                 Debian's containernetworking-plugins (/usr/lib/cni): bridge ``pipectl0``,
                      pods in 10.244.255.0/24, gateway (the host) 10.244.255.1, host-local IPAM
  kubelet             v1.34.4 from the same wrapper module as the control plane (build.sh),
                      cgroupDriver cgroupfs, failCgroupV1 false, imageGCHighThresholdPercent 100
  pause image         registry.k8s.io/pause:3.10.1, built from k8s.io/kubernetes build/pause (C,
                      static) and loaded into containerd
  argoexec image      quay.io/argoproj/argoexec:v4.0.5 (the controller's --executor-image), the
                      argoexec binary built from the argo-workflows module (build.sh)
  step images         pipectl/step-light, pipectl/step-train (scripts/images.sh), and the examples'
                      images built FROM step-train (pipectl/example-<name>), loaded with
                      ``docker save | ctr -n k8s.io images import -``
  CoreDNS             v1.14.7 (cut-down build, build.sh) on the gateway: cluster.local from the
                      API server, so the training gang finds ``<job>-worker-0.<job>`` (Volcano
                      svc plugin: headless Service + pod hostname/subdomain)

How pods reach the host. Everything of part 1 listens on 127.0.0.1, which a pod's network
namespace cannot reach. Pods keep their own network (no hostNetwork: the gang's two workers need
distinct addresses and the svc plugin's DNS names, as on a real cluster) and reach the host on the
bridge gateway 10.244.255.1. A host port P on 127.0.0.1 is published to pods as
10.244.255.1:P by a ``socat`` forwarder (`expose()`): RGW, MLflow. The API server is reached
the way in-cluster clients do, through the ``kubernetes`` Service's ClusterIP 10.96.0.1:443
(what kubelet puts in KUBERNETES_SERVICE_HOST/PORT; in the API server certificate's SANs): there
is no kube-proxy, so 10.96.0.1 is added as a host address on the bridge and a forwarder listens on
it. Pod-to-pod traffic on the bridge is accepted in iptables' FORWARD chain (Docker sets its policy
to DROP and br_netfilter sends bridged frames through it).

The kubelet authenticates with the cluster's admin client certificate; its own server accepts the
API server anonymously (authorization AlwaysAllow) — a throwaway, loopback-only node.

Needs root (network, mounts, cgroups). Usage::

    with TestCluster(tmp / "k8s", nodes=0) as c, RealNode(c, tmp / "node") as node:
        node.expose(rgw_port)  # -> "10.244.255.1:<port>"

Command line (scripts/node-up.sh, node-down.sh)::

    python tests/cluster/node.py up CLUSTER_RUN_DIR      # node on a running `make cluster-up`
    python tests/cluster/node.py down CLUSTER_RUN_DIR
    python tests/cluster/node.py check                   # exit 1 naming what is missing
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

if __name__ == "__main__":  # run as a script: import from the repository, not this folder
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from pipectl.pipelines.backends.processes import (  # noqa: E402
    ProcessError,
    free_ports,
    kill_group,
    spawn,
    stop,
    tcp_open,
    wait_until,
)
from tests.harness import cli as cluster_cli  # noqa: E402
from tests.harness.binaries import K8S_VERSION, VERSIONS, cache_root, load_yaml_docs  # noqa: E402
from tests.harness.components import Components  # noqa: E402
from tests.harness.controlplane import EXECUTOR_IMAGE, TestCluster  # noqa: E402
from tests.harness.kwok import MANIFESTS  # noqa: E402

NODE_NAME = "pipectl-node"
BRIDGE = "pipectl0"
POD_SUBNET = "10.244.255.0/24"
GATEWAY = "10.244.255.1"
SERVICE_IP = "10.96.0.1"          # first address of cluster.SERVICE_CIDR: Service "kubernetes"
CLUSTER_DOMAIN = "cluster.local"
PAUSE_IMAGE = "registry.k8s.io/pause:3.10.1"
def image_args() -> list[str]:
    """``--image <name>=c-<content hash>`` per step image, as scripts/images.sh wrote them for the
    last build (``<cache>/images/image-args.txt``); empty when no build happened yet."""
    path = cache_root() / "images" / "image-args.txt"
    return path.read_text().split() if path.exists() else []


def step_images() -> list[str]:
    """The step images the node runs: the last build's content tags (never a tag a rebuild
    reuses), or the release tags when nothing was built (then `missing` reports them)."""
    from pipectl.pipelines.training import IMAGE_VERSION, STEP_IMAGES

    built = dict(a.split("=", 1) for a in image_args() if a != "--image")
    return [f"pipectl/{name}:{built.get(name, IMAGE_VERSION)}" for name in STEP_IMAGES]


def example_images() -> dict[str, str]:
    """The examples' own images of the last build (``<cache>/images/example-images.txt``, written by
    scripts/images.sh): example folder name -> ``pipectl/example-<name>:c-<hash>``; empty when none."""
    path = cache_root() / "images" / "example-images.txt"
    lines = path.read_text().split() if path.exists() else []
    return dict(line.split("=", 1) for line in lines)


def node_images() -> list[str]:
    """What the node runs besides its own images: the step images and the examples' images."""
    return [*step_images(), *example_images().values()]
CNI_BIN = "/usr/lib/cni"
BRIDGE_MAC = "02:70:69:70:65:01"  # locally administered
NODE_COMPONENTS = {"kubelet": K8S_VERSION, "pause": K8S_VERSION,
                   "argoexec": VERSIONS["workflow-controller"], "coredns": "v1.14.7"}
KUBELET_CONFIG = MANIFESTS / "kubelet-config.yaml"
STOP_GRACE_S = 5.0  # SIGTERM, then SIGKILL what is left after this long
STATE_FILE = "node.json"
IPT_RULE = ["FORWARD", "-i", BRIDGE, "-o", BRIDGE, "-m", "comment", "--comment", "pipectl-node",
            "-j", "ACCEPT"]
DOCKER = shutil.which("docker", path="/usr/bin") or "docker"


class NodeNotAvailable(RuntimeError):
    """Something the node needs is missing (see `missing()`); the message says what and how."""


class NodeStartError(RuntimeError):
    pass


def node_binary(name: str) -> Path:
    return cache_root() / "cluster-bin" / f"{name}-{NODE_COMPONENTS[name]}" / name


def missing(images: list[str] | None = None) -> list[str]:
    """What the node needs and cannot find: root, Debian packages, built binaries, images."""
    out = []
    if os.geteuid() != 0:
        out.append("root (network namespaces, mounts and cgroups)")
    for cmd, pkg in [("containerd", "containerd"), ("ctr", "containerd"), ("runc", "runc"),
                     ("socat", "socat"), ("iptables", "iptables"), ("ip", "iproute2"),
                     ("dockerd", "docker.io")]:
        if not shutil.which(cmd):
            out.append(f"command {cmd} (Debian package {pkg}: scripts/system-deps.sh node)")
    if not os.path.exists(f"{CNI_BIN}/bridge"):
        out.append(f"{CNI_BIN}/bridge (Debian package containernetworking-plugins)")
    for name in NODE_COMPONENTS:
        if not os.access(node_binary(name), os.X_OK):
            out.append(f"binary {node_binary(name)} (run tests/cluster/build.sh {name})")
    images = node_images() if images is None else images
    if images and not out:
        try:
            have = set(subprocess.run([DOCKER, "images", "--format", "{{.Repository}}:{{.Tag}}"],
                                      capture_output=True, text=True, timeout=30,
                                      check=True).stdout.split())
        except (OSError, subprocess.SubprocessError) as e:
            out.append(f"a running Docker engine ({e}; scripts/images.sh starts one)")
        else:
            out += [f"docker image {i} (run scripts/images.sh)" for i in images if i not in have]
    return out


def _run(argv: list[str], timeout_s: float = 120, check: bool = True, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False, **kw)
    if check and p.returncode != 0:
        raise NodeStartError(f"{' '.join(argv)} exited {p.returncode}: {(p.stderr or p.stdout)[-2000:]}")
    return p


def _group_alive(pgid: int, marker: str) -> bool:
    try:
        return marker.encode() in Path(f"/proc/{pgid}/cmdline").read_bytes()
    except OSError:
        return False


class RealNode:
    """One real node (containerd + kubelet) joined to a running TestCluster; a context manager.

    ``timings``: seconds since start() at which each step was done (network, containerd, images,
    coredns, kubelet, node-ready); ``image_import_s``: per image, seconds spent importing (0 when
    containerd already held that content).
    """

    __test__ = False

    def __init__(self, cluster_run_dir: Path, kubeconfig: Path, apiserver: str, run_dir: Path, *,
                 start_timeout_s: float = 180.0, die_with_parent: bool = True,
                 images: list[str] | None = None) -> None:
        self.cluster_run_dir = Path(cluster_run_dir).absolute()
        self.kubeconfig = Path(kubeconfig).absolute()
        self.apiserver = apiserver  # https://127.0.0.1:PORT
        self.run_dir = Path(run_dir).absolute()
        self.start_timeout_s = start_timeout_s
        self.die_with_parent = die_with_parent
        self.images = list(node_images() if images is None else images)
        self.logs = self.run_dir / "logs"
        self.sock = self.run_dir / "containerd.sock"
        self.containerd_root = cache_root() / "containerd"
        self.components = Components(self.logs, cwd=self.run_dir, die_with_parent=die_with_parent,
                                     on_change=self._save_state)
        self.ports: dict[str, int] = {}
        self.exposed: dict[int, str] = {}
        self.timings: dict[str, float] = {}
        self.image_import_s: dict[str, float] = {}
        self.startup_s: float | None = None
        self._t0 = 0.0
        self._lock_fd: int | None = None
        self._net_done = False
        self.kubelet_overrides: dict[str, object] = {}

    @classmethod
    def for_cluster(cls, c: TestCluster, run_dir: Path, **kw) -> RealNode:
        return cls(c.run_dir, c.kubeconfig, c.server, run_dir, **kw)

    @property
    def procs(self) -> dict[str, subprocess.Popen]:
        """Running processes: name -> process (its pid is its process group id)."""
        return self.components.procs

    # -- public --------------------------------------------------------------------------------

    def start(self) -> RealNode:
        m = missing(self.images)
        if m:
            raise NodeNotAvailable("real node: missing " + "; ".join(m))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        self.containerd_root.mkdir(parents=True, exist_ok=True)
        # One node per machine: bridge name, addresses and the cached containerd root are shared.
        self._lock_fd = os.open(cache_root() / "node.lock", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            self._lock_fd = None
            raise NodeStartError(f"another real node holds {cache_root() / 'node.lock'}")
        self._t0 = time.monotonic()
        try:
            self._start()
        except BaseException:
            self._log(f"start failed; logs in {self.logs}")
            self.stop(remove=False)
            raise
        self.startup_s = round(time.monotonic() - self._t0, 3)
        self._save_state()
        self._log(f"node up in {self.startup_s:.1f}s: {json.dumps(self.timings)}; "
                  f"image imports (s): {json.dumps(self.image_import_s)}")
        return self

    def expose(self, port: int) -> str:
        """Publish 127.0.0.1:``port`` of the host to pods as ``GATEWAY:port``; returns that address."""
        if port not in self.exposed:
            self._spawn(f"expose-{port}", ["socat", f"TCP-LISTEN:{port},bind={GATEWAY},reuseaddr,fork",
                                           f"TCP:127.0.0.1:{port}"])
            self._wait_tcp(GATEWAY, port, f"expose-{port}")
            self.exposed[port] = f"{GATEWAY}:{port}"
            self._save_state()
        return self.exposed[port]

    @contextlib.contextmanager
    def api_through_fault_proxy(self, cluster, fail, times: int = 1):
        """While inside, pods reach the API server (Service ``kubernetes``, SERVICE_IP:443) through
        tests/tools/kube_fault_proxy.KubeFaultProxy instead of the plain forwarder: the first
        ``times`` requests matching ``fail(method, path)`` are committed upstream and answered with
        a ServerTimeout 500 + Retry-After. Yields the proxy (``writes()``)."""
        from tests.tools.kube_fault_proxy import KubeFaultProxy

        api_port = int(self.apiserver.rsplit(":", 1)[1])
        self.components.stop("apiserver-forward", STOP_GRACE_S)
        try:
            with KubeFaultProxy(api_port, cluster.pki, fail, times, host=SERVICE_IP, port=443) as px:
                yield px
        finally:
            self._spawn("apiserver-forward", ["socat", f"TCP-LISTEN:443,bind={SERVICE_IP},reuseaddr,fork",
                                              f"TCP:127.0.0.1:{api_port}"])
            self._wait_tcp(SERVICE_IP, 443, "apiserver-forward")

    def stop(self, remove: bool = True) -> None:
        """Stop the kubelet, every pod container, containerd, CoreDNS and the forwarders; undo the
        network changes; unmount what the kubelet mounted under run_dir."""
        self.components.stop("kubelet", STOP_GRACE_S)
        if "containerd" in self.procs and self.procs["containerd"].poll() is None:
            self._remove_all_containers()
        self.components.stop_all(grace_s=STOP_GRACE_S)
        _kill_runc_containers(_stale_runc_containers(self.run_dir))
        _kill_shims(self.sock)
        _unmount_under(self.run_dir)
        if self._net_done:
            _net_down()
            self._net_done = False
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        if (self.run_dir / STATE_FILE).exists():
            (self.run_dir / STATE_FILE).unlink()
        if remove:  # the node's and the pods' logs stay (small; pytest keeps its last 3 tmp folders)
            for p in self.run_dir.iterdir() if self.run_dir.exists() else ():
                if p.name in ("logs", "pod-logs"):
                    continue
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)

    def restart_kubelet(self, **config: object) -> None:
        """Restart the kubelet with these KubeletConfiguration fields replaced (none: the file's
        own). Running pods keep running (containerd holds them; the new kubelet adopts them)."""
        self.kubelet_overrides = dict(config)
        self.components.stop("kubelet", STOP_GRACE_S)
        self._start_kubelet()

    def __enter__(self) -> RealNode:  # noqa: PYI034
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def ctr(self, *args: str, timeout_s: float = 60, check: bool = True, **kw) -> subprocess.CompletedProcess:
        return _run(["ctr", "--address", str(self.sock), "-n", "k8s.io", *args], timeout_s, check, **kw)

    def image_revision(self, ref: str) -> dict:
        """Which build of ``ref`` the node runs: the Docker image id and content hash of the build
        this checkout made (scripts/images.sh labels), and the id containerd holds for the ref (its
        ``pipectl.io/docker-id`` label, set when it was imported). Equal ids: the node runs this
        checkout's image."""
        docker_id = _run([DOCKER, "image", "inspect", "-f", "{{.Id}}", ref]).stdout.strip()
        content = _run([DOCKER, "image", "inspect", "-f", '{{index .Config.Labels "io.pipectl.content-hash"}}', ref]).stdout.strip()
        node_id = ""
        for line in self.ctr("images", "ls").stdout.splitlines()[1:]:
            parts = line.split()
            if parts and parts[0] == _normalize(ref):
                node_id = next((kv.split("=", 1)[1] for kv in parts[-1].split(",") if kv.startswith("pipectl.io/docker-id=")), "")
        return {"ref": ref, "docker_id": docker_id, "content_hash": content, "node_docker_id": node_id}

    # -- internals -----------------------------------------------------------------------------

    def _log(self, msg: str) -> None:
        print(f"[node +{time.monotonic() - self._t0:6.2f}s] {msg}", file=sys.stderr, flush=True)

    def _mark(self, what: str) -> None:
        self.timings[what] = round(time.monotonic() - self._t0, 3)
        self._log(f"{what} done")

    def _spawn(self, name: str, argv: list[str], env: dict | None = None) -> subprocess.Popen:
        return self.components.start(name, argv, env)

    def _wait(self, what: str, fn, timeout_s: float | None = None) -> None:
        """Wait for ``fn()``; NodeStartError when a process of the node exits or on timeout."""
        self.components.wait(what, fn, timeout_s or self.start_timeout_s, error=NodeStartError)

    def _wait_tcp(self, host: str, port: int, what: str) -> None:
        self._wait(what, lambda: tcp_open(host, port), 30)

    def _save_state(self) -> None:
        if not self.run_dir.exists():
            return
        st = {"run_dir": str(self.run_dir), "cluster_run_dir": str(self.cluster_run_dir),
              "pgids": self.components.pgids(), "exposed": self.exposed,
              "timings": self.timings, "image_import_s": self.image_import_s,
              "startup_s": self.startup_s, "socket": str(self.sock), "gateway": GATEWAY}
        tmp = self.run_dir / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(st, indent=2))
        tmp.replace(self.run_dir / STATE_FILE)

    def _start(self) -> None:
        self._start_network()
        self._start_containerd()
        self._load_images()
        self._mark("images")
        # API server for pods: Service "kubernetes" (10.96.0.1:443) -> 127.0.0.1:PORT
        api_port = int(self.apiserver.rsplit(":", 1)[1])
        self._spawn("apiserver-forward", ["socat", f"TCP-LISTEN:443,bind={SERVICE_IP},reuseaddr,fork",
                                          f"TCP:127.0.0.1:{api_port}"])
        self._wait_tcp(SERVICE_IP, 443, "apiserver-forward")
        self._start_coredns()
        self._start_kubelet()

    def _start_network(self) -> None:
        """Remove what a killed earlier node left (its containerd died, shims and containers live
        on: containers, shims, pod network namespaces and mounts, the bridge), then set up the
        bridge, addresses and forwarding rule."""
        stale = _stale_runc_containers()
        if stale:
            self._log(f"removing {len(stale)} containers of an earlier node that was killed")
            _kill_runc_containers(stale)
        _kill_shims(Path("containerd.sock"))
        _unmount_stale_pod_volumes(self.run_dir)
        _net_down()
        _net_up()
        self._net_done = True
        self._mark("network")

    def _write_cni_config(self) -> None:
        r = self.run_dir
        (r / "cni").mkdir(exist_ok=True)
        (r / "cni" / "10-pipectl.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "pipectl", "plugins": [
                {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False,
                 "hairpinMode": True, "ipam": {"type": "host-local", "subnet": POD_SUBNET,
                                               "gateway": GATEWAY, "dataDir": str(r / "cni-ipam"),
                                               "routes": [{"dst": "0.0.0.0/0"}]}},
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ]}, indent=1))

    def _write_containerd_config(self) -> Path:
        r = self.run_dir
        runc_binary = (f'\n        BinaryName = "{os.environ["PIPECTL_NODE_RUNC"]}"'
                       if os.environ.get("PIPECTL_NODE_RUNC") else "")
        (r / "containerd.toml").write_text(f"""\
version = 2
root = "{self.containerd_root}"
state = "{r / 'containerd-state'}"
[grpc]
  address = "{self.sock}"
[ttrpc]
  address = "{self.sock}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  enable_selinux = false
  restrict_oom_score_adj = true  # these machines drop CAP_SYS_RESOURCE: no negative scores
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    discard_unpacked_layers = false
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false{runc_binary}
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{r / 'cni'}"
""")
        return r / "containerd.toml"

    def _start_containerd(self) -> None:
        self._write_cni_config()
        self._spawn("containerd", ["containerd", "--config", str(self._write_containerd_config())])
        self._wait("containerd", lambda: self.ctr("version", timeout_s=5).returncode == 0, 60)
        self._mark("containerd")
        self._remove_all_containers()  # a killed earlier node's containers (the root is cached)

    def _start_coredns(self) -> None:
        """CoreDNS on the gateway: cluster.local from the API server, nothing else."""
        r = self.run_dir
        (r / "Corefile").write_text(f"""\
{CLUSTER_DOMAIN}:53 {{
    bind {GATEWAY}
    errors
    kubernetes {CLUSTER_DOMAIN} {{
        kubeconfig {self.kubeconfig} pipectl-test
        pods insecure
        ttl 5
    }}
    cache 5
}}
.:53 {{
    bind {GATEWAY}
    errors
}}
""")
        self._spawn("coredns", [str(node_binary("coredns")), "-conf", str(r / "Corefile"),
                                "-dns.port", "53"])
        self._wait_tcp(GATEWAY, 53, "coredns")
        self._mark("coredns")

    def _write_kubelet_config(self) -> Path:
        """manifests/kubelet-config.yaml with this node's addresses, ports, socket and folders."""
        import yaml

        r = self.run_dir
        kp, hp = free_ports(2)
        self.ports.update(kubelet=kp, kubelet_healthz=hp)
        (r / "resolv.conf").write_text("")  # pods get only the cluster DNS and search path
        conf = load_yaml_docs(KUBELET_CONFIG)[0]
        conf.update(address=GATEWAY, port=kp, healthzPort=hp, containerRuntimeEndpoint=f"unix://{self.sock}",
                    clusterDNS=[GATEWAY], clusterDomain=CLUSTER_DOMAIN, resolvConf=str(r / "resolv.conf"),
                    podLogsDir=str(r / "pod-logs"))
        conf.update(self.kubelet_overrides)
        (r / "kubelet.yaml").write_text(yaml.safe_dump(conf, sort_keys=False))
        return r / "kubelet.yaml"

    def _start_kubelet(self) -> None:
        from kubernetes import client

        r = self.run_dir
        self._spawn("kubelet", [
            str(node_binary("kubelet")), "--config", str(self._write_kubelet_config()),
            "--kubeconfig", str(self.kubeconfig), "--hostname-override", NODE_NAME,
            "--node-ip", GATEWAY, "--root-dir", str(r / "kubelet"), "--cert-dir", str(r / "kubelet-pki"),
            "--node-labels", "pipectl.io/real-node=true", "--v", "2",
        ])
        api = _api(self.kubeconfig)
        core = client.CoreV1Api(api)

        def ready():
            n = core.read_node(NODE_NAME)
            return any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
        self._wait("kubelet: node Ready", ready)
        self._mark("node-ready")
        api.close()

    def _remove_all_containers(self) -> None:
        p = self.ctr("tasks", "ls", "-q", check=False, timeout_s=30)
        for t in p.stdout.split():
            self.ctr("tasks", "kill", "-s", "KILL", t, check=False)
        for t in p.stdout.split():
            self.ctr("tasks", "delete", "-f", t, check=False)
        c = self.ctr("containers", "ls", "-q", check=False, timeout_s=30)
        for cid in c.stdout.split():
            self.ctr("containers", "delete", cid, check=False)

    def _load_images(self) -> None:
        """Build the pause and argoexec images from the cached binaries (docker, FROM scratch /
        the Debian base), then import every image whose Docker image id containerd does not hold
        yet (label ``pipectl.io/docker-id`` on the containerd image)."""
        refs = [self._binary_image("pause", PAUSE_IMAGE, "/pause", entry=["/pause"]),
                self._binary_image("argoexec", EXECUTOR_IMAGE, "/bin/argoexec", entry=["argoexec"])]
        refs.append(_latest_base_image())  # plain pods of the tests run on it; its layer is the step images' first
        refs += self.images
        done = import_images(self.sock, refs)
        if done is not None:
            self.image_import_s["+".join(done[0])] = done[1]
            self._log(f"imported {', '.join(done[0])} in {done[1]}s")

    def _binary_image(self, name: str, ref: str, path: str, entry: list[str]) -> str:
        """A docker image holding one cached binary at ``path`` (pause: FROM scratch, as upstream;
        argoexec: on the Debian base, standing in for distroless/static). Rebuilt when the binary
        changes (its sha256 is a label)."""
        b = node_binary(name)
        digest = hashlib.sha256(b.read_bytes()).hexdigest()[:16]
        try:
            cur = _run([DOCKER, "image", "inspect", "-f", '{{index .Config.Labels "io.pipectl.binary"}}', ref],
                       check=False).stdout.strip()
        except subprocess.TimeoutExpired:
            cur = ""
        if cur == digest:
            return ref
        ctx = self.run_dir / f"image-{name}"
        ctx.mkdir(exist_ok=True)
        shutil.copy2(b, ctx / name)
        base = "scratch" if name == "pause" else _latest_base_image()
        (ctx / "Dockerfile").write_text(
            f"FROM {base}\nCOPY {name} {path}\nLABEL io.pipectl.binary={digest}\n"
            f"ENTRYPOINT {json.dumps(entry)}\n" + ("USER 65535:65535\n" if name == "pause" else ""))
        _run([DOCKER, "build", "-q", "-t", ref, str(ctx)], timeout_s=300)
        return ref


BUILT_IMAGE_PREFIXES = ("docker.io/pipectl/step-", "docker.io/pipectl/example-")
"""Images of scripts/images.sh: a node's store keeps the build it was last given of each."""


def import_images(sock: Path, refs: list[str]) -> tuple[list[str], float] | None:
    """Import into the containerd at ``sock`` (namespace k8s.io) every Docker image of ``refs``
    whose Docker image id it does not hold yet (label ``pipectl.io/docker-id``), in ONE
    ``docker save | ctr import`` stream (layers the step images share, the ~6.6 GB venv, are in it
    once). Returns (the refs imported, seconds), None when nothing was missing. Raises NodeStartError."""
    def ctr(*args: str, **kw) -> subprocess.CompletedProcess:
        return _run(["ctr", "--address", str(sock), "-n", "k8s.io", *args], **kw)

    have, listed = {}, []
    for line in ctr("images", "ls").stdout.splitlines()[1:]:
        parts = line.split()
        labels = parts[-1] if parts else ""
        listed += parts[:1]
        for kv in labels.split(","):
            if kv.startswith("pipectl.io/docker-id="):
                have[parts[0]] = kv.split("=", 1)[1]
    todo: dict[str, tuple[str, str]] = {}
    for ref in refs:
        docker_id = _run([DOCKER, "image", "inspect", "-f", "{{.Id}}", ref]).stdout.strip()
        full = _normalize(ref)
        if have.get(full) != docker_id:
            todo[ref] = (full, docker_id)
    if not todo:
        return None
    # earlier builds of the step and example images: removed (and their content collected) before the import,
    # so a node's store holds one build, not one per dependency change (GBs each)
    # (their names, and the sha256:<image id> references the kubelet's CRI made for them)
    wanted = {full for full, _ in todo.values()} | {_normalize(r) for r in refs}
    stale = [ref for ref in have if ref.startswith(BUILT_IMAGE_PREFIXES) and ref not in wanted]
    kept_ids = {docker_id for ref, docker_id in have.items() if ref not in stale} | {i for _, i in todo.values()}
    stale += [ref for ref in listed if ref.startswith("sha256:") and ref not in kept_ids]
    if stale:
        ctr("images", "rm", "--sync", *stale, check=False, timeout_s=300)
    t0 = time.monotonic()
    save = subprocess.Popen([DOCKER, "save", *todo], stdout=subprocess.PIPE)
    imp = subprocess.run(["ctr", "--address", str(sock), "-n", "k8s.io", "images", "import", "-"],
                         stdin=save.stdout, capture_output=True, text=True, timeout=3600, check=False)
    save.stdout.close()
    save.wait()
    if save.returncode != 0 or imp.returncode != 0:
        raise NodeStartError(f"importing {', '.join(todo)}: docker save rc={save.returncode}, "
                             f"ctr import rc={imp.returncode}: {imp.stderr[-2000:]}")
    for ref, (full, docker_id) in todo.items():
        ctr("images", "label", full, f"pipectl.io/docker-id={docker_id}")
    return list(todo), round(time.monotonic() - t0, 1)


def preload_images(refs: list[str] | None = None) -> tuple[list[str], float] | None:
    """Import the Debian base, the step images and the examples' images into the node's cached
    containerd store (``<cache>/containerd``) ahead of any node, with a containerd of its own (CRI
    off) that stops afterwards; a node started later finds them and imports only what changed. ``make test`` runs
    it while the Go builds of the test cluster run. Holds the node lock. Returns as import_images."""
    import tempfile

    refs = refs or [_latest_base_image(), *node_images()]
    root = cache_root() / "containerd"
    root.mkdir(parents=True, exist_ok=True)
    lock_fd = os.open(cache_root() / "node.lock", os.O_CREAT | os.O_RDWR, 0o644)
    fcntl.flock(lock_fd, fcntl.LOCK_EX)
    try:
        with tempfile.TemporaryDirectory(prefix="pipectl-preload-") as d:
            sock = Path(d) / "containerd.sock"
            (Path(d) / "config.toml").write_text(
                f'version = 2\nroot = "{root}"\nstate = "{d}/state"\n'
                f'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
                f'[grpc]\n  address = "{sock}"\n[ttrpc]\n  address = "{sock}.ttrpc"\n')
            log = Path(d) / "containerd.log"
            proc = spawn(["containerd", "--config", str(Path(d) / "config.toml")], log)
            try:
                try:
                    wait_until("preload: containerd", lambda: _run(["ctr", "--address", str(sock), "version"],
                                                                   timeout_s=5, check=False).returncode == 0,
                               60, procs=[("containerd", proc, log)])
                except ProcessError as e:
                    raise NodeStartError(f"preload: containerd did not start ({e}): " + log.read_text()[-2000:]) from e
                return import_images(sock, refs)
            finally:
                stop(proc, STOP_GRACE_S)
    finally:
        os.close(lock_fd)


def _latest_base_image() -> str:
    """The Debian base scripts/images.sh bootstrapped (``pipectl/debian-base:<suite>-<key>``)."""
    bases = _run([DOCKER, "images", "--format", "{{.Repository}}:{{.Tag}}", "pipectl/debian-base"]).stdout.split()
    if not bases:
        raise NodeNotAvailable("docker image pipectl/debian-base:* missing (run scripts/images.sh)")
    return sorted(bases)[-1]


def _normalize(ref: str) -> str:
    """Docker's short reference -> the full name containerd stores (docker.io/library/...)."""
    first = ref.split("/")[0]
    if "/" in ref and ("." in first or ":" in first or first == "localhost"):
        return ref
    return ("docker.io/" if "/" in ref else "docker.io/library/") + ref


def _api(kubeconfig: Path):
    from kubernetes import config

    return config.new_client_from_config(config_file=str(kubeconfig))


# -- host network and cleanup --------------------------------------------------------------------


def _net_up() -> None:
    if _run(["ip", "link", "show", BRIDGE], check=False).returncode != 0:
        _run(["ip", "link", "add", BRIDGE, "type", "bridge"])
    # A fixed MAC: a Linux bridge otherwise takes the lowest MAC of its ports, which changes as pod
    # veths come and go, and pods that cached the gateway's old MAC lose the host (RGW, MLflow, the
    # API) until ARP re-resolves: the probable cause of a step's connect timeout to RGW seen right
    # after the gang's pods ended (not seen again since the MAC is fixed).
    _run(["ip", "link", "set", BRIDGE, "address", BRIDGE_MAC])
    _run(["ip", "addr", "replace", f"{GATEWAY}/24", "dev", BRIDGE])
    _run(["ip", "addr", "replace", f"{SERVICE_IP}/32", "dev", BRIDGE])
    _run(["ip", "link", "set", BRIDGE, "up"])
    Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")
    if _run(["iptables", "-C", *IPT_RULE], check=False).returncode != 0:
        _run(["iptables", "-I", *IPT_RULE])


def _net_down() -> None:
    while _run(["iptables", "-D", *IPT_RULE], check=False).returncode == 0:
        pass
    # veths of pods whose sandboxes were not torn down by the kubelet
    out = _run(["ip", "-o", "link", "show", "master", BRIDGE], check=False).stdout
    for line in out.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        _run(["ip", "link", "del", name], check=False)
    _run(["ip", "link", "del", BRIDGE], check=False)


RUNC_ROOT = "/run/containerd/runc/k8s.io"  # containerd's runc root for the k8s.io namespace


def _stale_runc_containers(only_under: Path | None = None) -> list[str]:
    """runc containers of a pipectl node's containerd: their bundle lies in a containerd state
    folder whose containerd.toml uses the cached pipectl containerd root. With ``only_under``, those
    of that run folder only; without, every such container (call it holding the node lock: another
    pipectl node cannot be running then)."""
    out = _run(["runc", "--root", RUNC_ROOT, "list", "-f", "json"], check=False).stdout.strip()
    ids = []
    for c in json.loads(out or "null") or []:
        bundle = Path(c.get("bundle", ""))
        if "containerd-state" not in bundle.parts:
            continue
        run_dir = Path(*bundle.parts[:bundle.parts.index("containerd-state")])
        if only_under is not None and run_dir != only_under:
            continue
        try:
            if str(cache_root() / "containerd") not in (run_dir / "containerd.toml").read_text():
                continue
        except OSError:
            if only_under is None:
                continue
        ids.append(c["id"])
    return ids


def _kill_runc_containers(ids: list[str]) -> None:
    for cid in ids:
        subprocess.run(["runc", "--root", RUNC_ROOT, "kill", cid, "KILL"], capture_output=True, check=False)
    for cid in ids:
        subprocess.run(["runc", "--root", RUNC_ROOT, "delete", "-f", cid], capture_output=True, check=False)


def _kill_shims(sock: Path) -> None:
    """containerd-shim-runc-v2 processes of this node's containerd (started by it, so ours)."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmd and cmd[0].endswith(b"containerd-shim-runc-v2") and any(
                a.endswith(str(sock).encode()) and (sock.is_absolute() or b"/node/" in a) for a in cmd):
            try:
                os.kill(int(d.name), signal.SIGKILL)
            except ProcessLookupError:
                pass


def _unmount_stale_pod_volumes(keep: Path) -> None:
    """Pod volume mounts (kubelet root ``<run>/node/kubelet``) of killed pipectl nodes, and the
    CRI's pod network namespaces."""
    _unmount_under(keep / "nonexistent")  # network namespaces only
    for line in Path("/proc/self/mounts").read_text().splitlines():
        mp = line.split()[1]
        if ("/node/kubelet/pods/" in mp or mp.endswith("/node/kubelet")) and not mp.startswith(str(keep) + "/"):
            subprocess.run(["umount", "-l", mp], capture_output=True, check=False)


def _unmount_under(path: Path) -> None:
    mounts = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        mp = line.split()[1].replace("\\040", " ")
        if mp == str(path) or mp.startswith(str(path) + "/"):
            mounts.append(mp)
    for mp in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", "-l", mp], capture_output=True, check=False)
    # network namespaces the CRI made for pods of this node
    for ns in Path("/var/run/netns").glob("cni-*") if Path("/var/run/netns").exists() else []:
        subprocess.run(["umount", "-l", str(ns)], capture_output=True, check=False)
        try:
            ns.unlink()
        except OSError:
            pass


# -- command line ---------------------------------------------------------------------------------


def _cli_up(cluster_dir: Path, images: list[str] | None) -> int:
    cst = cluster_cli.state(cluster_dir.absolute())
    if cst is None or not cst.get("startup_s"):
        print(f"no running cluster in {cluster_dir} (start one: make cluster-up)", file=sys.stderr)
        return 3
    run_dir = cluster_dir.absolute() / "node"
    st = json.loads((run_dir / STATE_FILE).read_text()) if (run_dir / STATE_FILE).exists() else None
    if st and st.get("startup_s") and all(_group_alive(p, str(run_dir)) or n.startswith("expose")
                                          for n, p in st["pgids"].items()):
        print(f"node already running in {run_dir}", file=sys.stderr)
        return 0
    if st:
        _cli_down(cluster_dir)
    m = missing(images)
    if m:
        print("node: missing " + "\n  ".join([""] + m), file=sys.stderr)
        return 2
    node = RealNode(cluster_dir, Path(cst["kubeconfig"]), cst["server"], run_dir, die_with_parent=False,
                    images=images)
    node.start()
    # KWOK's fake nodes stay, cordoned: real pods must land on the real node.
    from kubernetes import client

    api = _api(node.kubeconfig)
    core = client.CoreV1Api(api)
    for n in core.list_node(label_selector="type=kwok").items:
        core.patch_node(n.metadata.name, {"spec": {"unschedulable": True}})
    node.components.detach()  # `down` finds the groups in node.json
    node._lock_fd = None  # noqa: SLF001 - the lock dies with this process; down re-checks groups
    print(f"# node {NODE_NAME} up in {node.startup_s:.1f}s: {json.dumps(node.timings)}; "
          f"image imports (s): {json.dumps(node.image_import_s)}", file=sys.stderr)
    return 0


def _cli_down(cluster_dir: Path) -> int:
    run_dir = cluster_dir.absolute() / "node"
    p = run_dir / STATE_FILE
    if not p.exists():
        print(f"no {STATE_FILE} in {run_dir}: no node running", file=sys.stderr)
        _net_down()
        return 0
    st = json.loads(p.read_text())
    pg = st.get("pgids", {})
    if "kubelet" in pg and _group_alive(pg["kubelet"], str(run_dir)):
        kill_group(pg["kubelet"], STOP_GRACE_S)
    sock = Path(st["socket"])
    if "containerd" in pg and _group_alive(pg["containerd"], str(run_dir)):
        fake = RealNode(cluster_dir, Path("/dev/null"), "https://127.0.0.1:1", run_dir)
        fake._remove_all_containers()  # noqa: SLF001
    for name, pgid in pg.items():
        if name != "kubelet" and (_group_alive(pgid, str(run_dir)) or _group_alive(pgid, "socat")):
            kill_group(pgid, STOP_GRACE_S)
    _kill_runc_containers(_stale_runc_containers(run_dir))
    _kill_shims(sock)
    _unmount_under(run_dir)
    _net_down()
    shutil.rmtree(run_dir, ignore_errors=True)
    print(f"node in {run_dir} stopped", file=sys.stderr)
    return 0


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="node.py")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for c in ("up", "down"):
        sub.add_parser(c).add_argument("cluster_run_dir", type=Path)
    sub.choices["up"].add_argument("--image", action="append", dest="images",
                                   help="docker image to load (default: the step and example images)")
    sub.add_parser("check")
    sub.add_parser("preload", help="import the step and example images into the node's cached containerd store")
    a = ap.parse_args(argv)
    if a.cmd == "preload":
        done = preload_images()
        print("preload: nothing to import" if done is None else f"preload: imported {', '.join(done[0])} in {done[1]}s")
        return 0
    if a.cmd == "up":
        return _cli_up(a.cluster_run_dir, a.images)
    if a.cmd == "down":
        return _cli_down(a.cluster_run_dir)
    m = missing()
    for x in m:
        print("missing:", x, file=sys.stderr)
    return 1 if m else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
