"""NIXL progress-thread delay, for the real-engine test environment only (installed by install.sh as
_nixl_pthr_delay.py with a .pth file that imports it at interpreter start).

Upstream cause: nixl_cu13/_api.py (nixl 1.5.1) `nixl_agent.__init__` sets `agent_config.pthrDelay = 0` and vLLM's
NixlConnector always turns the progress thread on (vllm/distributed/kv_transfer/kv_connector/v1/nixl/
base_worker.py, `nixl_agent_config(...)`). Over UCX's TCP transport the UCX plugin's shared progress thread then
busy-polls: a whole core per engine, idle or not, which starves a 2-core machine (a first P/D request took 41-49 s
instead of 7.5 s). Neither NIXL nor vLLM exposes the delay. Turning the thread off is no fix: TCP is software
RMA, so an idle prefill worker never progresses UCX and the decode engine's read never completes.

When NIXL_PTHR_DELAY_US is set, every NIXL agent is created with that delay (1000 us: ~3% of a core idle, P/D
correct). Unset, nothing is patched. It wraps NIXL's internal nixlBind module, so a NIXL upgrade must be checked
against it (tests/real checks that the delay is in effect).
"""

import importlib.abc
import importlib.util
import os
import sys

ENV = "NIXL_PTHR_DELAY_US"


class _DelayedAgents(importlib.abc.MetaPathFinder):
    """On import of nixl_cuXX._api, replace its nixlBind with a proxy whose nixlAgent sets pthrDelay first."""

    def find_spec(self, name, path, target=None):
        if not (name.startswith("nixl_cu") and name.endswith("._api")):
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        delay = int(os.environ[ENV])
        exec_module = spec.loader.exec_module

        def exec_with_delay(module):
            exec_module(module)
            bind = module.nixlBind

            class _Bind:
                def __getattr__(self, attribute):
                    return getattr(bind, attribute)

                def nixlAgent(self, agent_name, config):  # noqa: N802 (NIXL's name)
                    config.pthrDelay = delay
                    return bind.nixlAgent(agent_name, config)

            module.nixlBind = _Bind()

        spec.loader.exec_module = exec_with_delay
        return spec


if os.environ.get(ENV):
    sys.meta_path.insert(0, _DelayedAgents())
