"""One registry of networks: the built-ins and a plug-in's are found alike, through entry points, and a broken
or clashing plug-in is an error that names it rather than a network that silently goes missing."""

from __future__ import annotations

import json
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="install the export distribution: make install")

from inferop_core.cli import main as inferop
from inferop_export import networks
from inferop_export.networks import ENTRY_POINT_GROUP, RegistryError, registered_networks


def with_plugins(monkeypatch: pytest.MonkeyPatch, *plugins: tuple[str, str]) -> None:
    """The installed entry points plus `plugins` (name, "module:attribute"), as another package would add them."""
    installed = list(entry_points(group=ENTRY_POINT_GROUP))
    extra = [EntryPoint(name, value, ENTRY_POINT_GROUP) for name, value in plugins]
    monkeypatch.setattr(networks, "entry_points", lambda group: [*installed, *extra])


class TestRegistry:
    def test_the_built_ins_are_registered_like_any_plug_in(self) -> None:
        found = registered_networks()
        assert {"conv_net", "inception_v3"} <= set(found)
        assert found["conv_net"].help == "AlphaZero-style policy/value convolutional network"

    def test_a_plug_in_is_exported_by_name(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
    ) -> None:
        with_plugins(monkeypatch, ("tiny_mlp", "tests.plugin_network:NETWORK"))
        assert inferop(["export", "tiny_mlp", "--width", "6", "--repo", str(tmp_path), "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["model"] == "tiny_mlp"
        assert report["serving"]["inputs"][0]["dims"] == [6]  # its own flag
        assert report["serving"]["outputs"][0]["name"] == "probabilities"
        assert (tmp_path / "tiny_mlp" / "config.pbtxt").is_file()

    @pytest.mark.parametrize(
        ("plugin", "message"),
        [
            (("broken", "no_such_package.nets:NETWORK"), "network 'broken' (no_such_package.nets:NETWORK) cannot be"),
            (("conv", "tests.plugin_network:build"), "network 'conv' (tests.plugin_network:build) is a function"),
            (("other_name", "tests.plugin_network:NETWORK"), "calls itself 'tiny_mlp'"),
            (("onnx", "tests.plugin_network:NETWORK"), "network 'onnx'"),
        ],
        ids=["cannot import", "not a contract", "misnamed", "takes a reserved name"],
    )
    def test_a_bad_plug_in_is_named(
        self, monkeypatch: pytest.MonkeyPatch, plugin: tuple[str, str], message: str
    ) -> None:
        with_plugins(monkeypatch, plugin)
        with pytest.raises(RegistryError, match=message.replace("(", r"\(").replace(")", r"\)")):
            registered_networks()

    def test_the_command_line_names_a_broken_plug_in_without_a_traceback(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        with_plugins(monkeypatch, ("broken", "no_such_package.nets:NETWORK"))
        assert inferop(["export", "conv_net", "--help"]) == 2
        assert "network 'broken' (no_such_package.nets:NETWORK) cannot be loaded" in capsys.readouterr().err
