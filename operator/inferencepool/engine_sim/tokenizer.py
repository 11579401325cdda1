"""Token counting and deterministic output text for the fake engine.

Two tokenizers, chosen at start-up and reported in the log and in /version:
- `HFTokenizer`: the model's real tokenizer.json through HF `tokenizers`, when one is found at --tokenizer or
  in the model directory (exact counts, as vLLM's);
- `EstimateTokenizer` otherwise: words and punctuation, with words split every 4 characters (the usual "1
  token ~ 4 characters of English" rule of thumb for BPE vocabularies of Llama 3's size) and chat-template
  special tokens (<|eot_id|>) counted once, each piece mapped to an id by CRC32, so equal text gives equal
  ids in every process (prefix caching and the prefill/decode handshake rely on that).

Output tokens are deterministic: a function of the request's prompt and the token's position, so two runs of
the same request stream the same text. A prompt that ends with the start of the model's own answer to what
precedes it (a continued answer: a chat's open final assistant message, a completion prompt carrying its
partial answer) is answered with the rest of that answer, as a real model continues a text (see
`continued_answer`).
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

# Words streamed as output, one token each (at most 4 characters, so the estimate counts a streamed answer
# as the tokens it streamed, as a real tokenizer does); any fixed list works, this one reads like text.
_OUTPUT_WORDS = [
    "the",
    "pool",
    "runs",
    "each",
    "turn",
    "on",
    "one",
    "of",
    "its",
    "pods",
    "and",
    "the",
    "kv",
    "of",
    "a",
    "long",
    "chat",
    "is",
    "kept",
    "warm",
    "so",
    "that",
    "the",
    "next",
    "turn",
    "can",
    "skip",
    "most",
    "of",
    "its",
    "work",
    "and",
    "the",
    "user",
    "gets",
    "the",
    "next",
    "word",
    "fast",
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


_PIECE_IDS: dict[tuple[str, str], tuple[int, ...]] = {}
_OUTPUT_IDS: dict[str, frozenset[int]] = {}


def _piece_ids(tokenizer: Tokenizer, piece: str) -> tuple[int, ...]:
    key = (tokenizer.name, piece)
    ids = _PIECE_IDS.get(key)
    if ids is None:
        ids = _PIECE_IDS[key] = tuple(tokenizer.encode(piece))
    return ids


def _output_ids(tokenizer: Tokenizer) -> frozenset[int]:
    """Every id an output piece starts with (a prompt ending in none of them continues no answer)."""
    ids = _OUTPUT_IDS.get(tokenizer.name)
    if ids is None:
        pieces = (
            _piece_ids(tokenizer, tokenizer.output_piece(seed, 0)) for seed in range(len(_OUTPUT_WORDS))
        )
        ids = _OUTPUT_IDS[tokenizer.name] = frozenset(piece[0] for piece in pieces if piece)
    return ids


def continued_answer(tokenizer: Tokenizer, ids: list[int]) -> tuple[int, int]:
    """(seed, pieces) of the answer `ids` asks for: when they end with the first `pieces` output pieces of
    the answer to the ids before them, that answer's seed and how far it got (the answer goes on from
    there); else the prompt's own seed and 0. The longest such continuation wins."""
    output = _output_ids(tokenizer)
    tail = 0
    while tail < len(ids) - 1 and ids[-1 - tail] in output:
        tail += 1
    for start in range(len(ids) - tail, len(ids)):
        seed = prompt_seed(ids[:start])
        at, pieces = start, 0
        while at < len(ids):
            piece = _piece_ids(tokenizer, tokenizer.output_piece(seed, pieces))
            if not piece or tuple(ids[at : at + len(piece)]) != piece:
                break
            at += len(piece)
            pieces += 1
        if at == len(ids):
            return seed, pieces
    return prompt_seed(ids), 0


def render_chat(
    messages: list[dict[str, object]],
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
) -> str:
    """Llama 3's chat template, so chat prompts count the header tokens a real template adds. With
    `continue_final_message` the last message stays open (no end-of-turn token), so the model continues it."""
    parts = ["<|begin_of_text|>"]
    for i, message in enumerate(messages):
        role = str(message.get("role", "user"))
        end = "" if continue_final_message and i == len(messages) - 1 else "<|eot_id|>"
        parts.append(
            f"<|start_header_id|>{role}<|end_header_id|>\n\n{_content_text(message.get('content'))}{end}"
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
