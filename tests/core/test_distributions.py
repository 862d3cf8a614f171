"""The operator image's install: the core's and the operator's wheels alone, with only the distributions they
declare (and theirs), run the operator and cannot import the local runtime, export or torch.

operator/Dockerfile installs exactly these two wheels. Here they are built from the checkout and installed into
a folder of their own; the distributions they declare come from this venv, linked one by one into a second
folder, and the interpreter starts without `site` (no .pth file, so none of the editable installs of this venv),
so a module that is neither in the wheels nor in a declared distribution is not found.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from inferop.paths import repo_root

IMAGE_DISTRIBUTIONS = ("core", "operator")  # folders of the repository, as operator/Dockerfile installs them


def declared_closure(requirements: list[str]) -> set[str]:
    """The distributions `requirements` name, with what those require in turn, as installed here."""
    seen: set[str] = set()
    todo = [(Requirement(text), frozenset({""})) for text in requirements]
    while todo:
        requirement, extras = todo.pop()
        if requirement.marker and not any(requirement.marker.evaluate({"extra": e}) for e in extras):
            continue
        name = canonicalize_name(requirement.name)
        if name in seen:
            continue
        seen.add(name)
        wanted = frozenset({"", *requirement.extras})
        todo += [(Requirement(text), wanted) for text in distribution(name).requires or []]
    return seen


def link_distributions(names: set[str], into: Path) -> None:
    """Each distribution's top-level files and folders in this venv's site-packages, linked into `into`."""
    site_packages = Path(sysconfig.get_paths()["purelib"])
    for name in names:
        files = distribution(name).files
        assert files is not None, f"{name} lists no files (no RECORD): cannot link it"
        for top in {file.parts[0] for file in files if file.parts[0] != ".."}:
            source, target = site_packages / top, into / top
            if source.exists() and not target.exists():
                target.symlink_to(source)


@pytest.fixture(scope="module")
def image_install(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """PYTHONPATH of the install: the two wheels, then what they declare."""
    root = tmp_path_factory.mktemp("image")
    wheels, target, declared = root / "wheels", root / "install", root / "declared"
    declared.mkdir()
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    folders = [str(repo_root() / folder) for folder in IMAGE_DISTRIBUTIONS]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), *folders], check=True)
    built = sorted(str(wheel) for wheel in wheels.glob("*.whl"))
    assert len(built) == len(IMAGE_DISTRIBUTIONS), built
    subprocess.run([*pip, "install", "--no-deps", "--no-index", "--target", str(target), *built], check=True)
    ours = {"inferop-core", "inferop-operator"}
    requirements = [
        text
        for folder in IMAGE_DISTRIBUTIONS
        for text in _wheel_requirements(target, folder)
        if canonicalize_name(Requirement(text).name) not in ours
    ]
    link_distributions(declared_closure(requirements), declared)
    return {"PYTHONPATH": os.pathsep.join([str(target), str(declared)]), "PATH": os.environ["PATH"]}


def _wheel_requirements(target: Path, folder: str) -> list[str]:
    name = {"core": "inferop_core", "operator": "inferop_operator"}[folder]
    (metadata,) = target.glob(f"{name}-*.dist-info/METADATA")
    return [
        line.split(":", 1)[1].strip() for line in metadata.read_text().splitlines() if line.startswith("Requires-Dist:")
    ]


def run_in(environment: dict[str, str], cwd: Path, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-S", "-c", code, *args]
    return subprocess.run(argv, env=environment, cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


class TestTheOperatorImage:
    def test_neither_wheel_requires_the_local_runtime_export_or_torch(self, image_install: dict[str, str]) -> None:
        target = Path(image_install["PYTHONPATH"].split(os.pathsep)[0])
        names = {
            canonicalize_name(Requirement(text).name)
            for f in IMAGE_DISTRIBUTIONS
            for text in _wheel_requirements(target, f)
        }
        assert names.isdisjoint({"inferop", "inferop-export", "inferop-devtools", "torch", "onnxruntime-gpu"}), names

    def test_the_operator_and_its_handlers_import_from_what_is_declared(
        self, image_install: dict[str, str], tmp_path: Path
    ) -> None:
        code = (
            "import importlib.util, inferop_operator.handlers, inferop_operator.crd\n"
            "print(sorted(n for n in ('inferop', 'inferop_export', 'inferop_devtools', 'torch', 'onnxruntime', 'PIL')\n"
            "             if importlib.util.find_spec(n) is not None))\n"
        )
        result = run_in(image_install, tmp_path, code)
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines()[-1] == "[]"

    def test_inferop_operator_runs_and_names_what_the_image_lacks(
        self, image_install: dict[str, str], tmp_path: Path
    ) -> None:
        code = "import sys\nfrom inferop_core.cli import main\nsys.exit(main(sys.argv[1:]))\n"
        help_ = run_in(image_install, tmp_path, code, "operator", "--help")
        assert help_.returncode == 0, help_.stderr
        assert "--all-namespaces" in help_.stdout
        serve = run_in(image_install, tmp_path, code, "serve", "model_repo")
        assert serve.returncode == 2
        assert "inferop serve is provided by inferop, which is not installed here" in serve.stderr


def test_a_module_outside_the_declared_closure_is_not_found(image_install: dict[str, str], tmp_path: Path) -> None:
    """The control: this venv has torch and the local runtime installed; the install does not see them."""
    try:
        distribution("torch")
    except PackageNotFoundError:
        pytest.fail("this venv has torch (make install): the control needs it installed here")
    result = run_in(image_install, tmp_path, "import torch")
    assert result.returncode != 0
    assert "No module named 'torch'" in result.stderr
