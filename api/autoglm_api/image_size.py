"""An inline image's width and height from the first bytes of its data: URL, without decoding it.

The router prices a request's images by it and the sim counts their prompt tokens by it
(`image_budget.image_tokens`). The router's body scan keeps only the head of each image URL
(`autoglm_router.scan.IMAGE_HEAD_CHARS`): enough for a PNG's IHDR chunk (bytes 16 to 24) and for
a JPEG's frame header unless metadata segments before it fill the head (a camera's EXIF
thumbnail can); a phone screenshot is a PNG with none."""

from __future__ import annotations

import base64
import binascii
import struct

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# JPEG start-of-frame markers (baseline, progressive, lossless...): not DHT, JPG or DAC.
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_STANDALONE_MARKERS = frozenset(range(0xD0, 0xDA)) | {0x01}  # RSTn, SOI, EOI, TEM: no length


def data_url_size(url: str) -> tuple[int, int] | None:
    """(width, height) of a base64 data: URL's PNG or JPEG, or None when its head does not
    say (another format, a cut-off head, not base64)."""
    if not url.startswith("data:"):
        return None
    meta, _, payload = url.partition(",")
    if not meta.endswith(";base64"):
        return None
    usable = len(payload) - len(payload) % 4
    try:
        head = base64.b64decode(payload[:usable], validate=True)
    except (binascii.Error, ValueError):
        return None
    return png_size(head) or jpeg_size(head)


def png_size(head: bytes) -> tuple[int, int] | None:
    if head[:8] != PNG_SIGNATURE or head[12:16] != b"IHDR" or len(head) < 24:
        return None
    width, height = struct.unpack(">II", head[16:24])
    return (width, height) if width and height else None


def jpeg_size(head: bytes) -> tuple[int, int] | None:
    if head[:2] != b"\xff\xd8":
        return None
    at = 2
    while at + 4 <= len(head):
        if head[at] != 0xFF:
            return None
        marker = head[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in _STANDALONE_MARKERS:
            at += 2
            continue
        (length,) = struct.unpack(">H", head[at + 2 : at + 4])
        if marker in _SOF_MARKERS:
            if at + 9 > len(head):
                return None
            height, width = struct.unpack(">HH", head[at + 5 : at + 9])
            return (width, height) if width and height else None
        at += 2 + length
    return None
