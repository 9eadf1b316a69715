"""What one image costs in prompt tokens, and how many pixels of it the engine takes.

GLM-4.1V (AutoGLM-Phone-9B's architecture) cuts an image into 14x14-pixel patches, two frames
deep (a still image is doubled), and merges 2x2 patches into one token: one prompt token per
28x28 pixels. Its processor first scales the image, keeping the aspect ratio, to sides that
are multiples of 28 with frames x height x width at most `max_pixels` (vLLM's
`--mm-processor-kwargs '{"max_pixels": N}'`). `image_tokens` is that arithmetic (transformers'
Glm4vImageProcessor `smart_resize`, vLLM's `_get_vision_info`), for code that must price an
image without the model's processor: the router, the operator's defaults.
"""

from __future__ import annotations

import math

PATCH_PIXELS = 14
MERGE = 2  # 2x2 patches per token
FRAMES = 2  # a still image is two frames deep (temporal_patch_size)
FACTOR = PATCH_PIXELS * MERGE  # sides are multiples of 28
# max_pixels counts both frames: one token per 1568 of it.
PIXELS_PER_TOKEN = FRAMES * FACTOR * FACTOR
MIN_PIXELS = 112 * 112  # the processor's own floor (size.shortest_edge)
MAX_PIXELS_CEILING = 28 * 28 * 15000  # the processor's own default (size.longest_edge)
IMAGE_DELIMITER_TOKENS = 2  # <|begin_of_image|>, <|end_of_image|> around an image's tokens
MAX_ASPECT_RATIO = 200  # the processor refuses a longer side over 200 times the shorter
# The model's official serve command (`--mm-processor-kwargs '{"max_pixels":5000000}'`).
OFFICIAL_MAX_PIXELS = 5_000_000
# The prompt text one agent step carries besides its screenshot: the phone agent's English
# system prompt (about 2.6 KB: ~650 tokens at ~4 bytes per token), the step's `** Screen Info **`
# text, the chat template and the image's delimiters. An estimate from the prompt's size: the
# model's own tokenizer cannot be fetched here, and the tiny test model's is not the real one.
AGENT_TEXT_TOKENS = 766
AGENT_SYSTEM_TOKENS = 650  # of which the system prompt, the same for every task


class RefusedImage(ValueError):
    """The processor refuses an image of this shape, so the engine answers 400."""


def scaled_size(width: int, height: int, max_pixels: int) -> tuple[int, int]:
    """The (width, height) the processor scales an image to; RefusedImage when it refuses the
    image's aspect ratio."""
    if width < FACTOR or height < FACTOR:
        scale = max(FACTOR / height, FACTOR / width)
        width, height = int(width * scale), int(height * scale)
    if max(width, height) / min(width, height) > MAX_ASPECT_RATIO:
        raise RefusedImage(f"absolute aspect ratio must be smaller than {MAX_ASPECT_RATIO}, "
                           f"got {max(width, height) / min(width, height)}")
    h_bar = round(height / FACTOR) * FACTOR
    w_bar = round(width / FACTOR) * FACTOR
    if FRAMES * h_bar * w_bar > max_pixels:
        beta = math.sqrt(FRAMES * height * width / max_pixels)
        h_bar = max(FACTOR, math.floor(height / beta / FACTOR) * FACTOR)
        w_bar = max(FACTOR, math.floor(width / beta / FACTOR) * FACTOR)
    elif FRAMES * h_bar * w_bar < MIN_PIXELS:
        beta = math.sqrt(MIN_PIXELS / (FRAMES * height * width))
        h_bar = math.ceil(height * beta / FACTOR) * FACTOR
        w_bar = math.ceil(width * beta / FACTOR) * FACTOR
    return w_bar, h_bar


def image_tokens(width: int, height: int, max_pixels: int) -> int:
    """Prompt tokens of one image of width x height pixels (its delimiters not counted);
    RefusedImage when the processor refuses it."""
    w_bar, h_bar = scaled_size(width, height, max_pixels)
    return (w_bar // FACTOR) * (h_bar // FACTOR)


def max_pixels_for(max_model_len: int, completion_tokens: int) -> int:
    """The default pixel budget: one screenshot, the agent's text (AGENT_TEXT_TOKENS) and a
    completion of `completion_tokens` fit in `max_model_len`; never above the official
    setting, never below the processor's floor."""
    image_budget = max_model_len - completion_tokens - AGENT_TEXT_TOKENS
    pixels = image_budget * PIXELS_PER_TOKEN
    return max(MIN_PIXELS, min(OFFICIAL_MAX_PIXELS, pixels))


def tokens_per_max_pixels(max_pixels: int) -> int:
    """The most tokens an image scaled to `max_pixels` can cost."""
    return max_pixels // PIXELS_PER_TOKEN
