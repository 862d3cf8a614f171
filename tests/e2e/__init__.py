"""End-to-end tests on a real cluster with a kubelet (kind); opt-in with make e2e-kind."""
