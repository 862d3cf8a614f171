"""The CRD, generated from the spec model: structural, documented, defaulted, and committed current."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferop_operator.builders import Service
from inferop_operator.crd import CRD_PATH, IDENTITY_TEMPLATE, build_crd, main, render_crd, render_identity_template
from inferop_operator.identity import CRD_NAME, GROUP, KIND, PLURAL, SHORT_NAME, VERSION
from inferop_operator.plan import plan_service
from inferop_operator.rollout import (
    AgreementStatus,
    AnalysisStatus,
    GatewayFigures,
    OutputAgreement,
    RolloutStatus,
    TrackFigures,
)
from inferop_operator.spec import SpecError, parse_spec
from inferop_operator.status import Status, deployed_status
from tests.specs import EXAMPLES

ROOT = Path(__file__).resolve().parents[2]
CHART_CRDS = ROOT / "charts" / "inferop" / "crds"


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    return build_crd()


@pytest.fixture(scope="module")
def version(crd: dict[str, Any]) -> dict[str, Any]:
    (served,) = crd["spec"]["versions"]
    return dict(served)


@pytest.fixture(scope="module")
def spec_schema(version: dict[str, Any]) -> dict[str, Any]:
    return dict(version["schema"]["openAPIV3Schema"]["properties"]["spec"])


@pytest.fixture(scope="module")
def validator(version: dict[str, Any]) -> Any:
    """The CRD's schema as a JSON Schema validator (OpenAPI 3.0 keeps draft 4's boolean exclusiveMinimum)."""
    jsonschema = pytest.importorskip("jsonschema", reason="install jsonschema to validate examples")
    return jsonschema.Draft4Validator(version["schema"]["openAPIV3Schema"])


def nodes(schema: dict[str, Any], path: str = "spec") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema node below `schema`, with a dotted path a user would recognise."""
    yield path, schema
    for name, child in schema.get("properties", {}).items():
        yield from nodes(child, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from nodes(schema["additionalProperties"], f"{path}.*")


def properties(schema: dict[str, Any], path: str = "spec") -> Iterator[tuple[str, dict[str, Any]]]:
    for node_path, node in nodes(schema, path):
        for name, child in node.get("properties", {}).items():
            yield f"{node_path}.{name}", child


class TestIdentity:
    def test_group_names_and_version(self, crd: dict[str, Any], version: dict[str, Any]) -> None:
        assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
        assert crd["metadata"]["name"] == CRD_NAME == f"{PLURAL}.{GROUP}"
        assert crd["spec"]["group"] == GROUP
        assert crd["spec"]["scope"] == "Namespaced"
        names = crd["spec"]["names"]
        assert (names["kind"], names["plural"], names["singular"]) == (KIND, PLURAL, KIND.lower())
        assert names["shortNames"] == [SHORT_NAME]
        assert (version["name"], version["served"], version["storage"]) == (VERSION, True, True)

    def test_status_and_scale_subresources(self, version: dict[str, Any]) -> None:
        subresources = version["subresources"]
        assert subresources["status"] == {}
        assert subresources["scale"] == {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        }

    def test_printer_columns(self, version: dict[str, Any]) -> None:
        columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
        assert {"Ready", "URL", "Replicas", "Threads", "Age"} <= set(columns)
        assert columns["Ready"]["jsonPath"] == '.status.conditions[?(@.type=="Ready")].status'
        assert columns["URL"]["jsonPath"] == ".status.url"
        assert columns["Threads"]["jsonPath"] == ".status.threads.summary"
        assert (columns["Age"]["type"], columns["Age"]["jsonPath"]) == ("date", ".metadata.creationTimestamp")
        assert columns["Replicas"]["type"] == "integer"

    def test_spec_required_and_status_typed(self, version: dict[str, Any]) -> None:
        root = version["schema"]["openAPIV3Schema"]
        assert root["required"] == ["spec"]
        assert "x-kubernetes-preserve-unknown-fields" not in root["properties"]["status"]

    def test_scale_and_printer_paths_are_in_the_status_schema(self, version: dict[str, Any]) -> None:
        status = dict(nodes(version["schema"]["openAPIV3Schema"]["properties"]["status"], ".status"))
        assert status[".status.replicas"]["type"] == "integer"
        assert status[".status.selector"]["type"] == "string"
        for column in version["additionalPrinterColumns"]:
            path = column["jsonPath"].split("[")[0]
            if path.startswith(".status"):
                assert path in status, column
        assert status[".status.conditions[].status"]["enum"] == ["True", "False", "Unknown"]


def every_key(value: Any, path: str = ".status") -> Iterator[str]:
    """Dotted paths of every field in a written status, list items as []."""
    if isinstance(value, dict):
        for key, child in value.items():
            yield f"{path}.{key}"
            yield from every_key(child, f"{path}.{key}")
    elif isinstance(value, list):
        for item in value:
            yield f"{path}[]"
            yield from every_key(item, f"{path}[]")


@pytest.fixture(scope="module")
def status_schema(version: dict[str, Any]) -> dict[str, Any]:
    return dict(version["schema"]["openAPIV3Schema"]["properties"]["status"])


@pytest.fixture(scope="module")
def written() -> dict[str, Any]:
    """A status with every field set: a measured capacity, a memory limit, warnings, a Deployment's report."""
    raw = yaml.safe_load((EXAMPLES / "conv-net.yaml").read_text())["spec"]
    raw["model"]["profile"]["samplesPerCpuSecond"] = 900.0
    raw["threads"] = {"intraOp": 4, "allowOversubscription": True}  # a warning
    spec = parse_spec(raw)
    service = Service(name="conv-net", namespace="models", uid="u", spec=spec, plan=plan_service(spec), image="t")
    available = {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable", "message": "ok"}
    deployment = {
        "metadata": {"generation": 1},
        "spec": {"replicas": 1},
        "status": {"observedGeneration": 1, "replicas": 1, "readyReplicas": 1, "conditions": [available]},
    }
    gateway = GatewayFigures(requests=101, errors=1, resets=0, error_ratio=0.0099, reset_ratio=0.0, p99_ms=9.2)
    figures = TrackFigures(requests=100, failures=1, failure_ratio=0.01, mean_latency_ms=2.5, gateway=gateway)
    rollout = RolloutStatus(
        phase="Progressing", reason="StepStarted", message="step 2", stable="a1", candidate="b2", step=1, weight=25,
        mirror_percent=10, header=True, split="gateway", scaling_for=25, step_started_at="2026-01-01T00:00:00Z",
        changed_at="2026-01-01T00:00:00Z", stable_spec={}, retried="b2/1767225600", stable_replicas=1,
        agreement=AgreementStatus(
            passed=True, samples=592, inputs="592 generated", seconds=0.8, false_refusal=0.0038,
            false_acceptance=0.0038, message="ok",
            outputs=[
                OutputAgreement(
                    name="policy", judged_by="top1", samples=591, agreement=1.0, bound=0.9922, decision="Passed",
                    near_ties=1, near_tie_flips=1,
                ),
                OutputAgreement(
                    name="value", judged_by="tolerance", samples=591, agreement=1.0, bound=0.9922, decision="Passed",
                    max_abs_difference=0.0001,
                ),
            ],
        ),
        analysis=AnalysisStatus(
            verdict="Failed", message="p99", step=1, weight=25, at="2026-01-01T00:00:10Z",
            since="2026-01-01T00:00:00Z", window_seconds=10, check="p99", candidate=figures, stable=figures,
        ),
    )  # fmt: skip
    status = deployed_status(service, deployment, 1, Status(), rollout=rollout)
    written = status.model_dump(by_alias=True, exclude_none=True)
    assert written["warnings"] and written["queue"]["capacitySamplesPerSecond"] and written["memory"]["availableBytes"]
    return written


class TestStatusSchema:
    """The API server prunes every status field its schema does not list: each one the operator writes is there."""

    def test_every_written_field_is_in_the_schema(self, status_schema: dict[str, Any], written: dict[str, Any]) -> None:
        listed = {path for path, _ in nodes(status_schema, ".status")}
        assert set(every_key(written)) - listed == set()

    def test_the_model_lists_nothing_it_never_writes(
        self, status_schema: dict[str, Any], written: dict[str, Any]
    ) -> None:
        listed = {path for path, _ in nodes(status_schema, ".status")} - {".status"}
        assert listed - set(every_key(written)) == set()

    def test_a_written_status_is_valid(self, validator: Any, written: dict[str, Any]) -> None:
        errors = [e.message for e in validator.iter_errors({"spec": {}, "status": written})]
        assert [e for e in errors if "'model' is a required property" not in e] == []

    def test_structural_documented_and_without_defaults(self, status_schema: dict[str, Any]) -> None:
        for path, node in nodes(status_schema, ".status"):
            assert not {"$ref", "$defs", "title", "allOf", "oneOf", "anyOf", "default"} & set(node), path
            assert node.get("type") in ("object", "array", "string", "integer", "number", "boolean"), path
            assert node.get("description", "").strip() or path.endswith("[]"), path


class TestSchema:
    def test_every_spec_property_has_a_description(self, spec_schema: dict[str, Any]) -> None:
        undocumented = [path for path, node in properties(spec_schema) if not node.get("description", "").strip()]
        assert undocumented == []
        assert spec_schema["description"]

    def test_descriptions_are_single_lines(self, spec_schema: dict[str, Any]) -> None:
        assert [path for path, node in nodes(spec_schema) if "\n" in node.get("description", "")] == []

    def test_structural(self, spec_schema: dict[str, Any]) -> None:
        """No pydantic leftovers; every node has a type, or is an int-or-string quantity."""
        for path, node in nodes(spec_schema):
            assert not {"$ref", "$defs", "title", "allOf", "oneOf"} & set(node), path
            if "anyOf" in node:
                assert node.get("x-kubernetes-int-or-string") is True, path
                assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path
            else:
                assert node.get("type") in ("object", "array", "string", "integer", "number", "boolean"), path
            assert node.get("additionalProperties") is not False, path

    def test_optional_fields_are_not_nullable(self, spec_schema: dict[str, Any]) -> None:
        for path in (
            "spec.runtime.image",
            "spec.threads.intraOp",
            "spec.batching.maxQueueSize",  # unset: derived from the capacity by the operator
            "spec.model.profile.samplesPerCpuSecond",
            "spec.autoscaling",
            "spec.gpu",
        ):
            node = dict(properties(spec_schema))[path]
            assert "anyOf" not in node, path
            assert "default" not in node, path
            assert node.get("nullable") is not True, path

    @pytest.mark.parametrize(
        ("path", "default"),
        [
            ("spec.batching.maxBatchSize", 8),
            ("spec.batching.maxQueueDelayMicroseconds", 2000),
            ("spec.timeouts.requestSeconds", 10.0),
            ("spec.timeouts.startupSeconds", 300),
            ("spec.threads.allowOversubscription", False),
            ("spec.autoscaling.minReplicas", 1),
            ("spec.autoscaling.metric", "cpu"),
            ("spec.replicas", 1),
            ("spec.model.inputs[].datatype", "FP32"),
        ],
    )
    def test_defaults(self, spec_schema: dict[str, Any], path: str, default: Any) -> None:
        assert dict(properties(spec_schema))[path]["default"] == default

    @pytest.mark.parametrize("section", ["batching", "timeouts", "threads"])
    def test_section_defaults_match_the_model(self, spec_schema: dict[str, Any], section: str) -> None:
        """What the apiserver fills in for a section a user left out is what the operator assumes."""
        schema = spec_schema["properties"][section]
        assert schema["default"] == {}
        from_crd = {name: p["default"] for name, p in schema["properties"].items() if "default" in p}
        model = parse_spec({"model": yaml.safe_load((EXAMPLES / "conv-net.yaml").read_text())["spec"]["model"]})
        assert from_crd == getattr(model, section).model_dump(by_alias=True, exclude_none=True)

    def test_required_sections_have_no_default(self, spec_schema: dict[str, Any]) -> None:
        assert spec_schema["required"] == ["model"]
        for section in ("model", "autoscaling", "gpu"):
            assert "default" not in spec_schema["properties"][section], section

    def test_enums_and_patterns(self, spec_schema: dict[str, Any]) -> None:
        found = dict(properties(spec_schema))
        assert found["spec.autoscaling.metric"]["enum"] == ["cpu", "queueTime", "pendingRequests"]
        assert found["spec.model.storageUri"]["pattern"] == "^(pvc|hostpath|oci|s3|https|http)://.+$"
        assert found["spec.gpu.memory"]["x-kubernetes-int-or-string"] is True
        limits = found["spec.resources.limits"]["additionalProperties"]
        assert limits["x-kubernetes-int-or-string"] is True
        assert "pattern" in limits

    def test_exclusive_minimum_in_openapi_form(self, spec_schema: dict[str, Any]) -> None:
        request = dict(properties(spec_schema))["spec.timeouts.requestSeconds"]
        assert (request["minimum"], request["exclusiveMinimum"]) == (0, True)


class TestExamplesAgainstTheSchema:
    """The apiserver's view: valid and refused examples are accepted, invalid ones rejected."""

    @pytest.mark.parametrize(
        "path",
        [
            pytest.param(p, id=p.name)
            for p in [*sorted(EXAMPLES.glob("*.yaml")), *sorted(EXAMPLES.glob("refused/*.yaml"))]
        ],
    )
    def test_accepted(self, validator: Any, path: Path) -> None:
        errors = [e.message for e in validator.iter_errors(yaml.safe_load(path.read_text()))]
        assert errors == []

    @pytest.mark.parametrize("path", [pytest.param(p, id=p.name) for p in sorted(EXAMPLES.glob("invalid/*.yaml"))])
    def test_rejected(self, validator: Any, path: Path) -> None:
        errors = {".".join(map(str, e.absolute_path)) for e in validator.iter_errors(yaml.safe_load(path.read_text()))}
        expected = {
            "bad-autoscaling.yaml": {"spec.batching.maxBatchSize", "spec.autoscaling.metric"},
            "unknown-scheme.yaml": {"spec.model.storageUri"},
        }
        assert errors
        assert errors == expected.get(path.name, errors)


class TestCommittedCrd:
    def test_chart_crd_is_current(self) -> None:
        """The drift check: regenerate with `make crd` when the spec model changes."""
        assert CHART_CRDS / f"{CRD_NAME}.yaml" == CRD_PATH
        assert CRD_PATH.read_text() == render_crd()

    def test_chart_holds_only_generated_crds(self) -> None:
        for path in CHART_CRDS.glob("*.yaml"):
            assert yaml.safe_load(path.read_text()) == build_crd(), path.name

    def test_rendered_text_round_trips(self) -> None:
        text = render_crd()
        assert text.startswith("# Generated from inferop_operator/spec.py")
        assert yaml.safe_load(text) == build_crd()

    def test_check_command_passes(self) -> None:
        result = subprocess.run(
            [sys.executable, "-m", "inferop_operator.crd", "--check"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr

    def test_check_fails_on_drift(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: Any) -> None:
        stale = tmp_path / "crd.yaml"
        stale.write_text(render_crd().replace("Most replicas.", "Most replicas (stale)."))
        monkeypatch.setattr("inferop_operator.crd.CRD_PATH", stale)
        assert main(["--check"]) == 1
        assert "make crd" in capsys.readouterr().err

    def test_check_fails_when_the_charts_identity_drifts(
        self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: Any
    ) -> None:
        stale = tmp_path / "_identity.tpl"
        stale.write_text(render_identity_template().replace(GROUP, "example.com"))
        monkeypatch.setattr("inferop_operator.crd.IDENTITY_TEMPLATE", stale)
        assert main(["--check"]) == 1
        assert str(stale) in capsys.readouterr().err

    def test_the_charts_identity_template_is_generated(self) -> None:
        assert IDENTITY_TEMPLATE.read_text() == render_identity_template()
        assert f'define "inferop.apiGroup" -}}}}{GROUP}{{{{' in IDENTITY_TEMPLATE.read_text()


def conv_net_spec(**changes: Any) -> dict[str, Any]:
    """The conv net example's spec with `changes` laid over it (a `model` dict over its model)."""
    spec = dict(yaml.safe_load((EXAMPLES / "conv-net.yaml").read_text())["spec"])
    spec["model"] = {**spec["model"], **changes.pop("model", {})}
    return {**spec, **changes}


IMAGE_SETTINGS = {"resizeRatio": 1.14, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
# For each CEL rule in the CRD (by the path of its schema node), specs its model_validator refuses.
REFUSED: dict[str, list[dict[str, Any]]] = {
    "spec.autoscaling": [
        conv_net_spec(autoscaling={"minReplicas": 3, "maxReplicas": 2, "target": 50}),
        conv_net_spec(autoscaling={"minReplicas": 1000, "maxReplicas": 999, "metric": "queueTime", "target": 1}),
    ],
    "spec.rollout": [
        conv_net_spec(rollout={"steps": [5, 25, 50]}),
        conv_net_spec(rollout={"steps": [0]}),
    ],
    "spec.model.processing": [
        conv_net_spec(model={"processing": {"kind": "imageClassification", "mean": IMAGE_SETTINGS["mean"]}}),
        conv_net_spec(model={"processing": {"kind": "imageClassification"}}),
        conv_net_spec(model={"processing": {"kind": "policyValue", "std": IMAGE_SETTINGS["std"]}}),
        conv_net_spec(model={"processing": IMAGE_SETTINGS}),  # kind defaults to tensors
    ],
}
ACCEPTED = [
    *(yaml.safe_load(path.read_text())["spec"] for path in sorted(EXAMPLES.glob("*.yaml"))),
    conv_net_spec(autoscaling={"minReplicas": 2, "maxReplicas": 2, "target": 50}),
    conv_net_spec(autoscaling={"maxReplicas": 1, "target": 50}),  # minReplicas left to its default, 1
    conv_net_spec(model={"processing": {"kind": "imageClassification", **IMAGE_SETTINGS}}),
    conv_net_spec(model={"processing": {"kind": "policyValue"}}),
    conv_net_spec(model={"processing": {}}),
    conv_net_spec(rollout={}),
    conv_net_spec(rollout={"steps": [0, 100], "shadow": {"percent": 20}, "header": {"name": "x-canary", "value": "1"}}),
]


@dataclass(frozen=True)
class Outcome:
    path: str
    rule: str
    message: str | None  # None: the rule holds


def k8s_format(template: Any, arguments: Any) -> Any:
    """`<string>.format(<list>)` of the Kubernetes CEL strings library, which cel-python lacks: %s and %d only."""
    from celpy import celtypes

    values = iter(arguments)

    def substitute(match: re.Match[str]) -> str:
        value = next(values)
        assert isinstance(value, celtypes.IntType if match[0] == "%d" else celtypes.StringType), (match[0], value)
        return str(value)

    return celtypes.StringType(re.sub(r"%[sd]", substitute, str(template)))


def evaluate_rules(schema: dict[str, Any], value: Any, path: str = "spec") -> Iterator[Outcome]:
    """Every CEL rule of `schema` evaluated on `value` as the apiserver does: at each node the object has, with
    `self` bound to that node, the messageExpression evaluated where the rule fails."""
    celpy = pytest.importorskip("celpy", reason="install cel-python (the dev extra) to evaluate the CRD's rules")
    environment = celpy.Environment()
    for rule in schema.get("x-kubernetes-validations", []):
        activation = {"self": celpy.json_to_cel(value)}
        holds = environment.program(environment.compile(rule["rule"])).evaluate(activation)
        message = None
        if not holds:
            program = environment.program(
                environment.compile(rule["messageExpression"]), functions={"format": k8s_format}
            )
            message = str(program.evaluate(activation))
        yield Outcome(path, rule["rule"], message)
    if isinstance(value, dict):
        for name, child in schema.get("properties", {}).items():
            if name in value:
                yield from evaluate_rules(child, value[name], f"{path}.{name}")
        if isinstance(schema.get("additionalProperties"), dict):
            for name, child_value in value.items():
                yield from evaluate_rules(schema["additionalProperties"], child_value, f"{path}.{name}")
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            yield from evaluate_rules(schema["items"], item, f"{path}.{index}")


class TestAdmissionRules:
    """The CRD's CEL rules are the model's validators again: what one refuses the other refuses, in the same words
    (Kubernetes 1.25+ evaluates them at admission; tests/kube/test_admission.py shows it on a real apiserver)."""

    def test_every_rule_has_refused_samples(self, spec_schema: dict[str, Any]) -> None:
        rules = [r for _, node in nodes(spec_schema) for r in node.get("x-kubernetes-validations", [])]
        assert all(set(rule) == {"rule", "messageExpression"} for rule in rules), rules
        refused = {
            o.rule for raws in REFUSED.values() for raw in raws for o in evaluate_rules(spec_schema, raw) if o.message
        }
        assert refused == {rule["rule"] for rule in rules}

    @pytest.mark.parametrize(
        ("path", "raw"),
        [pytest.param(path, raw, id=f"{path}-{i}") for path in REFUSED for i, raw in enumerate(REFUSED[path])],
    )
    def test_refused_by_the_model_and_a_rule_with_the_same_message(
        self, spec_schema: dict[str, Any], path: str, raw: dict[str, Any]
    ) -> None:
        (failed,) = [outcome for outcome in evaluate_rules(spec_schema, raw) if outcome.message is not None]
        assert failed.path == path
        with pytest.raises(SpecError) as refused:
            parse_spec(raw)
        # The apiserver says `spec.autoscaling: Invalid value: "object": <message>`; the model the same path.
        assert str(refused.value) == f"{path}: {failed.message}"

    @pytest.mark.parametrize("raw", [pytest.param(raw, id=str(i)) for i, raw in enumerate(ACCEPTED)])
    def test_accepted_by_the_model_and_every_rule(self, spec_schema: dict[str, Any], raw: dict[str, Any]) -> None:
        parse_spec(raw)
        assert [outcome for outcome in evaluate_rules(spec_schema, raw) if outcome.message is not None] == []

    def test_every_rule_holds_on_some_accepted_sample(self, spec_schema: dict[str, Any]) -> None:
        rules = {r["rule"] for _, node in nodes(spec_schema) for r in node.get("x-kubernetes-validations", [])}
        held = {outcome.rule for raw in ACCEPTED for outcome in evaluate_rules(spec_schema, raw)}
        assert held == rules
