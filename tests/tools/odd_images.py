"""A corpus of valid-but-unusual and truly broken images, generated (field case C13).

Usage: ``python -m tests.tools.odd_images OUT_DIR`` writes the corpus in ImageFolder layout
(``OUT_DIR/<label>/<file>``) and prints one line per file with its expected outcome. Tests import
:data:`CORPUS` and :func:`write_corpus`; the script and the tests read the same table.

The rule the table encodes (C13): an image is corrupt when the decoder cannot decode it,
not when a heuristic dislikes its bytes. Everything PIL and the common decoders (libjpeg-turbo,
libpng, nvJPEG) accept is *used*, and comes out of preprocessing as the picture a person sees:

- EXIF orientation is applied (what ``PIL.ImageOps.exif_transpose`` does, and what torchvision's
  ``decode_image(..., apply_exif_orientation=True)``, DALI's ``adjust_orientation=True`` default and
  every photo viewer do), so an image stored sideways with orientation 6 or 8 comes out upright;
- alpha is dropped, colour kept (torchvision's ``pil_loader``: ``img.convert("RGB")``); a palette
  image becomes its palette colours; greyscale is repeated into 3 channels;
- 16-bit samples are scaled to 8 bits (v * 255 / 65535, PNG spec 13.12), not clipped;
- CMYK JPEGs come out as PIL's RGB of them;
- the file name's extension does not decide the format: the bytes do (PNG bytes named ``.jpg``
  are a PNG); upper-case extensions (``.JPG``, ``.JPEG``, ``.PNG``) are images.

Broken files are *quarantined* with a reason in one of the categories of
``pipectl.components.preprocess.core.Corrupt`` (``empty``, ``not-an-image``, ``truncated``,
``corrupt-data``, ``undecodable``).

Content is known: every used image shows four coloured quadrants (:data:`UPRIGHT`) when upright, so
a test can check orientation, channels and colour after resizing. Only PIL, numpy and the standard
library are used (no downloads); output is deterministic for a given Pillow version.
"""

from __future__ import annotations

import io
import struct
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

W, H = 64, 48  # upright size (landscape, so a 90° rotation changes the stored shape)

# quadrant colours of the upright picture: top-left, top-right, bottom-left, bottom-right (RGB)
QUADRANTS = ((220, 40, 40), (40, 190, 60), (40, 60, 220), (235, 220, 60))
GREY_QUADRANTS = (30, 100, 170, 240)


def upright(colours: tuple[tuple[int, int, int], ...] = QUADRANTS, w: int = W, h: int = H) -> np.ndarray:
    """The picture a person sees: uint8 [h, w, 3], four quadrants of ``colours`` (TL, TR, BL, BR)."""
    a = np.empty((h, w, 3), np.uint8)
    a[: h // 2, : w // 2], a[: h // 2, w // 2:], a[h // 2:, : w // 2], a[h // 2:, w // 2:] = colours
    return a


UPRIGHT = upright()
GREY_UPRIGHT = upright(tuple((g, g, g) for g in GREY_QUADRANTS))


def quadrant_means(img: np.ndarray) -> np.ndarray:
    """Mean colour of the central half of each quadrant: float [4, C] (TL, TR, BL, BR) of ``img``
    [h, w, C]. The centres keep away from the edges that JPEG and resizing blur."""
    h, w = img.shape[:2]
    out = []
    for y0 in (0, h // 2):
        for x0 in (0, w // 2):
            qh, qw = h // 2, w // 2
            out.append(img[y0 + qh // 4: y0 + qh * 3 // 4, x0 + qw // 4: x0 + qw * 3 // 4].reshape(-1, img.shape[2]).mean(0))
    return np.asarray(out, np.float64)


# ---------------------------------------------------------------- encoders


def _pil(a: np.ndarray, fmt: str, mode: str | None = None, **save: object) -> bytes:
    from PIL import Image

    img = Image.fromarray(a)
    if mode is not None:
        img = img.convert(mode)
    buf = io.BytesIO()
    img.save(buf, fmt, **save)
    return buf.getvalue()


def _jpeg(a: np.ndarray = UPRIGHT, **save: object) -> bytes:
    return _pil(a, "JPEG", quality=95, **save)


def _png_chunk(kind: bytes, data: bytes, crc: int | None = None) -> bytes:
    crc = zlib.crc32(kind + data) & 0xFFFFFFFF if crc is None else crc
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


def png_raw(samples: np.ndarray, bit_depth: int, colour_type: int) -> bytes:
    """A PNG written by hand (PNG spec 11.2.2): ``samples`` uint8 or uint16 [h, w, c]; colour type
    0 grey, 2 RGB, 6 RGBA. For what PIL cannot write (16-bit RGB)."""
    h, w = samples.shape[:2]
    dt = ">u2" if bit_depth == 16 else "u1"
    rows = b"".join(b"\x00" + samples[y].astype(dt).tobytes() for y in range(h))  # filter 0 per row
    return (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, bit_depth, colour_type, 0, 0, 0))
            + _png_chunk(b"IDAT", zlib.compress(rows, 9)) + _png_chunk(b"IEND", b""))


def _stored_for_orientation(orientation: int) -> np.ndarray:
    """The pixels a camera stores so that EXIF ``orientation`` shows :data:`UPRIGHT` (the inverse
    of the transpose ``PIL.ImageOps.exif_transpose`` applies)."""
    from PIL import Image

    inverse = {6: Image.Transpose.ROTATE_90, 8: Image.Transpose.ROTATE_270, 3: Image.Transpose.ROTATE_180}[orientation]
    return np.asarray(Image.fromarray(UPRIGHT).transpose(inverse))


def _exif_jpeg(orientation: int) -> bytes:
    from PIL import Image

    exif = Image.Exif()
    exif[0x0112] = orientation
    return _jpeg(_stored_for_orientation(orientation), exif=exif.tobytes())


def _rgba_png() -> bytes:
    a = np.dstack([UPRIGHT, np.tile(np.linspace(0, 255, W, dtype=np.uint8), (H, 1))])  # alpha 0 at the left edge
    return _pil(a, "PNG")


def _palette_png() -> bytes:
    from PIL import Image

    img = Image.fromarray(UPRIGHT).quantize(colors=8)
    buf = io.BytesIO()
    img.save(buf, "PNG", transparency=0)  # palette index 0 transparent (tRNS)
    return buf.getvalue()


def _grey16_png() -> bytes:
    from PIL import Image

    g16 = GREY_UPRIGHT[..., 0].astype(np.uint16) * 257  # 8-bit g -> 16-bit g*257: scales back to g exactly
    buf = io.BytesIO()
    Image.fromarray(g16).save(buf, "PNG")  # PIL mode I;16 -> PNG bit depth 16, colour type 0
    data = buf.getvalue()
    assert data[24:26] == b"\x10\x00", "PIL did not write a 16-bit greyscale PNG"
    return data


def _rgb16_png() -> bytes:
    return png_raw(UPRIGHT.astype(np.uint16) * 257, 16, 2)


def _grey_alpha_png() -> bytes:
    return _pil(np.dstack([GREY_UPRIGHT[..., 0], np.full((H, W), 128, np.uint8)]), "PNG")  # PIL mode LA


def _ancillary_bad_crc_png() -> bytes:
    """A tEXt chunk with a wrong CRC before IDAT: libpng warns and drops the chunk (PNG spec 13.2:
    an ancillary chunk's error need not stop decoding); the picture is intact."""
    data = png_raw(UPRIGHT, 8, 2)
    i = data.index(b"IDAT") - 4
    return data[:i] + _png_chunk(b"tEXt", b"Comment\x00scanned 2019", crc=0x12345678) + data[i:]


def _two_frame_gif() -> bytes:
    from PIL import Image

    frames = [Image.fromarray(UPRIGHT), Image.fromarray(UPRIGHT[::-1].copy())]  # frame 2 upside down
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    return buf.getvalue()


def _truncated_jpeg() -> bytes:
    data = _jpeg(np.asarray(np.random.default_rng(1).integers(0, 256, (H, W, 3)), np.uint8))  # dense scan data
    sos = data.rfind(b"\xff\xda")
    return data[: sos + (len(data) - sos) // 2]  # cut in the middle of the scan


def _bad_crc_png() -> bytes:
    data = png_raw(UPRIGHT, 8, 2)
    i = data.index(b"IDAT")
    n = struct.unpack(">I", data[i - 4: i])[0]
    crc_at = i + 4 + n
    return data[:crc_at] + bytes(b ^ 0xFF for b in data[crc_at: crc_at + 4]) + data[crc_at + 4:]


def _truncated_png() -> bytes:
    data = png_raw(np.asarray(np.random.default_rng(2).integers(0, 256, (H, W, 3)), np.uint8), 8, 2)
    i = data.index(b"IDAT")
    return data[: i + 4 + 200]  # IDAT cut short; no CRC, no IEND


def _bad_deflate_png() -> bytes:
    """Every chunk well formed (lengths, CRCs, IEND) but the IDAT's zlib stream is garbage: only
    decoding finds it (the cheap checks pass it; DALI and PIL both fail)."""
    return (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", struct.pack(">IIBBBBB", W, H, 8, 2, 0, 0, 0))
            + _png_chunk(b"IDAT", b"\x78\x9c" + b"\xff" * 64) + _png_chunk(b"IEND", b""))


HTML = (b"<!DOCTYPE html>\n<html><head><title>403 Forbidden</title></head>\n"
        b"<body><h1>Forbidden</h1><p>You don't have permission to access this resource.</p></body></html>\n")


# ---------------------------------------------------------------- the table


@dataclass(frozen=True)
class OddImage:
    """One corpus file. ``key``: ``<label>/<file>``; ``make()``: its bytes; ``used``: True when it
    must be decoded and used, False when it must be quarantined; ``category``: the expected
    quarantine category (None when used); ``expected``: for used images, the upright picture
    uint8 [h, w, 3] preprocessing must produce (before resizing); ``reason``: for quarantined
    ones, a regular expression the quarantine reason must match (``re.search``); ``why``: one
    line for people."""

    key: str
    make: Callable[[], bytes]
    used: bool
    why: str
    category: str | None = None
    expected: np.ndarray | None = None
    reason: str | None = None


def _used(key: str, make: Callable[[], bytes], why: str, expected: np.ndarray = UPRIGHT) -> OddImage:
    return OddImage(key, make, True, why, None, expected)


def _bad(key: str, make: Callable[[], bytes], category: str, reason: str, why: str) -> OddImage:
    return OddImage(key, make, False, why, category, None, reason)


CORPUS: tuple[OddImage, ...] = (
    _used("jpeg/baseline.jpg", _jpeg, "baseline JPEG (the control)"),
    _used("jpeg/progressive.jpg", lambda: _jpeg(progressive=True), "progressive JPEG"),
    _used("jpeg/cmyk.jpg", lambda: _pil(UPRIGHT, "JPEG", "CMYK", quality=95), "CMYK JPEG (Adobe APP14)"),
    _used("jpeg/grey.jpg", lambda: _pil(GREY_UPRIGHT, "JPEG", "L", quality=95), "greyscale JPEG (1 channel)", GREY_UPRIGHT),
    _used("jpeg/exif-rotate-90-cw.jpg", lambda: _exif_jpeg(6), "stored sideways, EXIF orientation 6"),
    _used("jpeg/exif-rotate-90-ccw.jpg", lambda: _exif_jpeg(8), "stored sideways, EXIF orientation 8"),
    _used("jpeg/exif-rotate-180.jpg", lambda: _exif_jpeg(3), "stored upside down, EXIF orientation 3"),
    _used("jpeg/trailing-bytes.jpg", lambda: _jpeg() + b"\r\n\x00\x00garbage after EOI", "bytes after the end-of-image marker"),
    _used("jpeg/UPPER.JPG", _jpeg, "upper-case .JPG"),
    _used("jpeg/UPPER.JPEG", lambda: _jpeg(progressive=True), "upper-case .JPEG"),
    _used("jpeg/png-named.jpg", lambda: _pil(UPRIGHT, "PNG"), "PNG bytes named .jpg (the extension lies)"),
    _used("png/rgb.png", lambda: _pil(UPRIGHT, "PNG"), "8-bit RGB PNG (the control)"),
    _used("png/grey.png", lambda: _pil(GREY_UPRIGHT, "PNG", "L"), "8-bit greyscale PNG", GREY_UPRIGHT),
    _used("png/rgba.png", _rgba_png, "RGBA PNG (alpha dropped, colour kept)"),
    _used("png/palette-transparent.png", _palette_png, "palette PNG with a transparent index"),
    _used("png/grey16.png", _grey16_png, "16-bit greyscale PNG (PIL mode I;16)", GREY_UPRIGHT),
    _used("png/rgb16.png", _rgb16_png, "16-bit RGB PNG"),
    _used("png/UPPER.PNG", lambda: _pil(UPRIGHT, "PNG"), "upper-case .PNG"),
    _used("png/jpeg-named.png", _jpeg, "JPEG bytes named .png (the extension lies)"),
    _used("png/grey-alpha.png", _grey_alpha_png, "greyscale + alpha PNG (PIL mode LA)", GREY_UPRIGHT),
    _used("png/ancillary-bad-crc.png", _ancillary_bad_crc_png, "PNG with a bad CRC in a tEXt chunk (libpng drops it)"),
    _used("other/webp-named.jpg", lambda: _pil(UPRIGHT, "WEBP", lossless=True), "WebP bytes named .jpg (scraped data)"),
    _used("other/gif-named.jpg", lambda: _pil(UPRIGHT, "GIF"), "GIF bytes named .jpg (scraped data)"),
    _used("other/bmp-named.png", lambda: _pil(UPRIGHT, "BMP"), "BMP bytes named .png"),
    _used("other/tiff-named.jpg", lambda: _pil(UPRIGHT, "TIFF"), "TIFF bytes named .jpg"),
    _used("other/photo.webp", lambda: _pil(UPRIGHT, "WEBP", quality=95), "WebP (lossy) with its own extension"),
    _used("other/scan.TIF", lambda: _pil(UPRIGHT, "TIFF", compression="tiff_lzw"), "LZW TIFF, upper-case .TIF"),
    _used("other/icon.bmp", lambda: _pil(UPRIGHT, "BMP"), "BMP with its own extension"),
    _used("other/anim.gif", _two_frame_gif, "animated GIF (the first frame is used)"),
    _bad("broken/empty.jpg", lambda: b"", "empty", r"^empty file", "zero-byte file"),
    _bad("broken/truncated.jpg", _truncated_jpeg, "truncated", r"^truncated: .*no end-of-image marker after the last scan",
         "JPEG cut in the middle of its scan"),
    _bad("broken/header-only.jpg", lambda: _jpeg()[:300], "truncated", r"^truncated: .*no start-of-scan",
         "JPEG cut inside its header (no image data)"),
    _bad("broken/random.jpg", lambda: np.random.default_rng(3).integers(0, 256, 4096, dtype=np.uint8).tobytes(),
         "not-an-image", r"^not an image: unknown format", "random bytes named .jpg"),
    _bad("broken/error-page.jpg", lambda: HTML, "not-an-image", r"^not an image: HTML", "an HTML error page saved as .jpg"),
    _bad("broken/notes.png", lambda: b"label: cat\nsource: camera 2\n", "not-an-image", r"^not an image: text",
         "a text file named .png"),
    _bad("broken/bad-crc.png", _bad_crc_png, "corrupt-data", r"^corrupt data: CRC mismatch in the PNG's IDAT chunk",
         "PNG whose IDAT CRC does not match"),
    _bad("broken/truncated.png", _truncated_png, "truncated", r"^truncated: PNG ends inside its IDAT chunk",
         "PNG cut inside its IDAT chunk"),
    _bad("broken/bad-deflate.png", _bad_deflate_png, "undecodable", r"^decoder error: ",
         "PNG with valid chunks and CRCs but garbage compressed data"),
)


def write_corpus(out: Path, corpus: tuple[OddImage, ...] = CORPUS) -> dict[str, OddImage]:
    """Write every entry of ``corpus`` under ``out`` (ImageFolder layout); returns {key: entry}."""
    for e in corpus:
        p = out / e.key
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(e.make())
    return {e.key: e for e in corpus}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.tools.odd_images OUT_DIR", file=sys.stderr)
        return 2
    for key, e in write_corpus(Path(argv[0])).items():
        outcome = "used" if e.used else f"quarantined ({e.category})"
        print(f"{key}\t{outcome}\t{e.why}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
