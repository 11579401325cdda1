"""A continuation's events as the client gets them: the first answer's id and created time, no second
assistant-role opening, usage counting the tokens already sent as completion tokens; the rest untouched."""

from __future__ import annotations

import orjson

from inferencepool.router import resume

SENT = (
    b'data: {"id":"chatcmpl-first","created":100,"choices":[{"index":0,"delta":{"role":"assistant",'
    b'"content":""}}]}\n\n'
    b'data: {"id":"chatcmpl-first","created":100,"choices":[{"index":0,"delta":{"content":" the"}}]}\n\n'
    b'data: {"id":"chatcmpl-first","created":100,"choices":[{"index":0,"delta":{"content":" pool"}}]}\n\n'
)


def events(data: bytes) -> list[object]:
    return [
        e.removeprefix(b"data: ") if e.endswith(b"[DONE]") else orjson.loads(e.removeprefix(b"data: "))
        for e in data.split(b"\n\n")
        if e
    ]


def test_a_continuation_reads_as_the_first_answer() -> None:
    done = resume.progress(SENT, "chat")
    assert done is not None and done.tokens == 2
    rewrite = resume.Continued.of(SENT, done)
    continuation = (
        b'data: {"id":"chatcmpl-second","created":200,"choices":[{"index":0,"delta":{"role":"assistant",'
        b'"content":""},"finish_reason":null}]}\n\n'
        b'data: {"id":"chatcmpl-second","created":200,"choices":[{"index":0,"delta":{"content":" runs"},'
        b'"finish_reason":"length"}]}\n\n'
        b'data: {"id":"chatcmpl-second","created":200,"choices":[],"usage":{"prompt_tokens":14,'
        b'"completion_tokens":1,"total_tokens":15}}\n\n'
        b"data: [DONE]\n\n"
    )
    assert events(rewrite.events(continuation)) == [
        {
            "id": "chatcmpl-first",
            "created": 100,
            "choices": [{"index": 0, "delta": {"content": " runs"}, "finish_reason": "length"}],
        },
        {
            "id": "chatcmpl-first",
            "created": 100,
            "choices": [],
            "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
        },
        b"[DONE]",
    ]


def test_what_is_not_an_answer_chunk_passes_as_is() -> None:
    done = resume.progress(SENT, "chat")
    assert done is not None
    rewrite = resume.Continued.of(SENT, done)
    error = b'data: {"error":{"message":"boom","code":500}}\n\n'
    assert rewrite.events(error) == error
    assert rewrite.events(b": keep-alive\n\n") == b": keep-alive\n\n"
    assert rewrite.events(b"") == b""
