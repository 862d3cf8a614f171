"""inferop's local runtime: serve a model repository with tritonserver under a pod's limits, call it, benchmark it
(`inferop serve`, `infer`, `bench`). The planning it shares with the operator is in `inferop_core`."""

__version__ = "0.1.0"
