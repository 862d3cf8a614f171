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

# An image classifier as inferop export declares Inception V3: what a pipeline may wrap.
CLASSIFIER: dict[str, Any] = {
    "name": "inception_v3",
    "storageUri": "hostpath:///models/inception_v3",
    "profile": {"parameters": 10, "macsPerSample": 100, "weightBytes": 40, "activationBytesPerSample": 8},
    "inputs": [{"name": "images", "dims": [3, 299, 299]}],
    "outputs": [{"name": "logits", "dims": [1000], "labelFilename": "labels.txt"}],
    "processing": {
        "kind": "imageClassification",
        "resizeRatio": 1.14,
        "mean": [0.485, 0.456, 0.406],
        "std": [0.229, 0.224, 0.225],
    },
}


def raw_spec(**sections: Any) -> dict[str, Any]:
    """Only what has no default, with top-level `sections` replaced (deep copies: tests may mutate them)."""
    return copy.deepcopy({"model": MODEL, **sections})
