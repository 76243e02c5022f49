"""Image headers: the size read in Python agrees with libjpeg-turbo's, and bad headers are 400s."""

from __future__ import annotations

import io

import numpy as np
import pytest
import simplejpeg
from PIL import Image

from pipeline.errors import InvalidInput
from pipeline.imaging import encode_jpeg, image_size, jpeg_size


def _pillow_jpeg(img: np.ndarray, **save) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "JPEG", **save)
    return buf.getvalue()


def _jpegs() -> list[tuple[str, bytes]]:
    rng = np.random.default_rng(0)
    out = []
    for h, w in ((1, 1), (300, 451), (17, 4000), (2048, 3)):
        rgb = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
        out.append((f"simplejpeg {h}x{w}", encode_jpeg(rgb, 90)))
    rgb = rng.integers(0, 255, (123, 77, 3), dtype=np.uint8)
    exif = Image.Exif()
    exif[0x010F] = "Ferry camera"  # Make: an APP1 segment before the frame header
    out += [
        ("progressive", _pillow_jpeg(rgb, progressive=True)),
        ("restart intervals", _pillow_jpeg(rgb, restart_marker_blocks=1)),
        ("exif and icc", _pillow_jpeg(rgb, exif=exif, icc_profile=b"\0" * 3000)),
        ("grayscale", _pillow_jpeg(rgb[..., 0])),
        ("4:4:4 quality 100", _pillow_jpeg(rgb, quality=100, subsampling=0)),
    ]
    return out


@pytest.mark.parametrize("name,data", _jpegs(), ids=[n for n, _ in _jpegs()])
def test_jpeg_size_agrees_with_libjpeg_turbo(name, data):
    h, w, _, _ = simplejpeg.decode_jpeg_header(data)
    assert jpeg_size(data) == (h, w) == image_size(data, "jpeg")


@pytest.mark.parametrize(
    "data,detail",
    [
        (b"\xff\xd8", "no frame header"),
        (b"\xff\xd8\xff\xe0\x00\x10JFIF", "no frame header"),  # cut inside APP0
        (b"\xff\xd8\x00\x00\x00\x00", "no marker"),
        (b"\xff\xd8\xff\xe0\x00\x01\x00\x00", "segment length 1"),
        (b"\xff\xd8\xff\xda\x00\x08\x01\x01\x00\x00\x3f\x00", "no frame header"),  # scan first
        (b"\x89PNG\r\n\x1a\n", "no start-of-image"),
    ],
)
def test_malformed_jpeg_headers_are_invalid_input(data, detail):
    with pytest.raises(InvalidInput, match="malformed JPEG header") as err:
        jpeg_size(data)
    assert detail in err.value.fields["detail"]


def test_a_body_cut_before_the_frame_header_ends_is_invalid_input_and_after_it_reads():
    data = _pillow_jpeg(np.zeros((40, 60, 3), np.uint8))
    end = data.index(b"\xff\xc0") + 9  # the baseline frame header's height and width end here
    for cut in range(end):
        with pytest.raises(InvalidInput):
            jpeg_size(data[:cut])
    for cut in range(end, len(data) + 1, 7):
        assert jpeg_size(data[:cut]) == (40, 60)
