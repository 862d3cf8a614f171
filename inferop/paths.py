"""Where generated, cached artefacts live: outside the repository, reused across runs and clones."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """`$INFEROP_CACHE`, else `~/.cache/inferop`; built binaries and local state go here, never in git."""
    root = Path(os.environ.get("INFEROP_CACHE") or Path.home() / ".cache" / "inferop")
    root.mkdir(parents=True, exist_ok=True)
    return root


def repo_root() -> Path:
    """The source checkout, for scripts and examples shipped beside the package."""
    return Path(__file__).resolve().parent.parent
