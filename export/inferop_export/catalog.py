"""The networks `inferop export` knows, each with its tensor contract, test inputs and parity tolerance."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from inferop.tritonconfig import TensorSpec, random_weights
from inferop_export.exporter import Network
from inferop_export.networks import (
    INCEPTION_CLASSES,
    INCEPTION_SIZE,
    PolicyValueNet,
    build_inception_v3,
    inception_categories,
)

# Probabilities and values of order 1 agree to ~1e-7 in practice.
CONV_NET_TOLERANCE = 1e-4
# Logits of order 1 through ~100 layers agree to ~3e-4 in practice.
INCEPTION_TOLERANCE = 5e-3


def conv_net(
    rows: int = 8, cols: int = 7, depth: int = 10, hidden: int = 128, moves: int = 7, seed: int = 0
) -> Network:
    torch.manual_seed(seed)
    module = PolicyValueNet(rows=rows, cols=cols, depth=depth, hidden=hidden, moves=moves)

    def boards(batch: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        # Cells hold -1 (opponent), 0 (empty) or 1 (own stone).
        return (torch.randint(-1, 2, (batch, 1, rows, cols), generator=generator).float(),)

    return Network(
        name="conv_net",
        module=module,
        inputs=(TensorSpec(name="board", dims=(1, rows, cols)),),
        outputs=(TensorSpec(name="policy", dims=(moves,)), TensorSpec(name="value", dims=(1,))),
        make_input=boards,
        tolerance=CONV_NET_TOLERANCE,
        weights=random_weights(seed),  # no trained conv net is shipped or loaded
    )


def inception_v3(weights: Path | None = None, seed: int = 0) -> Network:
    module = build_inception_v3(weights=weights, seed=seed)

    def images(batch: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        # ImageNet-normalised pixels are roughly standard normal.
        return (torch.randn(batch, 3, INCEPTION_SIZE, INCEPTION_SIZE, generator=generator),)

    return Network(
        name="inception_v3",
        module=module,
        inputs=(TensorSpec(name="images", dims=(3, INCEPTION_SIZE, INCEPTION_SIZE)),),
        outputs=(TensorSpec(name="logits", dims=(INCEPTION_CLASSES,)),),
        make_input=images,
        tolerance=INCEPTION_TOLERANCE,
        weights=random_weights(seed) if weights is None else file_weights(weights),
        labels=inception_categories(),
    )


def file_weights(path: Path) -> str:
    """The provenance of weights loaded from `path`: its name, and enough of its SHA-256 to tell two files apart
    where the name alone would not (the export machine's path means nothing where the model is served)."""
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return f"{path.name}, sha256 {digest.hexdigest()[:16]}"
