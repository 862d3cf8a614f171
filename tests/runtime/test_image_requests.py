"""`inferop infer --image` and `inferop bench --images` against an image pipeline (an ensemble taking encoded images):
the files' bytes sent as they are, the pipeline told apart by its config and never by its name, refusals that name
the file or the flag, the bytes a request carries reported; and the same against Inception V3 behind its pipeline on
the real tritonserver, where the answers are those of decoding and running the model in process."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from inferop.bench import LevelResult, bench_requests, format_table
from inferop.client import (
    LABELS_CAVEAT,
    InferError,
    ModelInfo,
    classify_encoded,
    describe,
    encoded_images,
    image_bytes,
    weights_note,
)
from inferop.openloop import encode_request, run_open_loop
from inferop.openloop import format_table as open_loop_table
from inferop_core.cli import main
from inferop_core.tritonconfig import (
    IMAGE_INPUT,
    LABELS_OUTPUT,
    PROBABILITIES_OUTPUT,
    PipelineConfig,
    ServingConfig,
    TensorSpec,
    build_model_config,
    build_pipeline_configs,
    random_weights,
)
from inferop_export.pipeline import photographs
from tests.helpers import image_classifier, pipeline_in_process

INFEROP = Path(sys.executable).with_name("inferop")


def served(configs: dict[str, Any]) -> Any:
    """A client of a server holding `configs` (name -> ModelConfig): its model config and metadata as Triton's HTTP
    endpoints answer them."""
    from google.protobuf import json_format

    answers = {name: json_format.MessageToDict(c, preserving_proto_field_name=True) for name, c in configs.items()}

    class Client:
        @staticmethod
        def get_model_config(name: str) -> dict[str, Any]:
            return answers[name]

        @staticmethod
        def get_model_metadata(name: str) -> dict[str, Any]:
            config = answers[name]
            batch = [-1] if config.get("max_batch_size") else []

            def tensors(key: str) -> list[dict[str, Any]]:
                return [
                    {
                        "name": t["name"],
                        "datatype": t["data_type"].removeprefix("TYPE_").replace("STRING", "BYTES"),
                        "shape": [*batch, *map(int, t["dims"])],
                    }
                    for t in config.get(key, [])
                ]

            return {"name": name, "inputs": tensors("input"), "outputs": tensors("output")}

    return Client()


def classifier(**changes: Any) -> ServingConfig:
    return image_classifier(**{"weights": random_weights(3), **changes})


def pipeline_configs(**changes: Any) -> dict[str, Any]:
    """The configs of the pipeline `inception_v3` around `classifier(**changes)`, by name."""
    pipeline = PipelineConfig(
        name="inception_v3", model=classifier(**changes), max_image_bytes=2**21, max_image_pixels=10**7, top_k=3
    )
    return build_pipeline_configs(pipeline)


def info(batched: bool = True, ensemble: bool = True) -> ModelInfo:
    """What `describe` reads from the ensemble `inception_v3`, or from its model alone."""
    if not ensemble:
        return describe(served({"inception_v3_model": build_model_config(classifier())}), "inception_v3_model")
    return describe(served(pipeline_configs(max_batch_size=8 if batched else 0)), "inception_v3")


class TestDescribe:
    """An image pipeline is told by its config: an ensemble whose input is IMAGE and outputs LABELS, PROBABILITIES."""

    def test_the_ensemble_is_an_image_pipeline_with_its_models_weights(self) -> None:
        described = describe(served(pipeline_configs()), "inception_v3")
        assert described.image_pipeline and described.batched
        assert [(t.name, t.datatype, t.dims) for t in described.inputs] == [(IMAGE_INPUT, "BYTES", [1])]
        assert described.weights == "random (seed 3)"  # recorded by its model member, not by the ensemble

    @pytest.mark.parametrize("name", ["inception_v3_model", "inception_v3_pre"])
    def test_its_members_are_not(self, name: str) -> None:
        assert not describe(served(pipeline_configs()), name).image_pipeline

    def test_never_from_the_name(self) -> None:
        """A model named like a pipeline, with an input named IMAGE, is no pipeline unless an ensemble."""
        config = build_model_config(
            classifier(name="inception_v3", inputs=(TensorSpec(name=IMAGE_INPUT, dims=(3, 299, 299)),))
        )
        assert not describe(served({"inception_v3": config}), "inception_v3").image_pipeline

    def test_an_ensemble_taking_other_inputs_is_not(self) -> None:
        configs = pipeline_configs()
        configs["inception_v3"].input[0].name = "PHOTO"
        assert not describe(served(configs), "inception_v3").image_pipeline


class FakeInfer:
    """`client.infer` of a server that answers every image with `labels` or refuses it with `refusal`."""

    def __init__(self, labels: list[str], refusal: str | None = None) -> None:
        self.labels, self.refusal = labels, refusal
        self.bodies: list[bytes] = []

    def infer(self, model: str, inputs: list[Any], outputs: list[Any], timeout: int | None) -> Any:
        import tritonclient.http as httpclient
        from tritonclient.utils import InferenceServerException

        (tensor,) = inputs
        assert (tensor.name(), tensor.datatype(), tensor.shape()) == (IMAGE_INPUT, "BYTES", [1, 1])
        self.bodies.append(httpclient.InferenceServerClient.generate_request_body(inputs)[0])
        if self.refusal is not None:
            raise InferenceServerException(self.refusal, status="400")
        k = len(self.labels)
        answer = {
            LABELS_OUTPUT: np.array([[label.encode() for label in self.labels]], dtype=np.object_),
            PROBABILITIES_OUTPUT: np.linspace(0.5, 0.1, k, dtype=np.float32)[None],
        }
        return type("Response", (), {"as_numpy": staticmethod(answer.__getitem__)})()


def photo_file(folder: Path, name: str, colour: tuple[int, int, int] = (200, 100, 50)) -> Path:
    path = folder / name
    Image.new("RGB", (64, 48), colour).save(path, "PNG" if name.lower().endswith(".png") else "JPEG")
    return path


class TestInferSendsTheFile:
    def test_the_file_s_own_bytes_as_one_bytes_element(self, tmp_path: Path) -> None:
        path = photo_file(tmp_path, "cat.jpg")
        server = FakeInfer(["tabby", "tiger cat", "Egyptian cat"])
        (answer,) = classify_encoded(server, info(), [path], 2, None)
        data = path.read_bytes()
        assert server.bodies[0].endswith(len(data).to_bytes(4, "little") + data)  # untouched: no decoding here
        assert answer["image"] == str(path)
        assert [item["label"] for item in answer["top"]] == ["tabby", "tiger cat"]  # --top 2 of the pipeline's 3
        assert answer["top"][0]["probability"] == pytest.approx(0.5)
        assert answer["weights"] == "random (seed 3)"

    def test_without_a_file_the_drawn_picture_goes_as_a_png(self) -> None:
        server = FakeInfer(["tabby"])
        (answer,) = classify_encoded(server, info(), [None], 5, None)
        assert answer["image"] == "sample picture (drawn)"
        assert b"\x89PNG\r\n\x1a\n" in server.bodies[0]

    def test_a_refusal_names_the_file_and_what_the_pipeline_said(self, tmp_path: Path) -> None:
        good, bad = photo_file(tmp_path, "cat.jpg"), tmp_path / "report.jpg"
        bad.write_bytes(b"%PDF-1.7 a document")
        server = FakeInfer(["tabby"], refusal="in ensemble 'inception_v3', not a JPEG or PNG image (19 bytes)")
        with pytest.raises(InferError) as raised:
            classify_encoded(server, info(), [bad, good], 5, None)
        assert str(raised.value) == (
            f"image {bad}: server said 400 in ensemble 'inception_v3', not a JPEG or PNG image (19 bytes)"
        )
        assert len(server.bodies) == 1  # one request a file: the refused one ends the call

    def test_an_unreadable_file_names_it(self, tmp_path: Path) -> None:
        with pytest.raises(InferError, match=re.escape(f"image {tmp_path / 'missing.jpg'}: ")):
            image_bytes(tmp_path / "missing.jpg")

    def test_the_image_input_is_a_bytes_tensor_on_the_wire(self) -> None:
        body, headers = encode_request({IMAGE_INPUT: encoded_images(info(), [b"\xff\xd8jpeg"])}, [LABELS_OUTPUT])
        header = json.loads(body[: int(headers["Inference-Header-Content-Length"])])
        assert [(t["name"], t["datatype"], t["shape"]) for t in header["inputs"]] == [(IMAGE_INPUT, "BYTES", [1, 1])]
        assert body.endswith((6).to_bytes(4, "little") + b"\xff\xd8jpeg")


class TestBenchRequests:
    """What `inferop bench --images` sends in turn: the files in their order, each in the cycle equally often."""

    FILES = (b"a" * 10, b"b" * 20, b"c" * 30)

    def folder(self, tmp_path: Path) -> list[Path]:
        for name, data in zip("abc", self.FILES, strict=True):
            (tmp_path / f"{name}.jpg").write_bytes(data)
        return sorted(tmp_path.iterdir())

    @pytest.mark.parametrize(
        ("batch", "expected"),
        [(1, ["a", "b", "c"]), (2, ["ab", "ca", "bc"]), (3, ["abc"])],
    )
    def test_batches_wrap_around_the_sorted_files(self, tmp_path: Path, batch: int, expected: list[str]) -> None:
        requests = bench_requests(info(), self.folder(tmp_path), batch)
        sent = ["".join(chr(data[0]) for data in array.ravel()) for ((tensor, array),) in requests]
        assert sent == expected
        assert {(tensor.name, array.shape, array.dtype) for ((tensor, array),) in requests} == {
            (IMAGE_INPUT, (batch, 1), np.dtype(np.object_))
        }

    def test_a_pipeline_without_a_batch_axis_gets_one_image_a_request(self, tmp_path: Path) -> None:
        requests = bench_requests(info(batched=False), self.folder(tmp_path), 4)
        assert [array.shape for ((_, array),) in requests] == [(1,)] * 3

    def test_images_for_a_model_that_is_no_pipeline_name_the_flag(self, tmp_path: Path) -> None:
        with pytest.raises(InferError, match=r"^--images: model 'inception_v3_model' is not an image pipeline"):
            bench_requests(info(ensemble=False), self.folder(tmp_path), 1)

    def test_a_pipeline_without_images_asks_for_them(self) -> None:
        with pytest.raises(
            InferError, match=re.escape("is an image pipeline: give it JPEG or PNG files with --images")
        ):
            bench_requests(info(), [], 1)


def exit_code(argv: list[str]) -> int:
    """`inferop ...`'s exit code, whether argparse or the command refused the input."""
    try:
        return main(argv)
    except SystemExit as exit:
        return int(exit.code or 0)


class TestImagesFlag:
    def test_the_folder_s_jpeg_and_png_files_sorted(self, tmp_path: Path) -> None:
        from inferop.bench import _image_folder

        for name in ("b.PNG", "a.jpg", "c.jpeg", "notes.txt", "d.gif"):
            (tmp_path / name).write_bytes(b"x")
        (tmp_path / "sub.jpg").mkdir()
        assert [path.name for path in _image_folder(str(tmp_path))] == ["a.jpg", "b.PNG", "c.jpeg"]

    @pytest.mark.parametrize(
        ("files", "message"),
        [
            ((), "holds no JPEG or PNG file ("),
            (("notes.txt", "photo.gif"), "holds no JPEG or PNG file"),
            (None, "not a directory"),
        ],
        ids=["empty", "no images", "missing"],
    )
    def test_a_folder_without_images_names_the_flag_and_exits_2(
        self, tmp_path: Path, files: tuple[str, ...] | None, message: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        folder = tmp_path / "photos"
        if files is not None:
            folder.mkdir()
            for name in files:
                (folder / name).write_bytes(b"x")
        for mode in ([], ["--rate", "5"]):  # refused before the first request, closed loop or open
            assert exit_code(["bench", "--url", "127.0.0.1:9", "--model", "m", "--images", str(folder), *mode]) == 2
            assert f"argument --images: {folder}: {message}" in capsys.readouterr().err


class Recorder:
    """An HTTP server on 127.0.0.1 that answers every POST 200 and keeps its body."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                recorder.bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    running = Recorder()
    yield running
    running.server.shutdown()
    running.server.server_close()


class TestRequestBytes:
    """The report says what a request carries, so image files and tensors compare."""

    def test_the_open_loop_sends_the_requests_in_turn_and_reports_their_mean_body(self, recorder: Recorder) -> None:
        images = [b"a" * 1000, b"b" * 3000, b"c" * 5000]
        requests = [{IMAGE_INPUT: encoded_images(info(), [data])} for data in images]
        result = run_open_loop(
            recorder.url, "inception_v3", requests, 50, 0.14, timeout=10, process="fixed", outputs=[LABELS_OUTPUT]
        )
        assert (result.sent, result.ok, result.batch) == (7, 7, 1)
        assert [body[-1:] for body in recorder.bodies] == [b"a", b"b", b"c", b"a", b"b", b"c", b"a"]
        bodies = [encode_request(inputs, [LABELS_OUTPUT])[0] for inputs in requests]
        assert result.request_bytes == pytest.approx(sum(map(len, bodies)) / 3)
        assert 3000 < result.request_bytes < 3000 + 300  # the files' mean and a small V2 header
        assert re.search(r"^  request body +3,\d{3} bytes \(mean\)$", open_loop_table(result), re.M)

    def test_the_closed_loop_table_gives_the_mean_body(self) -> None:
        level = LevelResult(
            concurrency=1,
            requests=10,
            rejected=0,
            errors=0,
            seconds=1.0,
            throughput=10.0,
            p50_ms=1.0,
            p90_ms=1.0,
            p99_ms=1.0,
            queue_ms=0.0,
            compute_ms=0.0,
            mean_batch=1.0,
            request_bytes=123_456.7,
        )
        assert (
            format_table("m", 1, [level]).splitlines()[0]
            == "m (batch 1 per request, request body 123,457 bytes (mean))"
        )


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The photographs as files: JPEGs and a PNG, named in the order bench sends them."""
    folder = tmp_path_factory.mktemp("photos")
    files = {}
    for index, (name, photo) in enumerate(photographs().items()):
        path = folder / f"{index}-{name}.{'png' if name == 'coffee' else 'jpg'}"
        photo.save(path, quality=90)
        files[name] = path
    return files


@pytest.mark.integration
class TestAgainstThePipeline:
    """As a user runs them, against Inception V3 behind its pipeline (the ensemble `inception_v3`)."""

    @staticmethod
    def inferop(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(INFEROP), *args], capture_output=True, text=True, timeout=300, check=False)

    def test_infer_image_answers_the_labels_of_decoding_and_the_model_in_process(
        self, served_pipeline: dict[str, Any], photos: dict[str, Path]
    ) -> None:
        files = [str(path) for path in photos.values()]
        url = served_pipeline["url"]
        result = self.inferop(
            "infer", "--url", url, "--model", "inception_v3", "--json", *(f"--image={f}" for f in files)
        )
        assert result.returncode == 0, result.stderr
        answers = json.loads(result.stdout)
        assert [answer["image"] for answer in answers] == files
        assert {answer["weights"] for answer in answers} == {served_pipeline["config"].model.weights}
        for answer in answers:
            labels, probabilities = pipeline_in_process(served_pipeline, Path(answer["image"]).read_bytes())
            assert [item["label"] for item in answer["top"]] == labels, answer["image"]
            np.testing.assert_allclose([item["probability"] for item in answer["top"]], probabilities, rtol=1e-3)
        # Printed: the labels, and the weights the ensemble's model recorded
        (first, *_) = files
        table = self.inferop("infer", "--url", url, "--model", "inception_v3", "--image", first, "--top", "2")
        assert table.returncode == 0, table.stderr
        lines = table.stdout.splitlines()
        assert lines[0] == first and len(lines) == 4
        assert lines[1].startswith(f"  1. {answers[0]['top'][0]['label']} ")
        assert lines[-1] == weights_note(served_pipeline["config"].model.weights, LABELS_CAVEAT)
        assert "not recorded" not in lines[-1]

    def test_the_bare_model_preprocessed_here_agrees(
        self, served_pipeline: dict[str, Any], photos: dict[str, Path]
    ) -> None:
        """The client-side path stays for the model itself, and gives the pipeline's labels."""
        path = photos["chelsea"]
        result = self.inferop(
            "infer", "--url", served_pipeline["url"], "--model", "inception_v3_model", "--json", str(path)
        )
        assert result.returncode == 0, result.stderr
        (answer,) = json.loads(result.stdout)
        assert [item["label"] for item in answer["top"]] == pipeline_in_process(served_pipeline, path.read_bytes())[0]

    def test_a_file_the_pipeline_refuses_is_named_with_its_reason(
        self, served_pipeline: dict[str, Any], tmp_path: Path
    ) -> None:
        document = tmp_path / "scan.jpg"
        document.write_bytes(b"%PDF-1.7 a document")
        result = self.inferop(
            "infer", "--url", served_pipeline["url"], "--model", "inception_v3", "--image", str(document)
        )
        assert result.returncode == 1
        assert result.stderr.startswith(f"error: image {document}: server said 400 "), result.stderr
        assert "not a JPEG or PNG image" in result.stderr and "Traceback" not in result.stderr

    def test_a_flag_of_another_kind_is_refused(self, served_pipeline: dict[str, Any]) -> None:
        result = self.inferop("infer", "--url", served_pipeline["url"], "--model", "inception_v3", "--board", "b.txt")
        assert result.returncode == 1
        assert "model 'inception_v3' is an image pipeline: --board does not apply to it" in result.stderr

    def test_bench_sends_the_files_closed_loop_and_open(
        self, served_pipeline: dict[str, Any], photos: dict[str, Path]
    ) -> None:
        folder = str(next(iter(photos.values())).parent)
        mean_file = float(np.mean([path.stat().st_size for path in photos.values()]))
        common = ["bench", "--url", served_pipeline["url"], "--model", "inception_v3", "--images", folder, "--json"]
        closed = self.inferop(*common, "--concurrency", "2", "--seconds", "4")
        assert closed.returncode == 0, closed.stderr
        (level,) = json.loads(closed.stdout)["levels"]
        assert level["throughput"] > 0 and level["requests"] > 0
        assert (level["errors"], level["rejected"], level["first_error"]) == (0, 0, None)
        assert mean_file < level["request_bytes"] < mean_file + 300  # the files and a small V2 header
        offered = self.inferop(*common, "--rate", "2", "--seconds", "2", "--arrivals", "fixed")
        assert offered.returncode == 0, offered.stderr
        answer = json.loads(offered.stdout)
        assert (answer["sent"], answer["ok"], answer["failed"], answer["first_errors"]) == (4, 4, 0, {})
        assert answer["request_bytes"] == pytest.approx(level["request_bytes"])

    def test_bench_images_against_the_bare_model_names_the_flag(
        self, served_pipeline: dict[str, Any], photos: dict[str, Path]
    ) -> None:
        folder = str(next(iter(photos.values())).parent)
        result = self.inferop(
            "bench", "--url", served_pipeline["url"], "--model", "inception_v3_model", "--images", folder
        )
        assert result.returncode == 1
        assert result.stderr.startswith("error: --images: model 'inception_v3_model' is not an image pipeline")
