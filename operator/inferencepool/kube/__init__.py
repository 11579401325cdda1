"""Talking to the API server: one layer below the controller and the autoscaler, which both use it.

`Kube` is the door (reads, server-side apply, status writes); `fields` holds what two field managers share
about one object (who owns `replicas`, the replicas-only apply); `objects` the pool's object reference.
"""

from __future__ import annotations

from inferencepool.kube.client import Kube, KubeError, Resource, load_configuration, resource_of

__all__ = ["Kube", "KubeError", "Resource", "load_configuration", "resource_of"]
