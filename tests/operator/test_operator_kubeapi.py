"""How the operator reads an API server's refusal: status code, reason and message kept, retry or not."""

from __future__ import annotations

import http
import json
from typing import Any

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException
from kubernetes.client.rest import RESTResponse

from inferop_operator.builders import CHILDREN, Child
from inferop_operator.kubeapi import PLURALS, RETRY_MAX_SECONDS, ApiFailure, KubeApi, NoServedVersion, resource_path


def status_body(code: int, reason: str, message: str, **details: Any) -> str:
    """A `Status` as the apiserver answers a refused request."""
    answer = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "code": code}
    answer |= {"message": message, "reason": reason, **({"details": details} if details else {})}
    return json.dumps(answer)


def refused(code: int, body: str, headers: dict[str, str] | None = None) -> ApiException:
    """The exception KubeApi raises for such an answer (the client's own response objects, filled as read)."""
    raw = urllib3.HTTPResponse(
        body=body.encode(), status=code, reason=http.HTTPStatus(code).phrase, headers=headers or {}
    )
    response = RESTResponse(raw)
    response.read()
    return ApiException(http_resp=response)


RANGE_FULL = "Internal error occurred: failed to allocate a serviceIP: range is full"
QUOTA = (
    'services "conv-net" is forbidden: exceeded quota: no-services, requested: services=1, used: services=0, '
    "limited: services=0"
)
INVALID = (
    'Service "7-up" is invalid: metadata.name: Invalid value: "7-up": a DNS-1035 label must consist of lower case '
    "alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character"
)


class TestApiFailure:
    @pytest.mark.parametrize(
        ("code", "body", "reason", "message", "permanent"),
        [
            (500, status_body(500, "InternalError", RANGE_FULL), "InternalError", RANGE_FULL, False),
            (403, status_body(403, "Forbidden", QUOTA, name="conv-net", kind="services"), "Forbidden", QUOTA, False),
            (422, status_body(422, "Invalid", INVALID, name="7-up", kind="Service"), "Invalid", INVALID, True),
            (409, status_body(409, "Conflict", "the object has been modified"), "Conflict", "the object", False),
            (400, status_body(400, "BadRequest", "json: cannot unmarshal"), "BadRequest", "json: cannot", True),
            # Not the apiserver's answer: a proxy's page keeps its status and its text.
            (502, "<html>upstream unavailable</html>", "BadGateway", "<html>upstream unavailable</html>", False),
            (500, "", "InternalServerError", "Internal Server Error", False),
        ],
        ids=["range full", "quota", "invalid name", "conflict", "bad request", "proxy page", "empty body"],
    )
    def test_reads_the_servers_answer(self, code: int, body: str, reason: str, message: str, permanent: bool) -> None:
        failure = ApiFailure.of(refused(code, body), "apply", "Service", "conv-net")
        assert (failure.status, failure.reason, failure.permanent) == (code, reason, permanent)
        assert failure.message.startswith(message)
        assert failure.explain() == f"apply Service conv-net: {code} {reason}: {failure.message}"

    @pytest.mark.parametrize(
        ("code", "retry", "delay"),
        [
            (500, 0, 5),
            (500, 1, 10),
            (500, 3, 40),
            (500, 20, RETRY_MAX_SECONDS),
            (409, 0, 5),
            (429, 0, 5),
            (403, 0, 30),  # forbidden by RBAC or a quota: a person has to act
            (403, 2, 120),
            (404, 9, RETRY_MAX_SECONDS),
        ],
    )
    def test_backoff(self, code: int, retry: int, delay: float) -> None:
        failure = ApiFailure.of(refused(code, status_body(code, "x", "y")), "apply", "Service", "conv-net")
        assert failure.delay(retry) == delay

    @pytest.mark.parametrize(
        ("headers", "details", "delay"),
        [({"Retry-After": "42"}, {}, 42), ({}, {"retryAfterSeconds": 17}, 17), ({"Retry-After": "1"}, {}, 5)],
        ids=["header", "status details", "never shorter than the backoff"],
    )
    def test_retry_after_is_honoured(self, headers: dict[str, str], details: dict[str, Any], delay: float) -> None:
        body = status_body(429, "TooManyRequests", "too many requests", **details)
        failure = ApiFailure.of(refused(429, body, headers), "apply", "Deployment", "conv-net")
        assert failure.delay(0) == delay


def child(kind: str) -> Child:
    return next(c for c in CHILDREN if c.kind == kind)


class Discovery(KubeApi):
    """A KubeApi whose API server offers `offered` (group -> versions) and counts the discovery requests."""

    def __init__(self, offered: dict[str, list[str]]):
        super().__init__(None, "inferop")  # no request leaves this test
        self.offered = offered
        self.asked: list[tuple[str, str]] = []

    def _call(self, method: str, path: str, *_: Any, **__: Any) -> Any:
        self.asked.append((method, path))
        group = path.removeprefix("/apis/")
        return {"kind": "APIGroup", "name": group, "versions": [{"version": v} for v in self.offered.get(group, [])]}


KUBERNETES_1_20 = {"autoscaling": ["v1", "v2beta1", "v2beta2"], "policy": ["v1beta1"]}
KUBERNETES_1_33 = {"autoscaling": ["v2", "v1"], "policy": ["v1"]}


class TestServedVersion:
    @pytest.mark.parametrize(
        ("offered", "kind", "expected"),
        [
            (KUBERNETES_1_20, "HorizontalPodAutoscaler", "autoscaling/v2beta2"),
            (KUBERNETES_1_20, "PodDisruptionBudget", "policy/v1beta1"),
            (KUBERNETES_1_33, "HorizontalPodAutoscaler", "autoscaling/v2"),
            (KUBERNETES_1_33, "PodDisruptionBudget", "policy/v1"),
        ],
    )
    def test_the_first_candidate_the_server_offers(
        self, offered: dict[str, list[str]], kind: str, expected: str
    ) -> None:
        api = Discovery(offered)
        assert api.served_version(child(kind)) == expected
        assert api.served_version(child(kind)) == expected
        assert api.asked == [("GET", f"/apis/{child(kind).group}")]  # once

    @pytest.mark.parametrize(("kind", "expected"), [("ConfigMap", "v1"), ("Service", "v1"), ("Deployment", "apps/v1")])
    def test_a_single_candidate_needs_no_discovery(self, kind: str, expected: str) -> None:
        api = Discovery({})
        assert api.served_version(child(kind)) == expected
        assert api.asked == []

    def test_none_offered_names_what_would_do(self) -> None:
        with pytest.raises(NoServedVersion, match=r"none of policy/v1, policy/v1beta1 for PodDisruptionBudget"):
            Discovery({"policy": ["v2alpha1"]}).served_version(child("PodDisruptionBudget"))


class TestResourcePaths:
    def test_every_child_has_its_plural(self) -> None:
        assert {c.kind for c in CHILDREN} < set(PLURALS)
        assert resource_path("policy/v1beta1", "PodDisruptionBudget", "models", "conv-net") == (
            "/apis/policy/v1beta1/namespaces/models/poddisruptionbudgets/conv-net"
        )
        assert resource_path("v1", "ConfigMap", "models") == "/api/v1/namespaces/models/configmaps"
