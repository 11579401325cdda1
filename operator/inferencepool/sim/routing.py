"""The router's prefix index as the simulator uses it: one implementation, in `router.prefix` (chained block
keys, the per-pod LRU index of what was sent where, and the live router's pod choice on it)."""

from inferencepool.router.prefix import PrefixIndex, chained_keys

__all__ = ["PrefixIndex", "chained_keys"]
