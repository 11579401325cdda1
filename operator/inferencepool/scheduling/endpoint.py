"""What the scheduling core reads of an engine pod, and of the set of pods (Protocols: the router's `Pod` and
`PodSet` satisfy them, and so does the simulator, which drives the same objects)."""

from __future__ import annotations

from typing import Literal, Protocol, TypeVar

EngineRole = Literal["prefill", "decode"]


class Endpoint(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def seed(self) -> int:
        """The name's rendezvous seed (`prefix.name_seed`)."""
        ...

    @property
    def load(self) -> int:
        """Requests on the pod (the router's own in flight, or the engine's count when it reports more)."""
        ...

    @property
    def outstanding(self) -> int:
        """The router's own requests in flight there."""
        ...

    @property
    def kv_full(self) -> bool: ...

    @property
    def queued_tokens(self) -> int:
        """Prefill work the router sent there that has not produced its first token yet."""
        ...

    @property
    def engine_waiting(self) -> int: ...

    @property
    def kv_compat(self) -> str | None:
        """The pod's KV-compatibility label (`api.labels.LABEL_KV_COMPAT`); None when unlabelled."""
        ...


E = TypeVar("E", bound=Endpoint)
