"""One root for the project's errors: a caller catches `InferopError` and lets a bug's traceback through."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

from inferop_core.errors import InferopError

PACKAGES = ("inferop", "inferop_operator", "inferop_export", "inferop_devtools")
# Runs inside Triton's python stub only (it imports the stub's own module).
NOT_IMPORTABLE_HERE = {"inferop.serving.model"}
# Served as a stage's model.py inside Triton's python stub too, where inferop_core is not installed: its error cannot
# derive from InferopError, and the client turns it into one (InferError) where it meets it.
STUB_ERRORS = {"inferop.serving.pipeline.ImageRefused"}


def project_modules() -> list[str]:
    names = []
    for package in PACKAGES:
        root = importlib.import_module(package)
        names.append(package)
        names += [
            m.name for m in pkgutil.walk_packages(root.__path__, f"{package}.") if m.name not in NOT_IMPORTABLE_HERE
        ]
    return names


def test_every_exception_the_project_defines_is_an_inferop_error() -> None:
    pytest.importorskip("torch", reason="the export package is part of the check: make install")
    defined = [
        (name, cls)
        for name in project_modules()
        for _, cls in inspect.getmembers(importlib.import_module(name), inspect.isclass)
        if issubclass(cls, BaseException) and cls.__module__ == name
    ]
    assert len(defined) >= 10  # the walk found the modules
    outside = {f"{name}.{cls.__name__}" for name, cls in defined if not issubclass(cls, InferopError)}
    assert outside == STUB_ERRORS
