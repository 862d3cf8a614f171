"""An AlphaZero-style policy/value network: a board in, a move distribution and the position's value out."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from torch import nn

from inferop_core.agreement import Gate
from inferop_core.processing import Processing
from inferop_core.tritonconfig import TensorSpec, random_weights
from inferop_export.networks import NetworkContract
from inferop_export.sources import SourceError, TorchModule, file_weights, load_state_dict

# Probabilities and values of order 1 agree to ~1e-7 in practice.
TOLERANCE = 1e-4
PROCESSING = Processing(kind="policyValue")


class PolicyValueNet(nn.Module):
    """A board in, a move distribution and a position value out.

    Torso: `depth` 3x3 convolutions (stride 1, padding 1, so the board size is kept) with ReLU.
    Policy head: 3x3 conv to 2 channels, ReLU, fully connected to `moves`, softmax.
    Value head: 3x3 conv to 1 channel, ReLU, fully connected to 1 output, identity.
    """

    POLICY_CHANNELS = 2
    VALUE_CHANNELS = 1

    def __init__(self, rows: int = 8, cols: int = 7, depth: int = 10, hidden: int = 128, moves: int = 7):
        super().__init__()
        for name, value in {"rows": rows, "cols": cols, "depth": depth, "hidden": hidden, "moves": moves}.items():
            if value < 1:
                raise SourceError(f"--{name} must be >= 1, got {value}")
        self.rows, self.cols, self.moves = rows, cols, moves
        layers: list[nn.Module] = []
        for i in range(depth):
            layers += [nn.Conv2d(1 if i == 0 else hidden, hidden, 3, padding=1), nn.ReLU()]
        self.torso = nn.Sequential(*layers)
        cells = rows * cols
        self.policy_head = nn.Sequential(
            nn.Conv2d(hidden, self.POLICY_CHANNELS, 3, padding=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(self.POLICY_CHANNELS * cells, moves),
            nn.Softmax(dim=1),
        )
        self.value_head = nn.Sequential(
            nn.Conv2d(hidden, self.VALUE_CHANNELS, 3, padding=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(self.VALUE_CHANNELS * cells, 1),
        )

        # He initialisation of the weights: PyTorch's default shrinks the signal by about 1/sqrt(3) a layer, so
        # ten layers down every board gave the same policy and value, and nothing that compared outputs could tell.
        for layer in self.modules():
            if isinstance(layer, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(layer.weight, nonlinearity="relu")

    def forward(self, board: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.torso(board)
        return self.policy_head(features), self.value_head(features)


def conv_net(
    rows: int = 8,
    cols: int = 7,
    depth: int = 10,
    hidden: int = 128,
    moves: int = 7,
    seed: int = 0,
    weights: Path | None = None,
) -> TorchModule:
    """The network of these sizes, with seeded random weights or a trained state dict (`weights`) of the same
    sizes."""
    torch.manual_seed(seed)
    module = PolicyValueNet(rows=rows, cols=cols, depth=depth, hidden=hidden, moves=moves)
    if weights is not None:
        sizes = f"--rows {rows} --cols {cols} --depth {depth} --hidden {hidden} --moves {moves}"
        load_state_dict(module, weights, f"a state dict of the conv net of {sizes}")

    def boards(batch: int, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
        # Cells hold -1 (opponent), 0 (empty) or 1 (own stone).
        return (rng.integers(-1, 2, size=(batch, 1, rows, cols)).astype(np.float32),)

    return TorchModule(
        name="conv_net",
        module=module,
        inputs=(TensorSpec(name="board", dims=(1, rows, cols)),),
        output_names=("policy", "value"),
        make_input=boards,
        tolerance=TOLERANCE,
        weights=random_weights(seed) if weights is None else file_weights(weights),
        processing=PROCESSING,
        gate=Gate(top1=("policy",), max_abs_diff={"value": 0.02}),
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, default=8, help="board rows (default 8)")
    parser.add_argument("--cols", type=int, default=7, help="board columns (default 7)")
    parser.add_argument("--depth", type=int, default=10, help="3x3 convolutions in the torso (default 10)")
    parser.add_argument("--hidden", type=int, default=128, help="channels in the torso (default 128)")
    parser.add_argument("--moves", type=int, default=7, help="policy outputs (default 7)")
    parser.add_argument(
        "--weights",
        type=Path,
        help="a state dict (.pth) of PolicyValueNet with these sizes, e.g. a trained board network; default: seeded "
        "random weights",
    )


def build(args: argparse.Namespace) -> TorchModule:
    return conv_net(args.rows, args.cols, args.depth, args.hidden, args.moves, seed=args.seed, weights=args.weights)


NETWORK = NetworkContract(
    name="conv_net",
    help="AlphaZero-style policy/value convolutional network",
    add_arguments=add_arguments,
    build=build,
)
