"""Who an InferenceService is and how its objects are found, stated once.

The API identity (group, version, kind, plural), the labels every child carries and the selectors built from
them. The operator, the chart (its generated `_identity.tpl`), the drills, the bench and the tests read these;
nothing else spells them.
"""

from __future__ import annotations

from collections.abc import Mapping

GROUP = "inferop.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferenceService"
PLURAL = "inferenceservices"
SHORT_NAME = "infsvc"
CRD_NAME = f"{PLURAL}.{GROUP}"

INSTANCE = "app.kubernetes.io/instance"  # the InferenceService a child belongs to, by name
MANAGED = {"app.kubernetes.io/managed-by": "inferop"}
# The Triton pods of every service: `selector_labels` less the instance, which names the service.
PREDICTOR = {**MANAGED, "app.kubernetes.io/component": "predictor"}
CONFIG_HASH_ANNOTATION = f"{GROUP}/config-hash"


def selector_labels(service: str) -> dict[str, str]:
    """The labels that select one service's Triton pods (its Deployment's and Service's selector)."""
    return {INSTANCE: service, **PREDICTOR}


def labels(service: str) -> dict[str, str]:
    """Every label a service's children carry: the selector's and the recommended descriptive ones."""
    return {**selector_labels(service), "app.kubernetes.io/name": "triton", "app.kubernetes.io/part-of": "inferop"}


def label_selector(wanted: Mapping[str, str]) -> str:
    """`wanted` as a label selector string (key=value,...), as the API server's list and watch take it."""
    return ",".join(f"{key}={value}" for key, value in sorted(wanted.items()))
