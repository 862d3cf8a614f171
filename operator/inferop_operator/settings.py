"""Operator settings, from environment variables prefixed INFEROP_."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class OperatorSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="INFEROP_")

    triton_image: str = Field(
        default="nvcr.io/nvidia/tritonserver:25.01-py3",
        description="Triton image when spec.runtime.image is unset; its ONNX Runtime must read ONNX IR 10 (>= 1.18).",
    )
    resync_seconds: float = Field(
        default=60.0, gt=0, description="How often each service is re-applied, so manual drift of children is reverted."
    )
    log_format: Literal["plain", "json"] = Field(default="plain", description="json in-cluster, plain on a terminal.")
    field_manager: str = Field(default="inferop", description="Server-side apply field manager of every child.")
