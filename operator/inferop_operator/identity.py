"""Who an InferenceService is and how its objects are found, stated once.

The API identity (group, version, kind, plural), the labels every child carries and the selectors built from
them. The operator, the chart (its generated `_identity.tpl`), the drills, the bench and the tests read these;
nothing else spells them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal


def label_selector(wanted: Mapping[str, str]) -> str:
    """`wanted` as a label selector string (key=value,...), as the API server's list and watch take it."""
    return ",".join(f"{key}={value}" for key, value in sorted(wanted.items()))


GROUP = "inferop.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferenceService"
PLURAL = "inferenceservices"
SHORT_NAME = "infsvc"
CRD_NAME = f"{PLURAL}.{GROUP}"
# Gateway API, which routes a service's callers when a Gateway is named: its group and the HTTPRoute's version.
GATEWAY_GROUP = "gateway.networking.k8s.io"
ROUTE_API = f"{GATEWAY_GROUP}/v1"

INSTANCE = "app.kubernetes.io/instance"  # the InferenceService a child belongs to, by name
COMPONENT = "app.kubernetes.io/component"
MANAGED = {"app.kubernetes.io/managed-by": "inferop"}
# A service's two sets of Triton pods: the stable revision's and, during a rollout, the candidate's. Their component
# labels differ, so neither Deployment's selector ever takes the other's pods.
Track = Literal["stable", "candidate"]
COMPONENTS: dict[Track, str] = {"stable": "predictor", "candidate": "canary"}
CANDIDATE_SUFFIX = "-canary"  # the candidate's Deployment, Service and ConfigMap: <service>-canary
# The header the HTTPRoute sets on each request it sends to a service's pods: the track's component. Its filter on
# every backendRef is also what gives each backend its own Envoy cluster (builders.build_http_route).
TRACK_HEADER = "inferop-track"
# The stable Triton pods of every service: `selector_labels` less the instance, which names the service.
PREDICTOR = {**MANAGED, COMPONENT: COMPONENTS["stable"]}
# Every Triton pod of every service, stable or candidate, as a label selector string.
TRITON_PODS_SELECTOR = f"{label_selector(MANAGED)},{COMPONENT} in ({','.join(sorted(COMPONENTS.values()))})"
CONFIG_HASH_ANNOTATION = f"{GROUP}/config-hash"
# The pods' containers, by name: the status reads what each reports.
TRITON_CONTAINER = "triton"
FETCH_CONTAINER = "fetch-model"  # a model from an image or object storage; `inferop fetch` writes "<reason>: <message>"


def selector_labels(service: str, track: Track = "stable") -> dict[str, str]:
    """The labels that select one service's Triton pods of one track (its Deployment's selector)."""
    return {INSTANCE: service, **MANAGED, COMPONENT: COMPONENTS[track]}


def service_labels(service: str) -> dict[str, str]:
    """The labels that select every Triton pod of a service, whatever its track."""
    return {INSTANCE: service, **MANAGED}


def labels(service: str, track: Track = "stable") -> dict[str, str]:
    """Every label a service's children carry: the selector's and the recommended descriptive ones."""
    return {
        **selector_labels(service, track),
        "app.kubernetes.io/name": "triton",
        "app.kubernetes.io/part-of": "inferop",
    }
