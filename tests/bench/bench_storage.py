"""Storage benchmark: staging throughput to one real Ceph RGW, side by side in one run.

    .venv/bin/python tests/bench/bench_storage.py [--runs 5] [--small 10000] [--big 3] [--only small|big]

Tools (each a separate process, as a user would run it, all at 16 concurrent transfers):
- ``stage, 2 processes`` (small files only): stage with ``--upload-processes 2`` (worker processes)
- ``stage``: ``python -m pipectl.components.stage`` (hashes every file, verifies every write, manifest)
- ``rclone copy`` (Debian's rclone; ``scripts/system-deps.sh --bench`` installs it): ``--transfers 16``
- ``aws s3 sync`` (AWS CLI; ``aws`` on PATH, else a venv under ~/.cache/pipectl/awscli-venv):
  ``max_concurrent_requests = 16``

Datasets (random bytes, ImageFolder layout because stage takes labelled images):
(a) ``--small`` files of 4-60 KiB (uniform) in 10 labels; (b) ``--big`` files of 256 MiB in 2 labels.

Each run gets a fresh single-node Ceph (started before and stopped after the timed part) and an
empty bucket: nothing to skip, the memstore OSD never fills, no run pays for another's garbage. One warm-up run per
tool and dataset, then ``--runs`` measured runs, interleaved (stage, rclone, aws, stage, ...) so
load from other processes on the machine hits every tool alike. Reports the median MB/s (MB =
10^6 bytes) and files/s with min-max over the runs, and the ratio of stage's median to the faster
peer's. Not collected by pytest (file name), not a timed test: it prints a table and returns rows.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.ceph.ceph import CephCluster  # noqa: E402

CONCURRENCY = 16
CACHE = Path(os.environ.get("PIPECTL_CACHE_DIR", Path.home() / ".cache" / "pipectl"))


def aws_cli() -> str:
    """The AWS CLI: ``aws`` on PATH, else one installed into ~/.cache/pipectl/awscli-venv (pip)."""
    found = shutil.which("aws")
    if found:
        return found
    venv = CACHE / "awscli-venv"
    if not (venv / "bin" / "aws").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "awscli"], check=True)
    return str(venv / "bin" / "aws")


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


class Bench:
    """Runs one tool once against a Ceph of its own: every run starts a fresh single-node Ceph
    (1-2 s, not timed) and stops it after, so the memstore OSD never fills and no run pays for
    another's garbage (``radosgw-admin gc process`` took > 300 s after a 10,000-object run)."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.aws = aws_cli()
        self.cfg = work / "aws-config"
        self.cfg.write_text(f"[default]\nregion = us-east-1\ns3 =\n  addressing_style = path\n"
                            f"  max_concurrent_requests = {CONCURRENCY}\n")

    def env(self, ceph: CephCluster) -> dict[str, str]:
        return {
            **os.environ, **ceph.env(),
            "AWS_CONFIG_FILE": str(self.cfg),
            # botocore >= 1.36 sends checksum headers Pacific's RGW rejects (REFERENCE.md §3)
            "AWS_REQUEST_CHECKSUM_CALCULATION": "when_required",
            "AWS_RESPONSE_CHECKSUM_VALIDATION": "when_required",
            "RCLONE_CONFIG_CEPH_TYPE": "s3", "RCLONE_CONFIG_CEPH_PROVIDER": "Ceph",
            "RCLONE_CONFIG_CEPH_ENDPOINT": ceph.s3_endpoint,
            "RCLONE_CONFIG_CEPH_ACCESS_KEY_ID": ceph.access_key,
            "RCLONE_CONFIG_CEPH_SECRET_ACCESS_KEY": ceph.secret_key,
            "RCLONE_CONFIG_CEPH_FORCE_PATH_STYLE": "true",
            "PIPECTL_S3_ENDPOINT": ceph.s3_endpoint,
            "PIPECTL_S3_ACCESS_KEY": ceph.access_key,
            "PIPECTL_S3_SECRET_KEY": ceph.secret_key,
        }

    def command(self, tool: str, src: Path, bucket: str, endpoint: str) -> list[str]:
        if tool == "stage":
            return [sys.executable, "-m", "pipectl.components.stage", "--source-uri", str(src), "--bucket", bucket,
                    "--max-concurrency", str(CONCURRENCY), "--outputs-dir", str(self.work / "out" / bucket)]
        if tool == "stage, 2 processes":  # stage/parallel.py's worker processes (opt-in)
            return [*self.command("stage", src, bucket, endpoint), "--upload-processes", "2"]
        if tool == "rclone copy":
            return ["rclone", "copy", str(src), f"ceph:{bucket}/data", "--transfers", str(CONCURRENCY),
                    "--checkers", str(CONCURRENCY)]
        if tool == "aws s3 sync":
            return [self.aws, "s3", "sync", str(src), f"s3://{bucket}/data", "--endpoint-url", endpoint,
                    "--only-show-errors"]
        raise ValueError(tool)

    def run_once(self, tool: str, src: Path) -> float:
        run_dir = Path(tempfile.mkdtemp(prefix="ceph-", dir=self.work))
        with CephCluster(run_dir / "run", memstore_bytes=4 << 30) as ceph:
            s3 = ceph.s3_client()
            bucket = f"b-{uuid.uuid4().hex[:12]}"
            s3.create_bucket(Bucket=bucket)  # every tool starts from an existing, empty bucket
            s3.put_object(Bucket=bucket, Key="probe", Body=b"x")  # RGW creates its data pool on the first write
            s3.delete_object(Bucket=bucket, Key="probe")
            env = self.env(ceph)
            if tool == "rclone copy":  # rclone 1.60 fails on AWS_CA_BUNDLE ("HTTPClient's transport unsupported type")
                env = {k: v for k, v in env.items() if k != "AWS_CA_BUNDLE"}
            t0 = time.perf_counter()
            r = subprocess.run(self.command(tool, src, bucket, ceph.s3_endpoint), env=env, capture_output=True, text=True)
            seconds = time.perf_counter() - t0
            if r.returncode != 0:
                raise RuntimeError(f"{tool} failed (rc={r.returncode}): {(r.stdout + r.stderr)[-2000:]}")
            listed = sum(page.get("KeyCount", 0) for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket))
            self.last_objects = listed
        shutil.rmtree(run_dir, ignore_errors=True)
        return seconds


def _fmt(values: list[float]) -> str:
    return f"{statistics.median(values):,.1f} ({min(values):,.1f}-{max(values):,.1f})"


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--small", type=int, default=10_000)
    ap.add_argument("--big", type=int, default=3)
    ap.add_argument("--only", choices=["small", "big"])
    ap.add_argument("--tools", default="stage,stage; 2 processes,rclone copy,aws s3 sync",
                    help="comma-separated; 'stage; 2 processes' is stage with --upload-processes 2 (small files only)")
    args = ap.parse_args([] if argv is None else argv)  # tests.bench.run calls main()
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the clean-ups (Ceph daemons) on TERM
    small = 0 if args.only == "big" else args.small
    big = 0 if args.only == "small" else args.big
    tools = [t.replace(";", ",") for t in args.tools.split(",")]
    if "rclone copy" in tools and shutil.which("rclone") is None:
        raise SystemExit("rclone is missing: run scripts/system-deps.sh --bench (Debian package rclone)")

    rows: list[dict] = []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="storage-bench-") as tmp:
        work = Path(tmp)
        datasets = make_datasets(work / "data", small, big)
        bench = Bench(work)
        for name, (src, files, nbytes) in datasets.items():
            ds_tools = [t for t in tools if not (t == "stage, 2 processes" and files < 1000)]
            times: dict[str, list[float]] = {t: [] for t in ds_tools}
            for t in ds_tools:
                bench.run_once(t, src)  # warm-up (page cache, interpreter, RGW pools)
            for i in range(args.runs):
                for t in ds_tools:
                    times[t].append(bench.run_once(t, src))
                    assert bench.last_objects >= files, f"{t} left {bench.last_objects} objects, expected {files}"
                    print(f"# {name} run {i + 1} {t}: {times[t][-1]:.2f}s (load {os.getloadavg()[0]:.1f})",
                          file=sys.stderr, flush=True)
            for t in ds_tools:
                mbs = [nbytes / 1e6 / s for s in times[t]]
                fps = [files / s for s in times[t]]
                rows.append({"dataset": name, "tool": t, "files": files, "bytes": nbytes, "runs": len(mbs),
                             "seconds": times[t], "mb_s": statistics.median(mbs), "mb_s_min": min(mbs),
                             "mb_s_max": max(mbs), "files_s": statistics.median(fps),
                             "files_s_min": min(fps), "files_s_max": max(fps), "text_mb": _fmt(mbs), "text_fps": _fmt(fps)})
            ours = next((r for r in rows if r["dataset"] == name and r["tool"] == "stage"), None)
            peers = [r for r in rows if r["dataset"] == name and not r["tool"].startswith("stage")]
            if ours and peers:
                fastest = max(peers, key=lambda r: r["mb_s"])
                for r in rows:
                    if r["dataset"] == name:
                        r["ratio"] = r["mb_s"] / fastest["mb_s"]
                        r["vs"] = fastest["tool"]
    load_after = os.getloadavg()

    lines = [f"staging to one Ceph 16.2 RGW (memstore OSD) on 127.0.0.1; {os.cpu_count()} CPUs; "
             f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}; "
             f"median of {args.runs} runs after a warm-up (min-max); {CONCURRENCY} concurrent transfers each",
             "", "| dataset | tool | MB/s | files/s | ratio to the faster peer |", "|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r['ratio']:.2f}x {r['vs']}" if "ratio" in r and r["tool"].startswith("stage") else ("" if "ratio" not in r else f"{r['ratio']:.2f}")
        lines.append(f"| {r['dataset']} | {r['tool']} | {r['text_mb']} | {r['text_fps']} | {ratio} |")
    print("\n" + "\n".join(lines))
    for r in rows:
        r["load_before"], r["load_after"] = load_before, load_after
    results = Path(__file__).resolve().parent / "results"
    results.mkdir(exist_ok=True)
    (results / "storage.md").write_text("### Staging to Ceph RGW\n\n" + "\n".join(lines) + "\n")
    (results / "storage.json").write_text(json.dumps(rows, indent=2, default=str))
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
