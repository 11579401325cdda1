"""A CPU-only stand-in for a vLLM engine: vLLM's HTTP API, NIXL handshake and metrics over a timing model.

- `profiles`: model x hardware numbers (Llama-3.1-8B on H100/H200, 70B at TP4, cpu-demo, zero), with sources;
- `timing`: the roofline step-time formulas; `kv`: KV blocks, prefix cache LRU, LMCache CPU tier, p2p index;
- `core.EngineCore`: the engine loop as a pure object (no clock, no I/O), driven in wall-clock time by
  `server.FakeEngine` (aiohttp) and in virtual time by `virtual.run_virtual` / `run_closed_loop` (simulator);
- `cli`: `inferencepool fake-engine [serve] MODEL` with vLLM's flags (tests start engines in-process with
  tests/support/engines.py).
"""
