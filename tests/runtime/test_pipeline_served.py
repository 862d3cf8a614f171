"""Inception V3 behind its image pipeline on the real tritonserver: photographs in as JPEG or PNG bytes, the top
labels out, the same as decoding, running the model and taking the top labels in process; bytes that are no image
refused with a 400 that names the problem, the other callers answered."""

from __future__ import annotations

import os
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inferop_devtools.bench.pipeline import png_declaring
from inferop_export.pipeline import PHOTOGRAPHS, ask, encodings, photographs
from tests.helpers import (
    PIPELINE_MAX_IMAGE_BYTES,
    ExportedRepo,
    StubProcess,
    pipeline_in_process,
    python_stubs,
    serving,
)

pytestmark = pytest.mark.integration


def test_photographs_get_the_top_labels_of_decoding_and_the_model_in_process(served_pipeline: dict[str, Any]) -> None:
    compared = 0
    for name, photo in photographs().items():
        for encoding, data in encodings(photo).items():
            served, expected = (
                ask(served_pipeline["url"], "inception_v3", data),
                pipeline_in_process(served_pipeline, data),
            )
            assert served[0] == expected[0], (name, encoding)
            np.testing.assert_allclose(served[1], expected[1], rtol=1e-3, atol=1e-6, err_msg=f"{name} {encoding}")
            compared += 1
    assert compared == len(PHOTOGRAPHS) * 10


def test_bytes_that_are_no_image_get_a_400_that_names_the_problem(served_pipeline: dict[str, Any]) -> None:
    from tritonclient.utils import InferenceServerException

    photo = encodings(photographs()["chelsea"])["jpeg75x1"]
    refused = {
        "an empty body": b"",
        "not a JPEG or PNG image": b"%PDF-1.7 a document",
        "a corrupt JPEG": photo[: len(photo) // 3],
        "maxImageBytes": b"\xff\xd8\xff" + b"\0" * PIPELINE_MAX_IMAGE_BYTES,
        "maxImagePixels": png_declaring(20_000, 20_000),
    }
    for words, data in refused.items():
        with pytest.raises(InferenceServerException) as raised:
            ask(served_pipeline["url"], "inception_v3", data)
        assert raised.value.status() == "400" and words in raised.value.message(), (words, str(raised.value))
    # and the next caller is answered
    assert ask(served_pipeline["url"], "inception_v3", photo)[0] == pipeline_in_process(served_pipeline, photo)[0]


def mutated(photo: bytes, rng: np.random.Generator) -> bytes:
    """A JPEG damaged as files on the way are: bytes flipped (in the headers or the coded data), cut short, a run
    of bytes inserted or dropped, a segment repeated."""
    data = bytearray(photo)
    kind = rng.integers(6)
    if kind == 0:  # a few bytes anywhere
        for at in rng.integers(len(data), size=rng.integers(1, 8)):
            data[at] = int(rng.integers(256))
    elif kind == 1:  # the headers: sizes, tables, markers
        for at in rng.integers(min(len(data), 700), size=rng.integers(1, 4)):
            data[at] = int(rng.integers(256))
    elif kind == 2:
        del data[int(rng.integers(2, len(data))) :]
    elif kind == 3:
        at = int(rng.integers(len(data)))
        data[at:at] = rng.integers(256, size=int(rng.integers(1, 64)), dtype=np.uint8).tobytes()
    elif kind == 4:
        at = int(rng.integers(len(data) - 64))
        del data[at : at + int(rng.integers(1, 64))]
    else:
        at = int(rng.integers(len(data) - 256))
        data[at:at] = data[at : at + 256]
    return bytes(data)


def test_a_thousand_mutated_jpegs_among_good_ones_get_answers_or_400s_and_the_good_ones_their_labels(
    served_pipeline: dict[str, Any], measured: Callable[[str], None]
) -> None:
    """Four callers at once; no 500, no crash; every good photograph answered with the labels of decoding and the model
    in process. A mutated file that still decodes is a picture like any other: it gets labels."""
    from concurrent.futures import ThreadPoolExecutor

    from tritonclient.utils import InferenceServerException

    url = served_pipeline["url"]
    photo = encodings(photographs()["coffee"])["jpeg75x0.5"]
    expected = pipeline_in_process(served_pipeline, photo)[0]
    rng = np.random.default_rng(42)
    sent = [photo if i % 10 == 0 else mutated(photo, rng) for i in range(1_100)]

    def outcome(data: bytes) -> tuple[str, list[str] | str]:
        try:
            return "answered", ask(url, "inception_v3", data)[0]
        except InferenceServerException as error:
            return str(error.status()), str(error.message())

    with ThreadPoolExecutor(max_workers=4) as callers:
        outcomes = list(callers.map(outcome, sent))
    statuses = Counter(status for status, _ in outcomes)
    assert set(statuses) <= {"answered", "400"}, [o for o in outcomes if o[0] not in ("answered", "400")][:5]
    good = [answer for _, answer in outcomes[::10]]
    assert len(good) == 110 and all(answer == expected for answer in good), Counter(map(str, good))
    assert ask(url, "inception_v3", photo)[0] == expected  # the server lives on
    measured(f"1,000 mutated JPEGs and 110 good ones, 4 callers: {dict(statuses)}")


def test_the_rollout_s_agreement_check_compares_the_pipelines_top_labels(
    served_pipeline: dict[str, Any], model_repo: ExportedRepo, measured: Callable[[str], None], tmp_path: Path
) -> None:
    """Both revisions behind their pipeline: pictures in as PNG, the top-1 labels compared. The same pipeline (here
    one server twice) agrees; one whose decoding stage resizes otherwise (the whole short side to 299, not 342) is
    refused; a revision serving tensors cannot be compared with one serving pictures."""
    from inferop.serving.localrepo import write_pipeline_repo
    from inferop_operator.agreement import AgreementError, compare_revisions
    from inferop_operator.spec import parse_spec

    raw = model_repo.reports["inception_v3"].spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    rollout = {"agreement": {"minAgreement": 0.9, "tolerance": 0.2}}
    spec = parse_spec({**raw, "pipeline": {"topK": 5}, "rollout": rollout})
    url = f"http://{served_pipeline['url']}"
    result = compare_revisions(url, url, spec, spec)
    assert result.passed and result.outputs[0].share == 1.0, result.describe()
    measured(f"agreement on the pipeline's answers: {result.describe()}")
    config = served_pipeline["config"]
    processing = config.model.processing.model_copy(update={"resize_ratio": 1.0})
    other = config.model_copy(update={"model": config.model.model_copy(update={"processing": processing})})
    with serving(write_pipeline_repo(other, model_repo.path / "inception_v3", tmp_path / "repo")) as resized:
        refused = compare_revisions(url, f"http://{resized}", spec, spec)
    assert not refused.passed and refused.outputs[0].share < 0.5, refused.describe()
    measured(f"against a pipeline resizing otherwise: {refused.describe()}")
    with pytest.raises(AgreementError, match="the candidate serves an image pipeline, the stable revision does not"):
        compare_revisions(url, url, parse_spec({**raw, "rollout": rollout}), spec)


def test_each_stage_runs_one_thread_in_every_math_library_whatever_the_model_s_count(
    served_pipeline: dict[str, Any], model_repo: ExportedRepo, measured: Callable[[str], None], tmp_path: Path
) -> None:
    """The server's thread variables carry the model's intra-op count (the operator sets them in the container); the
    stub imports numpy, whose OpenBLAS starts a thread for each CPU the variable allows, before the stage's code runs.
    Each stage's own stub starts the libraries with one: the same threads under the model's count as under one. With
    the stages' stubs removed, the stages run with the model's count (and, on two CPUs or more, more threads)."""
    from inferop.serving.localrepo import write_pipeline_members
    from inferop.serving.tritonserver import TritonServer, free_port
    from inferop_core.threads import THREAD_ENV
    from inferop_core.tritonconfig import STAGE_STUB

    config = served_pipeline["config"]
    stages = [config.members["pre"], config.members["post"]]
    repo = tmp_path / "stages"
    write_pipeline_members(config, repo, model_repo.path / "inception_v3" / "labels.txt", link=True)
    shutil.rmtree(repo / config.name)  # the stages alone: the ensemble would need the model
    cpus = len(os.sched_getaffinity(0))
    many = str(max(2, cpus))

    def stage_processes(threads: str) -> dict[str, StubProcess]:
        with TritonServer(repo, http_port=free_port(), env=dict.fromkeys(THREAD_ENV, threads)) as server:
            assert server.process is not None
            return {stage: only(python_stubs(stage, server.process.pid)) for stage in stages}

    one, pinned = stage_processes("1"), stage_processes(many)
    for stage in stages:
        assert pinned[stage].variables == dict.fromkeys(THREAD_ENV, "1"), stage
        assert pinned[stage].threads == one[stage].threads, (stage, pinned[stage], one[stage])
        # Triton left it as it was: it changes the mode of a stub it doubts (read-only in a pod, where that fails)
        assert (repo / stage / STAGE_STUB).stat().st_mode & 0o777 == 0o755, stage
    for stage in stages:
        (repo / stage / STAGE_STUB).unlink()
    unpinned = stage_processes(many)
    for stage in stages:
        assert unpinned[stage].variables == dict.fromkeys(THREAD_ENV, many), stage
        if cpus >= 2:
            assert unpinned[stage].threads > pinned[stage].threads, (stage, unpinned[stage], pinned[stage])
    measured(
        f"stage threads with the model's count at {many} on {cpus} CPUs: "
        + ", ".join(f"{s} {pinned[s].threads} (without its stub {unpinned[s].threads})" for s in stages)
    )


def only(stubs: dict[str, StubProcess]) -> StubProcess:
    assert len(stubs) == 1, stubs
    return next(iter(stubs.values()))
