"""Kubernetes resource quantities ("500m", "2Gi", "1e3", 4) as numbers, with errors naming the field."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

# The apiserver's own quantity grammar (k8s.io/apimachinery resource.Quantity).
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
_SUFFIXES = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}
# Kubernetes keeps amounts in a signed 64-bit integer (of milli-units for CPUs); nothing larger is a resource.
MAX_AMOUNT = Decimal(2**63 - 1)
_SPLIT = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)$")


def parse_quantity(value: int | float | str, field: str = "quantity") -> float:
    """The quantity's value in base units (cores, bytes, devices)."""
    text = str(value).strip()
    match = _SPLIT.match(text) if re.fullmatch(QUANTITY_PATTERN, text) else None
    if match is None or match.group(2) not in _SUFFIXES:
        raise ValueError(f"{field}: {value!r} is not a Kubernetes quantity (examples: 2, 500m, 4Gi, 1.5)")
    try:
        amount = Decimal(match.group(1)) * _SUFFIXES[match.group(2)]
    except InvalidOperation as error:
        raise ValueError(f"{field}: {value!r} is not a Kubernetes quantity") from error
    if abs(amount) > MAX_AMOUNT:  # "1e400" matches the grammar; as a float it would be infinite
        raise ValueError(f"{field}: {value!r} is too large (at most {MAX_AMOUNT:.3g} cores, bytes or devices)")
    return float(amount)


def format_bytes(size: float) -> str:
    """Bytes in the largest binary unit that keeps a number >= 1, e.g. 1.5Gi."""
    for unit, factor in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if abs(size) >= factor:
            value = size / factor
            return f"{value:.3g}{unit}" if abs(value) < 1000 else f"{value:.0f}{unit}"  # never an exponent
    return f"{size:.0f}B"
