"""The weight-broadcast wire format (pearl/train/broadcast.py) between two members in threads."""

from __future__ import annotations

import threading

import pytest
import torch

from pearl.train.broadcast import BroadcastError, layout_of, open_group, recv_tensors, send_weights
from pearl.train.client import free_port


def test_layout_groups_by_dtype_or_per_tensor() -> None:
    state = {"a": torch.zeros(2, 3), "step": torch.zeros(1, dtype=torch.int64), "b": torch.zeros(4)}
    assert layout_of(state, torch.bfloat16) == [
        ["bfloat16", [["a", [2, 3]], ["b", [4]]]], ["int64", [["step", [1]]]]]
    assert layout_of(state, per_tensor=True) == [
        ["float32", [["a", [2, 3]]]], ["int64", [["step", [1]]]], ["float32", [["b", [4]]]]]


def test_send_and_receive_round_trip_with_cast() -> None:
    torch.manual_seed(0)
    state = {"w": torch.randn(3, 4), "v": torch.randn(7), "ids": torch.arange(5)}
    layout = layout_of(state, torch.bfloat16)
    port = free_port()
    got: dict[str, torch.Tensor] = {}

    def receiver() -> None:
        g = open_group("127.0.0.1", port, 1, 2, timeout_s=60)
        got.update({n: t.clone() for n, t in recv_tensors(g, layout)})
        g.close()

    th = threading.Thread(target=receiver)
    th.start()
    g = open_group("127.0.0.1", port, 0, 2, timeout_s=60)
    stats = send_weights(g, state, layout)
    th.join(60)
    assert (stats.tensors, stats.buckets, stats.bytes) == (3, 2, (12 + 7) * 2 + 5 * 8)
    for k, v in state.items():
        assert torch.equal(got[k], v.to(torch.bfloat16) if v.is_floating_point() else v), k
    with pytest.raises(BroadcastError, match="'missing'"):
        send_weights(g, state, [["float32", [["missing", [1]]]]])
    g.close()


def test_bad_membership_is_refused() -> None:
    with pytest.raises(BroadcastError, match="world_size >= 2"):
        open_group("127.0.0.1", 1, 0, 1)
