"""What a network declares about its callers' pre- and post-processing, and what a bad declaration says."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from inferop_core.processing import Processing


class TestProcessing:
    def test_a_model_without_a_declaration_takes_plain_tensors(self) -> None:
        assert Processing.from_parameter(None).kind == "tensors"
        assert Processing.from_parameter("").kind == "tensors"

    def test_round_trips_through_the_config_parameter(self) -> None:
        image = Processing(kind="imageClassification", resize_ratio=1.1, mean=[0.5, 0.5, 0.5], std=[0.2, 0.2, 0.2])
        assert image.to_parameter() == (
            '{"kind":"imageClassification","resizeRatio":1.1,"mean":[0.5,0.5,0.5],"std":[0.2,0.2,0.2]}'
        )
        assert Processing.from_parameter(image.to_parameter()) == image

    def test_an_image_classifier_needs_its_normalisation(self) -> None:
        with pytest.raises(ValidationError, match="kind imageClassification needs mean, std"):
            Processing(kind="imageClassification", resize_ratio=1.1)

    def test_image_settings_on_another_kind_are_refused(self) -> None:
        with pytest.raises(ValidationError, match="resizeRatio apply to kind imageClassification only, not tensors"):
            Processing(resize_ratio=1.1)

    @pytest.mark.parametrize("std", [[0.2, 0.0, 0.2], [0.2, -1.0, 0.2]])
    def test_a_deviation_must_be_positive(self, std: list[float]) -> None:
        with pytest.raises(ValidationError, match="every value must be above 0"):
            Processing(kind="imageClassification", resize_ratio=1.1, mean=[0.5, 0.5, 0.5], std=std)

    def test_an_unknown_kind_is_refused(self) -> None:
        with pytest.raises(ValidationError, match="kind"):
            Processing.from_parameter('{"kind":"audio"}')
