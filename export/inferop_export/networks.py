"""The two networks we export: an AlphaZero-style policy/value net and torchvision's Inception V3."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

INCEPTION_SIZE = 299
INCEPTION_CLASSES = 1000


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
                raise ValueError(f"--{name} must be >= 1, got {value}")
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

    def forward(self, board: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.torso(board)
        return self.policy_head(features), self.value_head(features)


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
            raise ValueError(f"--weights {weights}: not a PyTorch checkpoint ({reason})") from error
        if not isinstance(state, dict):
            raise ValueError(f"--weights {weights}: expected a state dict, got {type(state).__name__}")
        try:
            missing, unexpected = model.load_state_dict(state, strict=False)
        except RuntimeError as error:  # strict=False still refuses tensors of the wrong shape
            raise ValueError(f"--weights {weights}: not a torchvision Inception V3 state dict ({error})") from error
        # Pretrained files may omit the auxiliary classifier, which eval mode never runs.
        missing = [k for k in missing if not k.startswith("AuxLogits.")]
        if missing or unexpected:
            raise ValueError(
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
