"""Operator settings, from environment variables prefixed INFEROP_."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from inferop_core.errors import InferopError
from inferop_core.memory import CONTAINER_RUNTIME, RuntimeCosts
from inferop_core.quantity import format_bytes, parse_quantity
from inferop_operator.rollout import SAFEGUARDS
from inferop_operator.spec import GatewayRef


class OperatorSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="INFEROP_")

    triton_image: str = Field(
        default="nvcr.io/nvidia/tritonserver:25.01-py3",
        description="Triton image when spec.runtime.image is unset; its ONNX Runtime must read ONNX IR 10 (>= 1.18).",
    )
    fetch_image: str = Field(
        default="inferop/operator:0.1.0",
        description=(
            "The image whose `inferop fetch` fetches models in object storage into each pod (the operator's own; "
            "the chart sets it to the image it runs)."
        ),
    )
    operator_namespace: str | None = Field(
        default=None,
        description=(
            "The namespace of the operator's own pod (the chart sets it): a service's NetworkPolicy open to its "
            "gateway alone (networkPolicy.inferenceFrom) lets the operator's pods there call its pods for the "
            "agreement check. Unset (an operator outside the cluster): none are let; one on a node reaches them as "
            "the node."
        ),
    )
    resync_seconds: float = Field(
        default=60.0, gt=0, description="How often each service is re-applied, so manual drift of children is reverted."
    )
    log_format: Literal["plain", "json"] = Field(default="plain", description="json in-cluster, plain on a terminal.")
    field_manager: str = Field(default="inferop", description="Server-side apply field manager of every child.")
    api_workers: int = Field(
        default=8,
        ge=1,
        le=64,
        description=(
            "Threads that reconcile at once, each with its own connection to the API server. More than the "
            "server answers at once only holds more objects in the operator's memory."
        ),
    )
    prometheus_url: str | None = Field(
        default=None,
        description=(
            "The Prometheus that scrapes the Triton pods (the chart's PodMonitor), e.g. "
            "http://prometheus.monitoring:9090; a rollout's analysis reads it. Unset: rollouts hold at their first "
            "step (never promoted blind)."
        ),
    )
    default_gateway: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-a-z0-9]*[a-z0-9])?(/[a-z0-9]([-a-z0-9]*[a-z0-9])?)?$",
        description="namespace/name[/listener] of the Gateway for services whose spec names none; unset: none.",
    )
    crd_wait_seconds: float = Field(
        default=30.0,
        gt=0,
        description=(
            "How long the operator waits at start for the API server to serve InferenceServices (the CRD installed "
            "and served) before it exits saying so."
        ),
    )
    api_lost_seconds: float = Field(
        default=60.0,
        gt=0,
        description=(
            "How long the API server may stay unreachable before the operator exits saying so (non-zero: its pod "
            "restarts it); a restarted control plane is back within seconds."
        ),
    )
    rollout_tick_seconds: float = Field(
        default=2.0, gt=0, le=60, description="How often a rollout in progress looks at its pods, route and analysis."
    )
    rollout_ablate: str = Field(
        default="",
        description=(
            "For drills only: rollout safeguards to remove, comma-separated (" + ", ".join(SAFEGUARDS) + "), so "
            "that a drill shows what each prevents. Never set where anything serves: a candidate then goes on "
            "taking traffic where it would have been stopped."
        ),
    )
    runtime_memory_overhead: str = Field(
        default=format_bytes(CONTAINER_RUNTIME.baseline_bytes),
        description=(
            "Memory of the Triton process before any model is loaded, for the memory fit (a quantity). The "
            "default was not measured (no container engine where inferop is developed) and is generous; "
            "measure your image and set it, or set runtime.memoryOverhead per InferenceService."
        ),
    )

    @field_validator("rollout_ablate")
    @classmethod
    def _safeguards(cls, value: str) -> str:
        unknown = sorted(set(_names(value)) - set(SAFEGUARDS))
        if unknown:
            raise ValueError(
                f"INFEROP_ROLLOUT_ABLATE: no safeguard {', '.join(map(repr, unknown))}; one of {', '.join(SAFEGUARDS)}"
            )
        return value

    @field_validator("runtime_memory_overhead")
    @classmethod
    def _quantity(cls, value: str) -> str:
        if parse_quantity(value, "INFEROP_RUNTIME_MEMORY_OVERHEAD") < 0:
            raise ValueError(f"INFEROP_RUNTIME_MEMORY_OVERHEAD: {value!r} must not be negative")
        return value

    def ablated_safeguards(self) -> frozenset[str]:
        return frozenset(_names(self.rollout_ablate))

    def gateway(self) -> GatewayRef | None:
        """The default gateway as a spec would name it."""
        if not self.default_gateway:
            return None
        namespace, name, *section = self.default_gateway.split("/")
        return GatewayRef(name=name, namespace=namespace, section_name=section[0] if section else None)

    def runtime_costs(self) -> RuntimeCosts:
        """The container runtime's memory constants with this overhead as the baseline; unset, the baseline stays
        the stated assumption."""
        if "runtime_memory_overhead" not in self.model_fields_set:
            return CONTAINER_RUNTIME
        overhead = parse_quantity(self.runtime_memory_overhead, "INFEROP_RUNTIME_MEMORY_OVERHEAD")
        return replace(CONTAINER_RUNTIME, baseline_bytes=round(overhead), assumed=None)


def _names(listed: str) -> list[str]:
    return [name.strip() for name in listed.split(",") if name.strip()]


class SettingsError(InferopError, ValueError):
    """An INFEROP_* environment variable the operator cannot start with."""


def read_settings() -> OperatorSettings:
    """The settings from the environment as the operator starts, an invalid one named by its variable."""
    try:
        return OperatorSettings()
    except ValidationError as error:
        raise SettingsError(f"the operator's settings: {'; '.join(map(_problem, error.errors()))}") from None


def _problem(error: Any) -> str:
    variable = "INFEROP_" + "_".join(str(part) for part in error["loc"]).upper()
    message = str(error["msg"]).removeprefix("Value error, ")
    return message if message.startswith(variable) else f"{variable}: {message}"
