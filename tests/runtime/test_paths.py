"""The tail of a local process's log that a failure quotes."""

from __future__ import annotations

from pathlib import Path

from inferop.paths import log_tail


def test_a_log_tail_is_its_last_lines_under_its_path(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("".join(f"line {n}\n" for n in range(100)))
    assert log_tail(log, 3).splitlines() == [f"--- last lines of {log}:", "line 97", "line 98", "line 99"]


def test_a_missing_log_says_so() -> None:
    assert log_tail(None) == "(no log)"
    assert log_tail(Path("/nonexistent/server.log")) == "(no log at /nonexistent/server.log)"
