"""A split of shards read as a stream: each process reads its own share, a bounded window at a time.

Train and evaluate never hold a whole split. The order of epoch ``e`` is a pure function of the
seed, the epoch, the world size and the shard sizes, so a restarted gang continues with exactly
the samples it would have seen:

1. the split's shards in an order drawn from ``(seed, e)``;
2. their samples laid end to end and padded by wrapping to the start, to ``W x P`` positions
   (``W`` processes, ``P = ceil(N / W)`` each, as ``torch``'s ``DistributedSampler`` pads), so
   every process takes the same number of steps (no rank waits at a collective another never
   reaches);
3. process ``r`` takes positions ``r*P .. (r+1)*P - 1``: a run of whole shards and at most two
   partial ones, about ``1/W`` of the split;
4. its run is cut into windows of ``window`` samples (the largest shard, rounded up to whole
   batches); each window's samples are permuted by a draw from ``(seed, e, r, window number)``.

Resuming at step ``b`` of an epoch loads the window holding sample ``b x batch`` and nothing
before it. While a window trains, the shards of the next one are fetched in a thread.

Memory: the shards the current and the next window touch, each once (a shard shared by two
windows is fetched once): with shards of ``S`` bytes, about ``4 x S`` and at most ``6 x S``, plus
one batch in float32 (shards stay as stored: uint8 from preprocess, normalised a batch at a time by
:meth:`ShardStream.model_input`). Preprocess keeps ``S`` at or below 256 MiB, so a process's data memory does
not grow with the dataset.

Shard sizes come from the index (``train_sizes``/``validation_sizes``); an index written without
them (shards built elsewhere) has each shard's labels read once to count them.
"""

from __future__ import annotations

import logging
import math
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Iterator

import numpy as np

from pipectl.components.contracts import ShardIndex
from pipectl.components.runtime import StepError
from pipectl.components.shards import as_float, read_index, read_shard

log = logging.getLogger("pipectl.data")

Batch = tuple[np.ndarray, np.ndarray]
"""images [B, C, H, W] as the shard stores them (uint8 from preprocess; float16 or float32, already
normalised, from elsewhere) and labels int64 [B]; :meth:`ShardStream.model_input` makes the images
what a model takes."""


def shard_sizes(reader: Any, index: ShardIndex, split: str) -> list[int]:
    """Samples per shard of ``split``, from the index or (an index without them) by reading each shard's labels."""
    uris, sizes = getattr(index, split), getattr(index, f"{split}_sizes")
    if len(sizes) == len(uris):
        return list(sizes)
    if len(uris) == 1:
        return [getattr(index, f"{split}_count")]
    log.info("the shard index has no %s_sizes: reading the labels of its %d %s shards once to count them",
             split, len(uris), split)
    return [len(read_shard(reader, uri)[1]) for uri in uris]


class ShardStream:
    """``split`` of the shards at ``shards_uri`` as process ``rank`` of ``world_size`` reads it.

    Use :meth:`batches` for training (this process's share, see the module doc) and
    :meth:`shards` for a pass over every shard (evaluation)."""

    def __init__(self, reader: Any, shards_uri: str, split: str, *, rank: int = 0, world_size: int = 1, seed: int = 0,
                 index: ShardIndex | None = None) -> None:
        self.reader, self.split, self.rank, self.world_size, self.seed = reader, split, rank, world_size, seed
        self.index = index if index is not None else read_index(reader, shards_uri)
        self.uris: list[str] = list(getattr(self.index, split))
        self.sizes = shard_sizes(reader, self.index, split)
        self._scale: dict[str, tuple[Any, Any]] = {}  # device -> (mean, std) tensors of model_input
        if not self.uris or sum(self.sizes) == 0:
            raise ValueError(f"the {split} split of {shards_uri} has no samples")

    def model_input(self, images: np.ndarray, device: Any = None) -> Any:
        """``images`` (a batch or a shard of this split, as stored) as a model takes them: float32
        [B, C, H, W], normalised; a torch tensor on ``device`` when one is given, else numpy.

        uint8 images (preprocess writes these: half the bytes of float16 to store, read and hold)
        are normalised here, after the copy to the device, as ``(x - mean[c]) / std[c]`` with the
        index's mean and std; float images were normalised when they were written."""
        if device is None:
            return as_float(images, self.index)
        import torch

        t = torch.from_numpy(images).to(device, non_blocking=True).float()
        if images.dtype != np.uint8:
            return t
        key = str(t.device)
        if key not in self._scale:  # made once per device, not per batch
            self._scale[key] = tuple(torch.tensor(v, dtype=torch.float32).reshape(1, -1, 1, 1).to(t.device)
                                     for v in (self.index.mean, self.index.std))
        mean, std = self._scale[key]
        return t.sub_(mean).div_(std)

    @property
    def num_samples(self) -> int:
        """Samples in the split (every process's shares together, before padding)."""
        return sum(self.sizes)

    @property
    def per_process(self) -> int:
        """Samples each process takes per epoch: ``ceil(num_samples / world_size)``."""
        return math.ceil(self.num_samples / self.world_size)

    def steps_per_epoch(self, batch_size: int) -> int:
        return math.ceil(self.per_process / batch_size)

    def window(self, batch_size: int) -> int:
        """Samples shuffled together: the largest shard, rounded up to whole batches."""
        return math.ceil(max(self.sizes) / batch_size) * batch_size

    def positions(self, epoch: int, batch_size: int, window: int) -> tuple[np.ndarray, np.ndarray]:
        """(shard number, index in the shard) of each sample of this process's ``window``-th
        window in ``epoch``, in the order it is given out (module doc, steps 1-4)."""
        order = np.random.default_rng([self.seed, epoch]).permutation(len(self.uris))
        starts = np.concatenate([[0], np.cumsum(np.asarray(self.sizes, np.int64)[order])])
        size = self.window(batch_size)
        first = self.rank * self.per_process + window * size
        last = min(first + size, (self.rank + 1) * self.per_process)
        q = np.arange(first, last, dtype=np.int64) % self.num_samples
        slot = np.searchsorted(starts, q, side="right") - 1
        shard, local = order[slot], q - starts[slot]
        perm = np.random.default_rng([self.seed, epoch, self.rank, window]).permutation(len(q))
        return shard[perm], local[perm]

    def batches(self, epoch: int, batch_size: int, start_step: int = 0) -> Iterator[Batch]:
        """This process's batches of ``epoch`` from step ``start_step`` on (the last one may be
        smaller; every process has the same number)."""
        size = self.window(batch_size)
        windows = math.ceil(self.per_process / size)
        first = start_step * batch_size // size
        with _ShardCache(self) as cache:
            plan = {first: self.positions(epoch, batch_size, first)}
            for w in range(first, windows):
                shard, local = plan.pop(w)
                if w + 1 < windows:
                    plan[w + 1] = self.positions(epoch, batch_size, w + 1)
                upcoming = plan[w + 1][0] if w + 1 in plan else np.empty(0, np.int64)
                cache.keep(np.unique(shard).tolist(), np.unique(upcoming).tolist())
                skip = start_step * batch_size - w * size if w == first else 0
                for b in range(skip, len(shard), batch_size):
                    yield cache.gather(shard[b:b + batch_size], local[b:b + batch_size])

    def shards(self, *, own: bool = False) -> Iterator[Batch]:
        """Every shard in the index's order (``own``: only shards ``rank, rank + W, ...``), the next
        one fetched while this one is used."""
        chosen = [i for i in range(len(self.uris)) if not own or i % self.world_size == self.rank]
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard-read") as pool:
            ahead: Future[Batch] | None = pool.submit(read_shard, self.reader, self.uris[chosen[0]]) if chosen else None
            for n in range(len(chosen)):
                current = ahead.result()  # type: ignore[union-attr]
                ahead = pool.submit(read_shard, self.reader, self.uris[chosen[n + 1]]) if n + 1 < len(chosen) else None
                yield current

    def example(self, n: int = 2) -> np.ndarray:
        """``n`` images of the split (the first shard's first, repeated when it is smaller)."""
        images = read_shard(self.reader, self.uris[0])[0]
        return np.resize(images[:n], (n, *images.shape[1:]))


class _ShardCache:
    """Shards fetched ahead in threads, kept while a window that needs them is in use."""

    def __init__(self, stream: ShardStream) -> None:
        self.stream = stream
        self.loaded: dict[int, Future[Batch]] = {}
        self.pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="shard-read")

    def __enter__(self) -> "_ShardCache":
        return self

    def __exit__(self, *exc: object) -> None:
        for fut in self.loaded.values():
            fut.cancel()
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.loaded.clear()

    def keep(self, current: list[int], upcoming: list[int]) -> None:
        """Drop the shards no longer needed; start fetching the new ones, the current window's first."""
        for i in [i for i in self.loaded if i not in current and i not in upcoming]:
            self.loaded.pop(i).cancel()
        for i in current + upcoming:
            if i not in self.loaded:
                self.loaded[i] = self.pool.submit(self._read, i)

    def _read(self, i: int) -> Batch:
        images, labels = read_shard(self.stream.reader, self.stream.uris[i])
        if len(labels) != self.stream.sizes[i] or len(images) != len(labels):
            raise StepError(f"shard {self.stream.uris[i]} holds {len(images)} images and {len(labels)} labels; "
                            f"the index says {self.stream.sizes[i]}",
                            f"write the number of samples of each shard in index.json's {self.stream.split}_sizes")
        return images, labels

    def gather(self, shard: np.ndarray, local: np.ndarray) -> Batch:
        """The samples ``(shard[k], local[k])`` as one batch."""
        parts = {int(i): self.loaded[int(i)].result() for i in np.unique(shard)}
        first = next(iter(parts.values()))[0]
        dtype = np.result_type(*(x.dtype for x, _ in parts.values()))
        images = np.empty((len(shard), *first.shape[1:]), dtype)
        labels = np.empty(len(shard), np.int64)
        for i, (x, y) in parts.items():
            at = np.flatnonzero(shard == i)
            images[at] = x[local[at]]
            labels[at] = y[local[at]]
        return images, labels

