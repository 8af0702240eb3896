"""The trainer's weight group (``pearl.train.broadcast``) joined by SGLang's own receiver code.

Two receiver processes play one SGLang server with two TP ranks (``tests/contract/
sglang_receiver.py``: SGLang's ``WeightUpdater.init_weights_update_group`` ->
``init_custom_process_group``, then ``receive_weights_from_distributed``) on gloo; the trainer
side is ``open_group(..., group_name="weight_update_group")`` + ``send_weights``. Both of SGLang's
formats arrive bit-exact: the default (one broadcast per tensor, ``layout_of(per_tensor=True)``)
and ``flattened_bucket`` (one uint8 broadcast per dtype bucket).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from pearl.train.broadcast import BroadcastError, WeightGroup, layout_of, open_group, send_weights, sglang_ranks
from pearl.train.client import free_port

from .sglang_env import ROOT

pytestmark = pytest.mark.sglang_contract


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return {"model.embed_tokens.weight": torch.randn(64, 16, generator=g),
            "model.layers.0.mlp.up_proj.weight": torch.randn(32, 16, generator=g),
            "model.norm.weight": torch.randn(16, generator=g),
            "lm_head.weight": torch.randn(64, 16, generator=g),
            "step": torch.arange(3, dtype=torch.int64)}


def _calls(layout: list, load_format: str | None) -> list[dict]:
    """The ``/update_weights_from_distributed`` bodies for ``layout``: one per bucket."""
    return [{"names": [n for n, _ in entries], "dtypes": [d] * len(entries), "shapes": [s for _, s in entries],
             "load_format": load_format} for d, entries in layout]


def test_sglang_receivers_join_and_get_both_formats_bit_exact(sglang_installed: None, tmp_path: Path) -> None:
    state = _state()
    per_tensor = layout_of(state, torch.bfloat16, per_tensor=True)
    bucketed = layout_of(state, torch.bfloat16)
    calls = _calls(per_tensor, None) + _calls(bucketed, "flattened_bucket")
    (tmp_path / "calls.json").write_text(json.dumps(calls))
    world, offsets = sglang_ranks([2])
    assert (world, offsets) == (3, [1])
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen(
        [sys.executable, "-m", "tests.contract.sglang_receiver", "--host", "127.0.0.1", "--port", str(port),
         "--rank-offset", str(offsets[0]), "--world-size", str(world), "--tp-rank", str(k),
         "--calls", str(tmp_path / "calls.json"), "--out", str(tmp_path / f"tp{k}.pt")],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for k in range(2)]
    group: list[WeightGroup] = []
    opener = threading.Thread(target=lambda: group.append(
        open_group("127.0.0.1", port, 0, world, "gloo", timeout_s=240, group_name="weight_update_group")))
    opener.start()
    opener.join(250)
    try:
        assert group, "the trainer side never joined"
        g = group[0]
        with pytest.raises(BroadcastError, match="one tensor per broadcast"):
            send_weights(g, state, bucketed)  # SGLang's default format takes no multi-tensor bucket
        sent_pt = send_weights(g, state, per_tensor)
        sent_b = send_weights(dataclasses.replace(g, load_format="flattened_bucket"), state, bucketed)
    finally:
        outs = [p.communicate(timeout=240) for p in procs]
    for p, (_out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    nbytes = sum(t.numel() * (2 if t.is_floating_point() else 8) for t in state.values())
    assert (sent_pt.tensors, sent_pt.buckets, sent_pt.bytes) == (5, 5, nbytes)
    assert (sent_b.tensors, sent_b.buckets, sent_b.bytes) == (5, 2, nbytes)
    for k in range(2):
        got = torch.load(tmp_path / f"tp{k}.pt")
        assert len(got) == 10
        for fmt in ("None", "flattened_bucket"):
            for name, t in state.items():
                want = t.to(torch.bfloat16) if t.is_floating_point() else t
                r = got[f"{fmt}/{name}"]
                assert r.dtype == want.dtype and r.shape == want.shape, (fmt, name)
                assert torch.equal(r.view(torch.uint8) if r.dtype.itemsize == 1 else r, want), (fmt, name)
        report = json.loads(outs[k][0].strip().splitlines()[-1])
        assert report["tensors"] == 10
        print(f"tp{k}: joined in {report['join_s']:.2f} s; {sent_pt.bytes + sent_b.bytes} bytes received")
    g.close()


def test_pearl_form_and_sglang_form_do_not_meet(sglang_installed: None) -> None:
    """PEARL's raw-store group and SGLang's prefixed one wait on different keys: a raw member never
    completes a rendezvous with a prefixed one (both time out instead of exchanging tensors)."""
    port = free_port()
    errors: list[BaseException] = []

    def raw() -> None:
        try:
            open_group("127.0.0.1", port, 1, 2, "gloo", timeout_s=3)
        except BroadcastError as e:
            errors.append(e)

    th = threading.Thread(target=raw)
    th.start()
    with pytest.raises(BroadcastError, match="could not join"):
        open_group("127.0.0.1", port, 0, 2, "gloo", timeout_s=3, group_name="weight_update_group")
    th.join(30)
    assert len(errors) == 1
