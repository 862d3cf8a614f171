"""The image pipeline's stages as functions: what a caller's bytes become, what is refused and with which words."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from inferop.serving.pipeline import ImageRefused, decode, image_tensor, preprocess, top_k
from inferop_devtools.bench.pipeline import png_declaring


def encoded(image: Image.Image, fmt: str = "PNG", **options: object) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


def halves(size: tuple[int, int] = (200, 100)) -> Image.Image:
    """Red on the left half, blue on the right."""
    image = Image.new("RGB", size, (0, 0, 255))
    image.paste((255, 0, 0), (0, 0, size[0] // 2, size[1]))
    return image


class TestDecode:
    @pytest.mark.parametrize(
        ("data", "words"),
        [
            (b"", "an empty body"),
            (b"GIF89a" + b"\0" * 40, "not a JPEG or PNG image (46 bytes beginning b'GIF89a"),
            (b"hello, this is text", "not a JPEG or PNG image"),
        ],
        ids=["empty", "gif", "text"],
    )
    def test_bytes_that_are_no_image_are_refused_by_name(self, data: bytes, words: str) -> None:
        with pytest.raises(ImageRefused, match=words.replace("(", r"\(")):
            decode(data)

    def test_a_file_over_the_byte_limit_is_refused_before_it_is_read(self) -> None:
        data = encoded(halves((64, 64)))
        with pytest.raises(ImageRefused, match=f"{len(data)} bytes, over the 100 bytes .*maxImageBytes"):
            decode(data, max_bytes=100)

    @pytest.mark.parametrize("declared", [(20_000, 20_000), (7_000, 7_000)])
    def test_a_decompression_bomb_is_refused_from_its_header(self, declared: tuple[int, int]) -> None:
        bomb = png_declaring(*declared)
        assert len(bomb) < 100
        with pytest.raises(ImageRefused, match="maxImagePixels"):
            decode(bomb)

    def test_the_pixel_limit_is_the_services(self) -> None:
        data = encoded(Image.new("RGB", (300, 200)))
        with pytest.raises(ImageRefused, match="300x200 pixels, over the 50000"):
            decode(data, max_pixels=50_000)
        assert decode(data, max_pixels=60_000).size == (300, 200)

    def test_a_truncated_jpeg_is_refused_as_corrupt(self) -> None:
        data = encoded(halves((640, 480)), "JPEG", quality=90)
        with pytest.raises(ImageRefused, match="a corrupt JPEG"):
            decode(data[: len(data) // 2])

    @pytest.mark.parametrize(
        "mode", ["L", "P", "CMYK", "RGBA", "LA", "I;16", "1"], ids=lambda mode: mode.replace(";", "")
    )
    def test_every_mode_becomes_rgb(self, mode: str) -> None:
        fmt = "JPEG" if mode == "CMYK" else "PNG"
        image = halves().convert(mode) if mode not in ("I;16",) else Image.new("I;16", (200, 100), 40_000)
        rgb = decode(encoded(image, fmt))
        assert (rgb.mode, rgb.size) == ("RGB", (200, 100))
        if mode == "I;16":
            assert np.asarray(rgb)[0, 0].tolist() == [156, 156, 156]  # 40,000 / 257, rounded
        if mode in ("P", "RGBA", "CMYK"):
            left, right = np.asarray(rgb)[50, 20].astype(int), np.asarray(rgb)[50, 180].astype(int)
            assert left[0] > 200 > left[2] and right[2] > 200 > right[0]

    def test_transparency_is_shown_on_white(self) -> None:
        clear = Image.new("RGBA", (10, 10), (255, 0, 0, 0))
        assert np.asarray(decode(encoded(clear))).reshape(-1, 3).tolist()[0] == [255, 255, 255]

    def test_an_exif_rotated_photo_is_made_upright(self) -> None:
        exif = Image.Exif()
        exif[0x0112] = 6  # stored turned: a viewer rotates it 90 degrees clockwise
        rgb = decode(encoded(halves(), "JPEG", quality=95, exif=exif.tobytes()))
        assert rgb.size == (100, 200)
        pixels = np.asarray(rgb).astype(int)
        assert pixels[20, 50, 0] > 200 and pixels[180, 50, 2] > 200  # red on top, blue below

    def test_a_thousand_mutated_jpegs_are_each_decoded_or_refused_by_name(self) -> None:
        """Flipped, cut, repeated and inserted bytes of a photograph-like JPEG: every one gives a picture or
        ImageRefused, never another error (which a server would answer with a 500)."""
        rng = np.random.default_rng(7)
        noise = rng.normal(128, 50, size=(48, 64, 3)).clip(0, 255).astype(np.uint8)
        original = encoded(Image.fromarray(noise), "JPEG", quality=80, exif=Image.Exif().tobytes())
        outcomes = {"decoded": 0, "refused": 0}
        for _ in range(1000):
            data = bytearray(original)
            for _ in range(int(rng.integers(1, 6))):
                at = int(rng.integers(0, len(data)))
                kind = rng.integers(0, 4)
                if kind == 0:
                    data[at] = int(rng.integers(0, 256))
                elif kind == 1:
                    del data[at:]
                elif kind == 2:
                    data[at:at] = bytes(rng.integers(0, 256, size=int(rng.integers(1, 16)), dtype=np.uint8))
                else:
                    data[at:at] = data[at : at + int(rng.integers(1, 64))]
            try:
                assert decode(bytes(data)).mode == "RGB"
                outcomes["decoded"] += 1
            except ImageRefused:
                outcomes["refused"] += 1
        assert min(outcomes.values()) > 0, outcomes  # the mutations reach both ends


class TestPreprocess:
    def test_the_same_picture_as_a_png_and_a_good_jpeg_gives_nearly_the_same_tensor(self) -> None:
        picture = halves((400, 300))
        png = preprocess(decode(encoded(picture)), 32, 1.0, [0.5] * 3, [0.25] * 3)
        jpeg = preprocess(decode(encoded(picture, "JPEG", quality=95)), 32, 1.0, [0.5] * 3, [0.25] * 3)
        assert png.shape == (3, 32, 32) and png.dtype == np.float32
        assert np.abs(png - jpeg).mean() < 0.05

    def test_a_large_jpeg_is_decoded_at_the_least_scale_that_covers_the_resize(self) -> None:
        photo = encoded(halves((2000, 1500)), "JPEG", quality=90)
        assert decode(photo, short_side=342).size == (500, 375)  # a quarter: an eighth would be under 342
        assert decode(photo, short_side=1500).size == (2000, 1500)
        declared = (299, 342 / 299, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
        full = preprocess(decode(photo), *declared)
        assert np.abs(image_tensor(photo, *declared) - full).mean() < 0.01  # of a range of about 4.5: the edge moves


class TestTopK:
    def test_the_best_first_with_softmax_probabilities(self) -> None:
        order, probabilities = top_k(np.array([[1.0, 3.0, 2.0, 3.0]]), 3)
        assert order.tolist() == [[1, 3, 2]]  # a tie in the classes' order
        expected = np.exp([3.0, 3.0, 2.0]) / np.exp([1.0, 3.0, 2.0, 3.0]).sum()
        np.testing.assert_allclose(probabilities[0], expected)


def test_the_stage_refuses_by_the_spec_s_defaults() -> None:
    """The stage runs in Triton's python stub without inferop_core, so it holds the spec's defaults again."""
    from inferop.serving import pipeline
    from inferop_core import tritonconfig

    assert (pipeline.MAX_IMAGE_BYTES, pipeline.MAX_IMAGE_PIXELS) == (
        tritonconfig.DEFAULT_MAX_IMAGE_BYTES,
        tritonconfig.DEFAULT_MAX_IMAGE_PIXELS,
    )


# A fresh interpreter decodes the file named by argv[1] into Inception V3's tensor and prints its peak resident rise:
# the kernel's high-water mark, reset (clear_refs 5) once the imports' own peak is behind and a small picture is done.
PEAK_SCRIPT = """
import io, sys
from PIL import Image
from inferop.serving.pipeline import image_tensor
def kib(field):
    return int(next(line for line in open("/proc/self/status") if line.startswith(field)).split()[1])
warm = io.BytesIO()
Image.new("RGB", (8, 8)).save(warm, "PNG")
image_tensor(warm.getvalue(), 299, 342 / 299, [0.5] * 3, [0.25] * 3)  # what one picture loads, the stage has loaded
data = open(sys.argv[1], "rb").read()
with open("/proc/self/clear_refs", "w") as refs:
    refs.write("5")
before = kib("VmRSS:")
image_tensor(data, 299, 342 / 299, [0.5] * 3, [0.25] * 3, 2**30, 10**9)
print((kib("VmHWM:") - before) * 1024)
"""


@pytest.mark.parametrize("mode", ["RGBA", "I;16", "RGB"])
def test_a_decoded_picture_takes_no_more_memory_than_the_estimate_counts(mode: str, tmp_path: Path) -> None:
    """The memory fit counts DECODED_BYTES_PER_PIXEL for each pixel a decoding instance may take in (its worst
    pictures: transparent and 16-bit PNGs); a copy of the pixels more than the decode needs breaks it."""
    from inferop_core.memory import DECODED_BYTES_PER_PIXEL

    height, width = 1500, 2400
    y, x = np.mgrid[0:height, 0:width]
    smooth = ((x * 5 + y * 11) % 256).astype(np.uint8)  # compresses: a small file of many pixels
    planes = {"RGBA": 4, "RGB": 3}
    if mode == "I;16":
        picture = Image.fromarray(smooth.astype(np.uint16) * 257)
    else:
        picture = Image.fromarray(np.stack([(smooth + 60 * i) % 256 for i in range(planes[mode])], -1).astype(np.uint8))
    assert picture.mode == mode
    path = tmp_path / "picture.png"
    picture.save(path)
    run = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, str(path)], capture_output=True, text=True, check=True)
    rise = int(run.stdout)
    assert rise <= DECODED_BYTES_PER_PIXEL * height * width, f"{rise / (height * width):.2f} bytes a pixel"
    if mode != "RGB":  # the worst pictures are what the constant is for: it stays close to them
        assert rise >= 0.85 * DECODED_BYTES_PER_PIXEL * height * width, f"{rise / (height * width):.2f} bytes a pixel"
