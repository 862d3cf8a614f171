"""`inferop operator`: run the InferenceService operator against the current KUBECONFIG (or in-cluster)."""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import logging
import os
import signal
import sys
import threading
import time
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
    settings = kopf.OperatorSettings()
    # Exact namespaces need no watching of Namespaces and CRDs across the cluster, nor RBAC for it.
    settings.scanning.disabled = bool(args.namespace)
    asyncio.run(
        operate(
            # One replica with a Recreate strategy: no peering needed to avoid two operators at once.
            standalone=True,
            clusterwide=not args.namespace,
            namespaces=args.namespace,
            liveness_endpoint=args.liveness,
            settings=settings,
            registry=handlers.registry(operator_settings),
        )
    )
    return 0


async def operate(**options: Any) -> None:
    """kopf.operator() with our own SIGTERM/SIGINT handling: a stop flag for kopf and a deadline for the rest."""
    import kopf

    existing = asyncio.all_tasks()
    stop = asyncio.Event()
    tasks = await kopf.spawn_tasks(stop_flag=stop, **options)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        # Replaces kopf's own handler (installed by spawn_tasks), which would wait without a bound.
        loop.add_signal_handler(signum, begin_stop, signum, stop)
    await kopf.run_tasks(tasks, ignored=existing)


def begin_stop(signum: signal.Signals, stop: asyncio.Event) -> None:
    if stop.is_set():
        return  # the deadline already runs
    log.info("%s received: stopping, within %g s", signum.name, STOP_SECONDS)
    stop.set()
    deadline = threading.Timer(STOP_SECONDS, exit_now)
    deadline.daemon = True  # a stop that finishes in time leaves it behind
    deadline.start()


def exit_now() -> None:
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
    os._exit(0)
