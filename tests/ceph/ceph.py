"""A real single-node Ceph (mon, mgr, one memstore OSD, RADOS Gateway) on 127.0.0.1, for tests.

Built from Debian's packages (bookworm: Ceph 16.2.15 Pacific). Everything lives under one run
folder: config, mon store, OSD/mgr/RGW data, logs, admin sockets, pid files. Each daemon runs in
the foreground (``-f``) in its own process group; ``stop()`` kills those groups and removes the
run folder (only that folder, and only if this object created it from empty).

Usage::

    from tests.ceph.ceph import CephCluster, ensure_installed

    ensure_installed()                      # clear error naming missing Debian packages
    with CephCluster(tmp_path / "ceph") as ceph:
        s3 = boto3.client("s3", endpoint_url=ceph.s3_endpoint,
                          aws_access_key_id=ceph.access_key,
                          aws_secret_access_key=ceph.secret_key, config=ceph.boto_config())

Settings that a loopback single-node Ceph needs (auth none + ``ms mon client mode = crc``,
``paxos propose interval = 0.05``, memstore with 4 GiB device bytes, size-1 pools with 8 PGs,
``rgw gc obj min wait = 30``, readiness = the RGW HTTP port answering).

Command line (used by scripts/ceph-up.sh and scripts/ceph-down.sh)::

    python3 tests/ceph/ceph.py up RUN_DIR [--cephfs] [--mount DIR]  # start detached, print exports
    python3 tests/ceph/ceph.py down RUN_DIR   # kill the daemons recorded in RUN_DIR, remove it
    python3 tests/ceph/ceph.py check [--cephfs]  # exit 1 naming missing Debian packages
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if __name__ == "__main__":  # run as a script: import from the repository, not this folder
    sys.path[0] = str(ROOT)
    try:
        import pipectl.pipelines.backends.processes  # noqa: F401
    except ImportError:  # scripts/ceph-*.sh run the system python3: re-run with the project's venv
        if (ROOT / ".venv" / "bin" / "python").exists():
            os.execv(ROOT / ".venv" / "bin" / "python", [str(ROOT / ".venv" / "bin" / "python"), *sys.argv])
try:  # processes through the product's one supervisor (tests/harness/components.py)
    from pipectl.pipelines.backends.processes import free_ports, kill_group
    from tests.harness.components import Components
except ImportError:  # no venv: `check` still works, `up`/`down` say what is missing
    Components = None  # type: ignore[assignment,misc]

# binary -> Debian package that ships it
REQUIRED_BINARIES: dict[str, str] = {
    "ceph-mon": "ceph-mon",
    "monmaptool": "ceph-base",
    "ceph-mgr": "ceph-mgr",
    "ceph-osd": "ceph-osd",
    "radosgw": "radosgw",
    "radosgw-admin": "ceph-common",
    "ceph": "ceph-common",
}
CEPHFS_BINARIES: dict[str, str] = {"ceph-mds": "ceph-mds", "ceph-fuse": "ceph-fuse"}
DEBIAN_PACKAGES = ["ceph-mon", "ceph-mgr", "ceph-osd", "radosgw", "ceph-common"]

MGR_DISABLED_MODULES = [
    "alerts", "diskprediction_local", "influx", "insights", "localpool", "mirroring", "nfs",
    "osd_perf_query", "osd_support", "prometheus", "restful", "selftest", "snap_schedule",
    "stats", "telegraf", "test_orchestrator", "zabbix",
]
CEPHFS_NAME = "cephfs"
STOP_ORDER = ["client.rgw.gw", "mds.a", "mgr.x", "osd.0", "mon.a"]
STATE_FILE = "cluster.json"  # written into run_dir; lets `down` find the daemons again


class CephNotInstalled(RuntimeError):
    pass


class CephStartError(RuntimeError):
    pass


def missing_packages(cephfs: bool = False) -> list[str]:
    """Debian packages whose binaries are absent from PATH (sorted, de-duplicated)."""
    need = dict(REQUIRED_BINARIES)
    if cephfs:
        need.update(CEPHFS_BINARIES)
    return sorted({pkg for binary, pkg in need.items() if shutil.which(binary) is None})


def ensure_installed(cephfs: bool = False) -> None:
    """Raise CephNotInstalled naming the missing Debian packages. Never installs anything."""
    missing = missing_packages(cephfs)
    if missing:
        pkgs = sorted(set(DEBIAN_PACKAGES + (["ceph-mds", "ceph-fuse"] if cephfs else [])))
        raise CephNotInstalled(
            "Ceph binaries are missing; Debian package(s) not installed: "
            + " ".join(missing)
            + ". Install with: apt-get install -y --no-install-recommends "
            + " ".join(pkgs)
            + " (or run scripts/ceph-up.sh, which installs them)"
        )


def _child_env() -> dict[str, str]:
    # Ceph's CLI and ceph-mgr embed the system python3; a venv's PYTHONPATH/HOME must not leak in.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "CEPH_ARGS")}
    env["PATH"] = "/usr/bin:/usr/sbin:/bin:/sbin:" + env.get("PATH", "")
    return env


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _need_harness() -> None:
    if Components is None:
        raise CephNotInstalled("the project's virtual environment is missing (run scripts/setup.sh): "
                               "the test harness starts processes with pipectl's supervisor")


class CephCluster:
    """Single-node Ceph with an S3 gateway; a context manager. See the module docstring."""

    daemons = ("mon.a", "mgr.x", "osd.0", "client.rgw.gw")

    def __init__(
        self,
        run_dir: Path,
        *,
        memstore_bytes: int = 4 << 30,
        start_timeout_s: float = 60.0,
        remove_on_stop: bool = True,
        cephfs: bool = False,
        tcp_nodelay: bool = True,
    ) -> None:
        """``tcp_nodelay``: the RGW frontend's option (as production should set it); False gives
        the default, Nagle's algorithm on, where a small GET waits ~40 ms for a delayed ACK."""
        self.run_dir = Path(run_dir).absolute()
        self.tcp_nodelay = tcp_nodelay
        self.memstore_bytes = memstore_bytes
        self.start_timeout_s = start_timeout_s
        self.remove_on_stop = remove_on_stop
        self.cephfs = cephfs
        self.fsid = str(uuid.uuid4())
        self.mon_v2_port = 0
        self.mon_v1_port = 0
        self.rgw_port = 0
        self.access_key = ""
        self.secret_key = ""
        self.conf_path = self.run_dir / "ceph.conf"
        _need_harness()
        # stdout of each daemon in log/<name>.stdout (the daemon's own log is log/<name>.log)
        self.components = Components(self.run_dir / "log", log_suffix=".stdout", cwd=self.run_dir,
                                     base_env=_child_env, on_change=self._save_state, tail=self._tail)
        self.startup_s: float | None = None
        self._created_run_dir = False
        self._mounts: list[Path] = []
        self.timings: dict[str, float] = {}
        self._t0 = 0.0

    # -- public API -------------------------------------------------------------------------

    @property
    def procs(self) -> dict[str, subprocess.Popen]:
        """Running daemons: name -> process (its pid is its process group id)."""
        return self.components.procs

    @property
    def s3_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.rgw_port}"

    @property
    def mon_host(self) -> str:
        return f"[v2:127.0.0.1:{self.mon_v2_port},v1:127.0.0.1:{self.mon_v1_port}]"

    def boto_config(self):
        """botocore Config that Pacific's RGW accepts (path-style, checksums only when required)."""
        from botocore.config import Config

        return Config(
            s3={"addressing_style": "path"},
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            retries={"max_attempts": 5, "mode": "standard"},
        )

    def s3_client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.s3_endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name="us-east-1",
            config=self.boto_config(),
        )

    def env(self) -> dict[str, str]:
        """Variables for tools that talk to this cluster (ceph CLI, AWS SDKs)."""
        return {
            "CEPH_CONF": str(self.conf_path),
            "AWS_ENDPOINT_URL": self.s3_endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def ceph(self, *args: str, timeout_s: float = 30.0) -> str:
        """Run the `ceph` CLI against this cluster; returns stdout."""
        return self._run(["ceph", "-c", str(self.conf_path), *args], timeout_s).stdout

    def radosgw_admin(self, *args: str, timeout_s: float = 30.0) -> str:
        return self._run(
            ["radosgw-admin", "-c", str(self.conf_path), "-n", "client.admin", *args], timeout_s
        ).stdout

    def mount_cephfs(self, mountpoint: Path, timeout_s: float = 30.0) -> Path:
        """Mount the cluster's CephFS with ceph-fuse (foreground, own process group).

        Starts the MDS first if the cluster was started without one (:meth:`enable_cephfs`).
        Needs the ceph-mds and ceph-fuse packages and a usable /dev/fuse (root, or the `fuse`
        package for non-root). Unmounted by stop().
        """
        self.enable_cephfs()
        if shutil.which("ceph-fuse") is None:
            raise CephNotInstalled("ceph-fuse is missing; Debian package not installed: ceph-fuse")
        mountpoint = Path(mountpoint).absolute()
        mountpoint.mkdir(parents=True, exist_ok=True)
        name = f"fuse.{len(self._mounts)}"
        self._spawn(name, ["ceph-fuse", "-f", "-c", str(self.conf_path), "-n", "client.admin",
                           "--client_fs", CEPHFS_NAME, str(mountpoint)])
        self._mounts.append(mountpoint)
        self.components.wait(f"ceph-fuse mount of {mountpoint}", lambda: os.path.ismount(mountpoint),
                             timeout_s, error=CephStartError, poll_s=0.05)
        self._save_state()
        return mountpoint

    def rss_bytes(self) -> dict[str, int]:
        """Resident set size per daemon (process group members summed)."""
        out: dict[str, int] = {}
        page = os.sysconf("SC_PAGE_SIZE")
        for name, p in self.procs.items():
            total = 0
            for pid in _group_pids(p.pid):
                try:
                    total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
                except (OSError, ValueError, IndexError):
                    pass
            out[name] = total
        return out

    def start(self) -> CephCluster:
        ensure_installed(self.cephfs)
        if self.run_dir.exists() and any(self.run_dir.iterdir()):
            raise CephStartError(f"run_dir {self.run_dir} is not empty; refusing to use it")
        self._created_run_dir = True
        self.run_dir.mkdir(parents=True, exist_ok=True)
        t0 = self._t0 = time.monotonic()
        try:
            self._start()
        except BaseException:
            self.stop(remove=False)
            raise
        self.startup_s = time.monotonic() - t0
        return self

    def stop(self, remove: bool | None = None) -> None:
        """Kill every daemon's process group; remove run_dir (if we created it and remove).

        SIGKILL straight away: the cluster is throwaway, a clean RGW/mgr shutdown takes seconds
        and the OSD's memstore would write all of its RAM to disk on umount.
        """
        for mnt in self._mounts:  # lazy unmount first: a killed FUSE daemon leaves a dead mount
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True, check=False)
        self._mounts.clear()
        self.components.stop_all([n for n in self.procs if n.startswith("fuse.")] + STOP_ORDER)
        if remove is None:
            remove = self.remove_on_stop
        if remove and self._created_run_dir and self.run_dir.exists():
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def __enter__(self) -> CephCluster:  # noqa: PYI034
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- internals --------------------------------------------------------------------------

    def _run(self, argv: list[str], timeout_s: float) -> subprocess.CompletedProcess:
        try:
            r = subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout_s, env=_child_env(),
                check=False, cwd=self.run_dir,
            )
        except subprocess.TimeoutExpired as e:
            raise CephStartError(f"{' '.join(argv)} timed out after {timeout_s}s") from e
        if r.returncode != 0:
            raise CephStartError(
                f"{' '.join(argv)} failed (rc={r.returncode}): {r.stderr.strip()[-2000:]}"
            )
        return r

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        return self.components.start(name, argv)

    def _save_state(self) -> None:
        if not self.run_dir.exists():
            return
        state = {
            "fsid": self.fsid,
            "s3_endpoint": self.s3_endpoint if self.rgw_port else "",
            "access_key": self.access_key,
            "secret_key": self.secret_key,
            "conf": str(self.conf_path),
            "pgids": self.components.pgids(),
            "mounts": [str(m) for m in self._mounts],
        }
        tmp = self.run_dir / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.run_dir / STATE_FILE)

    def _write_conf(self) -> None:
        r = self.run_dir
        MGR_DISABLED = " ".join(MGR_DISABLED_MODULES)
        conf = f"""\
[global]
fsid = {self.fsid}
mon host = {self.mon_host}
mon initial members = a
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind ipv6 = false
auth cluster required = none
auth service required = none
auth client required = none
auth allow insecure global id reclaim = true
ms mon client mode = crc
run dir = {r}/run
pid file = {r}/run/$name.pid
log file = {r}/log/$name.log
crash dir = {r}/crash
exec dir = {r}/run
keyring = {r}/keyring
log to stderr = false
err to stderr = true
mon cluster log file = {r}/log/cluster.log
mon data = {r}/mon/$id
osd data = {r}/osd/$id
mgr data = {r}/mgr/$id
mds data = {r}/mds/$id
rgw data = {r}/rgw/$id
paxos propose interval = 0.05
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
mon warn on insecure global id reclaim = false
mon warn on insecure global id reclaim allowed = false
mon data avail warn = 1
mon data avail crit = 0
mon max pg per osd = 1000
mon pg warn min per osd = 0
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
osd objectstore = memstore
memstore device bytes = {self.memstore_bytes}
mgr initial modules = iostat
# Not even imported (saves mgr RAM); the always-on modules (status, volumes, ...) stay.
mgr disabled modules = {MGR_DISABLED}
# Clients (RGW, CLI) retry ops parked on a missing/down OSD only at each objecter tick (5 s by
# default); RGW creates its pools while osd.0 is still booting, so a short tick saves ~5 s.
objecter tick interval = 0.2

[osd]
osd max object name len = 460
osd max object namespace len = 64

[client.rgw.gw]
rgw frontends = beast endpoint=127.0.0.1:{self.rgw_port}{" tcp_nodelay=1" if self.tcp_nodelay else ""}
rgw gc obj min wait = 30
rgw thread pool size = 64
rgw dns name = 127.0.0.1
"""
        self.conf_path.write_text(conf)

    def _start(self) -> None:
        r = self.run_dir
        for d in ("run", "log", "crash", "mon/a", "osd/0", "mgr/x", "rgw/gw", "mds/a"):
            (r / d).mkdir(parents=True, exist_ok=True)
        self.mon_v2_port, self.mon_v1_port, self.rgw_port = free_ports(3)
        self.access_key = "T" + secrets.token_hex(9).upper()
        self.secret_key = secrets.token_urlsafe(30)
        self._write_conf()
        conf = str(self.conf_path)

        # Monitor store and the OSD's (memstore) mkfs run side by side, neither needs a daemon.
        monmap = r / "monmap"
        self._run(["monmaptool", "--create", "--fsid", self.fsid, "--addv", "a",
                   self.mon_host, str(monmap)], 30)
        osd_uuid = str(uuid.uuid4())
        osd_mkfs = subprocess.Popen(
            ["ceph-osd", "-c", conf, "-i", "0", "--mkfs", "--osd-uuid", osd_uuid,
             "--no-mon-config"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_child_env(), cwd=r,
        )
        try:
            self._run(["ceph-mon", "-c", conf, "-i", "a", "--mkfs", "--monmap", str(monmap)], 30)
            self._mark("mon_mkfs")
            # mgr and RGW need only the monitor to start; RGW waits for the OSD by itself.
            self._spawn("mon.a", ["ceph-mon", "-f", "-c", conf, "-i", "a"])
            self._spawn("mgr.x", ["ceph-mgr", "-f", "-c", conf, "-i", "x"])
            self._spawn("client.rgw.gw", ["radosgw", "-f", "-c", conf, "-n", "client.rgw.gw"])
            out, _ = osd_mkfs.communicate(timeout=60)
        finally:
            if osd_mkfs.poll() is None:
                osd_mkfs.kill()
                osd_mkfs.wait()
        if osd_mkfs.returncode != 0:
            raise CephStartError(f"ceph-osd --mkfs failed: {out.decode(errors='replace')[-2000:]}")
        # Register osd.0 (needs the monitor), then start it.
        self._mark("osd_mkfs")
        self.ceph("osd", "new", osd_uuid, "0")
        self._mark("osd_new")
        self._spawn("osd.0", ["ceph-osd", "-f", "-c", conf, "-i", "0"])
        fs_setup = self._spawn_cephfs() if self.cephfs else None
        self._wait_rgw()
        self._mark("rgw_ready")
        if fs_setup is not None:
            self._finish_cephfs(fs_setup)
        self.radosgw_admin(
            "user", "create", "--uid", "pipectl-test", "--display-name", "pipectl test",
            "--access-key", self.access_key, "--secret-key", self.secret_key,
        )
        self._mark("user_created")
        self._save_state()

    def enable_cephfs(self) -> float:
        """Add an MDS and the CephFS ``cephfs`` to a running cluster (no-op if it has one).

        Lets a session that needs CephFS only sometimes start without it and pay the MDS
        bring-up only when a test asks for it. Returns the seconds it took (0.0 if already on).
        Raises CephNotInstalled without ceph-mds/ceph-fuse, CephStartError if the MDS dies.
        """
        if self.cephfs:
            return 0.0
        ensure_installed(cephfs=True)
        t0 = time.monotonic()
        self._finish_cephfs(self._spawn_cephfs())
        self.cephfs = True
        self._save_state()
        self.timings["enable_cephfs_s"] = round(time.monotonic() - t0, 3)
        return time.monotonic() - t0

    def _spawn_cephfs(self) -> subprocess.Popen:
        # The MDS starts as a standby and goes active once the file system exists.
        self._spawn("mds.a", ["ceph-mds", "-f", "-c", str(self.conf_path), "-i", "a"])
        return self._mon_commands_async([
            {"prefix": "osd pool create", "pool": "cephfs_metadata", "pg_num": 8},
            {"prefix": "osd pool create", "pool": "cephfs_data", "pg_num": 8},
            {"prefix": "fs new", "fs_name": CEPHFS_NAME, "metadata": "cephfs_metadata",
             "data": "cephfs_data"},
        ], "wait-mds-active")

    def _finish_cephfs(self, fs_setup: subprocess.Popen) -> None:
        out, _ = fs_setup.communicate(timeout=self.start_timeout_s)
        if fs_setup.returncode != 0:
            raise CephStartError(f"CephFS setup failed: {out.decode(errors='replace')}")
        self._mark("cephfs_created")

    def _mark(self, what: str) -> None:
        self.timings[what] = round(time.monotonic() - self._t0, 3)

    def _mon_commands_async(self, cmds: list[dict], *extra: str) -> subprocess.Popen:
        """Send mon commands in one system-python process (librados), not one CLI per command."""
        return subprocess.Popen(
            ["/usr/bin/python3", "-c", _RADOS_SCRIPT, str(self.conf_path), json.dumps(cmds), *extra],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_child_env(), cwd=self.run_dir,
        )

    def _tail(self, name: str) -> str:
        """The end of the daemon's own log, then of its stdout."""
        log = self.run_dir / "log" / f"{name}.log"
        tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
        out = self.run_dir / "log" / f"{name}.stdout"
        return tail + (out.read_text(errors="replace")[-2000:] if out.exists() else "")

    def _rgw_answers(self) -> bool:
        try:
            with urllib.request.urlopen(self.s3_endpoint + "/", timeout=2) as resp:
                resp.read()
                return True
        except urllib.error.HTTPError:
            return True  # any HTTP answer means the gateway is serving

    def _wait_rgw(self) -> None:
        self.components.wait(f"RGW on {self.s3_endpoint}", self._rgw_answers, self.start_timeout_s,
                             error=CephStartError, poll_s=0.05)


_RADOS_SCRIPT = r"""
import json, sys, time, rados
c = rados.Rados(conffile=sys.argv[1])
c.connect(timeout=30)
for cmd in json.loads(sys.argv[2]):
    ret, out, err = c.mon_command(json.dumps(cmd), b"", timeout=30)
    if ret != 0:
        print(cmd, ret, err)
        sys.exit(1)
if len(sys.argv) > 3 and sys.argv[3] == "wait-mds-active":
    # a client mount fails ("probably no MDS server is up?") until the MDS is up:active
    deadline = time.monotonic() + 60
    while True:
        ret, out, err = c.mon_command(json.dumps({"prefix": "fs dump", "format": "json"}), b"", timeout=30)
        fss = json.loads(out).get("filesystems", []) if ret == 0 else []
        if any(i.get("state") == "up:active" for fs in fss for i in fs["mdsmap"]["info"].values()):
            break
        if time.monotonic() > deadline:
            print("no MDS up:active within 60 s")
            sys.exit(1)
        time.sleep(0.05)
c.shutdown()
"""


def _group_pids(pgid: int) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:  # field 5 of stat: pgrp
                pids.append(int(d.name))
        except (OSError, ValueError, IndexError):
            pass
    return pids


# -- command line: detached start/stop for scripts/ceph-up.sh and ceph-down.sh ----------------


def _cli_up(run_dir: Path, cephfs: bool, mount: Path | None) -> int:
    cluster = CephCluster(run_dir, remove_on_stop=False, cephfs=cephfs or mount is not None)
    cluster.start()
    if mount is not None:
        try:
            cluster.mount_cephfs(mount)
        except BaseException:
            cluster.stop(remove=False)
            raise
    # Detach: the daemons run in their own sessions and outlive this process; `down` finds them
    # again through cluster.json.
    cluster.components.detach()
    print(f"export CEPH_CONF={cluster.conf_path}")
    print(f"export CEPH_RUN_DIR={cluster.run_dir}")
    print(f"export S3_ENDPOINT={cluster.s3_endpoint}")
    print(f"export AWS_ENDPOINT_URL={cluster.s3_endpoint}")
    print(f"export AWS_ACCESS_KEY_ID={cluster.access_key}")
    print(f"export AWS_SECRET_ACCESS_KEY={cluster.secret_key}")
    print("export AWS_DEFAULT_REGION=us-east-1")
    if mount is not None:
        print(f"export CEPHFS_MOUNT={Path(mount).absolute()}")
    print(f"# ceph up in {cluster.startup_s:.2f}s", file=sys.stderr)
    return 0


def _cli_down(run_dir: Path) -> int:
    run_dir = run_dir.absolute()
    state_path = run_dir / STATE_FILE
    _need_harness()
    if not state_path.exists():
        print(f"no {STATE_FILE} in {run_dir}: nothing to stop", file=sys.stderr)
        return 1
    state = json.loads(state_path.read_text())
    for mnt in state.get("mounts", []):
        subprocess.run(["umount", "-l", mnt], capture_output=True, check=False)
    pgids = state.get("pgids", {})
    for name in STOP_ORDER + [n for n in pgids if n not in STOP_ORDER]:
        pgid = pgids.get(name)
        if not pgid:
            continue
        # only kill a group whose leader still runs from this cluster's config
        try:
            cmdline = Path(f"/proc/{pgid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if state["conf"].encode() not in cmdline:
            continue
        kill_group(pgid)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(
        _pid_alive(p) for p in pgids.values() if p and Path(f"/proc/{p}").exists()
    ):
        time.sleep(0.05)
    shutil.rmtree(run_dir, ignore_errors=True)
    return 0


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="ceph.py", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start a cluster under RUN_DIR (must be empty), print exports")
    up.add_argument("run_dir", type=Path)
    up.add_argument("--cephfs", action="store_true", help="also an MDS and a CephFS")
    up.add_argument("--mount", type=Path, help="mount the CephFS here with ceph-fuse")
    down = sub.add_parser("down", help="kill the cluster recorded in RUN_DIR and remove RUN_DIR")
    down.add_argument("run_dir", type=Path)
    check = sub.add_parser("check", help="exit 1 naming missing Debian packages")
    check.add_argument("--cephfs", action="store_true")
    args = ap.parse_args(argv)
    if args.cmd == "check":
        try:
            ensure_installed(args.cephfs)
        except CephNotInstalled as e:
            print(e, file=sys.stderr)
            return 1
        return 0
    if args.cmd == "up":
        try:
            return _cli_up(args.run_dir, args.cephfs, args.mount)
        except (CephStartError, CephNotInstalled) as e:
            print(f"ceph up failed: {e}", file=sys.stderr)
            return 1
    return _cli_down(args.run_dir)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
