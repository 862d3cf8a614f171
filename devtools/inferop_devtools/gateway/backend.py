"""A stand-in backend for one pod: an HTTP server bound to the pod's IP that answers every request with the pod's
name and counts what it received, so a drill can tell where a gateway sent each request.

`python -m inferop_devtools.gateway.backend --address 10.0.0.7 --port 8080 --name stable-abc12`

GET /-/counts answers {"received": n} and is not counted itself. Mirrored copies are counted with the rest: Envoy
discards a mirror's answer, so only the backend sees it, and Envoy Gateway turns off Envoy's "-shadow" Host suffix
(DisableShadowHostSuffixAppend, since it gives the mirror a cluster of its own), so a copy looks like any request.
A drill gets the mirrored count as what a backend received minus the answers its clients got from it.
"""

from __future__ import annotations

import argparse
import json
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

COUNTS_PATH = "/-/counts"


class PodHandler(BaseHTTPRequestHandler):
    pod_name: ClassVar[str] = ""
    counts: ClassVar[dict[str, int]] = {"received": 0}
    lock: ClassVar[threading.Lock] = threading.Lock()
    protocol_version = "HTTP/1.1"  # keep-alive, as Envoy's upstream connections expect
    # Headers and body in one segment: written unbuffered they go out as two, and Nagle's algorithm against
    # Envoy's delayed ACK held every other answer for 40 ms (seen in Envoy's access log).
    wbufsize = 1 << 16

    def _answer(self, body: bytes, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == COUNTS_PATH:
            with self.lock:
                body = json.dumps(self.counts).encode()
            self._answer(body, "application/json")
            return
        with self.lock:
            self.counts["received"] += 1
        self._answer(self.pod_name.encode(), "text/plain")

    def log_message(self, format: str, *args: object) -> None:  # quiet: hundreds of requests per drill
        pass


def main(args: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--address", required=True, help="the pod's IP (local through the AnyIP route)")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--name", required=True, help="the pod's name, the body of every answer")
    options = parser.parse_args(args)
    PodHandler.pod_name = options.name
    ThreadingHTTPServer((options.address, options.port), PodHandler).serve_forever()


if __name__ == "__main__":
    main()
