"""The operator's process around kopf: one line for kopf's retries of a request, and a stop once the API server
has been gone for the set time (the run against a real control plane stopped for good: tests/kube/test_startup.py)."""

from __future__ import annotations

import logging
import threading

import pytest

from inferop_operator import cli

RETRY = "Request attempt #%d/65 failed; will retry: GET https://10.0.0.1/api -> ConnectionRefused"
URLLIB3_RETRY = "Retrying (Retry(total=2, connect=None)) after connection broken by 'NewConnectionError(...)': /api"


def record(message: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("kopf._cogs.clients.api", logging.ERROR, __file__, 1, message, args, None)


def test_one_line_per_period_of_each_kind_saying_how_many_were_held() -> None:
    now = [0.0]
    lines = cli.OneLinePerOutage(seconds=30, clock=lambda: now[0])
    shown = []
    for attempt in range(1, 13):  # one every 5 s for a minute, each with the client library's own retry beside it
        for line in (record(RETRY, attempt), record(URLLIB3_RETRY)):
            if lines.filter(line):
                shown.append(line.getMessage())
        now[0] += 5
    assert len(shown) == 4
    assert "#1/65" in shown[0] and "more like it" not in shown[0] and shown[1] == URLLIB3_RETRY
    assert "#7/65" in shown[2] and "(5 more like it in the last 30 s)" in shown[2]
    assert lines.filter(record("Request attempt #1/65 failed; escalating: GET ... -> 403"))  # others pass


def test_the_operator_stops_once_the_api_server_is_gone_for_the_set_time(caplog: pytest.LogCaptureFixture) -> None:
    answers = iter([True, *[False] * 10_000])
    with caplog.at_level(logging.ERROR, logger="inferop.operator"):
        assert cli.api_lost(lambda: next(answers), 0.05, threading.Event(), period=0.01)
    assert [r.getMessage() for r in caplog.records] == [
        "the API server has not answered for 0.05 s: stopping (start the operator again once it is back)"
    ]


def test_an_api_server_that_comes_back_in_time_stops_nothing() -> None:
    # Down for three probes at a time, shorter than the set time, then answering again: never lost, until the end.
    answers = iter(([False] * 3 + [True]) * 100)
    ended = threading.Event()
    threading.Timer(0.5, ended.set).start()
    assert cli.api_lost(lambda: next(answers, True), 1.0, ended, period=0.001) is False


def test_kopf_s_account_of_its_start_is_held_back_and_its_warnings_are_not() -> None:
    def info(message: str) -> logging.LogRecord:
        return logging.LogRecord("kopf.activities", logging.INFO, __file__, 1, message, (), None)

    quiet = cli.StartupChatter()
    assert not quiet.filter(info("Activity 'login' succeeded."))
    assert not quiet.filter(info("Initial authentication has been initiated."))
    assert quiet.filter(record("Activity 'login' succeeded."))  # the same words at ERROR pass
    assert quiet.filter(info("Handler 'create_fn' succeeded."))
