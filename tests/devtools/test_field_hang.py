"""The hang drill's ablation: inferop's pod without its liveness probe, and nothing else changed."""

from __future__ import annotations

from inferop_devtools.field.hang import without_liveness
from inferop_devtools.field.node import NAMESPACE, inference_service, selector_of
from inferop_operator.builders import Service, build_config_map, build_deployment
from inferop_operator.plan import plan_service
from inferop_operator.spec import parse_spec
from tests.specs import raw_spec

FAULT = {"INFEROP_FAULT_STALL_FILE": "/tmp/inferop-stall"}


def test_the_ablation_is_the_operator_s_rendering_without_the_liveness_probe() -> None:
    raw = raw_spec()
    ablation = without_liveness("ablation", raw, "inferop.local/triton:1", FAULT)
    spec = parse_spec(inference_service("ablation", raw, FAULT)["spec"])
    service = Service("ablation", NAMESPACE, "uid-1", spec, plan_service(spec), "inferop.local/triton:1")
    config_map, deployment = build_config_map(service), build_deployment(service)
    assert [item["kind"] for item in ablation["items"]] == ["ConfigMap", "Deployment"]
    rendered, removed = deployment["spec"]["template"], ablation["items"][1]["spec"]["template"]
    triton = next(c for c in rendered["spec"]["containers"] if c["name"] == "triton")
    assert (
        "livenessProbe" in triton
        and {"name": "INFEROP_FAULT_STALL_FILE", "value": "/tmp/inferop-stall"} in triton["env"]
    )
    del triton["livenessProbe"]
    assert removed == rendered  # the pod as the operator renders it, but for the probe
    assert ablation["items"][0]["data"] == config_map["data"]
    assert all("ownerReferences" not in item["metadata"] for item in ablation["items"])  # no owner to collect it
    assert selector_of(ablation) == ",".join(
        f"{k}={v}" for k, v in deployment["spec"]["selector"]["matchLabels"].items()
    )
