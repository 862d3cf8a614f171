"""`inferop infer` and `inferop bench` without a server: preprocessing, boards, softmax, statistics, waiting."""

from __future__ import annotations

import asyncio
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from inferop.bench import LevelResult, build_figure, format_table, percentiles, read_answer, statistics_delta
from inferop.client import (
    BOARD_CAVEAT,
    LABELS_CAVEAT,
    InferError,
    load_board,
    preprocess_image,
    recorded_weights,
    softmax,
    weights_note,
)
from inferop_core.processing import Processing
from inferop_core.tritonconfig import ServingConfig, TensorSpec, build_model_config, random_weights
from tests.helpers import IMAGENET, TINY_BOARD

IMAGENET_MEAN = np.array(IMAGENET.mean, dtype=np.float32)
IMAGENET_STD = np.array(IMAGENET.std, dtype=np.float32)


class TestPreprocessImage:
    @pytest.mark.parametrize("size", [(400, 300), (299, 299), (120, 500), (1000, 1000)])
    @pytest.mark.parametrize("colour", [(200, 100, 50), (0, 255, 17)])
    def test_solid_colour_is_imagenet_normalised(
        self, tmp_path: Path, size: tuple[int, int], colour: tuple[int, int, int]
    ) -> None:
        path = tmp_path / "solid.png"
        Image.new("RGB", size, colour).save(path)
        pixels = preprocess_image(path, 299, IMAGENET)
        assert pixels.shape == (3, 299, 299)
        assert pixels.dtype == np.float32
        expected = (np.array(colour, dtype=np.float32) / 255 - IMAGENET_MEAN) / IMAGENET_STD
        np.testing.assert_allclose(pixels, np.broadcast_to(expected[:, None, None], pixels.shape), atol=1e-5)

    def test_channels_come_first_and_the_centre_is_kept(self, tmp_path: Path) -> None:
        # Left third red, the rest blue: after the centre crop of a 600x300 image the crop starts inside red.
        image = Image.new("RGB", (600, 300), (0, 0, 255))
        image.paste((255, 0, 0), (0, 0, 200, 300))
        path = tmp_path / "halves.png"
        image.save(path)
        pixels = preprocess_image(path, 299, IMAGENET)
        red = (1 - IMAGENET_MEAN[0]) / IMAGENET_STD[0]
        blue = (1 - IMAGENET_MEAN[2]) / IMAGENET_STD[2]
        assert pixels[0, 150, 0] == pytest.approx(red, abs=1e-5)  # left edge of the crop: red
        assert pixels[2, 150, 298] == pytest.approx(blue, abs=1e-5)  # right edge: blue

    def test_without_a_file_the_drawn_picture_is_used(self) -> None:
        pixels = preprocess_image(None, 299, IMAGENET)
        assert pixels.shape == (3, 299, 299)
        assert pixels.std() > 0.1  # a picture, not a blank

    def test_the_declared_normalisation_is_applied(self, tmp_path: Path) -> None:
        path = tmp_path / "grey.png"
        Image.new("RGB", (64, 64), (51, 51, 51)).save(path)
        plain = Processing(kind="imageClassification", resize_ratio=1.0, mean=[0.0, 0.0, 0.0], std=[0.5, 0.5, 0.5])
        np.testing.assert_allclose(preprocess_image(path, 32, plain), 0.4, atol=1e-6)  # 51/255 / 0.5

    def test_grey_and_palette_images_become_rgb(self, tmp_path: Path) -> None:
        path = tmp_path / "grey.png"
        Image.new("L", (320, 320), 128).save(path)
        assert preprocess_image(path, 299, IMAGENET).shape == (3, 299, 299)

    @pytest.mark.parametrize("content", [None, b"not an image"], ids=["missing", "not an image"])
    def test_unreadable_image_names_the_file(self, tmp_path: Path, content: bytes | None) -> None:
        path = tmp_path / "cat.png"
        if content is not None:
            path.write_bytes(content)
        with pytest.raises(InferError, match=re.escape(f"image {path}")):
            preprocess_image(path, 299, IMAGENET)


class TestLoadBoard:
    def test_from_text_rows(self, tmp_path: Path) -> None:
        path = tmp_path / "board.txt"
        path.write_text("\n".join(" ".join(str(c) for c in row) for row in TINY_BOARD) + "\n")
        board = load_board(path, [1, 6, 5], seed=0)
        assert board.dtype == np.float32
        np.testing.assert_array_equal(board, np.array(TINY_BOARD, dtype=np.float32)[None])

    def test_from_npy(self, tmp_path: Path) -> None:
        path = tmp_path / "board.npy"
        np.save(path, np.array(TINY_BOARD, dtype=np.int64))
        np.testing.assert_array_equal(load_board(path, [1, 6, 5], seed=0), np.array(TINY_BOARD, dtype=np.float32)[None])

    def test_random_board_is_seeded_and_holds_stones(self) -> None:
        board = load_board(None, [1, 6, 5], seed=4)
        assert board.shape == (1, 6, 5)
        assert set(np.unique(board)) <= {-1.0, 0.0, 1.0}
        np.testing.assert_array_equal(board, load_board(None, [1, 6, 5], seed=4))
        assert not np.array_equal(board, load_board(None, [1, 6, 5], seed=5))

    @pytest.mark.parametrize("suffix", [".txt", ".npy"])
    def test_wrong_size_names_the_file_and_both_shapes(self, tmp_path: Path, suffix: str) -> None:
        path = tmp_path / f"small{suffix}"
        small = np.zeros((4, 4), dtype=np.float32)
        if suffix == ".npy":
            np.save(path, small)
        else:
            np.savetxt(path, small)
        with pytest.raises(
            InferError, match=re.escape(f"board {path}: [4, 4] cells do not fit the model's board [1, 6, 5]")
        ):
            load_board(path, [1, 6, 5], seed=0)

    def test_unreadable_file_names_the_file(self, tmp_path: Path) -> None:
        path = tmp_path / "board.txt"
        path.write_text("x o x\n")
        with pytest.raises(InferError, match=re.escape(f"board {path}")):
            load_board(path, [1, 1, 3], seed=0)


class TestSoftmax:
    def test_probabilities_in_the_ratio_of_the_exponentials(self) -> None:
        probabilities = softmax(np.array([1.0, 2.0, 3.0]))
        assert probabilities.sum() == pytest.approx(1.0)
        assert probabilities[2] / probabilities[1] == pytest.approx(np.e)
        np.testing.assert_allclose(probabilities, np.exp([1, 2, 3]) / np.exp([1, 2, 3]).sum())

    def test_large_logits_do_not_overflow(self) -> None:
        probabilities = softmax(np.array([1000.0, 1001.0]))
        np.testing.assert_allclose(probabilities, [1 / (1 + np.e), np.e / (1 + np.e)])


def statistics(success: int, queue_ns: int, compute_ns: tuple[int, int, int], inferences: int, executions: int) -> Any:
    """The shape of one `get_inference_statistics(model)` answer."""
    compute_input, compute_infer, compute_output = compute_ns
    return {
        "model_stats": [
            {
                "name": "conv_net",
                "version": "1",
                "inference_count": inferences,
                "execution_count": executions,
                "inference_stats": {
                    "success": {"count": success, "ns": 0},
                    "fail": {"count": 0, "ns": 0},
                    "queue": {"count": success, "ns": queue_ns},
                    "compute_input": {"count": success, "ns": compute_input},
                    "compute_infer": {"count": success, "ns": compute_infer},
                    "compute_output": {"count": success, "ns": compute_output},
                },
            }
        ]
    }


class TestStatisticsDelta:
    def test_per_request_times_and_mean_batch_of_the_difference(self) -> None:
        # Warm-up before: 9 samples in 2 executions. Then 10 requests of 2 samples in 4 executions.
        before = statistics(9, 5_000_000, (1_000_000, 20_000_000, 1_000_000), inferences=9, executions=2)
        after = statistics(19, 45_000_000, (3_000_000, 78_000_000, 4_000_000), inferences=29, executions=6)
        assert statistics_delta(before, after) == {
            "requests": 10,
            "queue_ms": pytest.approx(4.0),  # 40 ms over 10 requests
            "compute_ms": pytest.approx(6.3),  # (2 + 58 + 3) ms over 10 requests
            "mean_batch": pytest.approx(5.0),  # 20 samples in 4 executions
        }

    def test_no_requests_gives_zeros_not_a_division_error(self) -> None:
        same = statistics(9, 5, (1, 2, 3), inferences=9, executions=2)
        assert statistics_delta(same, same) == {
            "requests": 0,
            "queue_ms": 0.0,
            "compute_ms": 0.0,
            "mean_batch": 0.0,
        }


class TestPercentiles:
    def test_in_milliseconds(self) -> None:
        p50, p90, p99 = percentiles([i / 1000 for i in range(1, 101)])  # 1 .. 100 ms
        assert p50 == pytest.approx(50.5)
        assert p90 == pytest.approx(90.1)
        assert p99 == pytest.approx(99.01)

    def test_none_measured_is_nan(self) -> None:
        assert all(np.isnan(p) for p in percentiles([]))


def served_config(weights: str | None) -> dict[str, Any]:
    """A model config as Triton's model-config endpoint answers it (the protobuf's JSON form)."""
    from google.protobuf import json_format

    cfg = ServingConfig(
        name="conv_net",
        inputs=(TensorSpec(name="board", dims=(1, 6, 5)),),
        outputs=(TensorSpec(name="value", dims=(1,)),),
        weights=weights,
    )
    answer: dict[str, Any] = json_format.MessageToDict(build_model_config(cfg), preserving_proto_field_name=True)
    return answer


class TestWeightsNote:
    """`inferop infer` says under every answer where the weights came from, and what random ones are worth."""

    def test_random_weights_carry_the_caveat(self) -> None:
        weights = recorded_weights(served_config(random_weights(0)))
        assert weights == "random (seed 0)"
        assert weights_note(weights, LABELS_CAVEAT) == (
            "weights: random (seed 0); the labels show the pipeline working, not accuracy"
        )
        assert weights_note(weights, BOARD_CAVEAT) == (
            "weights: random (seed 0); policy and value show the pipeline working, not playing strength"
        )

    def test_a_weights_file_is_named_without_the_caveat(self) -> None:
        weights = recorded_weights(served_config("inception_v3.pth, sha256 0123456789abcdef"))
        assert weights_note(weights, LABELS_CAVEAT) == "weights: inception_v3.pth, sha256 0123456789abcdef"

    def test_a_model_from_elsewhere_says_it_is_not_recorded(self) -> None:
        weights = recorded_weights(served_config(None))
        assert weights is None
        assert weights_note(weights, LABELS_CAVEAT) == (
            "weights: not recorded (the model's config has no 'inferop_weights' parameter)"
        )


def level(concurrency: int, throughput: float, p99_ms: float, rejected: int = 0) -> LevelResult:
    return LevelResult(
        concurrency=concurrency,
        requests=100,
        rejected=rejected,
        errors=0,
        seconds=3.0,
        throughput=throughput,
        p50_ms=p99_ms * 0.8,
        p90_ms=p99_ms * 0.9,
        p99_ms=p99_ms,
        queue_ms=0.0,
        compute_ms=0.0,
        mean_batch=1.0,
    )


# Nearly flat throughput at high latency: an axis from the lowest value would draw a fourfold rise.
FLAT_SWEEP = [level(1, 13.95, 80.0), level(4, 14.0, 290.0), level(16, 14.2, 1150.0)]


class TestBenchPlot:
    def test_both_axes_start_at_zero_and_show_every_point(self) -> None:
        pytest.importorskip("matplotlib", reason="install the serving extra: .venv/bin/pip install -e '.[serve]'")
        latency_axis, throughput_axis = build_figure("inception_v3", FLAT_SWEEP).axes
        assert throughput_axis.get_ylabel() == "samples / s"
        assert latency_axis.get_ylim()[0] == throughput_axis.get_ylim()[0] == 0
        assert throughput_axis.get_ylim()[1] >= 14.2
        assert latency_axis.get_ylim()[1] >= 1150.0

    def test_writes_a_png(self, tmp_path: Path) -> None:
        pytest.importorskip("matplotlib", reason="install the serving extra: .venv/bin/pip install -e '.[serve]'")
        from inferop.bench import plot

        path = tmp_path / "bench.png"
        plot("inception_v3", FLAT_SWEEP, path)
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class TestRejections:
    """A full queue's 503 is the bound at work: counted apart from errors, and said so where it happened."""

    @pytest.mark.parametrize(
        ("answer", "status", "body"),
        [
            (
                b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: 5\r\n\r\nhello",
                200,
                b"hello",
            ),
            (
                b'HTTP/1.1 503 Service Unavailable\r\ncontent-length: 19\r\n\r\n{"error":"timeout"}',
                503,
                b'{"error":"timeout"}',
            ),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n",
                200,
                b"abcde",
            ),
            (b"HTTP/1.1 204 No Content\r\n\r\n", 204, b""),
        ],
    )
    def test_an_answer_is_read_to_its_end_and_no_further(self, answer: bytes, status: int, body: bytes) -> None:
        async def read() -> tuple[tuple[int, bytes], bytes]:
            reader = asyncio.StreamReader()
            reader.feed_data(answer + b"HTTP/1.1 next")
            reader.feed_eof()
            return await read_answer(reader), await reader.read()

        assert asyncio.run(read()) == ((status, body), b"HTTP/1.1 next")

    @pytest.mark.parametrize("answer", [b"SSH-2.0-OpenSSH\r\n\r\n", b"HTTP/1.1 OK\r\n\r\n"])
    def test_what_is_not_http_is_an_error_that_quotes_it(self, answer: bytes) -> None:
        async def read() -> tuple[int, bytes]:
            reader = asyncio.StreamReader()
            reader.feed_data(answer)
            reader.feed_eof()
            return await read_answer(reader)

        with pytest.raises(ValueError, match="not an HTTP answer"):
            asyncio.run(read())

    def test_a_cut_answer_is_an_error(self) -> None:
        async def read() -> tuple[int, bytes]:
            reader = asyncio.StreamReader()
            reader.feed_data(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf")
            reader.feed_eof()
            return await read_answer(reader)

        with pytest.raises(asyncio.IncompleteReadError):
            asyncio.run(read())

    def test_the_table_says_what_a_rejection_is(self) -> None:
        assert "by design" not in format_table("m", 1, [level(1, 10.0, 5.0)])
        table = format_table("m", 1, [level(1, 10.0, 5.0), level(16, 10.0, 50.0, rejected=40)])
        assert table.splitlines()[3].split()[5] == "40"  # the rejected column
        assert "rejected: answered at once with 503 by a full queue" in table and "by design" in table


class TestWaitForTheServer:
    """`inferop infer --wait`: a server started in the background a moment before is waited for, never forever."""

    def test_nobody_listening_ends_at_the_deadline_with_the_last_reason(self) -> None:
        with socket.socket() as probe:  # a port that nothing listens on once closed
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        command = [sys.executable, "-m", "inferop_core.cli", "infer", "--url", f"127.0.0.1:{port}", "--model", "m"]
        started = time.monotonic()
        result = subprocess.run([*command, "--wait", "1.5"], capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode == 1
        assert re.search(rf"127\.0\.0\.1:{port}: not ready within --wait 1\.5 s \(.*[Rr]efused", result.stderr)
        assert time.monotonic() - started >= 1.5
        refused = subprocess.run([*command, "--wait", "-1"], capture_output=True, text=True, timeout=60, check=False)
        assert "--wait -1: seconds to wait cannot be negative" in refused.stderr
