"""The docs site's generated reference pages: the InferenceService (spec and status) from the CRD schema, which is
generated from the spec model, the command line from its parsers, and the memory model's figures from its constants,
its margin and the peaks make field measured. Nothing in them is written by hand, so they cannot drift:
`python -m inferop_devtools.docs` writes them, `--check` (make check) fails when one differs. The versions that the
hand-written pages and the README quote of what the build scripts pin are written from the pins the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from inferop.paths import repo_root

DOCS = repo_root() / "docs"
REFERENCE = DOCS / "reference"
HELP_COLUMNS = "100"  # argparse wraps help to $COLUMNS: one width, whatever the terminal
CONSTRAINTS = {
    "minimum": ">= {}",
    "maximum": "<= {}",
    "minLength": "length >= {}",
    "maxLength": "length <= {}",
    "minItems": ">= {} items",
    "maxItems": "<= {} items",
    "pattern": "matches `{}`",
}
SCRIPTS = repo_root() / "scripts"
VERSION = r"v?\d+\.\d+(?:\.\d+)?"


@dataclass(frozen=True)
class Pin:
    """A version a build script pins: `name` as the docs write it before the version, the script, and a pattern
    whose group is the version in the script."""

    name: str
    script: str
    read: str

    def version(self) -> str:
        found = re.search(self.read, (SCRIPTS / self.script).read_text(), re.MULTILINE)
        if found is None:
            raise ValueError(f"scripts/{self.script} pins no {self.name} version (looked for {self.read!r})")
        return found.group(1).removeprefix("v")


PINS = (
    Pin("etcd", "kube-current.sh", rf"^ETCD_VERSION=({VERSION})"),
    Pin("Envoy Gateway", "gateway.sh", rf"^ENVOY_GATEWAY_VERSION=({VERSION})"),
    Pin("Envoy", "gateway.sh", rf"^ENVOY_VERSION=({VERSION})"),
    Pin("versitygw", "s3-server.sh", rf"^VERSITYGW_VERSION=({VERSION})"),
    Pin("kwok", "kube-addons.sh", rf'^\s*"kwok \S+ ({VERSION}) '),
    Pin("prometheus-adapter", "kube-addons.sh", rf'^\s*"prometheus-adapter \S+ ({VERSION}) '),
)


def quoted_at_pins(text: str, pins: tuple[Pin, ...] = PINS) -> str:
    """`text` with each version it quotes after a pinned name set to the pin, in the quote's own style (with or
    without the v). A shorter quote that the pin begins with (Envoy 1.39 for 1.39.1) stays: it is not wrong."""
    for pin in pins:
        # "Envoy 1.39.1" but not "Envoy Gateway v1.9.1": a longer pinned name that begins with this one is its own.
        longer = "|".join(re.escape(p.name[len(pin.name) :]) for p in pins if p.name.startswith(pin.name + " "))
        name = re.escape(pin.name) + (f"(?!{longer})" if longer else "")
        text = re.sub(rf"(?<![\w-])({name}`? )(v?)(\d+\.\d+(?:\.\d+)?)", partial(at_pin, pin.version()), text)
    return text


def at_pin(version: str, found: re.Match[str]) -> str:
    """A quote of name, v and version, set to `version` unless it is `version` or a shorter form of it."""
    prefix, v, quoted = found.groups()
    kept = version == quoted or version.startswith(quoted + ".")
    return found.group(0) if kept else f"{prefix}{v}{version}"


def pages_quoting_pins() -> list[Path]:
    """The hand-written pages and the README (the generated ones are written from the code)."""
    return [repo_root() / "README.md", *(p for p in sorted(DOCS.rglob("*.md")) if REFERENCE not in p.parents)]


def field_rows(schema: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(dotted path, schema node) of every field under `schema`, depth first, in the schema's order."""
    for name, child in (schema.get("properties") or {}).items():
        here = f"{path}.{name}"
        yield here, child
        yield from field_rows(child, here)
        items = child.get("items") or {}
        if items.get("properties"):
            yield from field_rows(items, f"{here}[]")


def type_of(node: dict[str, Any]) -> str:
    if node.get("x-kubernetes-int-or-string"):
        return "quantity (integer or string)"
    kind = node.get("type", "any")
    if kind == "array":
        return f"array of {type_of(node.get('items') or {})}"
    if kind == "object" and "additionalProperties" in node:
        return f"map of {type_of(node['additionalProperties'])}"
    return str(kind)


def validation_of(node: dict[str, Any]) -> str:
    found = []
    for key, form in CONSTRAINTS.items():
        if key in node:
            bound = node[key]
            if key == "minimum" and node.get("exclusiveMinimum"):
                form = "> {}"
            if key == "maximum" and node.get("exclusiveMaximum"):
                form = "< {}"
            found.append(form.format(str(bound).replace("|", "\\|")))
    if "enum" in node:
        found.append("one of " + ", ".join(f"`{value}`" for value in node["enum"]))
    return "; ".join(found)


def cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def fields_table(schema: dict[str, Any], root: str, with_defaults: bool) -> list[str]:
    header = ["| field | type | default | validation | description |", "|---|---|---|---|---|"]
    if not with_defaults:
        header = ["| field | type | description |", "|---|---|---|"]
    rows = []
    for path, node in field_rows(schema, root):
        described = cell(node.get("description", ""))
        if with_defaults:
            default = "" if "default" not in node or node["default"] == {} else f"`{json.dumps(node['default'])}`"
            rows.append(f"| `{path}` | {type_of(node)} | {default} | {validation_of(node)} | {described} |")
        else:
            rows.append(f"| `{path}` | {type_of(node)} | {described} |")
    return header + rows


def cel_rules(schema: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    for rule in schema.get("x-kubernetes-validations") or []:
        yield path, rule
    for name, child in (schema.get("properties") or {}).items():
        yield from cel_rules(child, f"{path}.{name}")


def rule_message(rule: dict[str, Any]) -> str:
    """A CEL rule's message, or the CEL expression that builds it (which names the offending value)."""
    return cell(rule["message"]) if "message" in rule else f"`{cell(rule.get('messageExpression', ''))}`"


def inference_service_page() -> str:
    from inferop_operator.crd import spec_schema, status_schema
    from inferop_operator.identity import API_VERSION, KIND, SHORT_NAME

    spec, status = spec_schema(), status_schema()
    lines = [
        f"# {KIND} reference",
        "",
        f"`apiVersion: {API_VERSION}`, `kind: {KIND}`, short name `{SHORT_NAME}`. Generated from the spec model "
        "(the same schema as the CRD the chart installs; `kubectl explain` shows it too). A default is what the "
        "apiserver fills in for a field left out; a section left out gets its fields' defaults.",
        "",
        "## spec",
        "",
        *fields_table(spec, "spec", with_defaults=True),
        "",
        "## Rules across fields",
        "",
        "Checked by the apiserver at `kubectl apply` on Kubernetes 1.23 and later (CEL, `x-kubernetes-validations`), "
        "and by the operator on every release, with the same message.",
        "",
        "| where | rule | message |",
        "|---|---|---|",
        *[f"| `{where}` | `{cell(rule['rule'])}` | {rule_message(rule)} |" for where, rule in cel_rules(spec, "spec")],
        "",
        "## status",
        "",
        "Written by the operator; `inferop plan` prints the part the plan decides without a cluster.",
        "",
        *fields_table(status, "status", with_defaults=False),
        "",
    ]
    return "\n".join(lines)


def command_helps() -> Iterator[tuple[str, str]]:
    """(`inferop NAME ...`, its --help) for every installed command, and each subcommand of one that has them."""
    from inferop_core.cli import build_parser
    from inferop_core.commands import installed

    def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        for action in parser._actions:  # argparse keeps its subparsers here alone
            if isinstance(action, argparse._SubParsersAction):
                return dict(action.choices)
        return {}

    os.environ["COLUMNS"] = HELP_COLUMNS
    for name in installed():
        command = subparsers(build_parser([name]))[name]
        yield f"inferop {name}", command.format_help()
        for sub, parser in subparsers(command).items():
            yield f"inferop {name} {sub}", parser.format_help()


def cli_page() -> str:
    lines = [
        "# Command line reference",
        "",
        "Generated from the parsers of every `inferop` command (each distribution registers its own: the operator "
        "image has `operator`, `plan`, `fetch` and `push` only).",
        "",
    ]
    for title, text in command_helps():
        lines += [f"## `{title}`", "", "```text", text.rstrip(), "```", ""]
    return "\n".join(lines)


def memory_page() -> str:
    """The memory model's constants, the limit's margin and where it comes from, and the estimate and the limit against
    every measured peak: what tests/core/test_memory_measured.py checks, from the same functions."""
    from dataclasses import asdict

    from inferop_core.memory import LOCAL_RUNTIME
    from inferop_core.quantity import format_bytes
    from inferop_devtools.field.memory import (
        LIMIT_OVER_PEAK_BOUND,
        MEASURED,
        estimated,
        limit_over_peak,
        margin_needed,
    )
    from inferop_operator.plan import MEMORY_MARGIN, memory_limit

    data = json.loads(MEASURED.read_text())
    points = estimated(data["points"])
    sets = {name: [point for point in points if point["set"] == name] for name in ("fitted", "held_out")}

    def error(point: dict[str, Any]) -> float:
        return float(point["estimate_bytes"] / point["measured_bytes"] - 1)

    def where(point: dict[str, Any]) -> str:
        return (
            f"{point['network']}, {point['instances']} instance{'s' if point['instances'] > 1 else ''} at "
            f"maxBatchSize {point['max_batch_size']}, {point['state']}"
        )

    worst = min(sets["fitted"], key=error)
    lines = [
        "# Memory model reference",
        "",
        "Generated from the local runtime's constants (`inferop_core.memory.LOCAL_RUNTIME`), the memory limit's margin "
        "(`inferop_operator.plan.MEMORY_MARGIN`) and the peaks measured in a memory cgroup by "
        f"{data['source']} The estimate is explained in [The plan](../concepts/plan.md#memory-fit).",
        "",
        f"A manifest's memory limit is the peak estimate x {MEMORY_MARGIN}, in whole MiB rounded up: `inferop export` "
        "writes it, and the `OOMKilled` advice suggests it. The margin is the largest measured peak over its estimate "
        f"on the fit set, rounded up to hundredths ({margin_needed(sets['fitted'])}): {where(worst)}, "
        f"{format_bytes(worst['measured_bytes'])} against {format_bytes(worst['estimate_bytes'])} estimated "
        f"({error(worst):+.1%}, a ratio of {worst['measured_bytes'] / worst['estimate_bytes']:.3f}). Neither the "
        "constants nor the margin were taken from the held-out points (other models, other shapes, wider batches): "
        "that their limits cover them is the check. "
        "`tests/core/test_memory_measured.py` fails when a limit is under its peak or more than "
        f"{LIMIT_OVER_PEAK_BOUND:g}x it, or when the constants or the margin are not what these points give.",
        "",
        "| points | estimate against the peak | limit against the peak |",
        "|---|---|---|",
    ]
    for name, title in (("fitted", "fit set"), ("held_out", "held out")):
        chosen = sets[name]
        errors = [error(point) for point in chosen]
        ratios = [limit_over_peak(point) for point in chosen]
        lines.append(
            f"| {title} ({len(chosen)}) | {min(errors):+.1%} .. {max(errors):+.1%} | "
            f"{min(ratios):.2f}x .. {max(ratios):.2f}x |"
        )
    lines += [
        "",
        "## Constants of the local runtime",
        "",
        f"{LOCAL_RUNTIME.measured}.",
        "",
        "| constant | value |",
        "|---|---|",
        *[
            f"| `{name}` | {value:,} |"
            for name, value in asdict(LOCAL_RUNTIME).items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)
        ],
        "",
        "## Every measured point",
        "",
        "| set | model | instances | maxBatchSize | queue bound | state | measured peak | estimate | error | limit | "
        "limit / peak |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *[
            f"| {point['set']} | {point['network']} | {point['instances']} | {point['max_batch_size']} | "
            f"{point['queue_bound']} | {point['state']} | {format_bytes(point['measured_bytes'])} | "
            f"{format_bytes(point['estimate_bytes'])} | {error(point):+.1%} | "
            f"{memory_limit(point['estimate_bytes'])} | {limit_over_peak(point):.2f} |"
            for point in points
        ],
        "",
    ]
    return "\n".join(lines)


PAGES: dict[Path, Callable[[], str]] = {
    REFERENCE / "inferenceservice.md": inference_service_page,
    REFERENCE / "cli.md": cli_page,
    REFERENCE / "memory.md": memory_page,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a generated page differs")
    args = parser.parse_args(argv)
    stale = []
    for path, build in PAGES.items():
        text = build()
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(path)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(path)
    for path in pages_quoting_pins():
        text = path.read_text()
        if (current := quoted_at_pins(text)) != text:
            if args.check:
                stale.append(path)
                continue
            path.write_text(current)
            print(path)
    if stale:
        print(f"stale: {', '.join(map(str, stale))}: run python -m inferop_devtools.docs", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
