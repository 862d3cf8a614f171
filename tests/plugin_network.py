"""A network registered by a plug-in, as another package would ship one: one module, one entry point."""

from __future__ import annotations

import argparse

import torch
from torch import nn

from inferop_core.tritonconfig import TensorSpec, random_weights
from inferop_export.networks import NetworkContract
from inferop_export.sources import TorchModule


def build(args: argparse.Namespace) -> TorchModule:
    torch.manual_seed(args.seed)
    module = nn.Sequential(nn.Linear(args.width, 8), nn.ReLU(), nn.Linear(8, 3), nn.Softmax(dim=1))
    return TorchModule(
        name="tiny_mlp",
        module=module,
        inputs=(TensorSpec(name="x", dims=(args.width,)),),
        output_names=("probabilities",),
        tolerance=1e-5,
        weights=random_weights(args.seed),
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--width", type=int, default=4, help="input features (default 4)")


NETWORK = NetworkContract(name="tiny_mlp", help="a plug-in's tiny MLP", add_arguments=add_arguments, build=build)
