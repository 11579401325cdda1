"""The fake engine continues a text as vLLM does: a prompt that carries the start of the model's own answer
(a completion prompt, or a chat whose last assistant message is open with `continue_final_message`) gets the
rest of that answer, and vLLM's refusals of `continue_final_message` beside a generation prompt hold."""

from __future__ import annotations

from typing import Any

import pytest

from inferencepool.engine_sim import protocol
from inferencepool.engine_sim.tokenizer import EstimateTokenizer, continued_answer, prompt_seed, render_chat

TOKENIZER = EstimateTokenizer()
NAMES = ["m"]


def parse(kind: protocol.Kind, body: dict[str, Any]) -> protocol.GenerationRequest:
    return protocol.parse_generation(kind, {"model": "m", **body}, NAMES, TOKENIZER, 4096)


def answer(req: protocol.GenerationRequest, pieces: int) -> list[str]:
    return [TOKENIZER.output_piece(req.seed, req.answered + i) for i in range(pieces)]


@pytest.mark.parametrize("cut", [1, 5, 17])
def test_a_completion_prompt_with_part_of_its_answer_gets_the_rest(cut: int) -> None:
    prompt = "how does a pool split prefill and decode"
    whole = answer(parse("completion", {"prompt": prompt, "max_tokens": 30}), 30)
    # every output piece is one token, so a streamed answer re-reads as the tokens it streamed
    assert len(TOKENIZER.encode("".join(whole))) == 30
    rest = parse("completion", {"prompt": prompt + "".join(whole[:cut]), "max_tokens": 30 - cut})
    assert rest.answered == cut
    assert answer(rest, 30 - cut) == whole[cut:]


def test_a_chat_continues_its_open_final_assistant_message() -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "how does a pool split prefill and decode"}]
    first = parse("chat", {"messages": messages})
    whole = answer(first, first.output_tokens)
    continued = parse(
        "chat",
        {
            "messages": [*messages, {"role": "assistant", "content": "".join(whole[:7])}],
            "continue_final_message": True,
            "add_generation_prompt": False,
        },
    )
    assert answer(continued, continued.output_tokens) == whole[7:]  # and it stops where the first would
    # a closed assistant message is a finished turn: the model starts a new answer, not the rest of this one
    closed = parse(
        "chat",
        {
            "messages": [*messages, {"role": "assistant", "content": "".join(whole[:7])}],
            "add_generation_prompt": False,
        },
    )
    assert closed.answered == 0


def test_continue_final_message_refuses_a_generation_prompt_beside_it() -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "The"}]
    for extra in ({}, {"add_generation_prompt": True}):  # vLLM's validator, or transformers' template
        with pytest.raises(protocol.ApiError) as refused:
            parse("chat", {"messages": messages, "continue_final_message": True, **extra})
        assert refused.value.status == 400 and refused.value.param == "continue_final_message"
        assert "add_generation_prompt" in refused.value.message
    with pytest.raises(protocol.ApiError) as refused:
        parse("chat", {"messages": messages, "continue_final_message": "yes", "add_generation_prompt": False})
    assert refused.value.status == 400 and refused.value.param == "continue_final_message"


def test_an_open_final_message_has_no_end_of_turn() -> None:
    messages: list[dict[str, object]] = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "The"},
    ]
    assert render_chat(messages, False, True).endswith("<|end_header_id|>\n\nThe")
    assert render_chat(messages, False).endswith("The<|eot_id|>")


def test_a_prompt_that_only_ends_like_an_answer_keeps_its_own_seed() -> None:
    ids = TOKENIZER.encode("tell me about the pool")
    seed, answered = continued_answer(TOKENIZER, ids)
    if answered:  # the prompt's last words happen to be the start of the answer to what precedes them
        assert seed == prompt_seed(ids[:-answered])
    else:
        assert seed == prompt_seed(ids)
    assert continued_answer(TOKENIZER, TOKENIZER.encode("prefill, decode?")) == (
        prompt_seed(TOKENIZER.encode("prefill, decode?")),
        0,
    )
