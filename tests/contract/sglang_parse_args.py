"""SGLang's own argument parsing of launch argvs, in its own process.

``python -m tests.contract.sglang_parse_args < argvs.json``: for each argv (a list of strings) runs
``sglang.srt.server_args.prepare_server_args`` and the PD validation of its resolution pipeline
(``srt/arg_groups/pd_disaggregation_hook.py``: ``handle_pd_disaggregation``; the rest of
``resolve_once`` needs an accelerator) and prints one JSON list: the parsed fields the tests read,
or ``{"error": "<type>: <message>"}``.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any

FIELDS = ("model_path", "host", "port", "tp_size", "weight_version", "mem_fraction_static", "skip_server_warmup",
          "enable_memory_saver", "incremental_streaming_output", "enable_deterministic_inference",
          "disaggregation_mode", "disaggregation_transfer_backend", "disaggregation_bootstrap_port",
          "enable_pd_role_switch")


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.contract.sglang_env import MISSING, use_sglang

    if not use_sglang():
        raise SystemExit(MISSING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sglang.srt.arg_groups.pd_disaggregation_hook import handle_pd_disaggregation
        from sglang.srt.server_args import prepare_server_args
        from sglang.version import __version__

        out: list[dict[str, Any]] = []
        for argv in json.load(sys.stdin):
            try:
                args = prepare_server_args(argv)
                args._resolved_overrides = []  # what resolve_once starts from
                handle_pd_disaggregation(args)
                out.append({f: getattr(args, f) for f in FIELDS} | {"sglang": __version__})
            except (AssertionError, ValueError, SystemExit) as e:
                out.append({"error": f"{type(e).__name__}: {e}"})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
