"""Run by .venv-vllm's Python (tests/real/test_engine_configs.py): builds vLLM's own engine config from each
command line on stdin, exactly as `vllm serve` does before it starts anything: the CLI's parser
(ServeSubcommand.subparser_init -> make_arg_parser), `cmd.validate`, the positional model, then
AsyncEngineArgs.from_cli_args -> create_engine_config (vllm/entrypoints/launchers/api_server/entry.py). That
is where vLLM refuses a flag or a flag combination, and where it reads the model's config.

stdin: JSON [{"id": ..., "argv": ["vllm", "serve", MODEL, ...]}]; stdout: one JSON line per entry,
{"id", "ok", "error", and on success what vLLM made of the flags that matter to the operator}.
Imports only vLLM and the standard library: it runs outside the project's environment.
"""

from __future__ import annotations

import json
import sys
import traceback
from typing import Any


def check(argv: list[str]) -> dict[str, Any]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    command = ServeSubcommand()
    command.subparser_init(subparsers)
    args = parser.parse_args(argv[1:])
    command.validate(args)
    if getattr(args, "model_tag", None) is not None:
        args.model = args.model_tag
    engine_args = AsyncEngineArgs.from_cli_args(args)
    config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    kv = config.kv_transfer_config
    return {
        "served_model_name": config.model_config.served_model_name,
        "max_model_len": config.model_config.max_model_len,
        "tensor_parallel_size": config.parallel_config.tensor_parallel_size,
        "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
        "max_num_seqs": config.scheduler_config.max_num_seqs,
        "enable_chunked_prefill": config.scheduler_config.enable_chunked_prefill,
        "enable_prefix_caching": config.cache_config.enable_prefix_caching,
        "block_size": config.cache_config.block_size,
        "shutdown_timeout": getattr(args, "shutdown_timeout", None),
        "kv_connector": kv.kv_connector if kv else None,
        "kv_role": kv.kv_role if kv else None,
        "kv_buffer_device": kv.kv_buffer_device if kv else None,
        "kv_connector_extra_config": kv.kv_connector_extra_config if kv else None,
        "enforce_eager": config.model_config.enforce_eager,
    }


def main() -> int:
    entries = json.load(sys.stdin)
    for entry in entries:
        try:
            result = {"id": entry["id"], "ok": True, "config": check(entry["argv"])}
        except SystemExit as error:  # argparse refuses a flag
            result = {"id": entry["id"], "ok": False, "error": f"argparse exit {error.code}"}
        except Exception as error:
            last = traceback.extract_tb(error.__traceback__)[-1]
            where = f"{last.filename.split('site-packages/')[-1]}:{last.lineno}"
            result = {"id": entry["id"], "ok": False, "error": f"{type(error).__name__}: {error} ({where})"}
        print(json.dumps(result, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
