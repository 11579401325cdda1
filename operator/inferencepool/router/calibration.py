"""Tokenizer calibration (estimate mode only): off the hot path, ask a decode pod's /tokenize for the true
count of a recent prompt and fold it into the chars-per-token estimate."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from inferencepool.router.http1 import Upstream, UpstreamFailure
from inferencepool.router.pods import PodSet
from inferencepool.router.prompt import Endpoint, Prompt
from inferencepool.router.tokens import EstimateCounter

_FAST_SAMPLES = 50  # samples taken once a second; after that, one every 30 s
SMALL_CALL_SECONDS = 10


class Calibrator:
    def __init__(self, counter: EstimateCounter, pods: PodSet, upstream: Upstream) -> None:
        self.counter = counter
        self.pods = pods
        self.upstream = upstream
        self._candidate: tuple[Endpoint, dict[str, Any], Prompt] | None = None

    @property
    def wants_sample(self) -> bool:
        return self._candidate is None

    def offer(self, endpoint: Endpoint, body: dict[str, Any], prompt: Prompt) -> None:
        """A request just counted by estimate; kept as the next sample when none is waiting."""
        if self._candidate is None and prompt.texts:
            self._candidate = (endpoint, body, prompt)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(1.0 if self.counter.samples < _FAST_SAMPLES else 30.0)
            candidate, self._candidate = self._candidate, None
            if candidate is not None:
                await self.calibrate_once(*candidate)

    async def calibrate_once(self, endpoint: Endpoint, body: dict[str, Any], prompt: Prompt) -> None:
        counter = self.counter
        pod = self.pods.pick("decode", time.monotonic())
        if pod is None:
            return
        if endpoint == "chat":
            query: dict[str, Any] = {
                "model": body["model"],
                "messages": body["messages"],
                "add_generation_prompt": True,
            }
            allowance = counter.count(prompt) - round(len(prompt.texts[0]) / counter.chars_per_token)
        else:
            query = {"model": body["model"], "prompt": prompt.texts[0]}
            allowance = 0
        try:
            answer = await self.upstream.post(
                pod.url + "/tokenize",
                json.dumps(query).encode(),
                (("Content-Type", "application/json"),),
                stream=False,
                timeout_seconds=SMALL_CALL_SECONDS,
            )
            try:
                if answer.status != 200:
                    return
                count = json.loads(await answer.body()).get("count")
            finally:
                answer.close()
        except (UpstreamFailure, ValueError, AttributeError):
            return
        if isinstance(count, int):
            counter.observe(len(prompt.texts[0]), count - allowance)
