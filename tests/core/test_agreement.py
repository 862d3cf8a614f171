"""When two models answer alike (inferop_core.agreement), and the rollout's check of it against real tritonservers
(inferop_operator.agreement): the same model agrees, other weights do not."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from inferop_core.agreement import Comparison, Gate, default_gate, held_out_inputs
from inferop_core.processing import Processing
from inferop_core.tritonconfig import TensorSpec
from inferop_operator.agreement import AgreementError, compare_revisions, infer
from inferop_operator.spec import parse_spec
from tests.helpers import SERVING, TINY, ExportedRepo, RunningServer

OUTPUTS = (TensorSpec(name="policy", dims=(7,)), TensorSpec(name="value", dims=(1,)))


class TestGate:
    def test_each_kind_of_processing_implies_its_comparison(self) -> None:
        assert default_gate(Processing(kind="policyValue"), OUTPUTS) == Gate(
            top1=("policy",), max_abs_diff={"value": 0.02}
        )
        logits = (TensorSpec(name="scores", dims=(1000,)), TensorSpec(name="logits", dims=(1000,), label_filename="l"))
        image = Processing(kind="imageClassification", resize_ratio=1.14, mean=[0.5] * 3, std=[0.2] * 3)
        assert default_gate(image, logits).top1 == ("logits",)
        plain = default_gate(None, OUTPUTS, max_abs_difference=0.5)
        assert plain == Gate(top1=(), max_abs_diff={"policy": 0.5, "value": 0.5})

    def test_agreement_and_differences_are_counted_per_sample(self) -> None:
        comparison = Comparison(Gate(top1=("policy",), max_abs_diff={"value": 0.1}))
        reference = {"policy": np.array([[0.1, 0.9], [0.8, 0.2]]), "value": np.array([[0.5], [0.5]])}
        compared = {"policy": np.array([[0.2, 0.8], [0.1, 0.9]]), "value": np.array([[0.55], [0.2]])}
        comparison.add(reference, compared, 2)
        result = comparison.result("candidate", "the stable revision")
        assert result.agreement == {"policy": 0.5} and result.max_abs_diff["value"] == pytest.approx(0.3)
        assert result.failures == ["policy: top-1 agreement 50.0% < 99%", "value: max |diff| 0.3 >= 0.1"]
        assert "candidate against the stable revision on 2 held-out inputs" in result.describe()

    def test_one_sample_whose_output_turns_fails_the_cosine_gate(self) -> None:
        comparison = Comparison(Gate(min_cosine={"embedding": 0.98, "score": 0.98}))
        reference = {
            "embedding": np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]),
            "score": np.array([[2.0], [-0.01], [3.0]]),
        }
        # The second embedding turns a quarter; the second score flips its sign, which a cosine of one value would
        # call opposite: a score is compared over all samples at once.
        compared = {
            "embedding": np.array([[1.1, 0.0], [1.0, 0.0], [2.0, 2.0]]),
            "score": np.array([[2.1], [0.01], [2.9]]),
        }
        comparison.add(reference, compared, 3)
        result = comparison.result("int8")
        assert result.cosine["embedding"] == pytest.approx(0.0) and result.cosine["score"] > 0.99
        assert result.failures == ["embedding: cosine similarity 0.0000 on a sample < 0.98"]

    def test_accuracy_against_labels_may_drop_only_as_far_as_the_gate_says(self) -> None:
        comparison = Comparison(Gate(top1=("logits",), min_agreement=0.5, max_accuracy_drop=0.25))
        reference = {"logits": np.array([[0.9, 0.1], [0.2, 0.8], [0.7, 0.3], [0.4, 0.6]])}
        compared = {"logits": np.array([[0.9, 0.1], [0.6, 0.4], [0.3, 0.7], [0.4, 0.6]])}
        comparison.add(reference, compared, 4, labels=np.array([0, 1, 0, 1]))
        result = comparison.result("int8")
        assert result.accuracy == (1.0, 0.5) and result.agreement == {"logits": 0.5}
        assert result.failures == ["accuracy 50.00% against fp32's 100.00%: down more than 25.00%"]
        assert "accuracy fp32 100.00%, int8 50.00%" in result.describe()


class TestHeldOutInputs:
    def test_boards_in_batches_of_the_models_largest(self) -> None:
        board = [TensorSpec(name="board", dims=(1, 6, 5))]
        batches = list(held_out_inputs(Processing(kind="policyValue"), board, samples=10, batch=4, seed=1))
        assert [count for count, _ in batches] == [4, 4, 2]
        arrays = np.concatenate([feeds["board"] for _, feeds in batches])
        assert arrays.shape == (10, 1, 6, 5) and set(np.unique(arrays)) <= {-1.0, 0.0, 1.0}

    def test_the_same_seed_the_same_inputs_and_a_model_without_a_batch_axis(self) -> None:
        spec = [TensorSpec(name="x", dims=(3,)), TensorSpec(name="ids", datatype="INT64", dims=(2,))]
        first = list(held_out_inputs(None, spec, samples=2, batch=0, seed=7))
        again = list(held_out_inputs(None, spec, samples=2, batch=0, seed=7))
        assert [feeds["x"].shape for _, feeds in first] == [(3,), (3,)]
        assert all(np.array_equal(a["x"], b["x"]) for (_, a), (_, b) in zip(first, again, strict=True))
        assert first[0][1]["ids"].dtype == np.int64


def conv_net_spec(model_repo: ExportedRepo, **changes: object) -> object:
    """The tiny conv net's spec as export wrote it, with a rollout asking for the agreement check."""
    raw = model_repo.reports["conv_net"].spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    return parse_spec({**raw, "rollout": {}, **changes})


@pytest.mark.integration
class TestAgainstTritonServers:
    def test_binary_tensors_round_trip(self, triton: RunningServer) -> None:
        board = np.zeros((3, 1, TINY["rows"], TINY["cols"]), dtype=np.float32)
        answers = infer(f"http://{triton.url}", "conv_net", {"board": board}, ["policy", "value"])
        assert answers["policy"].shape == (3, TINY["moves"]) and answers["value"].shape == (3, 1)
        np.testing.assert_allclose(answers["policy"].sum(axis=1), 1.0, rtol=1e-5)

    def test_the_same_model_under_another_serving_config_agrees(
        self, model_repo: ExportedRepo, triton: RunningServer
    ) -> None:
        stable = conv_net_spec(model_repo)
        candidate = conv_net_spec(model_repo, instances=2)
        result = compare_revisions(f"http://{triton.url}", f"http://{triton.url}", stable, candidate)
        # The test stops at its fewest inputs (591 decisive ones, near ties past them), in a batch of 8.
        assert result.passed and 591 <= result.samples < 640, result.describe()
        assert [(o.name, o.share, o.largest_difference) for o in result.outputs] == [
            ("policy", 1.0, 0.0),
            ("value", 1.0, 0.0),
        ]
        assert result.inputs == f"{result.samples} generated"

    def test_other_weights_disagree_by_how_much(
        self, model_repo: ExportedRepo, triton: RunningServer, tmp_path: Path
    ) -> None:
        from inferop.serving.tritonserver import TritonServer, free_port
        from inferop_export.exporter import export_model
        from inferop_export.networks.conv_net import conv_net
        from inferop_operator.spec import parse_serving

        export_model(conv_net(**TINY, seed=7), tmp_path, serving=parse_serving(SERVING["conv_net"]), quiet=True)
        stable = conv_net_spec(model_repo)
        with TritonServer(tmp_path, http_port=free_port()) as other:
            result = compare_revisions(f"http://{triton.url}", f"http://{other.url}", stable, stable)
        assert not result.passed and result.samples < 100, result.describe()
        assert "refused" in result.failures[0]

    def test_a_pod_that_does_not_answer_is_an_error_not_a_disagreement(self, model_repo: ExportedRepo) -> None:
        from inferop.serving.tritonserver import free_port

        stable = conv_net_spec(model_repo)
        with pytest.raises(AgreementError, match=r"refused|Connection"):
            compare_revisions(f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}", stable, stable)

    def test_models_called_differently_cannot_agree(self, model_repo: ExportedRepo, triton: RunningServer) -> None:
        stable = conv_net_spec(model_repo)
        model = stable.model.model_dump(mode="json", by_alias=True, exclude_none=True)
        renamed = conv_net_spec(model_repo, model={**model, "inputs": [{"name": "cells", "dims": [1, 6, 5]}]})
        with pytest.raises(AgreementError, match="callers of one cannot call the other"):
            compare_revisions(f"http://{triton.url}", f"http://{triton.url}", stable, renamed)


class TestAgreementInputs:
    def test_the_recorded_validation_set_first_then_generated_inputs(self, tmp_path: Path) -> None:
        from inferop_core.objectstore import sha256_file
        from inferop_operator.agreement import AgreementError, agreement_inputs, design
        from tests.specs import raw_spec

        boards = np.arange(10 * 56, dtype=np.float32).reshape(10, 1, 8, 7)
        np.savez(tmp_path / "validation.npz", board=boards)
        recorded = {"samples": 10, "sha256": sha256_file(tmp_path / "validation.npz"), "sizeBytes": 1}
        raw = raw_spec(rollout={})
        raw["model"] |= {"storageUri": f"hostpath://{tmp_path}", "validation": recorded}
        spec = parse_spec(raw)
        assert design(spec).inputs.startswith("the validation set recorded with the model (10 samples)")
        batches = list(agreement_inputs(spec, batch=4, limit=14))
        assert [(origin, count) for origin, count, _ in batches] == [
            ("validation", 4), ("validation", 4), ("validation", 2), ("generated", 4),
        ]  # fmt: skip
        sent = np.concatenate([feeds["board"] for origin, _, feeds in batches if origin == "validation"])
        assert sorted(sent[:, 0, 0, 0].tolist()) == sorted(boards[:, 0, 0, 0].tolist())  # each once, shuffled
        np.savez(tmp_path / "validation.npz", board=boards[:5])
        with pytest.raises(AgreementError, match="not the validation set recorded with the model"):
            list(agreement_inputs(spec, batch=4, limit=14))
        elsewhere = parse_spec({**raw, "model": {**raw["model"], "storageUri": "pvc://models/conv_net"}})
        assert "pvc:// storage, which the operator does not read" in design(elsewhere).inputs


class TestPipelineAnswers:
    """Behind an image pipeline the check sends pictures and compares the top labels callers read."""

    def test_pictures_are_pngs_of_what_the_inputs_show(self) -> None:
        from PIL import Image

        from inferop_operator.agreement import pictures

        processing = Processing(
            kind="imageClassification", resizeRatio=1.14, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)
        )
        rgb = np.random.default_rng(3).integers(0, 256, size=(2, 5, 4, 3)).astype(np.uint8)
        mean, std = np.array(processing.mean).reshape(-1, 1, 1), np.array(processing.std).reshape(-1, 1, 1)
        tensors = ((rgb.transpose(0, 3, 1, 2) / 255.0 - mean) / std).astype(np.float32)
        images = pictures(processing, tensors)
        assert images.shape == (2, 1)
        for picture, data in zip(rgb, images[:, 0], strict=True):
            decoded = Image.open(io.BytesIO(data))
            assert (decoded.format, decoded.mode) == ("PNG", "RGB")
            np.testing.assert_array_equal(np.asarray(decoded), picture)

    def test_bytes_tensors_round_trip_the_binary_extension(self) -> None:
        from inferop_operator.agreement import deserialized, serialized

        images = np.array([[b"\x89PNG one"], [b""], [b"three \x00 bytes"]], dtype=np.object_)
        datatype, data = serialized(images)
        assert datatype == "BYTES" and data[:4] == (8).to_bytes(4, "little")
        np.testing.assert_array_equal(deserialized(datatype, data, [3, 1]), images)

    def test_top_labels_become_scores_whose_top_one_is_the_first_label(self) -> None:
        from inferop_operator.agreement import AgreementError, LabelScores

        scores = LabelScores(classes=4)

        def answer(*rows: tuple[list[bytes], list[float]]) -> dict[str, np.ndarray]:
            labels = np.array([names for names, _ in rows], dtype=np.object_)
            return {"LABELS": labels, "PROBABILITIES": np.array([p for _, p in rows], dtype=np.float32)}

        stable = scores(answer(([b"cat", b"dog"], [0.7, 0.2]), ([b"dog", b"cat"], [0.5, 0.4])))
        candidate = scores(answer(([b"cat", b"fox"], [0.6, 0.3]), ([b"cat", b"dog"], [0.45, 0.44])))
        assert np.argmax(stable, axis=1).tolist() == [0, 1] and np.argmax(candidate, axis=1).tolist() == [0, 0]
        assert stable[1].tolist() == pytest.approx([0.4, 0.5, 0.0, 0.0])  # near ties read off the same margins
        with pytest.raises(AgreementError, match="labels files differ"):
            scores(answer(([b"owl", b"bat"], [0.5, 0.1])))

    def test_the_gate_judges_the_top_one_label_of_pictures(self) -> None:
        from inferop_operator.agreement import design
        from tests.specs import CLASSIFIER, raw_spec

        planned = design(parse_spec(raw_spec(model=CLASSIFIER, pipeline={}, rollout={})))
        assert (planned.gate.top1, planned.gate.max_abs_diff) == (("logits",), {})
        assert planned.inputs.startswith("pictures sent as PNG through the pipeline, made from generated")
