"""Where generated, cached artefacts live (outside the repository, reused across runs and clones), and what a local
process's log ends with when it fails."""

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


def log_tail(path: Path | None, lines: int = 30) -> str:
    """The last `lines` of a process's log, headed by its path, for an error that says why the process failed."""
    if path is None:
        return "(no log)"
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return f"(no log at {path})"
    return "\n".join([f"--- last lines of {path}:", *text])
