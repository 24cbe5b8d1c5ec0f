"""C13: valid but unusual images are used, broken ones quarantined with a reason a person agrees with.

The corpus (tests/tools/odd_images.py, generated, nothing downloaded) goes through the real steps as
the pods run them: ``python -m pipectl.components.stage`` into a real S3 server (moto, and a real Ceph RGW), then
``python -m pipectl.components.preprocess`` (DALI on CPU). Per file: used or quarantined; for a
quarantined one its category and reason; for a used one the pixels in the shard: 3 channels,
upright (EXIF orientation applied), the known colours (alpha dropped, 16-bit scaled, CMYK and
palette converted, greyscale repeated).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from pipectl.components.contracts import DatasetManifest
from pipectl.components.preprocess.decode import MEAN, STD
from pipectl.components.preprocess.split import in_validation
from pipectl.components.runtime import read_json
from pipectl.components.shards import load_split
from tests.tools.odd_images import CORPUS, UPRIGHT, quadrant_means, write_corpus

pytestmark = pytest.mark.integration

IMAGE_SIZE = 32
COLOUR_TOLERANCE = 12.0  # 8-bit levels, mean of a quadrant's centre (JPEG q95 + resize: measured <= 2)


@pytest.fixture()
def store(store_settings):
    """The corpus test runs against moto's S3 server and a real Ceph RGW (a zero-byte object too)."""
    return store_settings


def _step(module: str, args: list[str], env: dict, tmp_path) -> tuple[dict, str]:
    """Run a step as its pod does; returns (its outputs, its log)."""
    out = tmp_path / f"out-{module.rsplit('.', 1)[1]}"
    r = subprocess.run([sys.executable, "-m", module, *args, "--outputs-dir", str(out)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def test_C13_odd_images_are_used_and_broken_ones_quarantined_with_their_reason(store, tmp_path):
    """C13: every corpus file through stage -> preprocess; each used or quarantined as the table says."""
    import os

    from pipectl.components.runtime import s3_client

    settings, s3 = store, s3_client(store)
    step_env = {**os.environ, **store.step_env()}
    corpus = write_corpus(tmp_path / "corpus")
    staged, _ = _step("pipectl.components.stage", ["--source-uri", str(tmp_path / "corpus"), "--bucket", settings.bucket],
                   step_env, tmp_path)
    shards = f"s3://{settings.bucket}/runs/c13/shards/"
    out, log = _step("pipectl.components.preprocess",
                ["--manifest-uri", staged["manifest_uri"], "--output-uri", shards, "--image-size", str(IMAGE_SIZE),
                 "--validation-fraction", "0.5", "--max-corrupt-fraction", "0.5", "--device", "cpu", "--batch-size", "8"],
                step_env, tmp_path)

    manifest = DatasetManifest.model_validate(read_json(s3, staged["manifest_uri"]))
    staged_keys = {m.key for m in manifest.entries}
    quarantine = {q["key"]: q for q in read_json(s3, shards + "quarantine.json")}
    wrong = []
    for key, e in corpus.items():
        q = quarantine.get(key)
        if key not in staged_keys:
            wrong.append(f"{key} ({e.why}): not staged")
        elif e.used and q is not None:
            wrong.append(f"{key} ({e.why}): quarantined as {q.get('category')}: {q['reason']}")
        elif not e.used and q is None:
            wrong.append(f"{key} ({e.why}): used, expected quarantined ({e.category})")
        elif not e.used and (q.get("category") != e.category or not re.search(e.reason, q["reason"])):
            wrong.append(f"{key} ({e.why}): quarantined as {q.get('category')}: {q['reason']!r}; "
                         f"expected {e.category}: /{e.reason}/")
    assert not wrong, "\n".join(wrong)
    for key in quarantine:  # the stored bytes kept for people to look at
        kept = s3.get_object(Bucket=settings.bucket, Key=f"runs/c13/shards/quarantine/{key}")["Body"].read()
        assert kept == (tmp_path / "corpus" / key).read_bytes(), key
    assert staged["objects"] == len(CORPUS)
    per_category = Counter(e.category for e in CORPUS if not e.used)
    categories = ", ".join(f"{n} {c}" for c, n in sorted(per_category.items(), key=lambda cn: (-cn[1], cn[0])))
    assert f"quarantined {out['corrupt']} of {len(CORPUS)} images ({categories})" in log
    assert out["corrupt"] == sum(not e.used for e in CORPUS)
    assert out["train_count"] + out["validation_count"] == sum(e.used for e in CORPUS)

    # used images: each split holds its images in content-hash order; check every one's pixels
    bad_pixels = []
    for split in ("train", "validation"):
        keys = [m.key for m in sorted(manifest.entries, key=lambda m: m.sha256) if m.key not in quarantine and in_validation(m.sha256, 0.5) == (split == "validation")]
        x, _, index = load_split(s3, out["shards_uri"], split)
        assert index.channels == 3 and x.shape == (len(keys), 3, IMAGE_SIZE, IMAGE_SIZE)
        pixels = x.transpose(0, 2, 3, 1) * np.asarray(STD) + np.asarray(MEAN)  # back to 0..255, HWC
        for key, img in zip(keys, pixels):
            got, want = quadrant_means(img), quadrant_means(corpus[key].expected.astype(np.float64))
            if np.abs(got - want).max() > COLOUR_TOLERANCE:
                bad_pixels.append(f"{key} ({corpus[key].why}): quadrants {np.round(got).astype(int).tolist()}, "
                                  f"expected {np.round(want).astype(int).tolist()}")
    assert not bad_pixels, "\n".join(bad_pixels)


def test_C13_an_image_dali_fails_alone_is_decoded_by_the_pil_fallback_in_place(small_digits_dir):
    """A GIF fed to DALI (as when a format DALI cannot read reaches it unrecognised) fails its batch;
    isolated, PIL decodes it and it is used, in its place in the stream; a PNG neither decoder reads
    is reported with the reason. Without the fallback (``fallback=False``) the GIF is lost."""
    from pipectl.components.preprocess.decode import decode_robust, decode_stream
    from pipectl.components.preprocess.screen import Corrupt
    from pipectl.components.preprocess.stream import batched

    good = [p.read_bytes() for p in sorted(small_digits_dir.rglob("*.jpg"))[:20]]
    gif = next(e for e in CORPUS if e.key == "other/anim.gif").make()
    bad_png = next(e for e in CORPUS if e.key == "broken/bad-deflate.png").make()
    items = list(enumerate(good[:9])) + [(100, gif)] + list(enumerate(good[9:15], start=9)) + [(200, bad_png)] \
        + list(enumerate(good[15:], start=15))
    reasons: dict = {}
    tags, parts, rejected = [], [], []
    for t, images, bad in decode_stream(batched(items, 8), IMAGE_SIZE, 8, use_gpu=False, reasons=reasons):
        tags += t
        parts.append(images.copy())
        rejected += [tag for tag, _ in bad]
    assert rejected == [200] and reasons[200].category == Corrupt.UNDECODABLE
    assert re.match(r"decoder error: PNG: DALI could not decode it and PIL neither: ", reasons[200].reason), reasons[200].reason
    assert tags == list(range(9)) + [100] + list(range(9, 20))
    x = np.concatenate(parts)
    gif_pixels = x[9].astype(np.float32).transpose(1, 2, 0)  # the decoder's uint8 pixels, HWC
    assert np.abs(quadrant_means(gif_pixels) - quadrant_means(UPRIGHT.astype(np.float64))).max() < COLOUR_TOLERANCE

    _, bad, _ = decode_robust([good[0], gif], IMAGE_SIZE, 8, use_gpu=False, fallback=False)
    assert bad == [1]
