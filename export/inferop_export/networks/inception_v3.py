"""torchvision's Inception V3: 299x299 ImageNet-normalised images in, logits over 1,000 classes out."""

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
from inferop_export.sources import SourceError, TorchModule, file_weights

INCEPTION_SIZE = 299
INCEPTION_CLASSES = 1000
# Logits of order 1 through ~100 layers agree to ~3e-4 in practice.
TOLERANCE = 5e-3
# torchvision's ImageNet preprocessing for Inception: the short side resized to 342, a 299 centre crop.
PROCESSING = Processing(
    kind="imageClassification", resize_ratio=342 / 299, mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]
)


def build_inception_v3(weights: Path | None = None, seed: int = 0, calibration_batches: int = 4) -> nn.Module:
    """Inception V3 in eval mode (one output: logits).

    With `weights`, a torchvision-layout state dict is loaded. Without, weights are seeded random and the
    BatchNorm running statistics are re-estimated on seeded inputs: the init statistics (mean 0, var 1)
    let activations grow to ~1e12 through 90+ layers, which makes parity checks and fp16 meaningless.
    `transform_input=True` in both cases: callers always send ImageNet-normalised images, and the network
    converts them to the normalisation the original weights were trained with.
    """
    from torchvision.models import inception_v3

    torch.manual_seed(seed)
    model = inception_v3(weights=None, aux_logits=True, init_weights=True, transform_input=True)
    if weights is not None:
        try:
            state = torch.load(weights, map_location="cpu", weights_only=True)
        except Exception as error:  # not a checkpoint: unpickling fails in many ways (EOF, IndexError)
            reason = f"{type(error).__name__}: {error}"
            raise SourceError(f"--weights {weights}: not a PyTorch checkpoint ({reason})") from error
        if not isinstance(state, dict):
            raise SourceError(f"--weights {weights}: expected a state dict, got {type(state).__name__}")
        try:
            missing, unexpected = model.load_state_dict(state, strict=False)
        except RuntimeError as error:  # strict=False still refuses tensors of the wrong shape
            raise SourceError(f"--weights {weights}: not a torchvision Inception V3 state dict ({error})") from error
        # Pretrained files may omit the auxiliary classifier, which eval mode never runs.
        missing = [k for k in missing if not k.startswith("AuxLogits.")]
        if missing or unexpected:
            raise SourceError(
                f"--weights {weights}: not a torchvision Inception V3 state dict "
                f"(missing {missing[:5]}, unexpected {unexpected[:5]})"
            )
    else:
        recalibrate_batchnorm(model, batches=calibration_batches, seed=seed)
    return model.eval()


@torch.no_grad()
def recalibrate_batchnorm(model: nn.Module, batches: int, seed: int, batch_size: int = 4) -> None:
    """Re-estimate BatchNorm running mean/var as a cumulative average over seeded random images."""
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    for bn in norms:
        bn.reset_running_stats()
        bn.momentum = None  # cumulative moving average over the calibration batches
    generator = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(batches):
        model(calibration_images(batch_size, generator))
    model.eval()


def calibration_images(batch: int, generator: torch.Generator) -> torch.Tensor:
    """ImageNet-normalised stand-ins for photos: half smooth colour fields (large flat regions, as in
    pictures), half white noise (fine texture), so activations stay of order 1 on both kinds of input."""
    smooth = torch.nn.functional.interpolate(
        torch.randn(batch - batch // 2, 3, 6, 6, generator=generator) * 1.2,
        size=(INCEPTION_SIZE, INCEPTION_SIZE),
        mode="bilinear",
        align_corners=False,
    )
    noise = torch.randn(batch // 2, 3, INCEPTION_SIZE, INCEPTION_SIZE, generator=generator)
    return torch.cat([smooth, noise])


def inception_categories() -> list[str]:
    """ImageNet class names from torchvision's weight metadata (shipped in the package, no download)."""
    from torchvision.models import Inception_V3_Weights

    return list(Inception_V3_Weights.IMAGENET1K_V1.meta["categories"])


def inception_v3(weights: Path | None = None, seed: int = 0) -> TorchModule:
    if weights is not None and not weights.is_file():
        raise SourceError(f"--weights {weights}: no such file")
    module = build_inception_v3(weights=weights, seed=seed)

    def images(batch: int, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
        # ImageNet-normalised pixels are roughly standard normal.
        return (rng.standard_normal((batch, 3, INCEPTION_SIZE, INCEPTION_SIZE)).astype(np.float32),)

    return TorchModule(
        name="inception_v3",
        module=module,
        inputs=(TensorSpec(name="images", dims=(3, INCEPTION_SIZE, INCEPTION_SIZE)),),
        output_names=("logits",),
        make_input=images,
        tolerance=TOLERANCE,
        weights=random_weights(seed) if weights is None else file_weights(weights),
        labels=inception_categories(),
        processing=PROCESSING,
        gate=Gate(top1=("logits",)),
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--weights", type=Path, help="torchvision-layout state dict (.pth); default: seeded random weights"
    )


def build(args: argparse.Namespace) -> TorchModule:
    return inception_v3(weights=args.weights, seed=args.seed)


NETWORK = NetworkContract(
    name="inception_v3",
    help="torchvision Inception V3, 299x299 images, 1000 classes",
    add_arguments=add_arguments,
    build=build,
)
