"""Trainer side of the gloo weight broadcast to vLLM workers (rank 0 of a private group).

Life cycle (driven by ``VllmEngine.broadcast_weights``; blocking calls run in a thread)::

    b = GlooBroadcaster(host, world_size)     # binds a free port, nothing else
    b.connect()                               # TCPStore master + ProcessGroupGloo rank 0; blocks until
                                              # every worker joined (pearl_join_group on each)
    b.send(buckets)                           # one broadcast per dtype bucket (see ``bucketize``)
    b.close()

``bucketize`` turns a state dict into the wire layout shared with
``pearl.engines.vllm_worker_ext``: ``[[dtype, [[name, shape], ...]], ...]`` plus one flat tensor per
dtype, concatenated in layout order.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from pearl.procutil import free_port


def bucketize(state: Mapping[str, Any]) -> tuple[list[Any], list[Any]]:
    """``(layout, flats)``: tensors grouped by dtype (first-seen order), each group flattened."""
    import torch

    groups: dict[str, list[tuple[str, torch.Tensor]]] = {}
    for name, t in state.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"state dict entry {name!r} is a {type(t).__name__}, not a tensor")
        groups.setdefault(str(t.dtype).removeprefix("torch."), []).append((name, t.detach().to("cpu")))
    layout: list[Any] = []
    flats: list[Any] = []
    for dtype, items in groups.items():
        layout.append([dtype, [[n, list(t.shape)] for n, t in items]])
        flats.append(torch.cat([t.reshape(-1) for _, t in items]))
    return layout, flats


class GlooBroadcaster:
    """Rank 0 of a ``world_size`` gloo group on ``host``:``port`` (``port`` 0 picks a free one)."""

    def __init__(self, host: str, world_size: int, port: int = 0, timeout_s: float = 120.0) -> None:
        if world_size < 2:
            raise ValueError(f"world_size={world_size}: a broadcast needs the trainer and at least one worker")
        self.host = host
        self.port = port or free_port(host)
        self.world_size = world_size
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self._store: Any = None
        self._group: Any = None

    def connect(self) -> None:
        import torch.distributed as dist

        # torch.distributed re-exports TCPStore from torch._C without marking it public (stub gap)
        self._store = dist.TCPStore(  # type: ignore[attr-defined]
            self.host, self.port, self.world_size, is_master=True, timeout=self.timeout)
        self._group = dist.ProcessGroupGloo(self._store, 0, self.world_size, self.timeout)

    def send(self, flats: list[Any]) -> None:
        if self._group is None:
            raise RuntimeError("GlooBroadcaster.send before connect()")
        for flat in flats:
            self._group.broadcast(flat, 0).wait()

    def close(self) -> None:
        self._group = None
        self._store = None
