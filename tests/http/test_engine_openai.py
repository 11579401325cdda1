"""The official openai client against the fake engine: completions and chat, streamed and not."""

from __future__ import annotations

from collections.abc import AsyncIterator

import openai
import pytest
from tests.support.engines import RunningEngine, running_engine

from inferencepool.engine_sim.tokenizer import EstimateTokenizer

MODEL = "fake-model"


@pytest.fixture
async def engine() -> AsyncIterator[RunningEngine]:
    async with running_engine("cpu-demo", MODEL, time_scale=0.02) as running:
        yield running


@pytest.fixture
async def client(engine: RunningEngine) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=f"{engine.url}/v1", api_key="unused", max_retries=0) as client:
        yield client


async def test_completion_returns_the_requested_number_of_tokens(client: openai.AsyncOpenAI) -> None:
    result = await client.completions.create(model=MODEL, prompt="The quick brown fox jumps", max_tokens=7)
    assert result.object == "text_completion"
    assert result.model == MODEL
    assert result.choices[0].finish_reason == "length"
    assert result.choices[0].text.strip()
    assert result.usage is not None
    assert result.usage.completion_tokens == 7
    # no tokenizer.json here: the engine counts with its documented estimate (words split every 4 characters)
    assert result.usage.prompt_tokens == len(EstimateTokenizer().encode("The quick brown fox jumps")) == 8
    assert result.usage.total_tokens == 15


async def test_completion_text_is_deterministic_per_prompt(client: openai.AsyncOpenAI) -> None:
    first = await client.completions.create(model=MODEL, prompt="same prompt here", max_tokens=6)
    second = await client.completions.create(model=MODEL, prompt="same prompt here", max_tokens=6)
    other = await client.completions.create(model=MODEL, prompt="a different prompt", max_tokens=6)
    assert first.choices[0].text == second.choices[0].text
    assert first.choices[0].text != other.choices[0].text


async def test_streamed_completion_with_usage(client: openai.AsyncOpenAI) -> None:
    stream = await client.completions.create(
        model=MODEL,
        prompt="Count to five",
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    token_chunks = [c for c in chunks if c.choices]
    assert len(token_chunks) == 5
    assert [c.choices[0].finish_reason for c in token_chunks] == [None] * 4 + ["length"]
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == []
    assert usage_chunk.usage is not None
    assert usage_chunk.usage.completion_tokens == 5
    assert usage_chunk.usage.prompt_tokens == len(EstimateTokenizer().encode("Count to five"))


async def test_streamed_completion_without_usage_has_no_usage_chunk(client: openai.AsyncOpenAI) -> None:
    stream = await client.completions.create(model=MODEL, prompt="hello", max_tokens=3, stream=True)
    chunks = [chunk async for chunk in stream]
    assert all(c.choices for c in chunks)
    assert all(c.usage is None for c in chunks)


async def test_chat_completion(client: openai.AsyncOpenAI) -> None:
    result = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hi"}], max_tokens=4
    )
    assert result.object == "chat.completion"
    message = result.choices[0].message
    assert message.role == "assistant"
    assert message.content and len(message.content.split()) == 4
    assert result.usage is not None and result.usage.completion_tokens == 4
    # the chat template's header tokens are counted, as a real template's would be
    assert result.usage.prompt_tokens > 2


async def test_chat_without_max_tokens_stops_on_its_own(client: openai.AsyncOpenAI) -> None:
    result = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Tell me"}]
    )
    assert result.choices[0].finish_reason == "stop"
    assert result.usage is not None and result.usage.completion_tokens >= 1


async def test_streamed_chat_with_usage(client: openai.AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "Hello there"}],
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(content.split()) == 6
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6


async def test_models_lists_the_served_name(client: openai.AsyncOpenAI) -> None:
    models = await client.models.list()
    assert [m.id for m in models.data] == [MODEL]


async def test_unknown_model_is_not_found(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as error:
        await client.completions.create(model="other-model", prompt="hi", max_tokens=2)
    assert "other-model" in str(error.value)
