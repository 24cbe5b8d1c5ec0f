"""The split rule and the entry listing: which images are held out for validation, and the order
the manifest's entries are decoded and written in.

The split is a pure function of each image's sha256 (no leakage between splits of duplicates,
the same split on every run of the same dataset, so champion and candidate are compared on
the same held-out images).
"""

from __future__ import annotations

import numpy as np

from pipectl.components.contracts import DatasetManifest, ManifestEntry


def in_validation(sha256: str, fraction: float) -> bool:
    """True when the image with content hash ``sha256`` belongs to the held-out split.

    Uses the first 32 bits of the hash as a uniform number in [0, 1).
    """
    return int(sha256[:8], 16) / 2**32 < fraction


def list_entries(manifest: DatasetManifest, validation_fraction: float) -> tuple[list[ManifestEntry], list[str], np.ndarray]:
    """The manifest's entries in the order the step decodes them, each entry's split
    (``"train"``/``"validation"``) and its class (int64 [N], the index of its label in ``manifest.labels``)."""
    label_index = {label: i for i, label in enumerate(manifest.labels)}
    # In content-hash order, not the manifest's (grouped by label): every shard mixes the classes,
    # so a window of a shard or two shuffled together (pipectl.components.shard_stream) is a fair sample.
    entries = sorted(manifest.entries, key=lambda e: e.sha256)
    splits = ["validation" if in_validation(e.sha256, validation_fraction) else "train" for e in entries]
    labels = np.asarray([label_index[e.label] for e in entries], dtype=np.int64)
    return entries, splits, labels
