"""One pod of a two-pod gang whose ranks serve their step anatomy to Prometheus, as a gang pod does.

The train step's TrainContext over a real shard stream and DDP on gloo (tests/tools/anatomy_run.py's
loop), rank 1 slowed by ``SHARE`` of its own step (a straggler), one epoch of
:data:`~tests.tools.anatomy_run.STEPS` steps. The endpoint is started as the train step starts
it (:func:`pipectl.components.train.exporter.from_env`, from the pod's environment:
``PIPECTL_METRICS_PORT``, ``PIPECTL_POD_NAME``, ``PIPECTL_NODE_NAME``). After the epoch the
process prints one JSON line (its rank, port, the figures it serves, rank 0's verdicts) and keeps
serving until its stdin closes, so a Prometheus can scrape what the run left.

    python -m tests.tools.rank_metrics_run prepare FOLDER
    python -m tests.tools.rank_metrics_run member FOLDER RANK SHARE
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.tools import anatomy_run
from tests.tools.folder_store import FolderStore

SHARDS_URI = f"{anatomy_run.SHARDS_URI}-metrics"


def prepare(folder: str) -> None:
    anatomy_run._shards(FolderStore(Path(folder)), 2 * anatomy_run.STEPS * anatomy_run.BATCH, SHARDS_URI)


def member(folder: str, rank: int, share: float) -> None:
    import torch.distributed as dist

    from pipectl.components.train import exporter, telemetry

    anatomy_run._process_group(folder, rank, 2)
    faults = anatomy_run.Faults()
    ctx = anatomy_run._context(FolderStore(Path(folder)), faults, rank, 2, 1, SHARDS_URI)
    ctx.exporter = exporter.from_env(ctx.params.workflow_name, *telemetry.whereabouts())  # as the train step does
    anatomy_run._train(ctx, faults, slower=share if rank == 1 else 0.0, base_ms=anatomy_run.GANG_BASE_MS)
    dist.barrier()
    served = ctx.exporter
    print(json.dumps({"rank": rank, "port": served._server.server_address[1] if served else None,
                      "values": {f"{m}/{r}": v for (m, r), v in (served.values.items() if served else [])},
                      "verdicts": ctx.verdicts}), flush=True)
    sys.stdin.read()  # serve until the test is done scraping
    dist.destroy_process_group()


if __name__ == "__main__":
    mode, *rest = sys.argv[1:]
    if mode == "prepare":
        prepare(rest[0])
    else:
        member(rest[0], int(rest[1]), float(rest[2]))
