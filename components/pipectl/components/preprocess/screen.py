"""Screening and quarantine verdicts: the cheap checks on an image's bytes before it is decoded,
the :class:`Corrupt` categories and the :class:`Verdict` that says why an image is quarantined.

What is corrupt (field case C13): an image the decoders cannot decode, not one whose bytes a
heuristic dislikes. The format is read from the bytes, not the file name (PNG bytes named .jpg are a
PNG). Checked on a generated corpus of odd and broken files (tests/tools/odd_images.py).
"""

from __future__ import annotations

import codecs
import re
import struct
import zlib
from collections import Counter
from dataclasses import dataclass
from typing import Sequence


class Corrupt:
    """Quarantine categories (``quarantine.json``'s ``category``), field case C13.

    The rule: an image is corrupt when the decoder cannot decode it, not when a heuristic dislikes
    its bytes. The cheap checks before DALI (:func:`screen`) only name, early and precisely, what
    the decoders would refuse anyway (measured on the C13 corpus, tests/tools/odd_images.py).
    """

    EMPTY = "empty"  # zero bytes
    NOT_AN_IMAGE = "not-an-image"  # HTML error page, text, unknown bytes: no image format
    TRUNCATED = "truncated"  # an image format, cut short (no JPEG EOI after the last scan, PNG without IEND)
    CORRUPT_DATA = "corrupt-data"  # complete, but a checksum or the structure says the bytes changed
    UNDECODABLE = "undecodable"  # passed the checks, but DALI and the PIL fallback both failed to decode it
    CHANGED = "changed"  # not the bytes the manifest names (sha256): changed in the store after staging


@dataclass(frozen=True)
class Verdict:
    """Why an image is quarantined: ``category`` (a :class:`Corrupt` value) and a sentence for people."""

    category: str
    reason: str


# formats DALI's decoders.image reads (DALI 2.4 docs, fn.decoders.image: "JPG, BMP, PNG, TIFF, PNM,
# JPEG 2000 and WebP"); GIF only through the PIL fallback. Recognised by content, never by name.
DALI_FORMATS = frozenset({"JPEG", "PNG", "BMP", "TIFF", "WEBP", "JPEG2000", "PNM"})
FALLBACK_FORMATS = frozenset({"GIF"})

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def image_format(data: bytes) -> str | None:
    """The image format of ``data`` by its magic bytes (file signatures of each format's spec),
    one of :data:`DALI_FORMATS` | :data:`FALLBACK_FORMATS`, or None. The file name plays no part."""
    if data[:2] == b"\xff\xd8":
        return "JPEG"
    if data[:8] == _PNG_SIGNATURE:
        return "PNG"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "GIF"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    if data[:4] in (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+"):
        return "TIFF"
    if data[:2] == b"BM" and len(data) >= 18 and int.from_bytes(data[14:18], "little") in (12, 40, 52, 56, 64, 108, 124):
        return "BMP"  # the DIB header sizes of the BMP versions
    if data[:12] == b"\x00\x00\x00\x0cjP  \r\n\x87\n" or data[:4] == b"\xff\x4f\xff\x51":
        return "JPEG2000"
    if len(data) > 2 and data[:1] == b"P" and data[1:2] in b"123456" and data[2:3] in b" \t\r\n#":
        return "PNM"
    return None


def _not_an_image(data: bytes) -> Verdict:
    """Name what non-image bytes are (the common cases in scraped or hand-made datasets)."""
    head = data[:2048]
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    low = text.lower()
    if low.startswith((b"<!doctype html", b"<html", b"<head", b"<body")) or b"<html" in low[:512]:
        m = re.search(rb"<title[^>]*>([^<]{1,80})", head, re.I)
        title = f": {m.group(1).decode('utf-8', 'replace').strip()!r}" if m else ""
        return Verdict(Corrupt.NOT_AN_IMAGE, f"not an image: HTML{title} (a web page, usually an error page "
                                             "a download saved under the image's name)")
    if low.startswith((b"<?xml", b"<svg")):
        kind = "SVG" if b"<svg" in low else "XML"
        return Verdict(Corrupt.NOT_AN_IMAGE, f"not an image: {kind} text (only raster images are decoded)")
    try:  # incremental: a character cut at the 2 KiB boundary is not an error
        decoded = codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError:
        decoded = None
    if decoded is not None and all(c.isprintable() or c in "\t\r\n" for c in decoded):
        if not decoded.strip():
            return Verdict(Corrupt.NOT_AN_IMAGE, "not an image: blank text (only white space)")
        first = decoded.strip().splitlines()[0][:40]
        return Verdict(Corrupt.NOT_AN_IMAGE, f"not an image: text (starts {first!r})")
    return Verdict(Corrupt.NOT_AN_IMAGE, f"not an image: unknown format (first bytes {data[:8].hex(' ')})")


def _check_jpeg(data: bytes) -> Verdict | None:
    # Bytes after EOI are not corruption (C13: a CR LF from a text-mode copy, zero padding, vendor
    # trailers, a second image (MPO)): decoders stop at EOI. Entropy-coded data cannot contain
    # FFDA/FFD9 (0xFF is byte-stuffed, ITU T.81 B.1.1.5), so rfind finds real markers. Without an
    # EOI after the last scan libjpeg-turbo (DALI's CPU decoder) fails: "Premature end of JPEG data".
    # Searched from where each marker is near: the first scan after the headers, the EOI at the
    # end (a backward search for the first scan's marker read the whole file, 2% of the step's CPU).
    if data.find(b"\xff\xda") < 0:
        return Verdict(Corrupt.TRUNCATED, "truncated: no start-of-scan marker (the JPEG ends inside its header: no image data)")
    end = data.rfind(b"\xff\xd9")
    if end < 0 or data.find(b"\xff\xda", end) >= 0:  # a scan after the last EOI
        return Verdict(Corrupt.TRUNCATED, "truncated: no end-of-image marker after the last scan "
                                          f"(the JPEG ends inside its image data, {len(data):,} bytes)")
    return None


def _check_png(data: bytes) -> Verdict | None:
    # Chunk walk (PNG spec 5.3): length, type, data, CRC-32 over type + data. A critical chunk's bad
    # CRC is refused by libpng (DALI's PNG decoder: "IDAT: CRC error"); an ancillary chunk's is only
    # a warning (the chunk is dropped), so it is not corruption. Bytes after IEND are ignored.
    pos, n, seen_idat = 8, len(data), False
    view = memoryview(data)  # CRCs over slices without copying them
    while True:
        if pos + 8 > n:
            return Verdict(Corrupt.TRUNCATED, f"truncated: PNG ends after {n:,} bytes, without its IEND chunk")
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if length > 0x7FFFFFFF or not kind.isalpha():
            return Verdict(Corrupt.CORRUPT_DATA, f"corrupt data: PNG chunk structure broken at byte {pos:,}")
        name = kind.decode("ascii")
        end = pos + 12 + length
        if end > n:
            return Verdict(Corrupt.TRUNCATED, f"truncated: PNG ends inside its {name} chunk "
                                              f"({max(0, n - pos - 8):,} of {length:,} bytes)")
        if kind[0] & 0x20 == 0:  # critical chunk (upper-case first letter)
            if zlib.crc32(view[pos + 4:end - 4]) & 0xFFFFFFFF != struct.unpack(">I", data[end - 4:end])[0]:
                return Verdict(Corrupt.CORRUPT_DATA, f"corrupt data: CRC mismatch in the PNG's {name} chunk "
                                                     "(its bytes changed after it was written)")
        seen_idat |= kind == b"IDAT"
        if kind == b"IEND":
            break
        pos = end
    if not seen_idat:
        return Verdict(Corrupt.CORRUPT_DATA, "corrupt data: PNG without an IDAT chunk (no image data)")
    return None


def screen(data: bytes) -> tuple[str | None, Verdict | None]:
    """Cheap checks before DALI (which fails a whole batch on one bad image); does not decode pixels.

    Returns (format by content (:func:`image_format`) or None, a :class:`Verdict` when the image is
    to be quarantined or None). Quarantined here: empty files, bytes of no image format (named:
    HTML, text, unknown), JPEGs without an end-of-image marker after the last scan, PNGs cut short
    or with a bad CRC in a critical chunk: what the decoders refuse (tests/tools/odd_images.py).
    Everything else goes to the decoder, which has the last word (:func:`decode_robust`).
    """
    if not data:
        return None, Verdict(Corrupt.EMPTY, "empty file (0 bytes)")
    fmt = image_format(data)
    if fmt is None:
        return None, _not_an_image(data)
    if fmt == "JPEG":
        return fmt, _check_jpeg(data)
    if fmt == "PNG":
        return fmt, _check_png(data)
    return fmt, None


def is_corrupt(data: bytes) -> str | None:
    """The quarantine reason of :func:`screen` for ``data``, or None when it goes to the decoder."""
    verdict = screen(data)[1]
    return verdict.reason if verdict is not None else None


def quarantine_summary(quarantined: Sequence[tuple[int, Verdict]]) -> str:
    """Counts per category, most first, then by name: ``"3 truncated, 2 not-an-image"`` ("none" when empty)."""
    counts = Counter(v.category for _, v in quarantined)
    return ", ".join(f"{n} {c}" for c, n in sorted(counts.items(), key=lambda cn: (-cn[1], cn[0]))) or "none"
