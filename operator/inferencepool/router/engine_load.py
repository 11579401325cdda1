"""Engine load signals, read off the request path: every engine pod's /metrics on a short interval, for the
three gauges the router weighs (vllm:num_requests_running, vllm:num_requests_waiting and
vllm:kv_cache_usage_perc).

They show what the router's own in-flight count cannot: other router replicas' requests, and the queue inside
the engine. A pod that does not answer keeps nothing stale: its engine figures drop to zero and the router's
own count decides alone. A pod that accepts the connection but sends nothing within the scrape's timeout is
hung (a stopped process, a wedged API server): it leaves the table (`Pod.unresponsive`) until a scrape
answers again. A refused connection is not a hang: legs.py cools such a pod down on its own. The parse reads
only those lines (a vLLM page has hundreds).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from inferencepool.router.http1 import Upstream, UpstreamFailure
from inferencepool.router.pods import Pod, PodSet

log = logging.getLogger("inferencepool.router")

_RUNNING = b"vllm:num_requests_running"
_WAITING = b"vllm:num_requests_waiting"
_KV = b"vllm:kv_cache_usage_perc"


def parse_engine_load(page: bytes) -> tuple[int, int, float] | None:
    """(running, waiting, KV usage) summed over a page's series (KV usage: the largest), or None when the
    page has none of them."""
    running = waiting = 0.0
    kv = 0.0
    found = False
    for line in page.splitlines():
        if not line.startswith(b"vllm:"):
            continue
        name, _, rest = line.partition(b"{")
        if not rest:
            name, _, rest = line.partition(b" ")
        else:
            rest = rest.rpartition(b"}")[2]
        name = name.strip()
        if name not in (_RUNNING, _WAITING, _KV):
            continue
        try:
            value = float(rest.split()[0])
        except (IndexError, ValueError):
            continue
        found = True
        if name == _RUNNING:
            running += value
        elif name == _WAITING:
            waiting += value
        else:
            kv = max(kv, value)
    return (round(running), round(waiting), kv) if found else None


class EngineLoad:
    """Reads every known pod's /metrics each interval and writes the figures onto its Pod."""

    def __init__(
        self,
        pods: PodSet,
        upstream: Upstream,
        interval_seconds: float,
        on_read: Callable[[], None] | None = None,
    ) -> None:
        self.pods = pods
        self.on_read = on_read  # after each round (overload.py reads saturation off the table)
        self.upstream = upstream
        self.interval_seconds = interval_seconds
        # also how long a hung pod stays in the table: two intervals, at least a second
        self.timeout_seconds = max(1.0, interval_seconds * 2)

    async def run(self) -> None:
        while True:
            await self.read_all()
            await asyncio.sleep(self.interval_seconds)

    async def read_all(self) -> None:
        pods = [pod for pod in self.pods.pods.values() if pod.known]
        await asyncio.gather(*(self._read(pod) for pod in pods))
        if self.on_read is not None:
            self.on_read()

    async def _read(self, pod: Pod) -> None:
        figures: tuple[int, int, float] | None = None
        answered = False
        try:
            response = await self.upstream.get(pod.url + "/metrics", self.timeout_seconds)
            answered = True
            try:
                if response.status == 200:
                    figures = parse_engine_load(await response.body())
            finally:
                response.close()
        except UpstreamFailure as failure:
            log.debug("engine metrics of %s unreadable: %s", pod.name, failure)
            if failure.kind == "timeout" and not answered and not pod.unresponsive:
                log.warning("%s pod %s does not answer: out of the table until it does", pod.role, pod.name)
                pod.unresponsive = True
        if answered and pod.unresponsive:
            log.warning("%s pod %s answers again: back in the table", pod.role, pod.name)
            pod.unresponsive = False
        pod.engine_running, pod.engine_waiting, pod.kv_usage = figures or (0, 0, 0.0)
