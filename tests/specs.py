"""The smallest valid InferenceService spec, shared by the operator's unit tests, and the shipped examples."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

# The InferenceService manifests shipped with the operator: valid, refused and invalid ones.
EXAMPLES = Path(__file__).resolve().parents[1] / "operator" / "examples"

MODEL: dict[str, Any] = {
    "name": "conv_net",
    "storageUri": "hostpath:///models/conv_net",
    "profile": {"parameters": 10, "macsPerSample": 100, "weightBytes": 40, "activationBytesPerSample": 8},
    "inputs": [{"name": "board", "dims": [1, 8, 7]}],
    "outputs": [{"name": "policy", "dims": [7]}, {"name": "value", "dims": [1]}],
}


def raw_spec(**sections: Any) -> dict[str, Any]:
    """Only what has no default, with top-level `sections` replaced (deep copies: tests may mutate them)."""
    return copy.deepcopy({"model": MODEL, **sections})
