"""Write an ImageFolder dataset of RGB images, one folder per class (circle, square, triangle,
cross): each image a shape of random colour, size and place on a noisy background.

    python -m shapes.generate ./shapes-data --per-class 200 --size 64

The same ``--seed`` writes the same bytes.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

CLASSES = ("circle", "square", "triangle", "cross")


def draw(kind: str, size: int, rng: random.Random) -> Image.Image:
    """One ``size`` x ``size`` RGB image of a ``kind`` shape."""
    noise = np.random.default_rng(rng.randrange(2**32)).integers(0, 90, (size, size, 3), dtype=np.uint8)
    image = Image.fromarray(noise, "RGB")
    pen = ImageDraw.Draw(image)
    r = rng.uniform(0.18, 0.35) * size
    cx, cy = rng.uniform(r, size - r), rng.uniform(r, size - r)
    colour = tuple(rng.randrange(120, 256) for _ in range(3))
    if kind == "circle":
        pen.ellipse([cx - r, cy - r, cx + r, cy + r], fill=colour)
    elif kind == "square":
        pen.rectangle([cx - r, cy - r, cx + r, cy + r], fill=colour)
    elif kind == "triangle":
        pen.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=colour)
    else:
        w = r / 3
        pen.rectangle([cx - r, cy - w, cx + r, cy + w], fill=colour)
        pen.rectangle([cx - w, cy - r, cx + w, cy + r], fill=colour)
    return image


def generate(out: Path, per_class: int, size: int = 64, seed: int = 0) -> int:
    """Write ``per_class`` JPEGs per class under ``out/<class>/``; returns how many."""
    rng = random.Random(seed)
    for kind in CLASSES:
        folder = out / kind
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            draw(kind, size, rng).save(folder / f"{kind}-{i:05d}.jpg", quality=92)
    return per_class * len(CLASSES)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--per-class", type=int, default=200)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    print(f"wrote {generate(a.out, a.per_class, a.size, a.seed)} images to {a.out}")


if __name__ == "__main__":
    main()
