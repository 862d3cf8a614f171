"""A local Kubernetes control plane for tests and for trying the operator and chart without a cluster."""

from inferop_devtools.cluster.controlplane import ClusterError, ControlPlane, default_state_dir, kube_binaries

__all__ = ["ClusterError", "ControlPlane", "default_state_dir", "kube_binaries"]
