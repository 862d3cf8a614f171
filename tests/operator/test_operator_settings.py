"""The operator's settings are read when it starts, from INFEROP_* variables, and each run's handlers follow them."""

from __future__ import annotations

import subprocess
import sys

import pytest
from kopf._core.intents.handlers import TimerHandler

from inferop_operator import handlers
from inferop_operator.settings import OperatorSettings, SettingsError, read_settings


def timer_intervals(settings: OperatorSettings) -> dict[str, float | None]:
    """The timers of a run's registry by handler id (kopf keeps them in its spawning registry)."""
    spawning = handlers.registry(settings)._spawning
    return {str(timer.id): timer.interval for timer in spawning.get_all_handlers() if isinstance(timer, TimerHandler)}


class TestReadAtStart:
    def test_the_timers_follow_the_settings_of_each_run(self) -> None:
        """A process that runs the operator twice (the tests do) gets each run's intervals, not the first import's."""
        first = timer_intervals(OperatorSettings(resync_seconds=5, rollout_tick_seconds=1))
        second = timer_intervals(OperatorSettings(resync_seconds=60, rollout_tick_seconds=2))
        assert first == {"resync": 5, "rollout_tick": 1}
        assert second == {"resync": 60, "rollout_tick": 2}
        assert handlers.operator_settings().resync_seconds == 60  # the handlers read the latest run's

    def test_importing_the_handlers_reads_no_setting(self) -> None:
        code = "import inferop_operator.handlers as h; print(h._settings)"
        env = {"INFEROP_RESYNC_SECONDS": "not a number", "PATH": ""}
        result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "None"


class TestInvalidSettings:
    @pytest.mark.parametrize(
        ("variable", "value", "message"),
        [
            ("INFEROP_RESYNC_SECONDS", "0", "INFEROP_RESYNC_SECONDS: Input should be greater than 0"),
            ("INFEROP_LOG_FORMAT", "xml", "INFEROP_LOG_FORMAT: Input should be 'plain' or 'json'"),
            ("INFEROP_RUNTIME_MEMORY_OVERHEAD", "-5Mi", "INFEROP_RUNTIME_MEMORY_OVERHEAD: '-5Mi' must not be negative"),
            (
                "INFEROP_RUNTIME_MEMORY_OVERHEAD",
                "5Zz",
                "INFEROP_RUNTIME_MEMORY_OVERHEAD: '5Zz' is not a Kubernetes quantity",
            ),
            ("INFEROP_DEFAULT_GATEWAY", "Gateway", "INFEROP_DEFAULT_GATEWAY: String should match pattern"),
            ("INFEROP_ROLLOUT_ABLATE", "ready-pods,nothing", "INFEROP_ROLLOUT_ABLATE: no safeguard 'nothing'; one of"),
        ],
    )
    def test_each_names_its_variable(
        self, variable: str, value: str, message: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv(variable, value)
        with pytest.raises(SettingsError) as error:
            read_settings()
        assert str(error.value).startswith(f"the operator's settings: {message}")

    def test_inferop_operator_exits_with_the_message_and_no_traceback(self) -> None:
        env = {"INFEROP_API_WORKERS": "0", "INFEROP_RESYNC_SECONDS": "-1", "PATH": ""}
        code = "import sys; from inferop_core.cli import main; sys.exit(main(['operator']))"
        result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        assert result.returncode == 2
        assert result.stderr == (
            "inferop: the operator's settings: INFEROP_RESYNC_SECONDS: Input should be greater than 0; "
            "INFEROP_API_WORKERS: Input should be greater than or equal to 1\n"
        )
