"""The commands the local runtime registers in the entry-point group `inferop.commands` (inferop_core.commands)."""

from inferop_core.commands import Command

SERVE = Command("inferop.serving.cli", "serve a model repository with a local tritonserver")
INFER = Command("inferop.client", "call a Triton endpoint with the HTTP client")
BENCH = Command("inferop.bench", "measure latency and throughput against concurrency")
