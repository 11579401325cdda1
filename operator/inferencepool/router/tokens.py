"""Prompt token counting: the model's real tokenizer when found, else an estimate calibrated on the engine.

The count decides the route, so it must agree with the engine's own count near the threshold. With a
tokenizer.json (HF `tokenizers`) the router counts exactly as the engine does for completions; chat requests
are counted on their rendered messages plus a per-message allowance for the template's role headers. Without
one, the router estimates from characters with a chars-per-token ratio that it calibrates against the engine's
/tokenize (sampled off the hot path, see server.py) so the estimate converges to the engine's tokenizer.
"""

from __future__ import annotations

import hashlib
import os
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from inferencepool.router.prompt import Prompt
from inferencepool.scheduling.prefix import prompt_keys

# Llama 3's template wraps each message in <|start_header_id|>role<|end_header_id|>\n\n ... <|eot_id|> and
# appends an assistant header: about 4 tokens per message and 4 for the generation prompt (the role word is in
# the text).
CHAT_TOKENS_PER_MESSAGE = 4
CHAT_TOKENS_FOR_REPLY = 4
# English prose under Llama-3/GPT-4-class BPE vocabularies averages about four characters per token.
DEFAULT_CHARS_PER_TOKEN = 4.0
# Affinity keys in estimate mode are cut at a fixed character length so that calibration never moves them.
AFFINITY_CHARS_PER_TOKEN = 4


class TokenCounter(Protocol):
    kind: str
    source: str

    def count(self, prompt: Prompt) -> int: ...

    def affinity_key(self, prompt: Prompt, key_tokens: int) -> int | None:
        """Hash of the first `key_tokens` tokens of the (first) prompt, or None when it is shorter than
        that."""
        ...

    def measure(self, prompt: Prompt, key_tokens: int | None) -> tuple[int, int | None]:
        """count() and, unless `key_tokens` is None, affinity_key(), from one tokenization of the prompt."""
        ...

    def measure_prefix(self, prompt: Prompt, block_tokens: int, max_blocks: int) -> tuple[int, list[int]]:
        """count() and the chained keys of the (first) prompt's whole blocks of `block_tokens` tokens (of
        characters at a fixed ratio when there is no tokenizer), from one tokenization (prefix.py)."""
        ...


def _hash(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def _ids_key(ids: tuple[int, ...] | list[int], key_tokens: int) -> int | None:
    if len(ids) < key_tokens:
        return None
    return _hash(b"".join(i.to_bytes(4, "little", signed=False) for i in ids[:key_tokens]))


def ids_keys(ids: Sequence[int], block_tokens: int, max_blocks: int) -> list[int]:
    """The chained keys of a prompt of token ids (4 bytes each), up to `max_blocks` whole blocks."""
    if len(ids) < block_tokens:
        return []
    return prompt_keys(array("I", ids[: block_tokens * max_blocks]).tobytes(), block_tokens * 4, max_blocks)


def _chat_allowance(prompt: Prompt) -> int:
    return (
        prompt.message_count * CHAT_TOKENS_PER_MESSAGE + CHAT_TOKENS_FOR_REPLY if prompt.message_count else 0
    )


@dataclass
class EstimateCounter:
    """chars / ratio, with the ratio learned from (characters, engine token count) samples."""

    chars_per_token: float = DEFAULT_CHARS_PER_TOKEN
    samples: int = 0
    # Weight of a new sample; early samples move the ratio fast, later ones slowly (running mean, capped
    # window).
    window: int = 50
    kind: str = "estimate"
    source: str = "calibrated"

    def count(self, prompt: Prompt) -> int:
        if prompt.token_ids:
            return max(len(ids) for ids in prompt.token_ids)
        longest = max(len(text) for text in prompt.texts)
        return max(1, round(longest / self.chars_per_token)) + _chat_allowance(prompt)

    def affinity_key(self, prompt: Prompt, key_tokens: int) -> int | None:
        if prompt.token_ids:
            return _ids_key(prompt.token_ids[0], key_tokens)
        key_chars = key_tokens * AFFINITY_CHARS_PER_TOKEN
        text = prompt.texts[0]
        if len(text) < key_chars:
            return None
        return _hash(text[:key_chars].encode())

    def measure(self, prompt: Prompt, key_tokens: int | None) -> tuple[int, int | None]:
        key = self.affinity_key(prompt, key_tokens) if key_tokens is not None else None
        return self.count(prompt), key

    def measure_prefix(self, prompt: Prompt, block_tokens: int, max_blocks: int) -> tuple[int, list[int]]:
        if prompt.token_ids:
            return self.count(prompt), ids_keys(prompt.token_ids[0], block_tokens, max_blocks)
        block_chars = block_tokens * AFFINITY_CHARS_PER_TOKEN
        text = prompt.texts[0]
        if len(text) < block_chars:
            return self.count(prompt), []
        data = text[: block_chars * max_blocks].encode()
        return self.count(prompt), prompt_keys(data, block_chars, max_blocks)

    def observe(self, characters: int, engine_tokens: int) -> None:
        """Fold one calibration sample (a text's length and the engine's token count for it) into the
        ratio."""
        if characters <= 0 or engine_tokens <= 0:
            return
        ratio = characters / engine_tokens
        self.samples += 1
        weight = 1.0 / min(self.samples, self.window)
        self.chars_per_token += (ratio - self.chars_per_token) * weight


@dataclass
class HFTokenCounter:
    """Exact counts with the model's own tokenizer.json (HF `tokenizers`, Rust)."""

    tokenizer: Any
    source: str
    kind: str = "hf-tokenizers"

    def count(self, prompt: Prompt) -> int:
        return self.measure(prompt, None)[0]

    def affinity_key(self, prompt: Prompt, key_tokens: int) -> int | None:
        if prompt.token_ids:
            return _ids_key(prompt.token_ids[0], key_tokens)
        ids = self.tokenizer.encode(prompt.texts[0], add_special_tokens=False).ids
        return _ids_key(ids, key_tokens)

    def measure(self, prompt: Prompt, key_tokens: int | None) -> tuple[int, int | None]:
        if prompt.token_ids:
            key = _ids_key(prompt.token_ids[0], key_tokens) if key_tokens is not None else None
            return max(len(ids) for ids in prompt.token_ids), key
        # One encode per prompt, BOS and friends included as the engine counts them; the affinity key is
        # taken from the same ids with the template's special tokens cut off (what encode without them gives).
        if len(prompt.texts) == 1:
            encodings = [self.tokenizer.encode(prompt.texts[0], add_special_tokens=True)]
        else:
            encodings = self.tokenizer.encode_batch(list(prompt.texts), add_special_tokens=True)
        tokens = max(len(e.ids) for e in encodings)
        key = _ids_key(_without_added_specials(encodings[0]), key_tokens) if key_tokens is not None else None
        return tokens + _chat_allowance(prompt), key

    def measure_prefix(self, prompt: Prompt, block_tokens: int, max_blocks: int) -> tuple[int, list[int]]:
        if prompt.token_ids:
            ids = prompt.token_ids[0]
            return max(len(ids) for ids in prompt.token_ids), ids_keys(ids, block_tokens, max_blocks)
        if len(prompt.texts) == 1:
            encodings = [self.tokenizer.encode(prompt.texts[0], add_special_tokens=True)]
        else:
            encodings = self.tokenizer.encode_batch(list(prompt.texts), add_special_tokens=True)
        tokens = max(len(e.ids) for e in encodings)
        keys = ids_keys(_without_added_specials(encodings[0]), block_tokens, max_blocks)
        return tokens + _chat_allowance(prompt), keys


def _without_added_specials(encoding: Any) -> list[int]:
    """The ids of an encoding less the special tokens its post-processor added around the text (marked in
    special_tokens_mask; special tokens written in the text itself are not marked)."""
    ids: list[int] = encoding.ids
    mask: list[int] = encoding.special_tokens_mask
    start, end = 0, len(ids)
    while start < end and mask[start]:
        start += 1
    while end > start and mask[end - 1]:
        end -= 1
    if 1 in mask[start:end]:  # a template with specials inside (pairs): drop each
        return [i for i, special in zip(ids, mask, strict=True) if not special]
    return ids[start:end]


def find_tokenizer_file(spec: str) -> Path | None:
    """Resolve a tokenizer spec: a tokenizer.json, a folder holding one, or a model id in the local HF hub
    cache."""
    path = Path(spec).expanduser()
    if path.is_file():
        return path
    if (path / "tokenizer.json").is_file():
        return path / "tokenizer.json"
    hub = Path(
        os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", "~/.cache/huggingface")) / "hub"
    )
    snapshots = hub.expanduser() / f"models--{spec.replace('/', '--')}" / "snapshots"
    if snapshots.is_dir():
        for snapshot in sorted(snapshots.iterdir(), reverse=True):
            if (snapshot / "tokenizer.json").is_file():
                return snapshot / "tokenizer.json"
    return None


def load_counter(spec: str | None) -> HFTokenCounter | EstimateCounter:
    """The exact counter when the spec resolves to a tokenizer.json, else the calibrated estimate.

    The router never downloads: in a cluster the tokenizer comes from the model cache volume (HF_HOME).
    """
    if spec:
        tokenizer_file = find_tokenizer_file(spec)
        if tokenizer_file is not None:
            from tokenizers import Tokenizer

            return HFTokenCounter(
                tokenizer=Tokenizer.from_file(str(tokenizer_file)), source=str(tokenizer_file)
            )
    return EstimateCounter()
