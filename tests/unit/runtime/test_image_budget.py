"""The image arithmetic the router and the operator's defaults use, against the numbers the
real processor gives (tests/engine checks them on a real engine)."""

from __future__ import annotations

import pytest

from autoglm_api.image_budget import (
    MAX_PIXELS_CEILING,
    MIN_PIXELS,
    OFFICIAL_MAX_PIXELS,
    RefusedImage,
    image_tokens,
    max_pixels_for,
    scaled_size,
    tokens_per_max_pixels,
)


@pytest.mark.parametrize(("size", "max_pixels", "scaled"), [
    # transformers' Glm4vImageProcessor smart_resize, run on these inputs
    ((1080, 2400), MAX_PIXELS_CEILING, (1092, 2408)),
    ((1080, 2400), 1_207_360, (504, 1148)),
    ((1080, 2400), OFFICIAL_MAX_PIXELS, (1036, 2352)),
    ((540, 1200), OFFICIAL_MAX_PIXELS, (532, 1204)),
    ((720, 1600), OFFICIAL_MAX_PIXELS, (728, 1596)),
    ((20, 3000), 1_207_360, (28, 4200)),  # too narrow: widened first
    ((50, 50), 1_207_360, (84, 84)),  # too small: raised to the floor
    ((28, 5600), OFFICIAL_MAX_PIXELS, (28, 5600)),  # the longest shape it takes
    ((1, 200), OFFICIAL_MAX_PIXELS, (28, 5600)),
])  # fmt: skip
def test_images_scale_as_the_models_processor_scales_them(
    size: tuple[int, int], max_pixels: int, scaled: tuple[int, int]
) -> None:
    assert scaled_size(*size, max_pixels) == scaled


@pytest.mark.parametrize("size", [(28, 5601), (5601, 28), (1, 201), (10, 1_000_000)])
def test_shapes_the_processor_refuses_are_refused(size: tuple[int, int]) -> None:
    # smart_resize: "absolute aspect ratio must be smaller than 200", after widening a thin side
    with pytest.raises(RefusedImage):
        scaled_size(*size, OFFICIAL_MAX_PIXELS)


def test_a_native_phone_screenshot_costs_what_the_engine_counts() -> None:
    assert image_tokens(1080, 2400, MAX_PIXELS_CEILING) == 39 * 86  # 3354: over 2048 alone


def test_the_default_budget_fits_one_screenshot_the_agents_text_and_the_completion() -> None:
    at_2048 = max_pixels_for(2048, 512)
    assert at_2048 == 1_207_360  # about 0.6 Mpx of image: 770 tokens at most
    assert tokens_per_max_pixels(at_2048) == 770
    assert image_tokens(1080, 2400, at_2048) <= 770
    # The official long-context setting gets the official budget, and never more.
    assert max_pixels_for(25_480, 512) == OFFICIAL_MAX_PIXELS
    assert max_pixels_for(65_536, 512) == OFFICIAL_MAX_PIXELS
    # Too short a context for any screenshot: the processor's floor, not a negative budget.
    assert max_pixels_for(128, 512) == MIN_PIXELS
