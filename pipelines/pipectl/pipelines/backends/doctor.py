"""``pipectl doctor``: is this cluster and namespace ready to run pipectl's pipelines?

Compares the cluster with what ``argo/`` installs (the same :func:`~pipectl.pipelines.manifests.cluster_manifests`
that renders it) and checks what ``argo/`` cannot install: the API server's version, the Argo and
gang-launcher CRDs, Argo Workflows' version, Karpenter and the NodePools of ``argo/autoscaling/``
where Karpenter runs, the store's Secret and whether its key lists where the runs write
(:mod:`~pipectl.pipelines.backends.doctor_store`), GPU nodes, whether the store and MLflow answer (and how
fast the store answers a small request: :mod:`~pipectl.components.store_latency`), and the
MLflow credentials against what MLflow asks for (:mod:`~pipectl.pipelines.backends.doctor_mlflow`). Each
check is one :class:`Row` with a fix; ``fail`` rows make the command exit 1, ``warn`` rows do not.
"""

from __future__ import annotations

import http.client
import re
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable

from pipectl.components.names import STORE_CONFIGMAP, STORE_SECRET
from pipectl.pipelines.admission import PARAMETER_RULES_CONFIGMAP

MIN_KUBERNETES = (1, 30)
"""ValidatingAdmissionPolicy (``argo/cluster/admission/``) is GA from Kubernetes 1.30."""
ARGO_CRDS = ("workflows.argoproj.io", "workflowtemplates.argoproj.io", "cronworkflows.argoproj.io",
             "workflowtaskresults.argoproj.io")
MIN_ARGO = (3, 6)
"""What pipectl renders (Hera 7: CronWorkflow ``schedules``, ``mutexes``/``semaphores`` lists) needs
Argo Workflows >= 3.6; an older controller drops those fields."""
ARGO_CONTROLLER_SELECTOR = "app=workflow-controller"
"""The label Argo's install manifests give the controller's Deployment."""
KARPENTER_CRDS = ("nodepools.karpenter.sh", "nodeclaims.karpenter.sh")
ADMIN_APPLY = "kubectl apply --server-side -k argo/cluster (cluster admin)"
OWNER_APPLY = "kubectl apply --server-side -k argo/namespace (namespace owner)"


@dataclass(frozen=True)
class Row:
    """One check: ``status`` is ok, warn or fail; ``fix`` says what to run when it is not ok."""

    check: str
    status: str
    detail: str
    fix: str = ""


def _rendered(cfg: Any) -> list[tuple[str, dict]]:
    """(the kustomization that installs it, object) for what must exist: argo/cluster and
    argo/namespace without the controller's and Volcano's shared settings, monitoring and cron."""
    from pipectl.pipelines.manifests import CLUSTER_ADMIN_DIR, CRON_FILE, NAMESPACE_OWNER_DIR, cluster_manifests

    out = []
    for path, objects in cluster_manifests(cfg).items():
        top = path.split("/", 1)[0]
        if top not in (CLUSTER_ADMIN_DIR, NAMESPACE_OWNER_DIR) or path == CRON_FILE or "/monitoring/" in path:
            continue
        if "/controller/" in path or "/volcano/" in path:
            continue
        out += [(top, o) for o in objects]
    return out


class Doctor:
    """The checks against one cluster (``api``: a kubernetes ApiClient) for a :class:`CompileConfig`."""

    def __init__(self, api: Any, cfg: Any, *, argo_server: Any = None, network_timeout_s: float = 5.0) -> None:
        """``argo_server``: a :class:`~pipectl.pipelines.backends.kube.ArgoServer` to ask for Argo's
        version (None: the controller's Deployment is looked for instead)."""
        from kubernetes import dynamic

        self.api, self.cfg, self.timeout, self.argo_server = api, cfg, network_timeout_s, argo_server
        self.dynamic = dynamic.DynamicClient(api)
        self._crd_list: list[Any] | None = None

    def rows(self) -> list[Row]:
        checks: list[Callable[[], list[Row]]] = [self._version, self._crds, self._argo_version, self._objects,
                                                 self._namespace_labels, self._secret, self._store_key, self._gpu_nodes,
                                                 self._karpenter, self._services, self._mlflow_secret]
        out: list[Row] = []
        for check in checks:
            out += check()
        return out

    def _version(self) -> list[Row]:
        from kubernetes import client

        v = client.VersionApi(self.api).get_code()
        major, minor = int(v.major), int("".join(c for c in v.minor if c.isdigit()) or 0)
        ok = (major, minor) >= MIN_KUBERNETES
        return [Row("Kubernetes", "ok" if ok else "fail", f"{v.git_version}",
                    "" if ok else f"the admission policies need Kubernetes >= {MIN_KUBERNETES[0]}.{MIN_KUBERNETES[1]}")]

    def _crd_objects(self) -> list[Any]:
        """The cluster's CustomResourceDefinitions (listed once)."""
        from kubernetes import client

        if self._crd_list is None:
            self._crd_list = client.ApiextensionsV1Api(self.api).list_custom_resource_definition().items
        return self._crd_list

    def _crds(self) -> list[Row]:
        from pipectl.pipelines.launchers import LAUNCHERS

        launcher = LAUNCHERS[self.cfg.launcher]
        have = {c.metadata.name for c in self._crd_objects()}
        rows = []
        for what, names, fix in (
            ("Argo Workflows CRDs", ARGO_CRDS, "install Argo Workflows (>= 3.6; pipectl renders for v4)"),
            (f"gang launcher CRDs ({self.cfg.launcher})", launcher.required_crds(),
             f"install the {self.cfg.launcher} launcher's operator, or render with another --launcher"),
        ):
            missing = [n for n in names if n not in have]
            rows.append(Row(what, "fail" if missing else "ok", f"missing: {', '.join(missing)}" if missing else ", ".join(names),
                            fix if missing else ""))
        return rows

    def _argo_version(self) -> list[Row]:
        """Argo Workflows' version, from the Argo Server when one is given (``ARGO_SERVER``), else
        from the image tag of the controller's Deployment (:data:`ARGO_CONTROLLER_SELECTOR`)."""
        check, least = "Argo Workflows version", f">= {MIN_ARGO[0]}.{MIN_ARGO[1]}"
        found = self._argo_server_version() or self._controller_version()
        if found is None:
            return [Row(check, "warn", f"not found: no Argo Server given and no Deployment labelled {ARGO_CONTROLLER_SELECTOR} to read",
                        f"check that `argo version` says {least}, or set ARGO_SERVER (and ARGO_TOKEN) so doctor asks the Argo Server")]
        version, where = found
        release = _release(version)
        if release is None:
            return [Row(check, "warn", f"{version} ({where}): not a release number", f"check that it is {least}")]
        if release < MIN_ARGO:
            return [Row(check, "fail", f"{version} ({where})",
                        f"upgrade Argo Workflows to {least}: older controllers drop fields pipectl renders "
                        "(CronWorkflow schedules, mutex and semaphore lists)")]
        return [Row(check, "ok", f"{version} ({where})")]

    def _argo_server_version(self) -> tuple[str, str] | None:
        from pipectl.components.errors import PipectlError

        if self.argo_server is None:
            return None
        try:
            version = self.argo_server.version().get("version", "")
        except PipectlError:
            return None  # not answering: the controller's Deployment may still tell
        return (version, f"Argo Server {self.argo_server.base}") if version else None

    def _controller_version(self) -> tuple[str, str] | None:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        try:
            deployments = client.AppsV1Api(self.api).list_deployment_for_all_namespaces(
                label_selector=ARGO_CONTROLLER_SELECTOR).items
        except ApiException as e:
            if e.status == 403:  # may not list Deployments cluster-wide: not known
                return None
            raise
        for d in deployments:
            for c in d.spec.template.spec.containers:
                name, _, tag = (c.image or "").partition("@")[0].rpartition(":")
                if "workflow-controller" in name and tag and "/" not in tag:
                    return tag, f"Deployment {d.metadata.namespace}/{d.metadata.name}"
        return None

    def _get(self, obj: dict) -> bool:
        from kubernetes.dynamic.exceptions import NotFoundError, ResourceNotFoundError

        try:
            res = self.dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
            res.get(name=obj["metadata"]["name"], namespace=obj["metadata"].get("namespace"))
            return True
        except (NotFoundError, ResourceNotFoundError):
            return False

    def _objects(self) -> list[Row]:
        """One row per kind of object argo/ installs: which are missing, and the apply that adds them."""
        by_kind: dict[str, tuple[str, list[str], list[str]]] = {}
        for top, obj in _rendered(self.cfg):
            where, present, missing = by_kind.setdefault(obj["kind"], (top, [], []))
            (present if self._get(obj) else missing).append(obj["metadata"]["name"])
        rows = []
        for kind, (top, present, missing) in by_kind.items():
            fix = ("pipectl templates apply" if kind == "WorkflowTemplate" else ADMIN_APPLY if top == "cluster" else OWNER_APPLY)
            if PARAMETER_RULES_CONFIGMAP in missing:  # without it the submission policy refuses every run here
                fix += f" (or pipectl templates apply, which creates {PARAMETER_RULES_CONFIGMAP})"
            rows.append(Row(kind, "fail" if missing else "ok",
                            f"missing: {', '.join(missing)}" if missing else ", ".join(present), fix if missing else ""))
        return rows

    def _namespace_labels(self) -> list[Row]:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        from pipectl.pipelines.manifests import namespace

        wanted = namespace(self.cfg)[0]["metadata"]["labels"]
        try:
            labels = client.CoreV1Api(self.api).read_namespace(self.cfg.namespace).metadata.labels or {}
        except ApiException as e:
            if e.status != 404:
                raise
            return []  # the Namespace row already says it is missing
        wrong = sorted(k for k, v in wanted.items() if labels.get(k) != v)
        return [Row(f"namespace {self.cfg.namespace} labels", "fail" if wrong else "ok",
                    f"not as argo/ sets them: {', '.join(wrong)}" if wrong else "Pod Security restricted, submission policy, lanes",
                    ADMIN_APPLY if wrong else "")]

    def _secret(self) -> list[Row]:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        fix = (f"kubectl -n {self.cfg.namespace} create secret generic {STORE_SECRET} "
               "--from-literal=PIPECTL_S3_ACCESS_KEY=... --from-literal=PIPECTL_S3_SECRET_KEY=...")
        try:
            data = client.CoreV1Api(self.api).read_namespaced_secret(STORE_SECRET, self.cfg.namespace).data or {}
        except ApiException as e:
            if e.status == 403:
                return [Row("store credentials", "warn", f"not allowed to read Secret {STORE_SECRET}: not checked")]
            if e.status == 404:
                return [Row("store credentials", "fail", f"Secret {STORE_SECRET} missing", fix)]
            raise
        missing = [k for k in ("PIPECTL_S3_ACCESS_KEY", "PIPECTL_S3_SECRET_KEY") if k not in data]
        return [Row("store credentials", "fail" if missing else "ok",
                    f"Secret {STORE_SECRET} lacks {', '.join(missing)}" if missing else f"Secret {STORE_SECRET}", fix if missing else "")]

    def _store_key(self) -> list[Row]:
        """The store Secret's key asked to list the namespace's store root (:mod:`doctor_store`)."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        from pipectl.pipelines.backends.doctor_store import CHECK, key_row

        core = client.CoreV1Api(self.api)
        try:
            endpoint = (core.read_namespaced_config_map(STORE_CONFIGMAP, self.cfg.namespace).data or {}).get("PIPECTL_S3_ENDPOINT")
            secret = core.read_namespaced_secret(STORE_SECRET, self.cfg.namespace).data or {}
        except ApiException as e:
            if e.status in (403, 404):
                return []  # the ConfigMap and store credentials rows say what is missing or unreadable
            raise
        found = key_row(endpoint, secret, self.cfg.store_root(), self.timeout) if endpoint else None
        return [Row(CHECK, *found)] if found is not None else []

    def _gpu_nodes(self) -> list[Row]:
        from kubernetes import client

        nodes = client.CoreV1Api(self.api).list_node().items
        gpus = sum(_gpus(n) for n in nodes)
        with_gpus = sum(1 for n in nodes if _gpus(n) > 0)
        placement = [topology_row(nodes, self.cfg.topology)] if self.cfg.topology is not None else []
        if gpus:
            return [Row("GPU nodes", "ok", f"{with_gpus} of {len(nodes)} nodes, {gpus} GPUs allocatable"), _urgent_reserve(nodes)] + placement
        return [Row("GPU nodes", "warn", f"none of {len(nodes)} nodes has nvidia.com/gpu now",
                    "fine with an autoscaler that adds GPU nodes (argo/autoscaling/); else install the NVIDIA device plugin")] + placement

    def _karpenter(self) -> list[Row]:
        """Where Karpenter runs: the NodePools ``argo/autoscaling/karpenter`` installs and the node
        class they launch with (the site's ``autoscaling.node_class``)."""
        from pipectl.pipelines.manifests import KARPENTER_DIR, cluster_manifests

        crds = {c.metadata.name: c for c in self._crd_objects()}
        if not all(n in crds for n in KARPENTER_CRDS):
            return [Row("Karpenter", "ok", f"not installed: {KARPENTER_DIR} does not apply (GPU nodes come from elsewhere)")]
        pools = cluster_manifests(self.cfg)[f"{KARPENTER_DIR}/nodepools.yaml"]
        missing = [p["metadata"]["name"] for p in pools if not self._get(p)]
        rows = [Row("Karpenter NodePools", "fail" if missing else "ok",
                    f"missing: {', '.join(missing)}" if missing else ", ".join(p["metadata"]["name"] for p in pools),
                    f"kubectl apply --server-side -k argo/{KARPENTER_DIR}" if missing else "")]
        return rows + [self._node_class(list(crds.values()))]

    def _node_class(self, crds: list[Any]) -> Row:
        ref, check = self.cfg.autoscaling.node_class, "Karpenter node class"
        what = f"{ref.kind} {ref.name} ({ref.group})"
        crd = next((c for c in crds if c.spec.group == ref.group and c.spec.names.kind == ref.kind), None)
        if crd is None:
            return Row(check, "fail", f"{ref.kind} ({ref.group}) is not a kind of this cluster",
                       "name your Karpenter provider's node class in the site file (autoscaling.node_class), "
                       "then render argo/ again")
        served = next(v.name for v in crd.spec.versions if v.storage)
        if not self._get({"apiVersion": f"{ref.group}/{served}", "kind": ref.kind, "metadata": {"name": ref.name}}):
            return Row(check, "fail", f"{what} missing",
                       "create it (your Karpenter provider's docs), or name yours in the site file: autoscaling.node_class.name")
        return Row(check, "ok", what)

    def _services(self) -> list[Row]:
        """The store and MLflow named in the namespace's store ConfigMap, asked over HTTP from this
        machine (a cluster-internal name may not resolve here: warn, not fail; from the namespace's
        own network: :mod:`~pipectl.pipelines.backends.probe`)."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        try:
            data = client.CoreV1Api(self.api).read_namespaced_config_map(STORE_CONFIGMAP, self.cfg.namespace).data or {}
        except ApiException as e:
            if e.status != 404:
                raise
            return []  # the ConfigMap row already says it is missing
        rows = []
        for what, key, path in (("object store", "PIPECTL_S3_ENDPOINT", "/"), ("MLflow", "PIPECTL_MLFLOW_URI", "/health")):
            url = data.get(key)
            if not url:
                rows.append(Row(what, "fail", f"{key} not set in ConfigMap {STORE_CONFIGMAP}", OWNER_APPLY))
                continue
            rows.append(self._answers(what, url.rstrip("/") + path))
            if key == "PIPECTL_S3_ENDPOINT" and rows[-1].status == "ok":
                rows.append(self._latency(url))
        return rows

    def _latency(self, url: str) -> Row:
        """The store's answer time for a small request (:mod:`~pipectl.components.store_latency`)."""
        from pipectl.components.store_latency import small_request_ms, verdict

        try:
            ms = small_request_ms(url, timeout_s=self.timeout)
        except (OSError, http.client.HTTPException) as e:
            return Row("object store latency", "warn", f"not measured: {e}")
        return Row("object store latency", *verdict(ms))

    def _mlflow_secret(self) -> list[Row]:
        """The namespace's MLflow credentials against what its MLflow asks for (:mod:`doctor_mlflow`)."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        from pipectl.components.names import MLFLOW_SECRET
        from pipectl.pipelines.backends.doctor_mlflow import CHECK, credentials_row

        core = client.CoreV1Api(self.api)
        try:
            uri = (core.read_namespaced_config_map(STORE_CONFIGMAP, self.cfg.namespace).data or {}).get("PIPECTL_MLFLOW_URI")
        except ApiException as e:
            if e.status != 404:
                raise
            uri = None
        try:
            secret: dict[str, str] | None = core.read_namespaced_secret(MLFLOW_SECRET, self.cfg.namespace).data or {}
        except ApiException as e:
            if e.status == 403:
                return [Row(CHECK, "warn", f"not allowed to read Secret {MLFLOW_SECRET}: not checked")]
            if e.status != 404:
                raise
            secret = None
        return [Row(CHECK, *credentials_row(uri, secret, self.cfg.namespace, self.timeout))]

    def _answers(self, what: str, url: str) -> Row:
        try:
            with urllib.request.urlopen(url, timeout=self.timeout):
                pass
        except urllib.error.HTTPError:
            pass  # it answered (an S3 endpoint answers 403 to an anonymous GET)
        except (OSError, ValueError) as e:
            reason = getattr(e, "reason", e)
            return Row(what, "warn", f"{url} did not answer from this machine ({reason})",
                       "a cluster-internal name does not resolve outside the cluster: pipectl doctor --from-pod asks from a pod "
                       "in the namespace")
        return Row(what, "ok", f"{url} answers from this machine")


def _release(version: str) -> tuple[int, int] | None:
    """(major, minor) of a version such as ``v4.0.5``, ``v3.6.2+abc`` or ``3.6``; None when it is none (``latest``)."""
    m = re.match(r"v?(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _gpus(node: Any) -> int:
    return int((node.status.allocatable or {}).get("nvidia.com/gpu", "0"))


def _urgent_reserve(nodes: list) -> Row:
    """GPU nodes only the urgent lane may use (taint ``pipectl.io/lane=urgent:NoSchedule``, not
    cordoned). Without them an urgent gang gets its GPUs by evicting lower-lane gangs, and a gang
    evicted in part restarts whole: on the test cluster full of 128-pod batch gangs, a 16-GPU
    urgent gang left 1,024 GPUs idle until it ended (Volcano picks victims without regard to the
    size of their gang). With a reserve it binds in Volcano's first action and evicts nothing."""
    from pipectl.components.names import LANE_TAINT_KEY
    from pipectl.pipelines.policy import Lane

    reserved = [n for n in nodes if _gpus(n) and not n.spec.unschedulable and any(
        t.key == LANE_TAINT_KEY and t.value == Lane.urgent.value and t.effect == "NoSchedule" for t in (n.spec.taints or []))]
    if reserved:
        return Row("urgent reserve", "ok", f"{len(reserved)} GPU node{'s' * (len(reserved) != 1)}, {sum(_gpus(n) for n in reserved)} GPUs only the urgent lane uses")
    return Row("urgent reserve", "warn",
               "no GPU node is reserved for the urgent lane: an urgent gang takes its GPUs by evicting lower-lane gangs, "
               "each restarting whole (a 128-pod batch gang for a 16-GPU urgent gang)",
               f"reserve nodes for the urgent lane's usual gang: kubectl taint nodes NODE {LANE_TAINT_KEY}={Lane.urgent.value}:NoSchedule "
               "(autoscaled clusters: the pipectl-urgent-buffer NodePool of argo/autoscaling/)")


def topology_row(nodes: list, topology: Any) -> Row:
    """Whether the nodes carry the site's topology label (:mod:`pipectl.pipelines.topology`): a
    ``required`` placement never lands a gang pod on a node without it, and a label no node has
    places nothing. GPU nodes are counted when there are any, else every node."""
    key, check = topology.key, f"topology {topology.key}"
    pool = [n for n in nodes if _gpus(n)] or nodes
    labelled = [n for n in pool if key in (n.metadata.labels or {})]
    domains = {n.metadata.labels[key] for n in labelled}
    fix = f"label each node with its network domain (kubectl label nodes NODE {key}=DOMAIN), or set the site's topology.key to the label the cluster has"
    what = f"{len(labelled)} of {len(pool)} {'GPU ' if pool is not nodes else ''}nodes carry it, {len(domains)} domain{'s' * (len(domains) != 1)}"
    if not labelled:
        return Row(check, "fail" if topology.mode == "required" else "warn",
                   f"{what}: " + ("no gang pod can be placed" if topology.mode == "required" else "the placement does nothing"), fix)
    if len(labelled) < len(pool) and topology.mode == "required":
        return Row(check, "warn", f"{what}: gang pods never land on the others (required)", fix)
    return Row(check, "ok", what)
