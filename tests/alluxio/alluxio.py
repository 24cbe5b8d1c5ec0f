"""A real Alluxio (master, job master, worker, job worker, S3/REST proxy) on 127.0.0.1, for tests.

Assembled from Alluxio's own artifacts on Maven Central (org.alluxio 2.9.4, the last 2.x
open-source release served there): a throwaway pom that depends on the server, job server,
proxy and under-storage modules, ``mvn dependency:copy-dependencies``, then each process is
``java -cp <those jars> <main class>``, as ``bin/alluxio-start.sh`` would run it. The jars are
cached under ``~/.cache/pipectl/alluxio-<version>/lib`` (~180 MB; ~45 s to fetch cold).

Layout inside Alluxio: the root mount is a local folder (``run_dir/underfs``); each bucket of the
object store is mounted at ``/<bucket>`` -> ``s3://<bucket>/`` (:meth:`mount_bucket`), so
Alluxio's S3 proxy serves the same bucket and key names as the gateway behind it.

Settings that mattered (found by running it against Ceph 16.2 RGW):
- ``alluxio.underfs.s3.signer.algorithm=S3SignerType``: with the default SigV4 signer the AWS
  SDK v1 inside Alluxio gets ``XAmzContentSHA256Mismatch`` from RGW on PUTs.
- ``alluxio.proxy.s3.v2.version.enabled=false``: with the v2 S3 handler (2.9's default) every
  ``/api/v1/paths/...`` REST call answers 200 with an empty body and does nothing.
- the job master's REST API takes ``BatchedJobConfig`` JSON with Jackson class ids
  (``"@type": "alluxio.job.plan.load.LoadConfig"``) and the property ``jobConfig`` (singular);
  a Load of a folder completes having loaded nothing, so files are listed and loaded in batches
  (what ``alluxio fs distributedLoad`` does).
- ``alluxio.master.update.check.enabled=false`` (else it probes EC2 metadata at start).
- logging: Alluxio 2.9 logs through log4j 1 (reload4j); log4j-slf4j-impl is left off the
  classpath so SLF4J binds to it.

Usage::

    with AlluxioCluster(tmp / "alluxio", s3_endpoint=..., access_key=..., secret_key=...) as ax:
        ax.mount_bucket("pipectl")
        ax.proxy_url, ax.job_master_url   # -> StoreSettings.alluxio_proxy_url / alluxio_job_master_url
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from pipectl.pipelines.backends.processes import free_ports
from tests.harness.components import Components

ALLUXIO_VERSION = "2.9.4"
CACHE = Path(os.environ.get("PIPECTL_CACHE_DIR", Path.home() / ".cache" / "pipectl")) / f"alluxio-{ALLUXIO_VERSION}"
MODULES = [
    "alluxio-core-server-master", "alluxio-core-server-worker", "alluxio-core-server-proxy",
    "alluxio-job-server", "alluxio-underfs-s3a", "alluxio-underfs-local", "alluxio-shell",
]
PROCESSES = {  # name -> main class (as bin/alluxio-start.sh runs them)
    "master": "alluxio.master.AlluxioMaster",
    "job_master": "alluxio.master.AlluxioJobMaster",
    "worker": "alluxio.worker.AlluxioWorker",
    "job_worker": "alluxio.worker.AlluxioJobWorker",
    "proxy": "alluxio.proxy.AlluxioProxy",
}


class AlluxioUnavailable(RuntimeError):
    """java/mvn missing or the artifacts could not be fetched: the message says which."""


class AlluxioStartError(RuntimeError):
    pass


def ensure_built(timeout_s: float = 900) -> list[Path]:
    """The jars of Alluxio ``ALLUXIO_VERSION`` (fetched once with Maven, then cached). Raises
    AlluxioUnavailable naming what is missing (java, mvn) or mvn's error."""
    lib = CACHE / "lib"
    done = CACHE / "complete"
    if not done.exists():
        for tool, pkg in (("java", "default-jre-headless"), ("mvn", "maven")):
            if shutil.which(tool) is None:
                raise AlluxioUnavailable(f"{tool} is missing; Debian package not installed: {pkg}")
        CACHE.mkdir(parents=True, exist_ok=True)
        deps = "\n".join(
            f"<dependency><groupId>org.alluxio</groupId><artifactId>{m}</artifactId><version>{ALLUXIO_VERSION}</version></dependency>"
            for m in MODULES)
        (CACHE / "pom.xml").write_text(f"""<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>pipectl.throwaway</groupId><artifactId>alluxio-assembly</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies>{deps}</dependencies>
</project>
""")
        shutil.rmtree(lib, ignore_errors=True)
        r = subprocess.run(["mvn", "-B", "-q", "dependency:copy-dependencies", f"-DoutputDirectory={lib}",
                            "-DincludeScope=runtime"], cwd=CACHE, capture_output=True, text=True, timeout=timeout_s)
        if r.returncode != 0:
            raise AlluxioUnavailable(f"mvn could not fetch Alluxio {ALLUXIO_VERSION}: {(r.stdout + r.stderr)[-2000:]}")
        done.write_text(ALLUXIO_VERSION)
    # log4j 1 (reload4j) is what Alluxio 2.9 configures; keep the log4j 2 binding off the path
    return sorted(p for p in lib.glob("*.jar") if not p.name.startswith("log4j-slf4j-impl"))


def _http(method: str, url: str, body: object | None = None, timeout_s: float = 30) -> bytes:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        return r.read()


class AlluxioCluster:
    """Five Alluxio JVMs over an S3 under-store; a context manager. See the module docstring."""

    def __init__(self, run_dir: Path, *, s3_endpoint: str, access_key: str, secret_key: str,
                 worker_mem_bytes: int = 1 << 30, heap_mb: int = 384, start_timeout_s: float = 180) -> None:
        self.run_dir = Path(run_dir).absolute()
        self.s3_endpoint, self.access_key, self.secret_key = s3_endpoint, access_key, secret_key
        self.worker_mem_bytes = worker_mem_bytes
        self.heap_mb = heap_mb
        self.start_timeout_s = start_timeout_s
        self.components = Components(self.run_dir / "logs")
        self.ports: dict[str, int] = {}
        self.startup_s: float | None = None

    @property
    def procs(self) -> dict[str, subprocess.Popen]:
        """Running JVMs: name (a key of PROCESSES) -> process."""
        return self.components.procs

    @property
    def proxy_url(self) -> str:
        """The proxy's base URL: S3 API under ``/api/v1/s3``, file-system REST under ``/api/v1/paths``."""
        return f"http://127.0.0.1:{self.ports['proxy.web']}"

    @property
    def job_master_url(self) -> str:
        """The job master's web/REST base URL (``/api/v1/master/job/...``)."""
        return f"http://127.0.0.1:{self.ports['job.master.web']}"

    @property
    def master_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['master.web']}"

    def master_info(self) -> dict:
        """``GET /api/v1/master/info``: capacity (bytes used/total), mount points, version."""
        return json.loads(_http("GET", self.master_url + "/api/v1/master/info"))

    def mount_bucket(self, bucket: str) -> None:
        """Mount ``s3://<bucket>/`` at ``/<bucket>`` (the bucket must exist in the under-store)."""
        _http("POST", f"{self.proxy_url}/api/v1/paths//{bucket}/mount?src=s3://{bucket}/", {})
        if f"/{bucket}" not in self.master_info().get("mountPoints", {}):
            raise AlluxioStartError(f"mounting s3://{bucket}/ at /{bucket} did not take; see {self.run_dir}/logs")

    def start(self) -> AlluxioCluster:
        jars = ensure_built()
        if self.run_dir.exists() and any(self.run_dir.iterdir()):
            raise AlluxioStartError(f"run_dir {self.run_dir} is not empty")
        t0 = time.monotonic()
        for d in ("conf", "logs", "journal", "underfs", "ramdisk"):
            (self.run_dir / d).mkdir(parents=True, exist_ok=True)
        (self.run_dir / "underfs" / "ready.txt").write_text("ready\n")
        names = ["master.rpc", "master.web", "master.embedded.journal", "job.master.rpc", "job.master.web",
                 "job.master.embedded.journal", "worker.rpc", "worker.web", "job.worker.rpc", "job.worker.data",
                 "job.worker.web", "proxy.web"]
        self.ports = dict(zip(names, free_ports(len(names))))
        self._write_conf()
        self._classpath = ":".join(str(j) for j in jars)
        try:
            fmt = subprocess.run(self._java("alluxio.cli.Format", "master"), capture_output=True, text=True, timeout=120)
            if fmt.returncode != 0:
                raise AlluxioStartError(f"alluxio Format master failed: {(fmt.stdout + fmt.stderr)[-2000:]}")
            for name, cls in PROCESSES.items():
                self.components.start(name, self._java(cls))
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - t0
        return self

    def stop(self) -> None:
        """SIGKILL every JVM with its process tree (throwaway state)."""
        self.components.stop_all()

    def __enter__(self) -> AlluxioCluster:  # noqa: PYI034
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def rss_bytes(self) -> int:
        page = os.sysconf("SC_PAGE_SIZE")
        total = 0
        for p in self.procs.values():
            try:
                total += int(Path(f"/proc/{p.pid}/statm").read_text().split()[1]) * page
            except (OSError, ValueError, IndexError):
                pass
        return total

    # -- internals

    def _java(self, cls: str, *args: str) -> list[str]:
        c = self.run_dir / "conf"
        return ["java", f"-Xmx{self.heap_mb}m", f"-Dalluxio.home={self.run_dir}", f"-Dalluxio.conf.dir={c}",
                f"-Dalluxio.logs.dir={self.run_dir / 'logs'}", f"-Dlog4j.configuration=file:{c / 'log4j.properties'}",
                "-cp", self._classpath, cls, *args]

    def _write_conf(self) -> None:
        p, r = self.ports, self.run_dir
        mem = f"{self.worker_mem_bytes // (1 << 20)}MB"
        conf = {
            "alluxio.home": r,
            "alluxio.master.hostname": "127.0.0.1", "alluxio.worker.hostname": "127.0.0.1",
            "alluxio.job.master.hostname": "127.0.0.1", "alluxio.job.worker.hostname": "127.0.0.1",
            "alluxio.proxy.s3.hostname": "127.0.0.1", "alluxio.user.hostname": "127.0.0.1",
            "alluxio.master.rpc.port": p["master.rpc"], "alluxio.master.web.port": p["master.web"],
            "alluxio.master.embedded.journal.port": p["master.embedded.journal"],
            "alluxio.job.master.rpc.port": p["job.master.rpc"], "alluxio.job.master.web.port": p["job.master.web"],
            "alluxio.job.master.embedded.journal.port": p["job.master.embedded.journal"],
            "alluxio.worker.rpc.port": p["worker.rpc"], "alluxio.worker.web.port": p["worker.web"],
            "alluxio.job.worker.rpc.port": p["job.worker.rpc"], "alluxio.job.worker.data.port": p["job.worker.data"],
            "alluxio.job.worker.web.port": p["job.worker.web"], "alluxio.proxy.web.port": p["proxy.web"],
            "alluxio.master.journal.type": "UFS", "alluxio.master.journal.folder": r / "journal",
            "alluxio.master.mount.table.root.ufs": r / "underfs",
            "s3a.accessKeyId": self.access_key, "s3a.secretKey": self.secret_key,
            "alluxio.underfs.s3.endpoint": self.s3_endpoint, "alluxio.underfs.s3.endpoint.region": "us-east-1",
            "alluxio.underfs.s3.disable.dns.buckets": "true", "alluxio.underfs.s3.inherit.acl": "false",
            "alluxio.underfs.s3.signer.algorithm": "S3SignerType",
            "alluxio.worker.ramdisk.size": mem, "alluxio.worker.tieredstore.levels": 1,
            "alluxio.worker.tieredstore.level0.alias": "MEM",
            "alluxio.worker.tieredstore.level0.dirs.path": r / "ramdisk",
            "alluxio.worker.tieredstore.level0.dirs.quota": mem,
            "alluxio.security.authentication.type": "NOSASL",
            "alluxio.security.authorization.permission.enabled": "false",
            "alluxio.master.update.check.enabled": "false",
            "alluxio.proxy.s3.v2.version.enabled": "false",
            "alluxio.network.ip.address.used": "true",
        }
        (r / "conf" / "alluxio-site.properties").write_text("".join(f"{k}={v}\n" for k, v in conf.items()))
        (r / "conf" / "log4j.properties").write_text(
            "log4j.rootLogger=INFO, console\n"
            "log4j.appender.console=org.apache.log4j.ConsoleAppender\n"
            "log4j.appender.console.layout=org.apache.log4j.PatternLayout\n"
            "log4j.appender.console.layout.ConversionPattern=%d{ISO8601} %-5p [%t] %c{1}: %m%n\n"
            "log4j.logger.com.amazonaws=WARN\n")

    def _load_completed(self, job: dict) -> bool:
        """One readiness probe: submit (or re-submit) a Load of /ready.txt, True once it completed
        and the proxy answers a REST call. ``job["id"]`` carries the job between probes."""
        if job.get("id") is None:
            job["id"] = int(_http("POST", self.job_master_url + "/api/v1/master/job/run",
                                  {"@type": "alluxio.job.plan.load.LoadConfig", "filePath": "/ready.txt",
                                   "replication": 1}))
        status = json.loads(_http("GET", f"{self.job_master_url}/api/v1/master/job/get_status?jobId={job['id']}"))
        if status["status"] == "COMPLETED":
            _http("POST", f"{self.proxy_url}/api/v1/paths//ready.txt/get-status", {})
            return True
        if status["status"] in ("FAILED", "CANCELED"):
            job["id"] = None  # e.g. no job worker registered yet: submit again
        return False

    def _wait_ready(self) -> None:
        """Ready = a Load job of a file in the root mount completes: master, job master, job
        worker and block worker all registered; then the proxy answers a REST call."""
        job: dict = {}
        self.components.wait("alluxio", lambda: self._load_completed(job), self.start_timeout_s,
                             error=AlluxioStartError, poll_s=0.5)
