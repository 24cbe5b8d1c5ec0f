"""Warm Alluxio's cache over a staged dataset: `python -m pipectl.components.stage.warm`.

Reads the manifest from the store, submits Alluxio ``Load`` jobs for every data file of the
prefix (``batch_size`` files per job) through the job master's REST API, waits for them, then
reports how many bytes Alluxio's workers hold (file status ``inAlluxioPercentage`` x length) and
the wall time. Rerunning is cheap: Alluxio skips blocks it already holds. See
``pipectl.components.alluxio`` for the layout it assumes (bucket mounted at ``/<bucket>``).
"""

from __future__ import annotations

import logging
import sys
import time

from pipectl.components.alluxio import AlluxioClient
from pipectl.components.contracts import DatasetLayout, DatasetManifest, StoreSettings, WarmInput, WarmOutput
from pipectl.components.runtime import parse_s3_uri, read_json, s3_client, step_main

log = logging.getLogger("pipectl.warm")


def warm(inp: WarmInput, s3, alluxio: AlluxioClient) -> WarmOutput:
    """Load the dataset of ``inp.manifest_uri`` into Alluxio; see the module doc.

    Raises StepError: transient when Alluxio is unreachable or a load job fails/times out;
    AlluxioError (exit 1) when Alluxio refuses (e.g. the bucket is not mounted at /<bucket>).
    """
    manifest = DatasetManifest.model_validate(read_json(s3, inp.manifest_uri))
    bucket, key = parse_s3_uri(DatasetLayout.of_manifest(inp.manifest_uri).data_uri)
    data = f"/{bucket}/{key}"
    files = [data + e.key for e in manifest.entries]
    t0 = time.monotonic()
    jobs = [alluxio.submit_load(files[i:i + inp.batch_size]) for i in range(0, len(files), inp.batch_size)]
    alluxio.wait(jobs, inp.timeout_s)
    cached, _ = alluxio.cached_bytes(files)
    seconds = time.monotonic() - t0
    log.info("warmed %s: %d of %d bytes in Alluxio (%d jobs, %.1f s)", data, cached, manifest.total_bytes, len(jobs), seconds)
    return WarmOutput(files=len(files), bytes=manifest.total_bytes, cached_bytes=cached, jobs=len(jobs), seconds=round(seconds, 3))


def run(inp: WarmInput, settings: StoreSettings) -> WarmOutput:
    """Step entry: the store client and the Alluxio client from ``settings``."""
    return warm(inp, s3_client(settings), AlluxioClient.from_settings(settings))


if __name__ == "__main__":
    sys.exit(step_main(WarmInput, run, prog="pipectl.components.stage.warm"))
