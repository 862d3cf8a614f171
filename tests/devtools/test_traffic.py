"""The rollout drill's callers, in their process of their own, against a small local HTTP server: every request
sent between start and stop comes back as an outcome, with its kind drawn from the mix and its clock comparable to
the drill's."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from inferop_devtools.drills.traffic import Traffic, board_request


class Answering(BaseHTTPRequestHandler):
    """200 to a request without the header, 500 to one with it."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        status = 500 if self.headers.get("x-fail") else 200
        self.send_response(status)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Answering)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_the_callers_send_the_mix_and_return_every_outcome(server: str) -> None:
    board = np.zeros((1, 1, 3, 3), dtype=np.float32)
    plain = board_request("plain", board, ["policy"])
    failing = board_request("failing", board, ["policy"], {"x-fail": "1"})
    before = time.monotonic()
    traffic = Traffic(server, "service.test", "m", 200.0, [(plain, 0.75), (failing, 0.25)]).start()
    time.sleep(2.0)
    outcomes = traffic.stop()
    after = time.monotonic()
    assert 250 <= len(outcomes) <= 550, len(outcomes)  # 400 expected; a Poisson count this far off is not chance
    assert all(before <= sent.at <= after for sent in outcomes)
    kinds = {(sent.request, sent.kind) for sent in outcomes}
    assert kinds == {("plain", "ok"), ("failing", "failed")}, kinds
    share = sum(sent.request == "failing" for sent in outcomes) / len(outcomes)
    assert 0.15 <= share <= 0.35, share
