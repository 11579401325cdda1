"""The scheduling core: which decode pod, which prefill pod (if any) and which route one request takes.

Pure: no I/O, no clock (time comes in as an argument), no knowledge of HTTP or of virtual time. The live
router (`router/generate.py`) and the simulator (`sim/cluster.py`) are two drivers of the same `Scheduler`,
so a route the simulator reports is a route the router would take. The pipeline, in the shape of the Gateway
API Inference Extension's endpoint picker and llm-d's P/D decider, one small named piece per module:

- `endpoint.py`  what the core reads of a pod (a Protocol the router's `Pod` satisfies);
- `filters.py`   pods that may take the request: not KV-full, under the bounded-load rule, KV-compatible;
- `scorers.py`   when the prompt would start: its cached prefix less the prefill queued, rendezvous among
                 equals;
- `picker.py`    one pod from the filtered, scored candidates (or the least loaded without a prefix);
- `costs.py`     what each route would cost, from the learned prefill speed and the pods' queues;
- `decider.py`   the disaggregation decision: prompts over N uncached tokens go through the prefill pool;
- `scheduler.py` `Scheduler.schedule(request, view, now) -> Decision`, the whole cycle.
"""
