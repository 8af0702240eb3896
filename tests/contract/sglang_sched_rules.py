"""SGLang's own scheduler rules on given requests, in its own process.

``python -m tests.contract.sglang_sched_rules --reqs reqs.json``: with a published scheduler
configuration (``prepare_server_args`` + ``runtime_context.publish``, as a scheduler process does
at start; this host has no accelerator, so ``--device cpu``), prints as JSON: SGLang 0.5.23's
retraction order (``ScheduleBatch._get_decode_retraction_order``) and new-token ratio after a
retraction (``NewTokenRatioTracker.estimate_new_token_ratio_after_retract``) for each request set
of ``reqs.json`` (``[[[generated, prompt, max_new_tokens], ...], ...]``), the ratio tracker's
``init`` / ``min`` / ``decay`` (``NewTokenRatioTracker.from_config``), and the constants the
emulator ports (``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION``, ``SGLANG_RETRACT_DECODE_STEPS``,
``num_reserved_decode_tokens``, ``schedule_policy``, ``retraction_policy``,
``disaggregation_decode_enable_radix_cache``). A request is the three fields the rules read.
"""

from __future__ import annotations

import argparse
import json
import sys
import types
import warnings
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reqs", required=True)
    ap.add_argument("--model", required=True, help="a local model folder (its config only is read)")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.contract.sglang_env import MISSING, use_sglang

    if not use_sglang():
        raise SystemExit(MISSING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sglang.srt.environ import envs
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        from sglang.srt.managers.scheduler_components.new_token_ratio_tracker import NewTokenRatioTracker
        from sglang.srt.runtime_context import publish
        from sglang.srt.server_args import prepare_server_args

        server_args = prepare_server_args(["--model-path", args.model, "--device", "cpu"])
        publish(server_args, role="scheduler")

    def req(generated: int, prompt: int, max_new: int) -> types.SimpleNamespace:
        return types.SimpleNamespace(output_ids=[0] * generated, origin_input_ids=[0] * prompt,
                                     sampling_params=types.SimpleNamespace(max_new_tokens=max_new), priority=None)

    sets = [[req(*r) for r in rs] for rs in json.loads(Path(args.reqs).read_text())]
    tracker = NewTokenRatioTracker.from_config()
    print(json.dumps({
        "orders": [ScheduleBatch._get_decode_retraction_order(rs) for rs in sets],
        "ratios": [NewTokenRatioTracker.estimate_new_token_ratio_after_retract(rs) for rs in sets],
        "tracker": {"init": tracker.init, "min": tracker.min, "decay": tracker.decay},
        "clip": envs.SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION.get(),
        "retract_decode_steps": envs.SGLANG_RETRACT_DECODE_STEPS.get(),
        "num_reserved_decode_tokens": server_args.num_reserved_decode_tokens,
        "schedule_policy": server_args.schedule_policy,
        "retraction_policy": server_args.retraction_policy,
        "decode_radix_cache": server_args.disaggregation_decode_enable_radix_cache,
    }))


if __name__ == "__main__":
    main()
