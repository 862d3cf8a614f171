"""A model of your own, as `inferop export torch` takes it: a factory that returns a `torch.nn.Module`.

This one scores items from two inputs: 16 numeric features (FP32) and a category id (INT64) looked up in an
embedding table. Export, serve and call it:

    inferop export torch ranker:build --app-dir export/examples \\
        --input features=16 --input category=1:INT64 --output score --manifest out/ranker.yaml
"""

import torch
from torch import nn


class Ranker(nn.Module):
    def __init__(self, features: int = 16, categories: int = 10, embedding: int = 8, hidden: int = 32):
        super().__init__()
        self.embedding = nn.Embedding(categories, embedding)
        self.score = nn.Sequential(nn.Linear(features + embedding, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, features: torch.Tensor, category: torch.Tensor) -> torch.Tensor:
        return self.score(torch.cat([features, self.embedding(category[:, 0])], dim=1))


def build() -> nn.Module:
    return Ranker()
