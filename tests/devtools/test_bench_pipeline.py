"""`make bench`'s image pipeline section: how its goals are judged from the figures, the plan's ablation included."""

from __future__ import annotations

import io
from typing import Any

from inferop_devtools.bench.pipeline import largest_images as images_at_most
from inferop_devtools.bench.pipeline import pipeline_lines, pipeline_targets


def served(median: float, request_bytes: int, callers_cpus: float = 0.01, errors: int = 0) -> dict[str, Any]:
    return {"median": median, "rounds": [median] * 3, "p99_ms": 2500.0, "request_bytes": request_bytes,
            "callers_cpu_ms": 0.2, "callers_cpus": callers_cpus, "errors": errors}  # fmt: skip


def figures(ensemble: float, model: float, decoding: float, naive: float, errors: int = 0) -> dict[str, Any]:
    return {
        "total_cpus": 1.0, "callers": 16, "stages": "1 decoding instance(s) of one thread", "proved": "40 photographs",
        "ensemble": served(ensemble, 57_000, errors=errors), "model": served(model, 1_072_988),
        "decoding": served(decoding, 1_072_988, 0.1), "decoding_splits": {"0.1": served(decoding, 1_072_988, 0.1)},
        "naive_ensemble": served(naive, 57_000), "bad_input": bad_input(good=served(ensemble, 57_000)),
        "largest_images": largest_images(peak_mib=1806.0),
    }  # fmt: skip


def largest_images(peak_mib: float) -> dict[str, Any]:
    return {
        "callers": 107, "seconds": 60.0, "jpeg_bytes": 8_329_103, "png_pixels": 25_000_000,
        "outcomes": {"503 queue full": 3017, "answered": 33}, "memory_before_mib": 656.9, "memory_peak_mib": peak_mib,
        "estimate_mib": 1717.7, "stages_mib": 968.8, "limit_mib": 2199.0, "ablated_mib": 959.0,
    }  # fmt: skip


def bad_input(good: dict[str, Any], not_400: int = 0, p99_ms: float = 40.0, after_mib: float = 812.0) -> dict[str, Any]:
    kinds = ("a zero-byte body", "a corrupt JPEG", "a decompression bomb")
    return {
        "sent": 900, "not_400": not_400, "p99_ms": p99_ms, "p99_ms_by_kind": dict.fromkeys(kinds, p99_ms), "good": good,
        "memory_before_mib": 800.0, "memory_halfway_mib": 810.0, "memory_peak_mib": 850.0,
        "memory_after_mib": after_mib,
    }  # fmt: skip


def outcome(measured: dict[str, Any]) -> dict[str, bool]:
    return {target.name: target.missed for target in pipeline_targets(measured)}


def test_an_ensemble_at_the_models_pace_with_fewer_bytes_meets_every_goal() -> None:
    assert not any(outcome(figures(ensemble=8.7, model=9.2, decoding=8.4, naive=7.5)).values())
    lines = pipeline_lines(figures(8.7, 9.2, 8.4, 7.5))
    assert any("the planned ensemble" in line and "57,000 bytes" in line for line in lines)
    assert any("900 sent, 0 not answered 400; p99 40 ms (a zero-byte body 40," in line for line in lines)
    assert any("1806 at its peak, against the estimate's 1717.7" in line for line in lines)


def test_each_goal_is_missed_on_its_own() -> None:
    assert outcome(figures(ensemble=8.0, model=9.2, decoding=7.9, naive=7.5))["ensemble / bare model, same CPU"]
    assert outcome(figures(8.7, 9.2, decoding=8.8, naive=7.5))["ensemble / callers decoding, same total CPU"]
    assert outcome(figures(8.7, 9.2, 8.4, naive=8.8))["planned / naive ensemble"]
    assert outcome(figures(8.7, 9.2, 8.4, 7.5, errors=1))["ensemble errors and rejections"]
    bytes_missed = figures(8.7, 9.2, 8.4, 7.5)
    bytes_missed["ensemble"]["request_bytes"] = 200_000
    assert outcome(bytes_missed)["bytes a request: tensors / image"]


def test_each_bad_input_goal_is_missed_on_its_own() -> None:
    measured = figures(8.7, 9.2, 8.4, 7.5)
    good = measured["ensemble"]
    for changes, missed in [
        ({"not_400": 1}, "bad input not answered 400"),
        ({"p99_ms": 2600.0}, "bad input p99 / the callers' p99 meanwhile"),
        ({"good": served(7.5, 57_000)}, "callers beside bad input / alone"),
        ({"after_mib": 900.0}, "server memory after bad input / half-way through it"),
    ]:
        bad = {**measured, "bad_input": bad_input(**{"good": good, **changes})}
        assert [name for name, miss in outcome(bad).items() if miss] == [missed], changes


def test_memory_over_the_limit_is_missed_and_so_is_a_limit_that_holds_without_the_stages() -> None:
    measured = figures(8.7, 9.2, 8.4, 7.5)
    for peak, missed in [
        (2200.0, "largest images: memory peak / the plan's limit"),
        (950.0, "largest images: memory peak / the limit without the stages"),
    ]:
        changed = {**measured, "largest_images": largest_images(peak_mib=peak)}
        assert [name for name, miss in outcome(changed).items() if miss] == [missed], peak


def test_the_largest_images_are_at_the_pipeline_s_limits() -> None:
    from PIL import Image

    images = images_at_most(max_image_bytes=300_000, max_image_pixels=1_000_000)
    assert 0.85 * 300_000 < len(images["jpeg"]) <= 300_000  # sides 5% apart: the largest under, within 11%
    with Image.open(io.BytesIO(images["png"])) as picture:
        assert picture.mode == "RGBA" and picture.width * picture.height <= 1_000_000 < (picture.width + 1) ** 2
