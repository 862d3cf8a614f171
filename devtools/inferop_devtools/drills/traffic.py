"""Live traffic for the rollout drill: open-loop Poisson arrivals through the gateway for as long as a scenario
lasts, each request one of a few kinds (a plain board, a board a failing candidate breaks on, a header-matched
caller), every outcome kept with the time it was sent, so a drill can tell what callers got at each moment of a
rollout."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

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


@dataclass(frozen=True)
class Sent:
    at: float  # time.monotonic() when it was sent
    latency_s: float
    kind: str  # ok, rejected, timed_out, client_timeout, failed
    request: str  # which Request
    message: str = ""


@dataclass
class Traffic:
    """`rate` requests a second to `url` (host:port) with Host `host`, `pick` choosing each one's kind; `start` and
    `stop` bound it, `outcomes` holds what callers got."""

    url: str
    host: str
    model: str
    rate: float
    pick: Callable[[np.random.Generator], Request]
    timeout: float = 10.0
    seed: int = 0
    outcomes: list[Sent] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Traffic:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), name="traffic", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[Sent]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout + 10)
        return self.outcomes

    def between(self, start: float, end: float) -> list[Sent]:
        return [sent for sent in list(self.outcomes) if start <= sent.at < end]

    async def _run(self) -> None:
        import aiohttp

        rng = np.random.default_rng(self.seed)
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
            self.outcomes.append(Sent(sent, time.monotonic() - sent, kind, request.name, message))

        timeout = aiohttp.ClientTimeout(total=self.timeout)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
            next_at = time.monotonic()
            while not self._stop.is_set():
                next_at += rng.exponential(1 / self.rate)
                delay = next_at - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                task = asyncio.get_running_loop().create_task(send(session, self.pick(rng)))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
            if in_flight:
                await asyncio.wait(set(in_flight), timeout=self.timeout + 1)
