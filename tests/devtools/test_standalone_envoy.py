"""The drills' Envoy (a real one, as Envoy Gateway runs it) admits what the operator's policy admits: callers
arriving together while its connections open are all admitted up to the pod's bound, the pod never holds more, and
the rest are refused at once with an answer callers count as a rejection."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from inferop.openloop import classify
from inferop_devtools.gateway.standalone import StandaloneEnvoy

HELD = 3  # requests the pod holds before it would reject


class Pod:
    """A backend that holds every request until released, counting how many it holds at once."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.held = 0
        self.most_held = 0
        self._lock = threading.Lock()
        pod = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                with pod._lock:
                    pod.held += 1
                    pod.most_held = max(pod.most_held, pod.held)
                pod.release.wait(30)
                with pod._lock:
                    pod.held -= 1
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]


@pytest.fixture()
def pod() -> Iterator[Pod]:
    pod = Pod()
    thread = threading.Thread(target=pod.server.serve_forever, daemon=True)
    thread.start()
    yield pod
    pod.release.set()
    pod.server.shutdown()
    thread.join()


def post(url: str) -> tuple[int, str, float]:
    """(status, body, seconds) of one POST of 64 KiB."""
    started = time.monotonic()
    request = urllib.request.Request(f"http://{url}/v2/models/m/infer", data=b"x" * 65536, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode(), time.monotonic() - started
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace"), time.monotonic() - started


def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_a_full_pod_gets_no_more_and_the_rest_is_refused_at_once(pod: Pod) -> None:
    with StandaloneEnvoy(f"127.0.0.1:{pod.port}", HELD) as envoy, ThreadPoolExecutor(HELD) as pool:
        # Together, from cold: every one needs a new connection, and none is refused for it.
        admitted = [pool.submit(post, envoy.url) for _ in range(HELD)]
        until(lambda: pod.held == HELD, f"the pod to hold {HELD}")
        refused = [post(envoy.url) for _ in range(3)]
        assert envoy.refused() == 3
        pod.release.set()
        answered = [future.result() for future in admitted]
    assert [status for status, _, _ in answered] == [200] * HELD
    assert pod.most_held == HELD
    for status, body, seconds in refused:
        assert classify(status, body) == "rejected", body
        assert seconds < 1.0  # at once, while the pod still held its bound
