"""A real Gateway API data plane on the local node: Envoy Gateway (the controller) and Envoy (the proxy), pods of
the node from local images, routing real HTTP requests to the operator's Triton pods, driven by Gateway/HTTPRoute
objects, for drills of weighted canaries, header matches and request mirroring.

The chain, each link the released program:
  HTTPRoute (kube-apiserver) -> Envoy Gateway (its Helm chart's Deployment; envoygateway) -> Envoy Deployment
  -> Envoy's pod (the kubelet, containerd) -> xDS from Envoy Gateway through its Service (kube-proxy, CoreDNS)
  -> EndpointSlices of the backend Services -> the Triton pods the operator rendered (plane).

Binaries, chart and CRDs: scripts/gateway.sh. Envoy alone, without Kubernetes, for the field drills: standalone.
"""
