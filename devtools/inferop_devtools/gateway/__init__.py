"""A real Gateway API data plane on one machine without containers: Envoy Gateway (the controller) and Envoy (the
proxy) routing real HTTP requests to local processes, driven by Gateway/HTTPRoute objects in the local control
plane (inferop_devtools.cluster), for drills of weighted canaries, header matches and request mirroring.

The chain, each link real except the kubelet, which is played:
  HTTPRoute (kube-apiserver) -> Envoy Gateway (host process, Kubernetes provider, KUBECONFIG; envoygateway)
  -> Envoy Deployment -> Pod Running with a pod IP (kube-scheduler, kwok) -> the pod's own envoy command, run
  here with its Secret/ConfigMap volumes mounted at their paths (kubelet) -> xDS from Envoy Gateway
  -> EndpointSlices of the backend Services -> one local process per backend pod bound to its pod IP (backend).
All of it runs in a private network namespace where the pod CIDR is local (namespaces).

Binaries and CRDs: scripts/gateway.sh. The end-to-end proof: `python -m inferop_devtools.gateway.proof`.
"""
