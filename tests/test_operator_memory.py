"""The operator keeps glibc's allocator from holding on to freed memory (measured by `make drills`' fleet)."""

from __future__ import annotations

import threading

import pytest

from inferop_operator.cli import hold_memory_down


def test_the_allocator_is_tuned_and_trimmed_on_glibc() -> None:
    import platform

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("the allocator tuning is for glibc")
    assert hold_memory_down(period=0.05) is True
    assert any(thread.name == "malloc-trim" and thread.daemon for thread in threading.enumerate())
