"""The step anatomy's verdicts, each rule at its threshold (the measured side: tests/integration/test_train.py)."""

from __future__ import annotations

import mmap

from pipectl.components.train.telemetry import GPU_MEMORY, RankEpoch, gang_shares, verdicts


def _rank(rank: int, data=0.1, compute=0.6, sync=0.1, optimizer=0.1, checkpoint=0.1, steps=40, hooked=True,
          gpu=False) -> RankEpoch:
    seconds = {"data": data, "compute": compute, "sync": sync, "optimizer": optimizer, "checkpoint": checkpoint}
    return RankEpoch(rank, f"node-{rank}", steps, steps * 32, {k: v * steps for k, v in seconds.items()}, hooked,
                     memory_kind=GPU_MEMORY if gpu else "resident memory")


def test_a_balanced_gang_gets_no_verdict_and_shares_sum_to_one():
    ranks = [_rank(r) for r in range(4)]
    shares = gang_shares(ranks)
    assert abs(sum(v for k, v in shares.items() if k.startswith("share_")) - 1) < 1e-9
    assert shares["slowest_rank_ratio"] == 1.0
    assert verdicts(ranks) == []


def test_starved_above_20_percent_data_wait():
    assert verdicts([_rank(r, data=0.19, compute=0.51) for r in range(2)]) == []
    found = verdicts([_rank(r, data=0.21, compute=0.49, gpu=True) for r in range(2)])
    assert len(found) == 1 and found[0].startswith("starved: 21%") and "DALI mixed" in found[0]


def test_a_cpu_gang_is_not_told_to_look_at_its_gpus():
    """The advice follows the device the ranks trained on: no DALI mixed, no GPU clocks on CPUs."""
    starved = verdicts([_rank(r, data=0.21, compute=0.49, gpu=False) for r in range(2)])
    assert len(starved) == 1 and "cpu-per-worker" in starved[0] and "GPU" not in starved[0], starved
    slow = verdicts([_rank(0, gpu=False), _rank(1, compute=1.2, gpu=False)])
    assert slow[0].startswith("straggler: rank 1") and "CPU throttling" in slow[0] and "GPU" not in slow[0], slow
    on_gpus = verdicts([_rank(0, gpu=True), _rank(1, compute=1.2, gpu=True)])
    assert "GPU clocks" in on_gpus[0], on_gpus


def test_fabric_bound_above_15_and_no_scale_above_30_percent_sync():
    assert verdicts([_rank(r, sync=0.14, compute=0.56) for r in range(2)]) == []
    assert verdicts([_rank(r, sync=0.16, compute=0.54) for r in range(2)])[0].startswith("fabric-bound: 16%")
    assert "not pay" not in verdicts([_rank(r, sync=0.16, compute=0.54) for r in range(2)])[0].split(");")[1]
    found = verdicts([_rank(r, sync=0.31, compute=0.39) for r in range(2)])
    assert found[0].startswith("fabric-bound: 31%") and "adding nodes will not pay" in found[0]
    # the sync is not measured without the hook (the user's own DDP): no sync verdict
    assert verdicts([_rank(r, sync=0.31, compute=0.39, hooked=False) for r in range(2)]) == []
    # one node: no fabric between the ranks
    one_node = [_rank(r, sync=0.31, compute=0.39) for r in range(2)]
    for r in one_node:
        r.node = "same"
    assert verdicts(one_node) == []


def test_a_straggler_is_named_with_its_node_over_enough_steps():
    gang = [_rank(0, sync=0.4), _rank(1, sync=0.4), _rank(2, compute=0.9), _rank(3, sync=0.4)]
    found = verdicts(gang)  # the others' sync is the wait for rank 2: one verdict, the straggler
    assert len(found) == 1 and found[0].startswith("straggler: rank 2 on node node-2"), found
    assert verdicts([_rank(0), _rank(1), _rank(2, compute=0.65), _rank(3)]) == []  # 1.06x: within the rule
    assert verdicts([_rank(0, steps=10), _rank(1, compute=0.9, steps=10)]) == []  # fewer than 20 steps
    on_a_cluster = [_rank(0), _rank(1, compute=1.2)]
    on_a_cluster[1].pod = "training-abcde-train-worker-1"
    assert verdicts(on_a_cluster)[0].startswith("straggler: rank 1 on node node-1 (pod training-abcde-train-worker-1) takes")


def test_a_straggler_is_measured_against_the_other_ranks_median_step():
    """Each rank's median step against the median of the others': in a gang of two, the other rank
    (the gang's median would be the pair's mean, so a rank 30% slower would be 1.13x of it)."""
    from pipectl.components.train.telemetry import stragglers

    who = ["rank 0 on node a", "rank 1 on node b"]
    found = stragglers([0.040, 0.052], who, "over steps 1-20")
    assert len(found) == 1 and found[0].startswith("straggler: rank 1 on node b takes 52 ms of its own per step over steps 1-20, 1.3x"), found
    assert stragglers([0.040, 0.046], who, "over steps 1-20") == []  # 1.15x
    assert stragglers([0.040], who[:1], "over steps 1-20") == []  # no gang
    # the epoch's median step, not its mean: one step held up 2 s moves the mean, not the verdict
    held_up = [_rank(0), _rank(1)]
    held_up[1].seconds["compute"] += 2.0
    held_up[0].own_median = held_up[1].own_median = 0.8
    assert verdicts(held_up) == [] and verdicts([_rank(0), _rank(1, compute=1.2)])[0].startswith("straggler: rank 1")


def _mem(values: list[float]) -> list[RankEpoch]:
    return [RankEpoch(0, "node-0", 40, 1280, dict.fromkeys(("data", "compute", "sync", "optimizer", "checkpoint"), 1.0), True, m)
            for m in values]


def test_memory_that_grows_at_every_one_of_the_last_four_epochs_is_a_likely_leak():
    from pipectl.components.train.telemetry import growing_memory

    found = growing_memory(_mem([500, 520, 600, 680, 760, 840]))
    assert found and found.startswith("memory growing: rank 0 on node node-0: resident memory grew at each of the last 4 epochs, 520 -> 840 MiB")
    assert growing_memory(_mem([600, 680, 760, 840])) is None  # 4 epochs: too few to tell
    assert growing_memory(_mem([500, 900, 905, 910, 915, 920])) is None  # settled after the first epoch (+20 MiB)
    assert growing_memory(_mem([500, 520, 600, 680, 670, 840])) is None  # not at every epoch
    assert growing_memory(_mem([5000, 5020, 5040, 5060, 5080])) is None  # +80 MiB is under 10% of 5 GB


def test_the_anatomy_chart_is_a_png_of_every_rank_and_epoch():
    """The picture rank 0 logs to MLflow (training/step_anatomy.png): a PNG that opens, with a row
    per rank and a column per epoch in its heatmap (the straggler's row the darkest)."""
    import io

    from PIL import Image

    from pipectl.components.train.anatomy_chart import figure, log_chart, own_ms

    epochs = [[_rank(0), _rank(1, compute=1.2), _rank(2)] for _ in range(3)]
    heat = own_ms(epochs)
    assert heat.shape == (3, 3) and (heat[1] > heat[0]).all() and heat[0, 0] == 800.0

    class Recorder:
        def log_figure(self, fig, path):
            buf = io.BytesIO()
            fig.savefig(buf, format="png")
            self.png, self.path = buf.getvalue(), path

    recorder = Recorder()
    assert log_chart(recorder, epochs, [1, 2, 3]) == "training/step_anatomy.png" == recorder.path
    image = Image.open(io.BytesIO(recorder.png))
    image.verify()
    assert image.format == "PNG" and image.size[0] > 600
    assert log_chart(recorder, [], []) is None
    # a chart that cannot be made is a warning, not a failed training
    assert log_chart(type("Broken", (), {"log_figure": lambda self, fig, path: 1 / 0})(), epochs, [1, 2, 3]) is None
    assert figure(epochs, [1, 2, 3]).axes


def test_each_rank_has_its_own_images_per_s_step_time_and_memory_in_the_metrics_and_the_line():
    from pipectl.components.train.telemetry import describe, rank_metrics

    gang = [_rank(0), _rank(1, compute=1.2)]  # own work per step of 32 images: rank 0 0.8 s, rank 1 1.4 s
    gang[0].memory_mib, gang[0].memory_peak_mib, gang[1].memory_mib, gang[1].memory_peak_mib = 300, 350, 310, 420
    metrics = rank_metrics(gang)
    assert metrics["rank0/images_per_s"] == 40.0 and abs(metrics["rank1/images_per_s"] - 32 / 1.4) < 1e-9
    assert abs(metrics["rank1/step_ms"] - 1400.0) < 1e-6 and metrics["rank1/memory_peak_mib"] == 420
    shares = gang_shares(gang)
    assert shares["memory_mib_max"] == 310 and shares["memory_peak_mib_max"] == 420
    line = describe(gang, shares)
    assert line.endswith("images/s (per rank: 0: 40, 1: 23); resident memory 310 MiB (peak 420 MiB)"), line
    # a large gang: the slowest rank alone
    big = [_rank(r) for r in range(9)] + [_rank(9, compute=1.2)]
    assert "(slowest rank: 9: 23)" in describe(big, gang_shares(big))
    assert "per rank" not in describe([_rank(0)], gang_shares([_rank(0)]))


def test_cpu_memory_is_the_resident_memory_now_and_at_its_peak():
    from pipectl.components.train.telemetry import memory_mib

    # fresh anonymous pages, each touched: resident whatever memory the allocator already holds
    # (a freed, still resident heap could serve a bytearray without raising the resident size)
    before = memory_mib()
    block = mmap.mmap(-1, 64 * 2**20)
    for offset in range(0, len(block), mmap.PAGESIZE):
        block[offset] = 1
    after = memory_mib()
    block.close()
    assert before.kind == after.kind == "resident memory"
    assert after.current >= before.current + 60 and after.peak >= after.current


def test_gpu_memory_is_read_from_torch_cuda_when_this_process_uses_cuda(monkeypatch):
    """No GPU on the test machine: the torch.cuda boundary is faked (is_available, is_initialized,
    memory_allocated, max_memory_allocated), everything above it is the product's code."""
    import torch

    from pipectl.components.train.telemetry import StepClock, growing_memory, memory_mib

    allocated = [2**30]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: allocated[0])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 3 * 2**30)
    assert memory_mib() == type(memory_mib())(1024.0, 3072.0, "GPU memory")
    clock, history = StepClock(), []
    for _ in range(5):  # +200 MiB of GPU memory at each epoch's end
        history.append(clock.epoch(0))
        allocated[0] += 200 * 2**20
    assert history[0].memory_kind == "GPU memory" and history[-1].memory_mib == 1824.0 and history[-1].memory_peak_mib == 3072.0
    found = growing_memory(history)
    assert found and "GPU memory grew at each of the last 4 epochs, 1024 -> 1824 MiB" in found, found


def test_the_epoch_tags_read_back_as_the_status_lines_and_an_unreachable_mlflow_is_a_line_not_a_failure():
    import socket
    import time

    from pipectl.components.train.live import TAG_LIMIT, epoch_tags, lines, read

    tags = epoch_tags(3, 15, "data 3%, compute 77%, sync 15%, optimizer 3%, checkpoint 2%; 906 images/s",
                      ["starved: 21% of the step waits for data", "straggler: rank 1 on node b takes 52 ms"])
    assert lines(tags) == ["training step time (epoch 3 of 15, the latest): data 3%, compute 77%, sync 15%, optimizer 3%, "
                           "checkpoint 2%; 906 images/s", "verdict: starved: 21% of the step waits for data",
                           "verdict: straggler: rank 1 on node b takes 52 ms"]
    assert lines(epoch_tags(1, 2, "x", [])) == ["training step time (epoch 1 of 2, the latest): x"]
    assert lines({}) == [] and len(epoch_tags(1, 2, "x" * 9000, [])["pipectl.step_time"]) == TAG_LIMIT
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    shown, problem = read(f"http://127.0.0.1:{port}", "wf-x", timeout_s=2)
    assert shown == [] and problem.startswith(f"the training's step anatomy could not be read from MLflow at http://127.0.0.1:{port}")
    assert time.monotonic() - t0 < 10  # one try, not MLflow's retries with back-off


def test_the_local_live_row_shows_the_data_and_sync_shares_and_the_verdict_kinds(tmp_path, monkeypatch):
    from pipectl.components import progress

    path = tmp_path / "progress.jsonl"
    monkeypatch.setenv("PIPECTL_PROGRESS_FILE", str(path))
    progress.report(3, 15, 60, 300, 0.4123, {"images_per_s": 950.2, "share_data": 0.031, "share_sync": 0.152},
                    ["straggler: rank 1 on node b", "starved: 21%"])
    assert progress.describe(progress.last(path)) == \
        "epoch 3/15 · step 60/300 · loss 0.412 · 950 images/s · data 3% · sync 15% · starved, straggler"
    progress.report(4, 15, 80, 300, float("nan"), {}, [])  # a train function's own loop: nothing measured
    assert progress.describe(progress.last(path)) == "epoch 4/15 · step 80/300"


def test_hostile_anatomy_tags_print_as_plain_bounded_text(capsys):
    """Anyone who can write to the MLflow run can set its tags: pipectl status prints them as plain
    text (no escape sequence reaches the terminal, no rich markup is read), each line bounded, at
    most ten verdicts."""
    from pipectl.cli.common import console
    from pipectl.components.train.live import SHOWN_CHARS, VERDICTS_TAG, STEP_TIME_TAG, lines

    tags = {STEP_TIME_TAG: "epoch 1 of 2: [bold red]red[/] \x1b[2J\x1b]0;title\x07 \r\x08\u202eevil" + "x" * 20000,
            VERDICTS_TAG: "\n".join([f"\x1b[31mv{i}\x9b2J" for i in range(50)] + ["\x1b]8;;http://x\x1b\\link"])}
    shown = lines(tags)
    assert len(shown) == 12 and shown[-1] == "verdict: and 41 more"
    assert all(len(line) <= SHOWN_CHARS for line in shown)
    assert shown[0].startswith("training step time (epoch 1 of 2, the latest): [bold red]red[/] ?[2J?]0;title? ???evil")
    assert shown[1] == "verdict: ?[31mv0?2J"
    for line in shown:  # as pipectl status prints them
        console().print(line, markup=False, soft_wrap=True)
    err = capsys.readouterr().err
    assert "[bold red]red[/]" in err
    assert not any(c in err for c in "\x1b\x07\r\x08\x9b\u202e"), repr(err[:200])
