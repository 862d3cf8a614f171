"""The `inferop` command line: subcommands come from the entry points of the installed distributions."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points

import pytest

from inferop.commands import BENCH, INFER, SERVE
from inferop_core import cli
from inferop_core.commands import FETCH, GROUP, PROVIDERS, PUSH, Command
from inferop_operator.commands import OPERATOR

# The local runtime's commands and the core's own, which come with any install
RUNTIME_ONLY: dict[str, Command] = {"bench": BENCH, "infer": INFER, "serve": SERVE, "fetch": FETCH, "push": PUSH}


def fresh_interpreter(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)


class TestMissingDistribution:
    @pytest.mark.parametrize(
        ("argv", "message"),
        [
            (
                ["export", "conv_net", "--repo", "r"],
                "inferop: inferop export is provided by inferop-export, which is not installed here: "
                "pip install inferop-export (from a checkout of inferop: pip install ./export)\n",
            ),
            (
                ["operator", "--help"],
                "inferop: inferop operator is provided by inferop-operator, which is not installed here: "
                "pip install inferop-operator (from a checkout of inferop: pip install ./operator)\n",
            ),
            (
                ["cluster", "up"],
                "inferop: inferop cluster is provided by inferop-devtools, which is not installed here: "
                "pip install inferop-devtools (from a checkout of inferop: pip install ./devtools)\n",
            ),
        ],
    )
    def test_names_the_distribution_to_install(
        self, argv: list[str], message: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        monkeypatch.setattr(cli, "installed", lambda: dict(RUNTIME_ONLY))
        assert cli.main(argv) == 2
        assert capsys.readouterr().err == message

    def test_the_operator_image_names_the_runtime_for_serve(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The operator image installs the core and the operator only (tests/core/test_distributions.py)."""
        monkeypatch.setattr(cli, "installed", lambda: {"operator": OPERATOR})
        assert cli.main(["serve", "model_repo"]) == 2
        assert capsys.readouterr().err == (
            "inferop: inferop serve is provided by inferop, which is not installed here: "
            "pip install inferop (from a checkout of inferop: pip install .)\n"
        )

    def test_help_lists_installed_commands_and_names_the_missing(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        monkeypatch.setattr(cli, "installed", lambda: dict(RUNTIME_ONLY))
        with pytest.raises(SystemExit) as exit_:
            cli.main(["--help"])
        assert exit_.value.code == 0
        out = capsys.readouterr().out
        assert "serve a model repository with a local tritonserver" in out
        assert "operator" not in out.split("not installed here")[0]
        missing = (
            "not installed here: operator (inferop-operator), plan (inferop-operator), rollout (inferop-operator), "
            "export (inferop-export), tune (inferop-export), "
            "cluster (inferop-devtools)"
        )
        assert missing in " ".join(out.split())

    def test_an_unknown_command_is_argparse_s_error(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        monkeypatch.setattr(cli, "installed", lambda: dict(RUNTIME_ONLY))
        with pytest.raises(SystemExit) as exit_:
            cli.main(["nonsense"])
        assert exit_.value.code == 2
        assert "invalid choice: 'nonsense'" in capsys.readouterr().err


class TestRegistration:
    def test_each_distribution_registers_the_commands_it_provides(self) -> None:
        """Here all five are installed (make install); the table of providers matches their metadata."""
        registered = {entry.name: entry.dist.name if entry.dist else None for entry in entry_points(group=GROUP)}
        assert registered == {name: provider.distribution for name, provider in PROVIDERS.items()}

    @pytest.mark.parametrize("name", sorted(PROVIDERS))
    def test_each_command_names_a_module_with_add_arguments_and_run(self, name: str) -> None:
        (entry,) = entry_points(group=GROUP, name=name)
        command = entry.load()
        assert isinstance(command, Command)
        assert command.help
        probe = f"import {command.module} as m; assert callable(m.add_arguments) and callable(m.run)"
        result = fresh_interpreter(probe)
        assert result.returncode == 0, result.stderr


class TestLazyImports:
    def test_top_level_help_imports_no_command_module(self) -> None:
        code = (
            "import sys\n"
            "from inferop_core.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "heavy = {'torch', 'onnx', 'kopf', 'kubernetes', 'inferop.serving.cli', 'inferop_export.cli',\n"
            "         'inferop_operator.cli', 'inferop_devtools.cluster.cli'}\n"
            "print(sorted(heavy & set(sys.modules)))\n"
        )
        result = fresh_interpreter(code)
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines()[-1] == "[]"

    def test_the_operator_command_does_not_import_torch(self) -> None:
        code = (
            "import sys\n"
            "from inferop_core.cli import main\n"
            "try:\n    main(['operator', '--help'])\nexcept SystemExit:\n    pass\n"
            "print('inferop_operator.cli' in sys.modules, 'torch' in sys.modules)\n"
        )
        result = fresh_interpreter(code)
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines()[-1] == "True False"
