"""The router's parts on their own: the one in-flight counter, the single tokenization, the LMCache PD leg
bodies, the relay's error-event test."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

from inferencepool.router import handshake, resume
from inferencepool.router.config import LMCachePDConfig
from inferencepool.router.pods import Pod, in_flight
from inferencepool.router.prompt import read_prompt
from inferencepool.router.relay import is_error_event
from inferencepool.router.tokens import HFTokenCounter
from inferencepool.router.transfer import ClientRequest, _unsplittable


async def test_in_flight_counts_a_leg_however_it_ends() -> None:
    pod = Pod("decode-0", "http://127.0.0.1:1", "decode")
    with in_flight(pod):
        assert pod.outstanding == 1
        with in_flight(pod):
            assert pod.outstanding == 2
    assert pod.outstanding == 0
    with pytest.raises(RuntimeError), in_flight(pod):
        raise RuntimeError("the engine failed")
    assert pod.outstanding == 0
    # A leg handed on: the count stays up past the block until it is released (once).
    with in_flight(pod) as hold:
        kept = hold.keep()
    assert pod.outstanding == 1
    kept.release()
    kept.release()
    assert pod.outstanding == 0

    async def held() -> None:
        with in_flight(pod):
            await asyncio.sleep(60)

    task = asyncio.create_task(held())
    await asyncio.sleep(0)
    assert pod.outstanding == 1
    task.cancel()  # a client that went away
    with pytest.raises(asyncio.CancelledError):
        await task
    assert pod.outstanding == 0


class CountingTokenizer:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.calls = 0

    def encode(self, text: str, add_special_tokens: bool = True) -> Any:
        self.calls += 1
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def encode_batch(self, texts: list[str], add_special_tokens: bool = True) -> Any:
        self.calls += 1
        return self.tokenizer.encode_batch(texts, add_special_tokens=add_special_tokens)


@pytest.fixture(scope="module")
def bos_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trained BPE tokenizer whose template adds BOS and EOS, as Llama-style tokenizer.json files do."""
    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()  # type: ignore[assignment]
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["[UNK]", "<s>", "</s>"])  # type: ignore[call-arg]
    tokenizer.train_from_iterator(["the pool keeps shared prefixes warm for every request"] * 20, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(  # type: ignore[assignment]
        single="<s> $A </s>", special_tokens=[("<s>", 1), ("</s>", 2)]
    )
    path = tmp_path_factory.mktemp("bos") / "tokenizer.json"
    tokenizer.save(str(path))
    return path


def test_a_prompt_is_tokenized_once_for_its_count_and_its_affinity_key(bos_tokenizer: Path) -> None:
    counting = CountingTokenizer(Tokenizer.from_file(str(bos_tokenizer)))
    counter = HFTokenCounter(counting, str(bos_tokenizer))
    assert counting.calls == 0  # nothing at start-up
    text = "the pool keeps shared prefixes warm for every request " * 8
    for body, endpoint in (
        ({"model": "m", "prompt": text}, "completions"),
        ({"model": "m", "messages": [{"role": "user", "content": text}]}, "chat"),
        ({"model": "m", "prompt": [text, text + " more"]}, "completions"),
    ):
        prompt = read_prompt(body, endpoint, None)  # type: ignore[arg-type]
        before = counting.calls
        tokens, key = counter.measure(prompt, 16)
        assert counting.calls == before + 1
        # The same as counting and hashing separately (two tokenizations).
        assert (tokens, key) == (counter.count(prompt), counter.affinity_key(prompt, 16))
        assert key is not None
    short = read_prompt({"model": "m", "prompt": "the pool"}, "completions", None)
    assert counter.measure(short, 16) == (counter.count(short), None)
    assert counter.measure(short, None)[1] is None


PORTS = LMCachePDConfig.model_validate(
    {"receiverInitPorts": [7001, 7002], "receiverAllocPorts": [7101, 7102]}
)


def test_lmcache_pd_prefill_leg_is_the_prompt_ids_less_the_last() -> None:
    body = {"model": "m", "prompt": "hi", "max_tokens": 50, "temperature": 0.3, "priority": 2, "stream": True}
    leg = handshake.lmcache_prefill_ids_body(body, [5, 6, 7, 8], "req-1", "10.0.0.7", PORTS)
    assert leg["prompt"] == [5, 6, 7]
    assert (leg["max_tokens"], leg["stream"], leg["priority"]) == (1, False, 2)
    spec = leg["kv_transfer_params"]["disagg_spec"]
    assert spec["req_id"] == "req-1" and spec["receiver_host"] == "10.0.0.7"
    assert spec["receiver_init_port"] == list(PORTS.receiver_init_ports)
    assert spec["receiver_alloc_port"] == list(PORTS.receiver_alloc_ports)
    assert "ret_first_tok" not in leg["kv_transfer_params"]


def test_tokenize_query_renders_chat_as_the_chat_endpoint_does() -> None:
    messages = [{"role": "user", "content": "hi"}]
    chat = {
        "model": "m",
        "messages": messages,
        "chat_template_kwargs": {"enable_thinking": False},
        "add_generation_prompt": False,
        "continue_final_message": True,
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "temperature": 0.5,
        "max_tokens": 9,
    }
    query = handshake.tokenize_body(chat, chat=True)
    assert query == {key: chat[key] for key in chat if key not in ("temperature", "max_tokens")}
    completion = {"model": "m", "prompt": "hello", "add_special_tokens": False, "max_tokens": 3}
    assert handshake.tokenize_body(completion, chat=False) == {
        "model": "m",
        "prompt": "hello",
        "add_special_tokens": False,
    }


def _client_request(body: dict[str, Any], endpoint: str) -> ClientRequest:
    prompt = read_prompt(body, endpoint, None)  # type: ignore[arg-type]
    return ClientRequest("/v1/x", endpoint, b"", body, [], None, prompt)  # type: ignore[arg-type]


def test_requests_lmcache_pd_cannot_split_exactly_are_named() -> None:
    assert _unsplittable(_client_request({"model": "m", "prompt": "one"}, "completions")) is None
    assert _unsplittable(_client_request({"model": "m", "prompt": ["a", "b"]}, "completions")) is not None
    truncated = {"model": "m", "prompt": "one", "truncate_prompt_tokens": 4}
    assert _unsplittable(_client_request(truncated, "completions")) == "truncate_prompt_tokens"
    image = {"type": "image_url", "image_url": {"url": "data:,"}}
    multimodal = {
        "model": "m",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}, image]}],
    }
    assert _unsplittable(_client_request(multimodal, "chat")) == "multimodal content"
    text_parts = {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]}
    assert _unsplittable(_client_request(text_parts, "chat")) is None


def test_an_error_event_is_told_from_a_token() -> None:
    assert is_error_event(b'data: {"error": {"message": "KV transfer failed", "code": 500}}\n\n')
    assert is_error_event(b'data:{"error":{}}\n\ndata: [DONE]\n\n')
    assert not is_error_event(b'data: {"id":"cmpl-1","choices":[{"text":"error"}]}\n\n')
    assert not is_error_event(b": keep-alive\n\n")


def test_a_broken_stream_is_continued_from_the_text_already_sent() -> None:
    completion_events = (
        b'data: {"id":"c","choices":[{"index":0,"text":"The pool","finish_reason":null}]}\n\n'
        b'data: {"id":"c","choices":[{"index":0,"text":" keeps","finish_reason":null}]}\n\n'
    )
    done = resume.progress(completion_events, "completions")
    assert done == resume.Progress("The pool keeps", 2, False)
    body = {"model": "m", "prompt": "Say: ", "max_tokens": 10, "stream": True, "temperature": 0}
    continued = orjson.loads(resume.continuation(body, "completions", done) or b"null")
    assert continued == {**body, "prompt": "Say: The pool keeps", "max_tokens": 8}

    chat_events = (
        b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
        b'data: {"choices":[{"index":0,"delta":{"content":"Hello"}}]}\n\n'
    )
    said = resume.progress(chat_events, "chat")
    assert said == resume.Progress("Hello", 1, False)
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 5}
    continued = orjson.loads(resume.continuation(chat, "chat", said) or b"null")
    assert continued["messages"][-1] == {"role": "assistant", "content": "Hello"}
    assert continued["continue_final_message"] is True and continued["add_generation_prompt"] is False
    assert continued["max_completion_tokens"] == 4

    finished = completion_events + b'data: {"choices":[{"index":0,"text":"","finish_reason":"length"}]}\n\n'
    assert resume.progress(finished, "completions") == resume.Progress("The pool keeps", 2, True)
    # What text alone cannot continue is not resumed.
    assert resume.continuation({**body, "max_tokens": 2}, "completions", done) is None  # nothing left
    assert resume.continuation({**body, "prompt": [1, 2, 3]}, "completions", done) is None
    assert resume.continuation({**body, "logprobs": 2}, "completions", done) is None
    assert resume.continuation({**body, "n": 2}, "completions", done) is None
    assert resume.progress(b'data: {"error": {"message": "x"}}\n\n', "completions") is None
