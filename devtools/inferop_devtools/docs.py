"""The docs site's generated reference pages: the InferenceService (spec and status) from the CRD schema, which is
generated from the spec model, and the command line from its parsers. Nothing in them is written by hand, so they
cannot drift: `python -m inferop_devtools.docs` writes them, `--check` (make check) fails when one differs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterator
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


PAGES: dict[Path, Callable[[], str]] = {
    REFERENCE / "inferenceservice.md": inference_service_page,
    REFERENCE / "cli.md": cli_page,
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
    if stale:
        print(f"stale: {', '.join(map(str, stale))}: run python -m inferop_devtools.docs", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
