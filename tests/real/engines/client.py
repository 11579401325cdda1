"""HTTP clients for the real-engine tests: the engine directly, or the router in front of the fleet,
configured as the operator configures it for the pool (builders.router.router_config) except that the pods
are the fleet's addresses instead of discovered ones."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from inferencepool.builders.common import PoolRef
from inferencepool.builders.router import router_config
from inferencepool.router.config import RouterConfig
from inferencepool.router.tokens import load_counter
from tests.http.router_harness import RunningRouter, running_router
from tests.support.real_engines import Fleet, RealEngine

TIMEOUT = aiohttp.ClientTimeout(total=600)


@dataclass
class Answer:
    status: int
    body: Any  # parsed JSON, or the text when it is not JSON
    headers: Mapping[str, str]
    events: list[Any] | None = None  # a stream's data events, parsed ("[DONE]" kept as the string)

    @property
    def text(self) -> str:
        """The generated text, whole answer or stream, of choice 0 (completion or chat)."""
        if self.events is not None:
            pieces = []
            for event in self.events:
                if not isinstance(event, dict):
                    continue
                for choice in event.get("choices", []):
                    if choice.get("index", 0) == 0:
                        pieces.append(choice.get("text") or (choice.get("delta") or {}).get("content") or "")
            return "".join(pieces)
        choice = self.body["choices"][0]
        return str(choice["text"] if "text" in choice else choice["message"]["content"])


def shape(value: Any) -> Any:
    """Keys and JSON types, recursively; a list is the set of its items' shapes."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in sorted(value.items())}
    if isinstance(value, list):
        shapes = {json.dumps(shape(item), sort_keys=True) for item in value}
        return [json.loads(s) for s in sorted(shapes)]
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if value is None:
        return "null"
    return "string"


def paths(value: Any, where: str = "") -> dict[str, set[str]]:
    """Leaf path -> the JSON types seen there."""
    if isinstance(value, dict):
        found: dict[str, set[str]] = {}
        for key, item in value.items():
            for path, kinds in paths(item, f"{where}.{key}").items():
                found.setdefault(path, set()).update(kinds)
        return found
    if isinstance(value, list):
        found = {}
        for item in value:
            for path, kinds in paths(item, f"{where}[]").items():
                found.setdefault(path, set()).update(kinds)
        return found or {f"{where}[]": {"empty"}}
    return {where: {shape(value)}}


def stream_shape(events: list[Any]) -> dict[str, Any]:
    """A stream by kind of event: the chat role opening, the token events merged (how many tokens vLLM
    puts in one event depends on timing, and a completion's finish may come in an event of its own), the
    usage event, the end."""
    kinds: dict[str, dict[str, set[str]]] = {}
    for event in events:
        if not isinstance(event, dict):
            kind = "end"
        elif "usage" in event:
            kind = "usage"
        elif any("role" in (c.get("delta") or {}) for c in event.get("choices", [])):
            kind = "role"
        else:
            kind = "tokens"
        for path, found in (paths(event) if isinstance(event, dict) else {"": {event}}).items():
            kinds.setdefault(kind, {}).setdefault(path, set()).update(found)
    # Token events by their fields only: whether one carries the finish (a string where the others have null)
    # is timing too.
    return {
        kind: {path: [] if kind == "tokens" else sorted(types) for path, types in merged.items()}
        for kind, merged in kinds.items()
    }


async def call(
    base: str, path: str, body: Mapping[str, Any], headers: Mapping[str, str] | None = None
) -> Answer:
    """POST, reading a stream's events when the answer is one."""
    async with (
        aiohttp.ClientSession(timeout=TIMEOUT) as session,
        session.post(base + path, json=body, headers=headers or {}) as response,
    ):
        raw = await response.read()
        kind = response.headers.get("content-type", "")
        if kind.startswith("text/event-stream"):
            events: list[Any] = []
            for block in raw.decode().split("\n\n"):
                block = block.strip()
                if block.startswith("data:"):
                    data = block[5:].strip()
                    events.append(data if data == "[DONE]" else json.loads(data))
            return Answer(response.status, None, dict(response.headers), events)
        try:
            parsed: Any = json.loads(raw)
        except ValueError:
            parsed = raw.decode(errors="replace")
        return Answer(response.status, parsed, dict(response.headers))


async def get_text(base: str, path: str) -> tuple[int, str]:
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session, session.get(base + path) as response:
        return response.status, await response.text()


async def metric_families(engine: RealEngine | str) -> dict[str, Any]:
    """The engine's /metrics, family name -> prometheus_client Metric."""
    url = engine if isinstance(engine, str) else engine.url
    status, text = await get_text(url, "/metrics")
    assert status == 200, text
    return {family.name: family for family in text_string_to_metric_families(text)}


async def metric_value(engine: RealEngine, sample_name: str, **labels: str) -> float:
    families = await metric_families(engine)
    return sum(
        sample.value
        for family in families.values()
        for sample in family.samples
        if sample.name == sample_name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def operator_router_config(fleet: Fleet, *, prefill: bool = True, **fields: Any) -> RouterConfig:
    """The router config the operator writes for the fleet's pool, on the fleet's engines."""
    config = router_config(fleet.pool, PoolRef.of(fleet.pool))
    data = config.model_dump(by_alias=True)
    data.update(
        pool=None,
        tokenizer=str(fleet.model),
        static={
            "prefill": [fleet.prefill.url] if prefill else [],
            "decode": [engine.url for engine in fleet.decodes],
        },
    )
    data.update(fields)
    return RouterConfig.model_validate(data)


@contextlib.asynccontextmanager
async def router(
    fleet: Fleet, config: RouterConfig | None = None, **fields: Any
) -> AsyncIterator[RunningRouter]:
    """The real router (the model's tokenizer.json as its counter) in front of the fleet."""
    config = config or operator_router_config(fleet, **fields)
    async with running_router(config, load_counter(str(fleet.model))) as running:
        yield running
