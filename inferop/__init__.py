"""inferop: PyTorch models to production behind NVIDIA Triton, without stalls, crawls or OOMs."""

__version__ = "0.1.0"
