"""Kubernetes quantities as numbers: what a user writes in `resources` is what the checks compute with."""

from __future__ import annotations

import pytest

from inferop_core.quantity import format_bytes, parse_quantity


class TestParseQuantity:
    @pytest.mark.parametrize(
        ("value", "expected"),
        [
            ("500m", 0.5),
            ("2Gi", 2 * 2**30),
            ("1e3", 1000),
            (4, 4),
            ("4", 4),
            ("1.5", 1.5),
            (".5", 0.5),
            ("250Mi", 250 * 2**20),
            ("1Ki", 1024),
            ("2k", 2000),
            ("3M", 3_000_000),
            ("1G", 1_000_000_000),
            ("1E", 10**18),
            ("100n", 100e-9),
            ("2E3", 2000),
            ("+1", 1),
            (" 2Gi ", 2 * 2**30),
        ],
    )
    def test_value_in_base_units(self, value: int | str, expected: float) -> None:
        assert parse_quantity(value) == pytest.approx(expected)

    @pytest.mark.parametrize("value", ["2Gb", "lots", "", "Gi", "1.2.3", "1e", "2 Gi", "1.5e3m", "0x10", "2gi"])
    def test_invalid_names_the_field_and_shows_examples(self, value: str) -> None:
        with pytest.raises(ValueError) as error:
            parse_quantity(value, "resources.limits.memory")
        message = str(error.value)
        assert message.startswith("resources.limits.memory: ")
        assert repr(value) in message
        assert "4Gi" in message  # an example of what is accepted

    @pytest.mark.parametrize("value", ["1e400", "-1e400", "9Ei", "1e19"])
    def test_an_amount_beyond_what_kubernetes_holds_is_refused_not_infinite(self, value: str) -> None:
        with pytest.raises(ValueError, match=rf"resources.limits.cpu: '{value}' is too large"):
            parse_quantity(value, "resources.limits.cpu")


class TestFormatBytes:
    @pytest.mark.parametrize(
        ("size", "text"),
        [
            (0, "0B"),
            (512, "512B"),
            (1024, "1Ki"),
            (1536, "1.5Ki"),
            (2**30, "1Gi"),
            (3 * 2**30 + 2**29, "3.5Gi"),
            (95269496, "90.9Mi"),
            (2**41, "2Ti"),
        ],
    )
    def test_largest_binary_unit(self, size: float, text: str) -> None:
        assert format_bytes(size) == text

    @pytest.mark.parametrize("text", ["1Ki", "250Mi", "2Gi", "1.5Gi"])
    def test_round_trips_through_parse_quantity(self, text: str) -> None:
        assert format_bytes(parse_quantity(text)) == text
