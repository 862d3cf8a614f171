"""How a caller turns files into a model's inputs and its outputs into an answer: declared by the network
when it is exported, served with its config, read back by `inferop infer`.

The declaration travels in the model's config (parameter `inferop_processing`), so a client needs nothing
but the endpoint: it never guesses from a model's name. A model without one (any model a user brings) is
called with plain tensors.
"""

from __future__ import annotations

from typing import Literal

from pydantic import AliasGenerator, BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

PROCESSING_PARAMETER = "inferop_processing"

ProcessingKind = Literal["tensors", "imageClassification", "policyValue"]


class Processing(BaseModel):
    """What a caller sends and how it reads the answer.

    tensors: each input from an .npy file or generated (seeded), each output shown with its shape and values.
    imageClassification: image files resized (short side to `resizeRatio` x the input size), centre-cropped,
    normalised with `mean` and `std` (CHW); the answer is the top labels. policyValue: a board (a text or .npy
    file, or random) in; the move distribution of output `policy` and the value of output `value` out.
    """

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        populate_by_name=True,
        alias_generator=AliasGenerator(validation_alias=to_camel, serialization_alias=to_camel),
        # _image_settings again as CEL for the operator's CRD (see inferop_operator.spec.admission_rules): the
        # apiserver refuses with the same words. `kind` is defaulted before the rules run; has() keeps them exact.
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "(has(self.kind) && self.kind == 'imageClassification') || "
                    "!(has(self.resizeRatio) || has(self.mean) || has(self.std))",
                    "messageExpression": "'%s%s%s apply to kind imageClassification only, not %s'.format(["
                    "has(self.resizeRatio) ? 'resizeRatio' : '', "
                    "has(self.mean) ? (has(self.resizeRatio) ? ', mean' : 'mean') : '', "
                    "has(self.std) ? (has(self.resizeRatio) || has(self.mean) ? ', std' : 'std') : '', "
                    "has(self.kind) ? self.kind : 'tensors'])",
                },
                {
                    "rule": "!has(self.kind) || self.kind != 'imageClassification' || "
                    "(has(self.resizeRatio) && has(self.mean) && has(self.std))",
                    "messageExpression": "'kind imageClassification needs %s%s%s'.format(["
                    "has(self.resizeRatio) ? '' : 'resizeRatio', "
                    "has(self.mean) ? '' : (has(self.resizeRatio) ? 'mean' : ', mean'), "
                    "has(self.std) ? '' : (has(self.resizeRatio) && has(self.mean) ? 'std' : ', std')])",
                },
            ]
        },
    )

    kind: ProcessingKind = Field(default="tensors", description="How inputs are made and outputs read.")
    resize_ratio: float | None = Field(
        default=None, gt=0, le=4, description="imageClassification: short side resized to this x the input size."
    )
    mean: list[float] | None = Field(
        default=None, min_length=3, max_length=3, description="imageClassification: per-channel mean (RGB)."
    )
    std: list[float] | None = Field(
        default=None, min_length=3, max_length=3, description="imageClassification: per-channel deviation (RGB)."
    )

    @model_validator(mode="after")
    def _image_settings(self) -> Processing:
        image_fields = {"resizeRatio": self.resize_ratio, "mean": self.mean, "std": self.std}
        if self.kind == "imageClassification":
            missing = [name for name, value in image_fields.items() if value is None]
            if missing:
                raise ValueError(f"kind imageClassification needs {', '.join(missing)}")
            if any(value <= 0 for value in self.std or []):
                raise ValueError(f"std {self.std}: every value must be above 0")
        elif any(value is not None for value in image_fields.values()):
            set_here = [name for name, value in image_fields.items() if value is not None]
            raise ValueError(f"{', '.join(set_here)} apply to kind imageClassification only, not {self.kind}")
        return self

    def to_parameter(self) -> str:
        """The JSON written into the served config."""
        return self.model_dump_json(by_alias=True, exclude_none=True)

    @classmethod
    def from_parameter(cls, text: str | None) -> Processing:
        """The declaration read from a served config; plain tensors when the config has none."""
        return cls() if not text else cls.model_validate_json(text)
