"""A classifier with real margins, trained here in seconds on two cores: what int8 is shown on where no trained
network can be downloaded.

The task: 8x8 single-channel images of ten classes, each a fixed seeded pattern at a random contrast under
Gaussian noise strong enough that fp32 gets some wrong (about 5%), so accuracy against the labels says something.
`classifier` is the module's factory, as a user gives one to `inferop export torch`; `write_task` trains it and
writes its weights and the calibration and validation sets a user would bring.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

CLASSES = 10
SIDE = 8
NOISE = 1.3  # per pixel, against patterns of unit variance
INPUT = "images"
FACTORY = "inferop_devtools.trained:classifier"
INPUT_FLAG = f"{INPUT}=1,{SIDE},{SIDE}"


def classifier() -> nn.Module:
    """Two convolutions, a pool and a linear layer: the shapes int8 quantizes in larger networks."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(32 * (SIDE // 2) ** 2, CLASSES),
    )


def samples(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`count` images (float32, [n, 1, 8, 8]) and their labels (int64): the task's patterns are fixed, the draws
    follow `seed`."""
    patterns = np.random.default_rng(12345).standard_normal((CLASSES, 1, SIDE, SIDE))
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, CLASSES, size=count)
    contrast = rng.uniform(0.5, 1.5, size=(count, 1, 1, 1))
    images = patterns[labels] * contrast + rng.standard_normal((count, 1, SIDE, SIDE)) * NOISE
    return images.astype(np.float32), labels.astype(np.int64)


def train(seed: int = 0, count: int = 6000, epochs: int = 4) -> nn.Module:
    torch.manual_seed(seed)
    module = classifier()
    images, labels = (torch.from_numpy(a) for a in samples(count, seed))
    optimizer = torch.optim.Adam(module.parameters(), lr=3e-3)
    for _ in range(epochs):
        for batch in torch.randperm(count).split(128):
            optimizer.zero_grad()
            nn.functional.cross_entropy(module(images[batch]), labels[batch]).backward()
            optimizer.step()
    return module.eval()


# A layer int8 cannot hold, by where it sits: the channel made dead, and the next layer whose weights from it grow.
DAMAGE = {"conv": ("0", "3"), "linear": ("3", "6")}
OUTLIER = 1000.0


def damaged(weights: Path, target: Path, layer: str) -> Path:
    """The trained weights with one `layer` (DAMAGE) that int8 cannot hold, as trained networks' first and last
    layers often cannot: one channel of the layer before made dead (zero weights, bias -1: its ReLU answers 0), and
    the layer's weights from that channel set to OUTLIER. fp32 answers as without the channel; int8's per-channel
    weight scale becomes OUTLIER / 63, and the layer's other weights round to 0."""
    dead, grown = DAMAGE[layer]
    state = torch.load(weights)
    state[f"{dead}.weight"][0] = 0.0
    state[f"{dead}.bias"][0] = -1.0
    state[f"{grown}.weight"][:, 0] = OUTLIER
    torch.save(state, target)
    return target


@dataclass(frozen=True)
class Task:
    weights: Path  # the trained state dict, for `--weights`
    calibration: Path  # 200 unlabelled images
    validation: Path  # 1,000 held-out images with labels

    @property
    def export_args(self) -> list[str]:
        """`inferop export torch` arguments for the trained module, int8 on these sets."""
        return [
            "torch", FACTORY, "--input", INPUT_FLAG, "--output", "logits", "--name", "classifier",
            "--weights", str(self.weights), "--precision", "int8",
            "--calibration", str(self.calibration), "--validation", str(self.validation),
        ]  # fmt: skip


def write_task(directory: Path, seed: int = 0) -> Task:
    """Train the classifier and write its weights and a user's two sets (draws no training image saw)."""
    directory.mkdir(parents=True, exist_ok=True)
    task = Task(directory / "classifier.pth", directory / "calibration.npz", directory / "validation.npz")
    torch.save(train(seed).state_dict(), task.weights)
    np.savez(task.calibration, **{INPUT: samples(200, seed + 1)[0]})
    images, labels = samples(1000, seed + 2)
    np.savez(task.validation, **{INPUT: images, "labels": labels})
    return task
