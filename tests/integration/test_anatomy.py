"""The step anatomy against faults injected into a real training loop: TrainContext's own loop,
DDP on gloo with the step clock's gradient hooks, a real shard stream (tests/tools/anatomy_run.py). What is
checked: the shares it reports are the true ones (timed by the test
around the loop's own calls, not by the clock's marks), the verdicts fire at their rules, and a rank
slowed by 30% is named within 20 steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
ACCURACY = 0.03
"""Reported share within 3 points of the true one."""


def _ahead_of_other_tests() -> None:
    """The runner's processes at nice -10 when allowed (root, as in `make test`): these tests
    measure time shares against the truth, and `make test` keeps both cores busy with other tiers
    (in full runs at 96% CPU busy, a clean gang's data wait reached 22% and a sync case's 20.65%). Without the right, they run at the default priority."""
    try:
        os.nice(-10)
    except PermissionError:
        pass


def _anatomy_run(*args: str) -> list[dict]:
    r = subprocess.run([sys.executable, "-m", "tests.tools.anatomy_run", *args], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600, preexec_fn=_ahead_of_other_tests)
    assert r.returncode == 0, r.stderr[-3000:]
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


def _fabric(verdicts: list[str]) -> str:
    return next((v for v in verdicts if v.startswith("fabric-bound:")), "")


def test_injected_sync_and_data_delays_are_reported_as_their_shares_and_the_verdicts_fire_at_their_rules():
    """A delay of 5%, 15% and 30% of the step in the gradient all-reduce, and of 40% in the loader:
    each case's reported sync and data shares are the true ones within 3 points (the sync includes
    the loop's own exposed all-reduce, about 10% of a step on this loaded machine, so the sync cases
    sit above their targets); fabric-bound fires above 15% and "adding nodes will not pay" above
    30% of what was reported, and never against the truth by more than those 3 points; starved
    fires for the slow loader. Against the injected delay itself: X of the step in the all-reduce
    is seen in full (the reported share is at least X, within 3 points); the rest of the share is
    the loop's own exposed all-reduce, which the true share above bounds."""
    cases = _anatomy_run("single", "sync:0.05", "sync:0.15", "sync:0.30", "data:0.40")
    print(json.dumps(cases, indent=1))
    assert [c["case"] for c in cases] == ["none", "sync", "sync", "sync", "data"]
    for c in cases:
        for part in ("sync", "data"):
            assert abs(c["reported"][part] - c["true"][part]) <= ACCURACY, (c["case"], c["target"], part, c)
        reported, true, fabric = c["reported"]["sync"], c["true"]["sync"], _fabric(c["verdicts"])
        assert bool(fabric) == (reported > 0.15) and ("adding nodes will not pay" in fabric) == (reported > 0.30), c
        assert (not fabric or true > 0.15 - ACCURACY) and (fabric or true <= 0.15 + ACCURACY), c
        starved = any(v.startswith("starved:") for v in c["verdicts"])
        # the rule, exactly; the slow loader must trip it (another case's loader can too, truly,
        # when other processes take the CPU: in a full test run a sync case's data wait was 20.65%)
        assert starved == (c["reported"]["data"] > 0.20) and (starved or c["case"] != "data"), c
    # against the injected X itself: a delay of X of the step in the all-reduce is in the sync share
    # in full. On top of it sits the loop's own exposed all-reduce, which includes waiting for the
    # slower peer: on a loaded 2-core machine it moved from 5.4% (no fault) to 13% of the rest of
    # the step between two cases a second apart, so the no-fault case's share cannot predict it;
    # the true share (checked above, within 3 points) is what bounds the report from above
    for c in cases[1:4]:
        x = c["injected"]
        assert c["reported"]["sync"] >= x - ACCURACY, (c["target"], x, c["reported"], c["true"])
    injected = [c["injected"] for c in cases[1:4]]
    # the targets reached, near enough on a loaded machine (each delay follows the steps' own time as it changes)
    assert injected == sorted(injected) and injected[1] > 0.10 and injected[2] > 0.22, injected


def test_a_rank_slowed_by_30_percent_is_named_within_20_steps_and_a_clean_gang_gets_no_verdict():
    """Two processes; rank 1 sleeps 30% of its own step's time at the end of every step: the check
    after step 20 names it (its median step over steps 1-20 against rank 0's), and never rank 0.
    The same gang without the fault for 15 epochs (300 steps: 15 checks of 20 steps, 15 epochs):
    no straggler and no leak named. (A verdict on the shares can be true of a clean gang on a
    saturated machine — in a full test run its data wait once measured 22%, over the starved
    rule's 20% — and those rules are checked against the measured truth in the test above.)"""
    run, clean = _anatomy_run("gang", "straggler:0.3", "clean:15")
    print(json.dumps([run, clean], indent=1))
    when, first = run["named"][0]
    assert when == "step 20" and first.startswith("straggler: rank 1 on node ") and "over steps 1-20" in first, run
    assert not [v for _, v in run["named"] if not v.startswith("straggler: rank 1 ")], run
    by_rank = ("straggler:", "memory growing:")
    assert clean["steps_per_epoch"] == 20, clean
    assert not [v for _, v in clean["named"] if v.startswith(by_rank)], clean
    assert not [v for v in clean["verdicts"] if v.startswith(by_rank)], clean
