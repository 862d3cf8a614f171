"""`inferop operator`: run the InferenceService operator against the current KUBECONFIG (or in-cluster)."""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import functools
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

# After SIGTERM (or Ctrl-C) kopf stops gracefully, but it waits for every handler thread to return, and a
# thread waiting on an API server that hangs returns only when its request times out (30 s). The graceful
# stop gets this long; then the process exits without what is still waiting. Whatever the API server does,
# the process is gone within STOP_BOUND_SECONDS, well inside the chart's terminationGracePeriodSeconds.
# Nothing is lost: every write is a server-side apply that the next operator repeats on resume.
STOP_SECONDS = 4.0
STOP_BOUND_SECONDS = 5.0

# glibc's mallopt parameters (malloc.h) and what the operator sets them to.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8
MALLOC_ARENAS = 2
LARGE_BUFFER_BYTES = 128 * 1024
TRIM_PERIOD_SECONDS = 30.0
MALLOC_OPTIONS = [
    (M_ARENA_MAX, MALLOC_ARENAS),
    (M_MMAP_THRESHOLD, LARGE_BUFFER_BYTES),
    (M_TRIM_THRESHOLD, LARGE_BUFFER_BYTES),
]
log = logging.getLogger("inferop.operator")
# kopf logs every failed attempt of a request it retries, each at ERROR: an API server that is gone for a minute
# gave dozens of lines. One line of them per RETRY_LINE_SECONDS says the same.
RETRY_LINE_SECONDS = 30.0
API_PROBE_SECONDS = 2.0  # how often the operator checks that the API server answers


def add_arguments(parser: argparse.ArgumentParser) -> None:
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", default=[], help="watch this namespace (repeatable)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace (the default)")
    parser.add_argument(
        "--liveness", default=None, help="serve kopf's liveness probe, e.g. http://0.0.0.0:8080/healthz"
    )
    parser.add_argument("--log-format", choices=["plain", "json"], help="default: INFEROP_LOG_FORMAT or plain")
    parser.add_argument("--verbose", action="store_true", help="debug logging")


def hold_memory_down(period: float = TRIM_PERIOD_SECONDS) -> bool:
    """Keep glibc's allocator from holding on to what the operator has freed. By default each thread that
    allocates may get its own arena (up to 8 per CPU), large transient buffers (a watch's JSON, an apply's answer)
    stay in the heap, and the heap is trimmed only at its top: with 1,000 services the operator's resident memory
    reached 475 MB while its live Python objects grew by a tenth of that. So: at most MALLOC_ARENAS arenas, buffers
    above 128 KiB mapped and unmapped on their own, and a trim of every arena each `period` seconds. False where
    the C library is not glibc (nothing to tune)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        tuned = all(libc.mallopt(option, value) for option, value in MALLOC_OPTIONS)
    except (OSError, AttributeError):
        return False

    def trim() -> None:
        while True:
            time.sleep(period)
            libc.malloc_trim(0)

    threading.Thread(target=trim, name="malloc-trim", daemon=True).start()
    return tuned


class OneLinePerOutage(logging.Filter):
    """Lets through one line of each kind that an unreachable API server makes repeat (kopf's retries of each
    request, the client library's, the handlers' temporary failures) per `seconds`, saying how many it held back;
    other lines pass."""

    KINDS = ("failed; will retry", "Retrying (Retry(", "the API server cannot be reached")

    def __init__(self, seconds: float = RETRY_LINE_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.seconds, self.clock = seconds, clock
        self.last: dict[str, float] = {}
        self.held: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        kind = next((kind for kind in self.KINDS if kind in message), None)
        if kind is None:
            return True
        now, last = self.clock(), self.last.get(kind)
        if last is not None and now - last < self.seconds:
            self.held[kind] = self.held.get(kind, 0) + 1
            return False
        if held := self.held.pop(kind, 0):
            record.msg, record.args = (
                f"{message} ({held} more like it in the last {now - (now if last is None else last):.0f} s)",
                (),
            )
        self.last[kind] = now
        return True


class StartupChatter(logging.Filter):
    """Holds back kopf's account of its own start (four INFO lines on every start, which a user reads as news); the
    operator says what it waits for itself, and `--verbose` shows them."""

    LINES = (
        "Activity 'configure' succeeded",
        "Activity 'login' succeeded",
        "Initial authentication has been initiated",
        "Initial authentication has finished",
    )

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno == logging.INFO and record.getMessage().startswith(self.LINES))


def api_lost(answers: Callable[[], bool], lost_seconds: float, ended: threading.Event, period: float) -> bool:
    """Block until the API server has not answered (`answers()` false) for `lost_seconds` on end (True, said in one
    line), or until `ended` (False)."""
    failing_since: float | None = None
    while not ended.is_set():
        now = time.monotonic()
        if answers():
            failing_since = None
        elif failing_since is None:
            failing_since = now
        elif now - failing_since >= lost_seconds:
            log.error(
                "the API server has not answered for %g s: stopping (start the operator again once it is back)",
                lost_seconds,
            )
            return True
        ended.wait(period)
    return False


def api_answers(api: Any) -> bool:
    """Whether the API server behind client `api` answers at all (any HTTP status counts: it is there)."""
    import urllib3
    from kubernetes import client

    try:
        client.VersionApi(api).get_code(_request_timeout=API_PROBE_SECONDS)
    except client.ApiException:
        return True
    except (urllib3.exceptions.HTTPError, OSError):
        return False
    return True


def run(args: argparse.Namespace) -> int:
    import kopf

    from inferop_operator import handlers
    from inferop_operator.settings import read_settings

    operator_settings = read_settings()
    hold_memory_down()  # before any handler thread exists

    log_format = (
        kopf.LogFormat.JSON if (args.log_format or operator_settings.log_format) == "json" else kopf.LogFormat.PLAIN
    )
    kopf.configure(verbose=args.verbose, log_format=log_format)
    for handler in logging.getLogger().handlers:  # kopf's, on the root logger: every logger's lines pass them
        handler.addFilter(OneLinePerOutage())
        if not args.verbose:
            handler.addFilter(StartupChatter())
    settings = kopf.OperatorSettings()
    # Exact namespaces need no watching of Namespaces and CRDs across the cluster, nor RBAC for it.
    settings.scanning.disabled = bool(args.namespace)
    lost = asyncio.run(
        operate(
            operator_settings.api_lost_seconds,
            # One replica with a Recreate strategy: no peering needed to avoid two operators at once.
            standalone=True,
            clusterwide=not args.namespace,
            namespaces=args.namespace,
            liveness_endpoint=args.liveness,
            settings=settings,
            registry=handlers.registry(operator_settings),
        )
    )
    return 1 if lost else 0


async def operate(api_lost_seconds: float, **options: Any) -> bool:
    """kopf.operator() with our own SIGTERM/SIGINT handling (a stop flag for kopf and a deadline for the rest), and
    a stop when the API server has been gone for `api_lost_seconds`; True after that stop."""
    import kopf

    from inferop_operator.kubeapi import load_client

    existing = asyncio.all_tasks()
    stop = asyncio.Event()
    tasks = await kopf.spawn_tasks(stop_flag=stop, **options)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        # Replaces kopf's own handler (installed by spawn_tasks), which would wait without a bound.
        loop.add_signal_handler(signum, begin_stop, signum, stop)
    ended, lost = threading.Event(), threading.Event()

    api = load_client(1)  # now: the kubeconfig may be gone by the time the API server is

    def watch() -> None:  # a thread of its own: kopf's handler threads may all be waiting on the API server
        if api_lost(functools.partial(api_answers, api), api_lost_seconds, ended, API_PROBE_SECONDS):
            lost.set()
            loop.call_soon_threadsafe(stop_within_deadline, stop, 1)

    threading.Thread(target=watch, name="api-lost", daemon=True).start()
    await kopf.run_tasks(tasks, ignored=existing)
    ended.set()
    return lost.is_set()


def begin_stop(signum: signal.Signals, stop: asyncio.Event) -> None:
    if stop.is_set():
        return  # the deadline already runs
    log.info("%s received: stopping, within %g s", signum.name, STOP_SECONDS)
    stop_within_deadline(stop, code=0)


def stop_within_deadline(stop: asyncio.Event, code: int) -> None:
    """Ask kopf to stop, and exit with `code` after STOP_SECONDS if it has not."""
    stop.set()
    deadline = threading.Timer(STOP_SECONDS, exit_now, args=(code,))
    deadline.daemon = True  # a stop that finishes in time leaves it behind
    deadline.start()


def exit_now(code: int = 0) -> None:
    """The graceful stop ran out of time: exit without the threads still waiting on the API server."""
    waiting = [t.name for t in threading.enumerate() if not t.daemon and t is not threading.main_thread()]
    log.warning(
        "the graceful stop took over %g s: exiting now (threads still waiting: %s); what they were writing is "
        "applied again on resume",
        STOP_SECONDS,
        ", ".join(waiting) or "none",
    )
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
