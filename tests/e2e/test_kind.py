"""End to end on kind: scripts/e2e-kind.sh builds both images, installs the chart, serves the conv net from
an OCI model image and calls it. Needs Docker and kind; without them the test says so and is skipped.

The pieces that need no container engine run everywhere: the model image's build context, and the
script's refusal, in words, when Docker or kind is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from inferop.paths import repo_root

REPO = repo_root()
E2E_SCRIPT = REPO / "scripts" / "e2e-kind.sh"
PACKAGE_SCRIPT = REPO / "scripts" / "package-model.sh"


def docker_reachable() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=30, check=False).returncode == 0


def missing_for_kind() -> list[str]:
    missing = []
    if not docker_reachable():
        missing.append("a reachable Docker daemon (https://docs.docker.com/engine/install/)")
    if shutil.which("kind") is None:
        missing.append("kind (https://kind.sigs.k8s.io/docs/user/quick-start/#installation)")
    return missing


@pytest.mark.e2e_kind
def test_conv_net_served_from_an_oci_model_image_on_kind() -> None:
    if missing := missing_for_kind():
        pytest.skip(f"needs {' and '.join(missing)}")
    result = subprocess.run(["bash", str(E2E_SCRIPT)], cwd=REPO, capture_output=True, text=True, timeout=3600)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "policy" in result.stdout and "value" in result.stdout  # what `inferop infer` prints for a board


def test_e2e_script_names_what_is_missing(tmp_path: Path) -> None:
    # A PATH with bash and the coreutils but neither docker nor kind.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname", "mktemp", "sed", "tail", "grep", "cat", "rm"):
        if found := shutil.which(tool):
            (bin_dir / tool).symlink_to(found)
    env = {**os.environ, "PATH": str(bin_dir)}
    result = subprocess.run(["bash", str(E2E_SCRIPT)], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "e2e-kind: error: docker not found: install Docker Engine" in result.stderr


class TestPackageModel:
    def model_dir(self, tmp_path: Path) -> Path:
        version = tmp_path / "repo" / "tiny" / "1"
        version.mkdir(parents=True)
        (version / "model.onnx").write_bytes(b"onnx")
        (tmp_path / "repo" / "tiny" / "labels.txt").write_text("a\nb\n")
        return tmp_path / "repo"

    def test_context_holds_the_model_at_slash_model_readable_by_any_user(self, tmp_path: Path) -> None:
        repo = self.model_dir(tmp_path)
        (repo / "tiny" / "1" / "model.onnx").chmod(0o600)
        context = tmp_path / "context"
        argv = ["bash", str(PACKAGE_SCRIPT), "--repo", str(repo), "--context-only", str(context), "tiny", "m:1"]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        dockerfile = (context / "Dockerfile").read_text().splitlines()
        assert dockerfile[:2] == ["FROM busybox:1.36.1", "COPY model/ /model/"]  # a shell and cp for fetch-model
        assert (context / "model" / "1" / "model.onnx").read_bytes() == b"onnx"
        assert (context / "model" / "1" / "model.onnx").stat().st_mode & 0o004  # the pod runs as UID 1000
        assert (context / "model" / "labels.txt").is_file()

    @pytest.mark.parametrize(
        ("layout", "message"),
        [
            ("missing", "is not a directory (export it first"),
            ("no-version", "holds no version directory"),
        ],
    )
    def test_refuses_what_the_operator_could_not_serve(self, tmp_path: Path, layout: str, message: str) -> None:
        repo = tmp_path / "repo"
        if layout == "no-version":
            (repo / "tiny").mkdir(parents=True)
            (repo / "tiny" / "model.onnx").write_bytes(b"onnx")
        argv = ["bash", str(PACKAGE_SCRIPT), "--repo", str(repo), "--context-only", str(tmp_path / "c"), "tiny", "m:1"]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert result.returncode == 2
        assert message in result.stderr
