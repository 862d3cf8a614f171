"""Live traffic for the rollout drill: open-loop Poisson arrivals through the gateway for as long as a scenario
lasts, each request one of a few kinds (a plain board, a board a failing candidate breaks on, a header-matched
caller, an image's bytes), every outcome kept with the time it was sent, so a drill can tell what callers got at
each moment of a rollout.

The callers run in a process of their own: in the drill's process they would share the interpreter with the threads
that watch the rollout and read every pod's metrics (more of them while a candidate's pods are up), and any wait for
it would count in the callers' latency as the gateway's and the servers'."""

from __future__ import annotations

import asyncio
import os
import pickle
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO

import numpy as np

from inferop.openloop import classify, encode_request


@dataclass(frozen=True)
class Request:
    """One kind of request: its body and headers, encoded once."""

    name: str
    body: bytes
    headers: dict[str, str]


def board_request(
    name: str, board: np.ndarray, outputs: Sequence[str], headers: dict[str, str] | None = None
) -> Request:
    body, encoding = encode_request({"board": board}, list(outputs))
    return Request(name, body, {**encoding, **(headers or {})})


def image_request(name: str, data: bytes, headers: dict[str, str] | None = None) -> Request:
    """A request of an image pipeline: the bytes as its one BYTES tensor, the top labels and probabilities back."""
    from inferop_core.tritonconfig import IMAGE_INPUT, LABELS_OUTPUT, PROBABILITIES_OUTPUT

    image = np.array([[data]], dtype=np.object_)
    body, encoding = encode_request({IMAGE_INPUT: image}, [LABELS_OUTPUT, PROBABILITIES_OUTPUT])
    return Request(name, body, {**encoding, **(headers or {})})


@dataclass(frozen=True)
class Sent:
    at: float  # time.monotonic() when it was sent (the system's monotonic clock: the same in every process)
    latency_s: float
    kind: str  # ok, rejected, timed_out, client_timeout, failed
    request: str  # which Request
    message: str = ""


Mix = Sequence[tuple[Request, float]]  # each kind of request and its share of the arrivals


@dataclass
class Traffic:
    """`rate` requests a second to `url` (host:port) with Host `host`, each of a kind drawn from `mix`; `start` and
    `stop` bound it (the callers' process), `stop` returns what callers got."""

    url: str
    host: str
    model: str
    rate: float
    mix: Mix
    timeout: float = 10.0
    seed: int = 0
    cpus: frozenset[int] | None = None  # where the callers run; None: wherever the kernel puts them
    _process: subprocess.Popen[bytes] | None = None

    def start(self) -> Traffic:
        """Once this returns, the callers' process is sending."""
        self._process = subprocess.Popen(
            [sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        assert self._process.stdin is not None and self._process.stdout is not None
        pickle.dump(self, self._process.stdin)
        self._process.stdin.flush()
        if self._process.stdout.readline() != b"sending\n":
            raise RuntimeError(f"the callers' process did not start (exit {self._process.wait()})")
        return self

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "_process": None}

    def stop(self) -> list[Sent]:
        """Stop sending; every outcome once the last answer is in (or timed out)."""
        process, self._process = self._process, None
        if process is None:
            return []
        assert process.stdin is not None and process.stdout is not None
        process.stdin.close()
        outcomes: list[Sent] = pickle.load(process.stdout)
        process.wait(self.timeout + 10)
        return outcomes

    def send_until_stopped(self, out: IO[bytes], stopped: threading.Event) -> None:
        def sending() -> None:
            out.write(b"sending\n")
            out.flush()

        outcomes: list[Sent] = []
        asyncio.run(self._run(outcomes, stopped, sending))
        pickle.dump(outcomes, out)
        out.flush()

    async def _run(self, outcomes: list[Sent], stopped: threading.Event, sending: Callable[[], None]) -> None:
        import aiohttp

        rng = np.random.default_rng(self.seed)
        kinds = [request for request, _ in self.mix]
        shares = np.array([share for _, share in self.mix], dtype=float)
        shares /= shares.sum()
        endpoint = f"http://{self.url}/v2/models/{self.model}/infer"
        in_flight: set[asyncio.Task[None]] = set()

        async def send(session: aiohttp.ClientSession, request: Request) -> None:
            sent = time.monotonic()
            try:
                async with session.post(
                    endpoint, data=request.body, headers={**request.headers, "Host": self.host}
                ) as r:
                    answer = await r.read()
                kind, message = (
                    ("ok", "")
                    if r.status == 200
                    else (
                        classify(r.status, answer.decode(errors="replace")),
                        f"{r.status} {answer[:200].decode(errors='replace')}",
                    )
                )
            except asyncio.TimeoutError:
                kind, message = "client_timeout", f"no answer within {self.timeout} s"
            except Exception as error:  # a refused or reset connection: counted, never lost
                kind, message = "failed", f"{type(error).__name__}: {error}"
            outcomes.append(Sent(sent, time.monotonic() - sent, kind, request.name, message))

        timeout = aiohttp.ClientTimeout(total=self.timeout)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
            sending()
            next_at = time.monotonic()
            while not stopped.is_set():
                next_at += rng.exponential(1 / self.rate)
                delay = next_at - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                request = kinds[rng.choice(len(kinds), p=shares)]
                task = asyncio.get_running_loop().create_task(send(session, request))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
            if in_flight:
                await asyncio.wait(set(in_flight), timeout=self.timeout + 1)


def main() -> None:
    """The callers' process: a pickled Traffic on stdin, sending until stdin closes, the outcomes pickled to stdout."""
    traffic: Traffic = pickle.load(sys.stdin.buffer)
    if traffic.cpus is not None:
        os.sched_setaffinity(0, traffic.cpus)
    stopped = threading.Event()

    def wait_for_close() -> None:
        sys.stdin.buffer.read()
        stopped.set()

    threading.Thread(target=wait_for_close, name="stop", daemon=True).start()
    traffic.send_until_stopped(sys.stdout.buffer, stopped)


if __name__ == "__main__":
    main()
