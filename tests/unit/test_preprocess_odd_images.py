"""C13: the cheap checks before DALI and the PIL fallback decoder, on the generated corpus.

The corpus and its expected outcomes: tests/tools/odd_images.py (the integration test
tests/integration/test_odd_images.py runs the same table through stage -> preprocess).
"""

from __future__ import annotations

import io
import re
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from pipectl.components.preprocess.decode import decode_with_pil
from pipectl.components.preprocess.screen import Corrupt, image_format, screen
from tests.tools.odd_images import CORPUS, UPRIGHT, png_raw, quadrant_means


@pytest.mark.parametrize("entry", CORPUS, ids=[e.key for e in CORPUS])
def test_C13_screen_passes_valid_images_and_names_what_is_wrong_with_broken_ones(entry):
    """Used images pass to the decoder; broken ones get their category and a reason naming the fault.
    ``undecodable`` ones pass too: only decoding finds them."""
    fmt, verdict = screen(entry.make())
    if entry.used or entry.category == Corrupt.UNDECODABLE:
        assert verdict is None, verdict
        assert fmt is not None
    else:
        assert verdict is not None and verdict.category == entry.category, verdict
        assert re.search(entry.reason, verdict.reason), verdict.reason


@pytest.mark.parametrize("key, fmt", [("jpeg/png-named.jpg", "PNG"), ("png/jpeg-named.png", "JPEG"),
                                      ("other/webp-named.jpg", "WEBP"), ("other/gif-named.jpg", "GIF"),
                                      ("other/bmp-named.png", "BMP"), ("other/tiff-named.jpg", "TIFF"),
                                      ("jpeg/UPPER.JPG", "JPEG"), ("png/UPPER.PNG", "PNG")])
def test_C13_the_format_is_read_from_the_bytes_not_the_name(key, fmt):
    entry = next(e for e in CORPUS if e.key == key)
    assert image_format(entry.make()) == fmt


def _chunk(kind: bytes, data: bytes, crc: int | None = None) -> bytes:
    crc = zlib.crc32(kind + data) & 0xFFFFFFFF if crc is None else crc
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


def test_C13_png_checks_follow_libpng_critical_chunks_only():
    """A bad CRC in an ancillary chunk is dropped by libpng (not corruption); in a critical one it is
    refused (corrupt data); a PNG without IEND is cut short; bytes after IEND are ignored."""
    png = png_raw(UPRIGHT, 8, 2)
    idat = png.index(b"IDAT") - 4
    assert screen(png + b"\r\n\x00\x00")[1] is None
    assert screen(png[:idat] + _chunk(b"tIME", b"\x07\xe3\x01\x01\x00\x00\x00", crc=1) + png[idat:])[1] is None
    bad_ihdr = bytearray(png)
    bad_ihdr[16] ^= 0x01  # width's low byte inside IHDR: its CRC no longer matches
    v = screen(bytes(bad_ihdr))[1]
    assert v.category == Corrupt.CORRUPT_DATA and "IHDR" in v.reason
    v = screen(png[: png.index(b"IEND") - 4])[1]
    assert v.category == Corrupt.TRUNCATED and "without its IEND" in v.reason
    no_idat = png[:idat] + _chunk(b"IEND", b"")
    assert screen(no_idat)[1].category == Corrupt.CORRUPT_DATA


def test_C13_not_an_image_says_what_it_is():
    assert "'404 Not Found'" in screen(b"\n  <html><head><title>404 Not Found</title></head></html>")[1].reason
    assert screen(b'<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg"/>')[1].reason.startswith("not an image: SVG")
    assert screen(b'{"error": "rate limited"}')[1].reason.startswith("not an image: text")
    assert screen(b"\x00\x01\x02\x03garbage\xff")[1].reason == "not an image: unknown format (first bytes 00 01 02 03 67 61 72 62)"
    assert screen(b"")[1].category == Corrupt.EMPTY


def _pil_rgb(data: bytes) -> np.ndarray:
    out = Image.open(io.BytesIO(decode_with_pil(data)))
    assert out.format == "PNG" and out.mode == "RGB"
    return np.asarray(out)


@pytest.mark.parametrize("key", ["jpeg/exif-rotate-90-cw.jpg", "jpeg/exif-rotate-90-ccw.jpg", "jpeg/exif-rotate-180.jpg",
                                 "jpeg/cmyk.jpg", "png/rgba.png", "png/palette-transparent.png", "png/grey16.png",
                                 "png/rgb16.png", "png/grey-alpha.png", "other/anim.gif", "other/gif-named.jpg"])
def test_C13_the_fallback_decoder_gives_the_upright_rgb_picture(key):
    """PIL fallback = torchvision's loader + exif_transpose: upright, 3 channels, 16-bit scaled (not
    clipped: grey16 would read 255 everywhere), alpha dropped, first GIF frame."""
    entry = next(e for e in CORPUS if e.key == key)
    img = _pil_rgb(entry.make())
    assert img.shape == entry.expected.shape
    assert np.abs(quadrant_means(img.astype(np.float64)) - quadrant_means(entry.expected.astype(np.float64))).max() < 6


def test_C13_the_fallback_decoder_refuses_a_truncated_gif():
    gif = next(e for e in CORPUS if e.key == "other/anim.gif").make()
    with pytest.raises(OSError):
        decode_with_pil(gif[: len(gif) // 3])
