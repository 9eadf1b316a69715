"""A stand-in tokenizer and a deterministic text generator for the sim.

Counting: every run of up to 8 non-space characters is one token, every message adds 4 template
tokens. An image costs what GLM-4.1V's processor makes of it: its two delimiters and one token
per 28x28 pixels once scaled to the pixel budget (`image_budget.image_tokens`, from the size in
its data: URL's head); one whose size the sim cannot read (a remote URL, which it never fetches,
or bytes that are neither PNG nor JPEG) counts `IMAGE_TOKENS`. Good enough to exercise context
limits; not a real tokenizer.
Token ids, for prefix caching, are hashes of those pieces: a message's template tokens hash its
role, an image's placeholder tokens hash its URL (data URLs: the data), so identical prompt
prefixes give identical ids and a different screenshot gives different ones.
Generation is seeded by the prompt so the same request gets the same answer.
"""

from __future__ import annotations

import hashlib
import random
import re

from autoglm_api.image_budget import image_tokens
from autoglm_api.image_size import data_url_size
from testkit.sim.model import IMAGE_TOKENS

MAX_CHARS_PER_TOKEN = 8
_TOKEN = re.compile(rf"\S{{1,{MAX_CHARS_PER_TOKEN}}}")
MESSAGE_OVERHEAD_TOKENS = 4

_WORDS_TEXT = (
    "tap swipe screen button open app settings search back home scroll type confirm the a "
    "to on in of and with next page item list menu icon text field result wait done check"
)
_THOUGHTS_TEXT = (
    "the user wants to find the right screen first so I should look at the current state "
    "then choose the element that matches and act on it carefully"
)
_WORDS = _WORDS_TEXT.split()
_THOUGHTS = _THOUGHTS_TEXT.split()


def count_text_tokens(text: str) -> int:
    return len(_TOKEN.findall(text))


def _piece_id(piece: str) -> int:
    digest = hashlib.blake2b(piece.encode("utf-8", "surrogatepass"), digest_size=4).digest()
    return int.from_bytes(digest, "little")


def text_token_ids(text: str) -> list[int]:
    return [_piece_id(piece) for piece in _TOKEN.findall(text)]


def message_token_ids(role: str) -> list[int]:
    """The chat template's tokens around one message."""
    return [_piece_id(f"<|{role}|>{index}") for index in range(MESSAGE_OVERHEAD_TOKENS)]


def image_prompt_tokens(url: str, max_pixels: int) -> int:
    """The prompt tokens of one image at the pixel budget `max_pixels`, its delimiters not
    counted (RefusedImage: the processor refuses its shape)."""
    size = data_url_size(url)
    return IMAGE_TOKENS if size is None else image_tokens(*size, max_pixels)


def image_token_ids(url: str, count: int = IMAGE_TOKENS) -> list[int]:
    """The image's delimiters around its `count` placeholder tokens; the same image gives the
    same ids (vLLM's mm hash)."""
    base = _piece_id("image:" + url) << 16
    begin, end = _piece_id("<|begin_of_image|>"), _piece_id("<|end_of_image|>")
    return [begin, *(base + index for index in range(count)), end]


def natural_length(seed: str, low: int = 24, high: int = 200) -> int:
    """How long the 'model' would answer before its end-of-sequence token."""
    return low + _rng(seed).randrange(high - low + 1)


def _rng(seed: str) -> random.Random:
    # JSON may carry lone surrogates ("\ud800"): plain UTF-8 cannot encode them, and the seed
    # only has to be stable.
    return random.Random(hashlib.sha256(seed.encode("utf-8", "surrogatepass")).digest())


def generate(seed: str, count: int, reasoning: int) -> list[tuple[str, str]]:
    """`count` tokens as (kind, text); the first `reasoning` are 'reasoning', then 'content'."""
    rng = _rng(seed)
    out: list[tuple[str, str]] = []
    for index in range(count):
        if index < reasoning:
            out.append(("reasoning", _THOUGHTS[index % len(_THOUGHTS)] + " "))
        else:
            word = rng.choice(_WORDS)
            out.append(("content", word if index == count - 1 else word + " "))
    return out


__all__ = [
    "IMAGE_TOKENS",
    "MAX_CHARS_PER_TOKEN",
    "MESSAGE_OVERHEAD_TOKENS",
    "count_text_tokens",
    "generate",
    "image_prompt_tokens",
    "image_token_ids",
    "message_token_ids",
    "natural_length",
    "text_token_ids",
]
