"""What one replica of each role can carry, as figures the planner divides demand by (pure).

The unit is engine-seconds of work per second: a replica busy all the time carries 1.

- Prefill work of a prompt of l tokens: prompts shorter than the chunk (max_num_batched_tokens B) batch
  together into full chunks, so one costs l x t_chunk / B, where t_chunk is the step time of a full B-token
  chunk; a longer prompt costs its own chunked prefill time (the attention part grows with l^2). The table
  holds the idle-engine prefill time at a few lengths; between them the cost is interpolated in l.
- Decode: a step of a continuous batch takes t0 + delta x (batch - 1) + the prefill chunks it carries, where
  t0 is the one-sequence step and delta the cost of one more sequence at the mean context. A pool generating
  G tokens/s with W seconds/s of prefill work on it spends delta x G + W of every second beyond the base
  steps; its steps stay under the ITL target while that share stays under 1 - t0 / ITL target.
- KV: a decode replica holds kv_capacity_tokens of context; the pool needs the KV in use to fit.

`from_profile` seeds the table from the fake engine's timing model (the same roofline the simulator runs);
a profiling run of a real engine would write the same table. The planner corrects it online, since the
observed utilisation divided by the predicted one is the factor by which the table is off.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

from inferencepool.perf import timing
from inferencepool.perf.profiles import EngineProfile


@dataclass(frozen=True)
class CapacityModel:
    chunk_tokens: int  # max_num_batched_tokens of the engines this table describes
    chunk_seconds: float  # step time of one full chunk on an idle engine
    prefill_points: tuple[tuple[int, float], ...]  # (prompt tokens, idle prefill seconds), increasing
    decode_points: tuple[tuple[int, float, float], ...]  # (context tokens, t0 seconds, delta seconds)
    kv_capacity_tokens: int
    max_num_seqs: int

    def __post_init__(self) -> None:
        if self.chunk_tokens < 1 or self.chunk_seconds <= 0:
            raise ValueError("a capacity model needs chunk_tokens >= 1 and chunk_seconds > 0")
        if not self.prefill_points or not self.decode_points:
            raise ValueError("a capacity model needs prefill and decode points")
        if any(a[0] >= b[0] for a, b in zip(self.prefill_points, self.prefill_points[1:], strict=False)):
            raise ValueError("prefill points must increase in prompt tokens")
        if any(a[0] >= b[0] for a, b in zip(self.decode_points, self.decode_points[1:], strict=False)):
            raise ValueError("decode points must increase in context tokens")

    def prefill_seconds(self, prompt_tokens: float) -> float:
        """Engine-seconds of work to prefill one prompt on a busy engine (short prompts batch into chunks)."""
        if prompt_tokens <= 0:
            return 0.0
        if prompt_tokens <= self.chunk_tokens:
            return prompt_tokens * self.chunk_seconds / self.chunk_tokens
        return _interpolate(self.prefill_points, prompt_tokens)

    def prefill_work(self, prompt_lengths: Sequence[int]) -> float:
        return sum(self.prefill_seconds(length) for length in prompt_lengths)

    def idle_prefill_seconds(self, prompt_tokens: float) -> float:
        """One prompt alone on an idle engine: its service time (TTFT without queueing)."""
        return _interpolate(self.prefill_points, max(1.0, prompt_tokens))

    def decode_step(self, context_tokens: float) -> tuple[float, float]:
        """(t0, delta) at a mean context: the one-sequence step and the cost of one more sequence."""
        points = self.decode_points
        contexts = [p[0] for p in points]
        if context_tokens <= contexts[0]:
            return points[0][1], points[0][2]
        if context_tokens >= contexts[-1]:
            return points[-1][1], points[-1][2]
        i = bisect_left(contexts, context_tokens)
        (c0, a0, d0), (c1, a1, d1) = points[i - 1], points[i]
        w = (context_tokens - c0) / (c1 - c0)
        return a0 + w * (a1 - a0), d0 + w * (d1 - d0)


def _interpolate(points: tuple[tuple[int, float], ...], x: float) -> float:
    xs = [p[0] for p in points]
    if x <= xs[0]:
        return points[0][1] * x / xs[0]
    if x >= xs[-1]:
        # beyond the table: per-token cost of the last segment (attention makes it a slight underestimate)
        (x0, y0), (x1, y1) = points[-2] if len(points) > 1 else (0, 0.0), points[-1]
        return y1 + (x - x1) * (y1 - y0) / (x1 - x0)
    i = bisect_left(xs, x)
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    return y0 + (x - x0) * (y1 - y0) / (x1 - x0)


def from_profile(profile: EngineProfile, chunk_tokens: int | None = None) -> CapacityModel:
    """The table from the engine's timing model, for engines run with `chunk_tokens` (the profile's
    max_num_batched_tokens by default)."""
    tuned = profile if chunk_tokens is None else profile.with_overrides(max_num_batched_tokens=chunk_tokens)
    chunk = tuned.max_num_batched_tokens
    lengths = sorted({16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, chunk})
    lengths = [n for n in lengths if n <= tuned.max_model_len] or [tuned.max_model_len]
    prefill = tuple((n, timing.ideal_prefill_time(tuned, n)) for n in lengths)
    decode = []
    for context in (128, 512, 1024, 2048, 4096, 8192, 16384, 32768):
        one = timing.step_time(tuned, (), [context])
        many = timing.step_time(tuned, (), [context] * 65)
        decode.append((context, one, (many - one) / 64))
    return CapacityModel(
        chunk_tokens=chunk,
        chunk_seconds=timing.step_time(tuned, [timing.PrefillChunk(chunk, 0)], ()),
        prefill_points=prefill,
        decode_points=tuple(decode),
        kv_capacity_tokens=tuned.kv_capacity_tokens,
        max_num_seqs=tuned.max_num_seqs,
    )
