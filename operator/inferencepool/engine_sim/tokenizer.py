"""Token counting and deterministic output text for the fake engine.

Two tokenizers, chosen at start-up and reported in the log and in /version:
- `HFTokenizer`: the model's real tokenizer.json through HF `tokenizers`, when one is found at --tokenizer or
  in the model directory (exact counts, as vLLM's);
- `EstimateTokenizer` otherwise: words and punctuation, with words split every 4 characters (the usual "1
  token ~ 4 characters of English" rule of thumb for BPE vocabularies of Llama 3's size) and chat-template
  special tokens (<|eot_id|>) counted once, each piece mapped to an id by CRC32, so equal text gives equal
  ids in every process (prefix caching and the prefill/decode handshake rely on that).

Output tokens are deterministic: a function of the request's prompt and the token's position, so two runs of
the same request stream the same text.
"""

from __future__ import annotations

import re
import zlib
from pathlib import Path
from typing import Protocol

# special tokens such as <|eot_id|> are one token each, as in Llama 3's vocabulary
_PIECE = re.compile(r"<\|[a-z_]+\|>|\w+|[^\w\s]", re.UNICODE)
_CHARS_PER_TOKEN = 4
ESTIMATE_VOCAB = 128256  # Llama 3's vocabulary size, so ids look plausible

# Words streamed as output; any fixed list works, this one reads like text in demos.
_OUTPUT_WORDS = [
    "the",
    "engine",
    "streams",
    "tokens",
    "while",
    "the",
    "router",
    "balances",
    "prefill",
    "and",
    "decode",
    "across",
    "the",
    "pool",
    "and",
    "each",
    "pod",
    "keeps",
    "its",
    "cache",
    "warm",
    "so",
    "that",
    "shared",
    "prefixes",
    "are",
    "computed",
    "once",
    "and",
    "reused",
    "by",
    "later",
    "requests",
    "in",
    "the",
    "same",
    "conversation",
    "with",
    "steady",
    "latency",
    "under",
    "load",
]


class Tokenizer(Protocol):
    name: str

    def encode(self, text: str) -> list[int]: ...

    def output_piece(self, seed: int, index: int) -> str: ...


class EstimateTokenizer:
    name = "estimate"

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for match in _PIECE.finditer(text):
            piece = match.group()
            if piece.startswith("<|"):
                ids.append(zlib.crc32(piece.encode()) % ESTIMATE_VOCAB)
                continue
            for start in range(0, len(piece), _CHARS_PER_TOKEN):
                ids.append(zlib.crc32(piece[start : start + _CHARS_PER_TOKEN].encode()) % ESTIMATE_VOCAB)
        return ids

    def output_piece(self, seed: int, index: int) -> str:
        return " " + _OUTPUT_WORDS[(seed + index * 7) % len(_OUTPUT_WORDS)]


class HFTokenizer:
    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer as _HF

        self._tokenizer = _HF.from_file(str(path))
        self.name = f"hf:{path}"
        self._vocab = self._tokenizer.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self._tokenizer.encode(text, add_special_tokens=False).ids
        return ids

    def output_piece(self, seed: int, index: int) -> str:
        word = _OUTPUT_WORDS[(seed + index * 7) % len(_OUTPUT_WORDS)]
        ids = self._tokenizer.encode(" " + word, add_special_tokens=False).ids
        text: str = self._tokenizer.decode(ids[:1]) if ids else " "
        return text


def find_tokenizer_json(*candidates: str | None) -> Path | None:
    for candidate in candidates:
        if not candidate:
            continue
        path = Path(candidate)
        if path.is_file() and path.name.endswith(".json"):
            return path
        if path.is_dir() and (path / "tokenizer.json").is_file():
            return path / "tokenizer.json"
    return None


def load_tokenizer(*candidates: str | None) -> Tokenizer:
    path = find_tokenizer_json(*candidates)
    return HFTokenizer(path) if path is not None else EstimateTokenizer()


def prompt_seed(token_ids: list[int]) -> int:
    return zlib.crc32(",".join(map(str, token_ids[:64])).encode())


def render_chat(messages: list[dict[str, object]], add_generation_prompt: bool = True) -> str:
    """Llama 3's chat template, so chat prompts count the header tokens a real template adds."""
    parts = ["<|begin_of_text|>"]
    for message in messages:
        role = str(message.get("role", "user"))
        parts.append(
            f"<|start_header_id|>{role}<|end_header_id|>\n\n{_content_text(message.get('content'))}<|eot_id|>"
        )
    if add_generation_prompt:
        parts.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
    return "".join(parts)


def _content_text(content: object) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: keep the text ones
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    raise ValueError("message content must be a string or a list of content parts")
