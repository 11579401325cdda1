"""Prompt reading, token counting (real HF tokenizer and calibrated estimate) and prefix keys."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from inferencepool.router.prompt import BadRequest, read_prompt
from inferencepool.router.tokens import (
    CHAT_TOKENS_FOR_REPLY,
    CHAT_TOKENS_PER_MESSAGE,
    EstimateCounter,
    HFTokenCounter,
    find_tokenizer_file,
    load_counter,
)

CORPUS = ["the quick brown fox jumps over the lazy dog", "prefill and decode pools share a router"] * 50


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real tokenizer.json, trained here (BPE) since no model files may be downloaded."""
    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=200, special_tokens=["[UNK]"]))
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tokenizer.save(str(path))
    return path


def test_read_prompt_accepts_the_openai_shapes() -> None:
    assert read_prompt({"model": "m", "prompt": "hi"}, "completions", "m").texts == ("hi",)
    assert read_prompt({"model": "m", "prompt": [1, 2, 3]}, "completions", None).token_ids == ((1, 2, 3),)
    assert read_prompt({"model": "m", "prompt": ["a", "b"]}, "completions", None).texts == ("a", "b")
    chat = read_prompt(
        {
            "model": "m",
            "stream": True,
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "image_url"}]},
            ],
        },
        "chat",
        "m",
    )
    assert chat.stream and chat.message_count == 2
    assert chat.texts == ("system\n\nbe brief\n\nuser\n\nhello",)


@pytest.mark.parametrize(
    ("body", "endpoint", "status", "needle"),
    [
        ([], "completions", 400, "JSON object"),
        ({"prompt": "x"}, "completions", 400, "`model` is required"),
        ({"model": "other", "prompt": "x"}, "completions", 404, "does not exist"),
        ({"model": "m"}, "completions", 400, "`prompt` is required"),
        ({"model": "m", "prompt": [1, "a"]}, "completions", 400, "`prompt` is required"),
        ({"model": "m", "messages": []}, "chat", 400, "`messages` is required"),
        ({"model": "m", "messages": [{"content": "x"}]}, "chat", 400, "messages[0].role"),
        ({"model": "m", "messages": [{"role": "user", "content": 5}]}, "chat", 400, "messages[0].content"),
        ({"model": "m", "prompt": "x", "stream": "yes"}, "completions", 400, "`stream`"),
    ],
)
def test_bad_requests_name_the_problem(body: object, endpoint: str, status: int, needle: str) -> None:
    with pytest.raises(BadRequest) as caught:
        read_prompt(body, endpoint, "m")  # type: ignore[arg-type]
    assert caught.value.status == status and needle in str(caught.value)


def test_hf_counter_counts_with_the_real_tokenizer(tokenizer_file: Path) -> None:
    counter = load_counter(str(tokenizer_file))
    assert isinstance(counter, HFTokenCounter) and counter.kind == "hf-tokenizers"
    reference = Tokenizer.from_file(str(tokenizer_file))
    text = "the quick brown fox jumps over the lazy dog " * 3
    prompt = read_prompt({"model": "m", "prompt": text}, "completions", None)
    assert counter.count(prompt) == len(reference.encode(text).ids)
    batch = read_prompt({"model": "m", "prompt": ["the fox", text]}, "completions", None)
    assert counter.count(batch) == len(reference.encode(text).ids)  # the longest prompt decides
    chat = read_prompt({"model": "m", "messages": [{"role": "user", "content": text}]}, "chat", None)
    rendered = len(reference.encode(chat.texts[0]).ids)
    assert counter.count(chat) == rendered + CHAT_TOKENS_PER_MESSAGE + CHAT_TOKENS_FOR_REPLY


def test_tokenizer_is_found_in_a_folder_or_the_hf_cache(
    tokenizer_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert find_tokenizer_file(str(tokenizer_file.parent)) == tokenizer_file
    snapshot = tmp_path / "hub" / "models--org--tiny" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "tokenizer.json").write_bytes(tokenizer_file.read_bytes())
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert find_tokenizer_file("org/tiny") == snapshot / "tokenizer.json"
    assert isinstance(load_counter("org/missing"), EstimateCounter)
    assert isinstance(load_counter(None), EstimateCounter)


def test_estimate_calibrates_toward_the_engine_count() -> None:
    counter = EstimateCounter()
    prompt = read_prompt({"model": "m", "prompt": "x" * 3000}, "completions", None)
    assert counter.count(prompt) == 750  # 4 chars per token before calibration
    for _ in range(10):
        counter.observe(characters=3000, engine_tokens=1000)  # the engine says 3 chars per token
    assert counter.count(prompt) == 1000
    counter.observe(characters=0, engine_tokens=5)  # useless samples are ignored
    assert counter.samples == 10


def test_affinity_keys_match_on_shared_prefix_only(tokenizer_file: Path) -> None:
    shared = "the quick brown fox jumps over the lazy dog " * 20
    for counter in (load_counter(str(tokenizer_file)), EstimateCounter()):
        first = read_prompt({"model": "m", "prompt": shared + "first question"}, "completions", None)
        second = read_prompt({"model": "m", "prompt": shared + "another one"}, "completions", None)
        other = read_prompt({"model": "m", "prompt": "prefill " + shared}, "completions", None)
        short = read_prompt({"model": "m", "prompt": "tiny"}, "completions", None)
        key = counter.affinity_key(first, 16)
        assert key is not None and key == counter.affinity_key(second, 16)
        assert counter.affinity_key(other, 16) != key
        assert counter.affinity_key(short, 16) is None  # shorter than one block: nothing to keep local
    ids = read_prompt({"model": "m", "prompt": list(range(40))}, "completions", None)
    assert EstimateCounter().affinity_key(ids, 16) == EstimateCounter().affinity_key(
        read_prompt({"model": "m", "prompt": [*range(16), 99]}, "completions", None), 16
    )
