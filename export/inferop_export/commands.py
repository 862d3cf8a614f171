"""The command this distribution registers in the entry-point group `inferop.commands` (see `inferop_core.commands`)."""

from inferop_core.commands import Command

EXPORT = Command("inferop_export.cli", "export a network to ONNX in a Triton model repository, verified")
TUNE = Command("inferop_export.tune", "search threads, instances and batching on the local Triton for a p99 budget")
