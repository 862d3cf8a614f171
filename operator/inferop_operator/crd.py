"""The CustomResourceDefinition, generated from the typed spec and status so they cannot drift, and the chart's
identity template, generated from the identity module.

`python -m inferop_operator.crd --write` regenerates both chart files; `--check` (in `make check`) fails when a
committed file differs from what the spec, status and identity say.
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from inferop_operator.identity import (
    COMPONENT,
    COMPONENTS,
    CRD_NAME,
    GROUP,
    KIND,
    MANAGED,
    PLURAL,
    SHORT_NAME,
    VERSION,
)
from inferop_operator.spec import InferenceServiceSpec
from inferop_operator.status import Status

CHART = Path(__file__).resolve().parents[2] / "charts" / "inferop"
CRD_PATH = CHART / "crds" / f"{CRD_NAME}.yaml"
IDENTITY_TEMPLATE = CHART / "templates" / "_identity.tpl"
# Keywords a structural OpenAPI v3 schema keeps; pydantic's others (title, $defs, ...) are dropped.
KEPT = {
    "type", "description", "default", "enum", "pattern", "minimum", "maximum", "minLength", "maxLength",
    "minItems", "maxItems", "items", "properties", "required", "additionalProperties", "x-kubernetes-int-or-string",
    "anyOf", "exclusiveMinimum", "exclusiveMaximum", "x-kubernetes-validations", "x-kubernetes-preserve-unknown-fields",
}  # fmt: skip


def structural(schema: dict[str, Any], definitions: dict[str, Any]) -> dict[str, Any]:
    """Turn a pydantic JSON schema node into a structural OpenAPI v3 schema node."""
    if "$ref" in schema:
        resolved = definitions[schema["$ref"].rsplit("/", 1)[-1]]
        return structural({**resolved, **{k: v for k, v in schema.items() if k != "$ref"}}, definitions)
    branches = schema.get("anyOf")
    if branches and not schema.get("x-kubernetes-int-or-string"):
        present = [b for b in branches if b.get("type") != "null"]
        if len(present) == 1:  # Optional[X]: absent means unset
            rest = {
                k: v for k, v in schema.items() if k not in ("anyOf", "default") or (k == "default" and v is not None)
            }
            optional = structural({**present[0], **rest}, definitions)
            if schema.get("default", ...) is None:
                optional.pop("default", None)  # unset stays unset: the apiserver must not fill in an empty section
            return optional
    node: dict[str, Any] = {}
    for key, value in schema.items():
        if key not in KEPT or (key == "additionalProperties" and isinstance(value, bool)):
            continue
        if key == "properties":
            node[key] = {name: structural(child, definitions) for name, child in value.items()}
        elif key in ("items", "additionalProperties"):
            node[key] = structural(value, definitions)
        elif key == "anyOf":
            node[key] = [{"type": b["type"]} for b in value]
        elif key == "description":
            node[key] = " ".join(value.split())
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):  # JSON Schema 2020 numbers -> OpenAPI 3.0 booleans
            node["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            node[key] = True
        else:
            node[key] = copy.deepcopy(value)
    if node.get("type") == "object" and "properties" in node and not node.get("required") and "default" not in node:
        node["default"] = {}  # so the apiserver fills the defaults of a section the user left out
    return node


def spec_schema() -> dict[str, Any]:
    schema = InferenceServiceSpec.model_json_schema(by_alias=True)
    return structural(schema, schema.get("$defs", {}))


def status_schema() -> dict[str, Any]:
    """Every field the operator writes, and nothing else: the API server prunes what its schema does not list.
    No defaults: the status says what the operator found, and an object it has not reconciled has none."""
    schema = Status.model_json_schema(by_alias=True)
    return without_defaults(structural(schema, schema.get("$defs", {})))


def without_defaults(node: dict[str, Any]) -> dict[str, Any]:
    pruned = {key: value for key, value in node.items() if key != "default"}
    if "properties" in pruned:
        pruned["properties"] = {name: without_defaults(child) for name, child in pruned["properties"].items()}
    if "items" in pruned:
        pruned["items"] = without_defaults(pruned["items"])
    return pruned


def build_crd() -> dict[str, Any]:
    spec = spec_schema()
    spec.pop("default", None)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME, "labels": {"app.kubernetes.io/part-of": "inferop"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": [SHORT_NAME],
                "categories": ["inferop"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "A model served by NVIDIA Triton Inference Server, reconciled by inferop.",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec,
                                "status": status_schema(),
                            },
                        }
                    },
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": [
                        {
                            "name": "Ready",
                            "type": "string",
                            "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
                        },
                        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                        {"name": "URL", "type": "string", "jsonPath": ".status.url"},
                        {"name": "Replicas", "type": "integer", "jsonPath": ".status.readyReplicas"},
                        {"name": "Threads", "type": "string", "jsonPath": ".status.threads.summary"},
                        {"name": "Rollout", "type": "string", "jsonPath": ".status.rollout.phase"},
                        {"name": "Canary", "type": "string", "jsonPath": ".status.rollout.weight"},
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                }
            ],
        },
    }


def render_crd() -> str:
    header = "# Generated from inferop_operator/spec.py and status.py by `make crd`; `make check` fails if it drifts.\n"
    return header + yaml.safe_dump(build_crd(), sort_keys=False, width=120)


def render_identity_template() -> str:
    """The chart's named templates for what the identity module states: the API group its RBAC grants and the
    selector of the pods its PodMonitor scrapes, so the chart spells neither by hand."""
    tracks = "\n".join(
        [
            "matchLabels:",
            *(f"  {key}: {value}" for key, value in sorted(MANAGED.items())),
            "matchExpressions:",
            f"  - key: {COMPONENT}",
            "    operator: In",
            f"    values: [{', '.join(sorted(COMPONENTS.values()))}]",
        ]
    )
    return "\n".join(
        [
            "{{/* Generated from inferop_operator/identity.py by `make crd`; `make check` fails if it drifts. */}}",
            "",
            "{{/* The API group of InferenceServices. */}}",
            f'{{{{- define "inferop.apiGroup" -}}}}{GROUP}{{{{- end }}}}',
            "",
            "{{/* A selector of every Triton pod, stable or a rollout's candidate. */}}",
            '{{- define "inferop.tritonPodsSelector" -}}',
            tracks,
            "{{- end }}",
            "",
        ]
    )


def generated() -> dict[Path, Callable[[], str]]:
    """Each generated file and what renders it: `--write` writes them all, `--check` fails on any that drifted."""
    return {CRD_PATH: render_crd, IDENTITY_TEMPLATE: render_identity_template}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", action="store_true", help=f"write {', '.join(map(str, generated()))}")
    action.add_argument("--check", action="store_true", help="fail if a committed file differs from the models")
    action.add_argument("--print", action="store_true", help="print the CRD")
    args = parser.parse_args(argv)
    if args.print:
        sys.stdout.write(render_crd())
        return 0
    stale = []
    for path, render in generated().items():
        text = render()
        if args.write:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
        elif not path.exists() or path.read_text() != text:
            stale.append(path)
    for path in stale:
        print(
            f"{path} is out of date with inferop_operator's spec, status or identity: run `make crd`", file=sys.stderr
        )
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
