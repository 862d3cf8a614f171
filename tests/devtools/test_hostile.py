"""Hostile requests against a real tritonserver: malformed requests get a 4xx and leave the server live, ready
and answering; a stalled body does not hold up other clients; the drill runs end to end and reports every case.
The request builders and the classification of answers are pure and tested on their own."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from inferop.serving.tritonserver import TritonServer, free_port, http_status
from inferop_devtools.drills import hostile
from inferop_devtools.drills.hostile import (
    Answer,
    Model,
    Probe,
    binary_infer,
    classify,
    error_text,
    exchange,
    goal_met,
    http_request,
    json_infer,
    large_json_infer,
    parse_status,
    response_complete,
)
from tests.helpers import EXPORT_EXTRA, SERVE_EXTRA, SERVING, TINY

MODEL = Model(name="conv_net", input="board", datatype="FP32", dims=(1, 6, 5), max_batch_size=8,
              outputs=("policy", "value"))  # fmt: skip


def body_of(request: bytes) -> bytes:
    return request.partition(b"\r\n\r\n")[2]


def header(request: bytes, name: str) -> str:
    head = request.partition(b"\r\n\r\n")[0].decode()
    return next(line.split(": ", 1)[1] for line in head.split("\r\n")[1:] if line.split(": ")[0] == name)


class TestRequestBuilders:
    def test_content_length_is_the_bodys_unless_it_is_told_to_lie(self) -> None:
        honest = http_request("/v2/models/m/infer", b"abc")
        lying = http_request("/v2/models/m/infer", b"abc", content_length=2**31)
        assert honest.startswith(b"POST /v2/models/m/infer HTTP/1.1\r\n")
        assert header(honest, "Content-Length") == "3" and body_of(honest) == b"abc"
        assert header(lying, "Content-Length") == "2147483648" and body_of(lying) == b"abc"

    def test_json_request_overrides_one_field_at_a_time(self) -> None:
        request = json.loads(json_infer(MODEL, datatype="INT64", data=[0] * 30))["inputs"][0]
        assert request == {"name": "board", "datatype": "INT64", "shape": [1, 1, 6, 5], "data": [0] * 30}
        batch = json.loads(json_infer(MODEL, shape=[9, 1, 6, 5]))["inputs"][0]
        assert len(batch["data"]) == 9 * 30
        asked = json.loads(json_infer(MODEL, outputs=["nope"]))["outputs"]
        assert asked == [{"name": "nope"}]

    def test_binary_request_declares_the_bytes_it_is_told(self) -> None:
        array = np.zeros((1, 1, 6, 5), dtype=np.float32)
        body, headers = binary_infer(MODEL, array, declared_bytes=4096)
        length = int(headers["Inference-Header-Content-Length"])
        declared = json.loads(body[:length])["inputs"][0]["parameters"]["binary_data_size"]
        assert declared == 4096 and body[length:] == array.tobytes()

    def test_large_json_tensor_has_whole_samples_and_at_least_the_elements_asked(self) -> None:
        request = json.loads(large_json_infer(MODEL, 1000))["inputs"][0]
        batch = request["shape"][0]
        assert request["shape"][1:] == [1, 6, 5] and len(request["data"]) == batch * 30 >= 1000 > (batch - 1) * 30

    def test_every_case_builds_bytes_for_any_model(self) -> None:
        names = [case.name for case in hostile.cases()]
        assert len(names) == len(set(names))
        for case in hostile.cases(json_elements=1000):
            if case.probe is not None:
                probe = case.probe(MODEL)
                assert probe.chunks and all(isinstance(chunk, bytes) for chunk in probe.chunks)


class TestClassification:
    @pytest.mark.parametrize(
        ("response", "closed", "timed_out", "word"),
        [
            (b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n", False, False, "400"),
            (b"HTTP/1.0 404 Not Found\r\n\r\n", True, False, "404"),
            (b"", True, False, "closed"),
            (b"", False, True, "timeout"),
            (b"garbage", False, True, "timeout"),
        ],
    )
    def test_one_word_for_what_came_back(self, response: bytes, closed: bool, timed_out: bool, word: str) -> None:
        assert classify(response, closed, timed_out) == word

    def test_a_response_is_complete_once_its_content_length_arrived(self) -> None:
        assert not response_complete(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n")
        assert not response_complete(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nabc")
        assert response_complete(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nabcde")
        assert parse_status(b"HTTP/1.1 503 Service Unavailable\r\n") == 503 and parse_status(b"") is None

    @pytest.mark.parametrize(
        ("expect", "answer", "met"),
        [
            ("reject", Answer("400", 400, 0.01), True),
            ("reject", Answer("closed", None, 0.2), True),
            ("reject", Answer("400", 400, 1.5), False),  # too late
            ("reject", Answer("500", 500, 0.01), False),  # a client's error answered as the server's
            ("reject", Answer("200", 200, 0.01), False),
            ("reject", Answer("timeout", None, 5.0), False),
            ("tolerate", Answer("200", 200, 0.01), True),
            ("tolerate", Answer("400", 400, 0.01), True),
            ("tolerate", Answer("closed", None, 0.01), False),
        ],
    )
    def test_goal(self, expect: hostile.Expect, answer: Answer, met: bool) -> None:
        assert goal_met(expect, answer) is met

    def test_error_text_quotes_the_server_and_counts_non_finite_outputs(self) -> None:
        refusal = b'HTTP/1.1 400 Bad Request\r\n\r\n{"error":"[request id: <id_unknown>] batch-size must be <= 8"}'
        assert error_text(refusal) == "batch-size must be <= 8"
        nan = b'HTTP/1.1 200 OK\r\n\r\n{"outputs":[{"name":"policy","data":[NaN,NaN,0.5]}]}'
        assert error_text(nan) == "policy: 1 of 3 finite"
        page = b"HTTP/1.1 413 Request Entity Too Large\r\n\r\n<html><head><title>413 Request Entity Too Large</title>"
        assert error_text(page) == "413 Request Entity Too Large"


class TestIngressConfig:
    def test_nginx_config_carries_the_defences_triton_lacks(self, tmp_path: Path) -> None:
        text = hostile.nginx_config(9000, 8000, tmp_path, max_body_bytes=2**20, body_timeout_s=0.8,
                                    header_timeout_s=5)  # fmt: skip
        for line in ("client_max_body_size 1048576;", "client_body_timeout 800ms;", "client_header_timeout 5000ms;",
                     "proxy_request_buffering on;", "server 127.0.0.1:8000;", "listen 127.0.0.1:9000"):  # fmt: skip
            assert line in text


# ---------------------------------------------------------------------------------------- integration


@pytest.fixture(scope="module")
def tiny_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny conv net alone, exported and verified (a couple of seconds)."""
    pytest.importorskip("torch", reason=EXPORT_EXTRA)
    from inferop_export.exporter import export_model
    from inferop_export.networks.conv_net import conv_net
    from inferop_operator.spec import parse_serving

    repo = tmp_path_factory.mktemp("hostile_repo")
    export_model(conv_net(**TINY), repo, serving=parse_serving(SERVING["conv_net"]), quiet=True)
    return repo


@pytest.fixture(scope="module")
def server(tiny_repo: Path) -> Iterator[TritonServer]:
    pytest.importorskip("pytriton", reason=SERVE_EXTRA)
    with TritonServer(tiny_repo, http_port=free_port()) as running:
        yield running


def address(server: TritonServer) -> tuple[str, int]:
    return ("127.0.0.1", server.http_port)


def assert_still_serving(server: TritonServer) -> None:
    url = server.url
    assert http_status(f"http://{url}/v2/health/live") == 200
    assert http_status(f"http://{url}/v2/health/ready") == 200
    model = hostile.read_model(url, "conv_net")
    valid = exchange(address(server), Probe((http_request(model.infer_path(), json_infer(model)),)))
    assert valid.status == 200, valid


REJECTED = ["wrong dtype", "wrong shape", "batch above max", "empty body", "truncated binary", "unknown model",
            "unknown version", "unknown output"]  # fmt: skip


@pytest.mark.integration
class TestAgainstTriton:
    @pytest.mark.parametrize("name", REJECTED)
    def test_malformed_request_gets_a_4xx_and_the_server_carries_on(self, server: TritonServer, name: str) -> None:
        model = hostile.read_model(server.url, "conv_net")
        case = next(case for case in hostile.cases() if case.name == name)
        assert case.probe is not None
        answer = exchange(address(server), case.probe(model), timeout=10)
        assert answer.status is not None and 400 <= answer.status < 500, answer
        assert answer.detail  # Triton says why
        assert_still_serving(server)

    @pytest.mark.parametrize("value", [float("nan"), float("inf")])
    def test_non_finite_values_are_computed_not_refused(self, server: TritonServer, value: float) -> None:
        """NaN and Inf are valid floats: Triton answers 200 and the network's outputs are NaN; the server is
        unharmed."""
        model = hostile.read_model(server.url, "conv_net")
        body, headers = binary_infer(model, np.full((1, *model.dims), value, dtype=np.float32))
        request = http_request(model.infer_path(), body, content_type="application/octet-stream", headers=headers)
        answer = exchange(address(server), Probe((request,)), timeout=10)
        assert answer.status == 200 and answer.detail.startswith("policy: 0 of"), answer
        assert_still_serving(server)

    def test_a_stalled_body_does_not_hold_up_other_clients(self, server: TritonServer) -> None:
        """A client that declares more body than it sends keeps its own connection waiting (Triton has no body
        timeout: an ingress must have one), while other requests are answered."""
        import socket

        model = hostile.read_model(server.url, "conv_net")
        stalled = [socket.create_connection(address(server), timeout=10) for _ in range(16)]
        try:
            for sock in stalled:
                sock.sendall(http_request(model.infer_path(), b'{"inpu', content_length=2**31))
            assert_still_serving(server)
        finally:
            for sock in stalled:
                sock.close()


@pytest.mark.integration
def test_drill_reports_every_case_and_keeps_the_server_healthy(tiny_repo: Path, tmp_path: Path) -> None:
    pytest.importorskip("pytriton", reason=SERVE_EXTRA)
    result = hostile.run_hostile_drill(tiny_repo, tmp_path, seconds=1.0, quick=True, limits=None, case_timeout=1.5)
    names = [row["case"] for row in result["cases"]]
    quick = hostile.IDLE_CONNECTIONS // 10
    assert names == [case.name for case in hostile.cases(hostile.JSON_ELEMENTS // 10, quick)]
    rows = {row["case"]: row for row in result["cases"]}
    for name in REJECTED:
        assert rows[name]["goal_met"], rows[name]
    assert rows[f"{quick} idle connections"]["opened"] == quick
    assert result["baseline"]["requests"] > 0 and result["during_cases"]["requests"] > 0
    assert result["health"]["checks"] > 0 and not result["health"]["failures"]
    assert result["memory"]["baseline_peak_bytes"] > 0 and result["memory"]["cases_peak_bytes"] > 0
    report = (tmp_path / "hostile.md").read_text()
    assert report.startswith("Hostile requests:") and all(f"| {name} |" in report for name in names)
    assert json.loads((tmp_path / "hostile.json").read_text())["cases"] == result["cases"]


def test_drill_names_the_export_that_makes_a_missing_model(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="inferop export conv_net --repo"):
        hostile.run_hostile_drill(tmp_path / "empty", tmp_path / "out", seconds=1.0, limits=None)
