"""One SGLang TP rank receiving a weight update with SGLang's own code, in its own process.

``python -m tests.contract.sglang_receiver --host H --port P --rank-offset R --world-size W
--tp-rank K --calls calls.json --out received.pt``: a real ``WeightUpdater`` (SGLang's
``srt/model_executor/model_runner_components/weight_updater.py``; the fields a receive does not
read are placeholders) joins the group with ``init_weights_update_group`` (which calls
``init_custom_process_group`` with ``rank = rank_offset + tp_rank``) and runs
``receive_weights_from_distributed`` once per call in ``calls.json`` (``[{names, dtypes, shapes,
load_format}, ...]``), as the scheduler does for ``/update_weights_from_distributed``. The received
tensors go to ``--out`` (``torch.save``); the join time is printed as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    for name in ("--host", "--calls", "--out"):
        ap.add_argument(name, required=True)
    for name in ("--port", "--rank-offset", "--world-size", "--tp-rank"):
        ap.add_argument(name, type=int, required=True)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.contract.sglang_env import MISSING, use_sglang

    if not use_sglang():
        raise SystemExit(MISSING)
    import torch
    import torch.distributed as dist

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sglang.srt.model_executor.model_runner_components.weight_updater import WeightUpdater

    # SGLang's scheduler process has its default (TP) group before it joins the update group
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/default", rank=0, world_size=1)
        updater = WeightUpdater(
            tp_rank=args.tp_rank, device="cpu", gpu_id=0, model_config=None, custom_weight_loaders={},
            get_model=lambda: None, update_model_fields=lambda *a, **k: None, recapture_cuda_graph=lambda: None,
            get_model_runner=lambda: None)
        t0 = time.perf_counter()
        ok, message = updater.init_weights_update_group(
            args.host, args.port, args.rank_offset, args.world_size, "weight_update_group", backend="gloo")
        join_s = time.perf_counter() - t0
        if not ok:
            raise SystemExit(message)
        received: dict[str, torch.Tensor] = {}
        for call in json.loads(Path(args.calls).read_text()):
            for name, tensor in updater.receive_weights_from_distributed(
                    names=call["names"], dtypes=call["dtypes"], shapes=call["shapes"],
                    group_name="weight_update_group", load_format=call["load_format"]):
                received[f"{call['load_format']}/{name}"] = tensor.clone()
        torch.save(received, args.out)
        dist.destroy_process_group()
    print(json.dumps({"join_s": join_s, "tensors": len(received)}), flush=True)


if __name__ == "__main__":
    main()
