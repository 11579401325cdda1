"""`inferencepool bench resume` judges a stream against the unkilled engine's answer: whole only when the
client got that answer exactly once (text, one id, one end, the same usage), wrong when it ended cleanly but
differs, broken when it carried an error or never ended."""

from __future__ import annotations

import argparse

import pytest

from inferencepool.bench import resume


def answer(*events: str, chat: bool = False) -> resume.Answer:
    got = resume.Answer()
    for event in events:
        got.add(event.encode(), chat)
    return got


def chunk(text: str, finish: str | None = None, id_: str = "cmpl-1") -> str:
    finish_json = "null" if finish is None else f'"{finish}"'
    return f'data: {{"id":"{id_}","choices":[{{"index":0,"text":"{text}","finish_reason":{finish_json}}}]}}'


USAGE = 'data: {"id":"cmpl-1","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2}}'
REFERENCE = answer(chunk(" the"), chunk(" pool", "length"), USAGE, "data: [DONE]")


def test_the_same_answer_is_whole() -> None:
    assert REFERENCE.verdict(REFERENCE) == "whole"
    assert (
        answer(chunk(" the"), chunk(" pool", "length"), USAGE, "data: [DONE]").verdict(REFERENCE) == "whole"
    )


def test_a_clean_end_that_differs_is_wrong() -> None:
    twice = answer(chunk(" the"), chunk(" the"), chunk(" pool", "length"), USAGE, "data: [DONE]")
    assert twice.verdict(REFERENCE) == "wrong"  # a token twice
    second_id = answer(chunk(" the"), chunk(" pool", "length", "cmpl-2"), USAGE, "data: [DONE]")
    assert second_id.verdict(REFERENCE) == "wrong"
    usage = USAGE.replace('"prompt_tokens":9', '"prompt_tokens":10')
    assert (
        answer(chunk(" the"), chunk(" pool", "length"), usage, "data: [DONE]").verdict(REFERENCE) == "wrong"
    )
    two_ends = answer(chunk(" the", "length"), chunk(" pool", "length"), USAGE, "data: [DONE]")
    assert two_ends.verdict(REFERENCE) == "wrong"


def test_an_error_or_no_end_is_broken() -> None:
    error = 'data: {"error":{"message":"decode pod failed mid-stream","code":502}}'
    assert answer(chunk(" the"), error, "data: [DONE]").verdict(REFERENCE) == "broken"
    assert answer(chunk(" the")).verdict(REFERENCE) == "broken"


def test_a_chat_opens_once() -> None:
    role = 'data: {"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}'
    text = 'data: {"id":"c","choices":[{"index":0,"delta":{"content":" the"},"finish_reason":"stop"}]}'
    reference = answer(role, text, "data: [DONE]", chat=True)
    assert reference.roles == 1 and reference.text == " the"
    assert answer(role, role, text, "data: [DONE]", chat=True).verdict(reference) == "wrong"


def test_the_requests_mix_what_a_resume_must_get_right() -> None:
    requests = [resume.request_for(i, 48) for i in range(12)]
    assert {path for path, _ in requests} == {"/v1/completions", "/v1/chat/completions"}
    assert any("max_tokens" not in body for path, body in requests if path == "/v1/completions")
    assert any("max_tokens" not in body for path, body in requests if path == "/v1/chat/completions")
    assert any("stream_options" in body for _, body in requests)


def test_settings_that_cannot_measure_a_resume_are_refused() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="out/bench")
    resume.configure(parser)
    assert resume.run(parser.parse_args(["--engines", "1"])) == 2
    assert resume.run(parser.parse_args(["--kill-after", "16"])) == 2


def test_the_pause_at_the_kill_is_read_from_the_gap_across_it() -> None:
    got = resume.Answer(times=[1.0, 1.1, 1.2, 1.9, 2.0])
    assert got.gap_across(1.25) == pytest.approx(0.7)
    assert resume.Answer(times=[1.0, 1.1]).gap_across(1.5) is None  # broken at the kill: no event after
    rounds = [
        resume.Round("resume", 4, 4, 0, 0, 1, 0, 1.0, gaps_across_kill_ms=[900.0, 60.0, 50.0, 40.0]),
        resume.Round("no-resume", 4, 3, 1, 0, 0, 0, 1.0, gaps_across_kill_ms=[55.0, 45.0, 40.0]),
    ]
    assert resume.pauses(rounds) == {
        "resumed_pause_p50_ms": 900.0,
        "other_streams_gap_p50_ms": 50.0,
        "ratio": 18.0,
    }
