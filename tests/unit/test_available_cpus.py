"""available_cpus: the affinity mask capped by a cgroup v2/v1 CPU quota (what a pod's CPU limit sets)."""

from __future__ import annotations

import os
from pathlib import Path

from pipectl.components.runtime import available_cpus

AFFINITY = len(os.sched_getaffinity(0))


def test_no_cgroup_files_means_the_affinity_mask(tmp_path: Path) -> None:
    assert available_cpus(tmp_path) == AFFINITY


def test_cgroup_v2_without_a_limit(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert available_cpus(tmp_path) == AFFINITY


def test_cgroup_v2_quota_caps_and_rounds_up(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("50000 100000\n")  # limits.cpu: 500m
    assert available_cpus(tmp_path) == 1
    (tmp_path / "cpu.max").write_text(f"{100000 * AFFINITY + 1} 100000\n")  # just above the mask: the mask wins
    assert available_cpus(tmp_path) == AFFINITY


def test_cgroup_v1_quota(tmp_path: Path) -> None:
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert available_cpus(tmp_path) == AFFINITY
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("100000\n")  # limits.cpu: 1
    assert available_cpus(tmp_path) == 1


def test_this_machine_is_within_cpu_count() -> None:
    assert 1 <= available_cpus() <= (os.cpu_count() or 1)
