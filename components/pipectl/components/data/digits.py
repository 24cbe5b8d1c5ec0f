"""The scikit-learn handwritten digits, written out as JPEG files in ImageFolder layout.

Source: ``sklearn.datasets.load_digits`` (the UCI "Optical Recognition of Handwritten Digits"
test set, 1,797 images of 8x8 pixels, 16 grey levels, 10 classes), bundled inside the
scikit-learn wheel: nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path

EXAMPLES = ("digits",)


def write_example(name: str, directory: Path, *, side_px: int = 32) -> int:
    """Write example dataset ``name`` to ``directory/<label>/<name>-<index>.jpg``.

    Images are upscaled from 8x8 to ``side_px`` x ``side_px`` (bilinear), RGB, JPEG quality 95.
    Returns the number of images written. Raises ``ValueError`` for an unknown name.
    Deterministic: the same bytes on every call, so staging it twice is a no-op.
    """
    if name not in EXAMPLES:
        raise ValueError(f"unknown example dataset {name!r}; known: {', '.join(EXAMPLES)}")
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    directory.mkdir(parents=True, exist_ok=True)
    for index, (pixels, label) in enumerate(zip(digits.images, digits.target)):
        grey = (np.asarray(pixels, dtype=np.float32) * (255.0 / 16.0)).round().astype(np.uint8)
        img = Image.fromarray(grey, mode="L").resize((side_px, side_px), Image.BILINEAR).convert("RGB")
        out = directory / str(int(label)) / f"{name}-{index:04d}.jpg"
        out.parent.mkdir(exist_ok=True)
        tmp = out.with_suffix(".tmp")
        img.save(tmp, format="JPEG", quality=95)
        tmp.replace(out)
    return len(digits.images)


MANIFEST = "train.csv"
"""The manifest :func:`write_manifest` writes beside the images."""


def write_manifest(directory: Path) -> Path:
    """Write ``directory/train.csv``: one ``uri,label`` row per image of the ImageFolder tree under
    ``directory`` (uris relative to the manifest), the form a dataset whose images do not sit in
    one folder per class takes. Returns its path."""
    import csv

    rows = sorted((p.relative_to(directory).as_posix(), p.parent.name) for p in directory.glob("*/*.jpg"))
    out = directory / MANIFEST
    tmp = out.with_suffix(".tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["uri", "label"])
        writer.writerows(rows)
    tmp.replace(out)
    return out
