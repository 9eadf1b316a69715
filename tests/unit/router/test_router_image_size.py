"""An inline image's size from the head of its data: URL, as the body scan keeps it."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from autoglm_api.image_size import data_url_size
from autoglm_router.scan import IMAGE_HEAD_CHARS


def data_url(fmt: str, width: int, height: int, **save: object) -> str:
    buffer = io.BytesIO()
    image = Image.effect_noise((width, height), 40).convert("RGB")  # not trivially small
    image.save(buffer, format=fmt, **save)
    mime = "png" if fmt == "PNG" else "jpeg"
    return f"data:image/{mime};base64," + base64.b64encode(buffer.getvalue()).decode()


@pytest.mark.parametrize(("fmt", "save"), [
    ("PNG", {}), ("JPEG", {}), ("JPEG", {"progressive": True}),
    # A camera's metadata ahead of the frame header, well inside the scanned head.
    ("JPEG", {"exif": b"Exif\x00\x00" + b"\x00" * 1500}),
])  # fmt: skip
@pytest.mark.parametrize(("width", "height"), [(1080, 2400), (540, 1200), (2400, 1080)])
def test_the_size_comes_from_the_head_the_scan_keeps(
    fmt: str, save: dict[str, object], width: int, height: int
) -> None:
    head = data_url(fmt, width, height, **save)[:IMAGE_HEAD_CHARS]
    assert data_url_size(head) == (width, height)


@pytest.mark.parametrize("url", [
    "data:image/png;base64,AAAA",  # too short to hold the header
    "data:image/png;base64,iVBORw0KGgo",  # the signature, cut off
    "data:image/gif;base64,R0lGODlhAQABAAAAACw=",  # another format
    "data:image/png,rawbytes",  # not base64
    "data:image/png;base64,!!!!",  # not valid base64
    "https://example.com/screen.png",  # remote: not read
    "",
])  # fmt: skip
def test_a_head_that_does_not_say_gives_no_size(url: str) -> None:
    assert data_url_size(url) is None


def test_metadata_that_fills_the_head_gives_no_size_rather_than_a_wrong_one() -> None:
    url = data_url("JPEG", 540, 1200, exif=b"Exif\x00\x00" + b"\x00" * 6000)
    assert data_url_size(url) == (540, 1200)
    assert data_url_size(url[:IMAGE_HEAD_CHARS]) is None
