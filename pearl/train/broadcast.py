"""Weight broadcast from trainer rank 0 to inference servers over a private gloo / NCCL group.

The group is *not* the trainer's default process group: it is a ``TCPStore`` hosted by the sender
(rank 0) plus a ``ProcessGroupGloo`` (CPU) or ``ProcessGroupNCCL`` (GPUs) built on it directly, so
inference servers join without being part of ``torch.distributed``'s world.

Wire format = the one ``pearl.engines.vllm_worker_ext.PearlWorkerExtension`` receives (and
``pearl.engines.vllm_broadcast.bucketize`` produces): a *layout* sent out of band (HTTP, JSON)::

    layout = [[dtype, [[name, shape], ...]], ...]     # buckets in send order

followed by one broadcast per bucket of the bucket's tensors flattened and concatenated in layout
order. ``layout_of(..., per_tensor=False)`` makes one bucket per dtype (fewest collectives: the
vLLM path); ``per_tensor=True`` one bucket per tensor, the order SGLang's
``/update_weights_from_distributed {names, dtypes, shapes}`` receives.

Life cycle (the controller drives both sides concurrently)::

    trainer rank 0 (TrainerClient)                inference servers (ranks 1..N)
    layout = weight_layout()            --HTTP-->  (layout kept for the receive call)
    open_group(host, port, 0, N+1)    <-rendezvous-> pearl_join_group(host, port, i, N+1)
    per update: send_weights(g, state, layout) --> pearl_receive(layout) -> reload_weights
    group.close()                                  pearl_leave_group()

``recv_tensors`` is the receiving side for any other process (tests, benchmarks).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

Layout = list[list[Any]]  # [[dtype, [[name, shape], ...]], ...]


class BroadcastError(RuntimeError):
    """The weight broadcast group could not be formed or a transfer failed."""


@dataclass
class WeightGroup:
    """One member of a broadcast group (rank 0 sends)."""

    rank: int
    world_size: int
    store: Any
    pg: Any
    device: torch.device

    def close(self) -> None:
        self.pg = None
        self.store = None


def open_group(
    host: str, port: int, rank: int, world_size: int, backend: str = "gloo", timeout_s: float = 300.0
) -> WeightGroup:
    """Join (rank 0: host) the broadcast group; blocks until all ``world_size`` members joined."""
    if world_size < 2 or not 0 <= rank < world_size:
        raise BroadcastError(f"need world_size >= 2 and 0 <= rank < world_size, got rank={rank}, "
                             f"world_size={world_size}")
    timeout = timedelta(seconds=timeout_s)
    try:
        # torch.distributed re-exports TCPStore from torch._C without marking it public (stub gap)
        store = dist.TCPStore(  # type: ignore[attr-defined]
            host, port, world_size, is_master=(rank == 0), timeout=timeout)
        if backend == "gloo":
            pg: Any = dist.ProcessGroupGloo(store, rank, world_size, timeout)
            device = torch.device("cpu")
        elif backend == "nccl":
            pg = dist.ProcessGroupNCCL(store, rank, world_size)  # type: ignore[call-arg]  # stub omits options' default
            device = torch.device("cuda", torch.cuda.current_device())
        else:
            raise BroadcastError(f"unknown backend {backend!r}; use 'gloo' (CPU) or 'nccl' (GPUs)")
    except (RuntimeError, dist.DistError) as e:
        raise BroadcastError(
            f"rank {rank}/{world_size} could not join the weight group at {host}:{port} ({backend}): {e}"
        ) from e
    return WeightGroup(rank, world_size, store, pg, device)


def layout_of(state: Mapping[str, torch.Tensor], dtype: torch.dtype | None = None,
              per_tensor: bool = False) -> Layout:
    """The layout of ``state`` as it will be sent (floating tensors cast to ``dtype`` if given)."""
    buckets: dict[str, list[list[Any]]] = {}
    out: Layout = []
    for name, t in state.items():
        dt = dtype if dtype is not None and t.is_floating_point() else t.dtype
        dname = str(dt).removeprefix("torch.")
        entry = [name, list(t.shape)]
        if per_tensor:
            out.append([dname, [entry]])
        else:
            buckets.setdefault(dname, []).append(entry)
    if not per_tensor:
        out = [[d, entries] for d, entries in buckets.items()]
    return out


@dataclass(frozen=True)
class BroadcastStats:
    tensors: int
    buckets: int
    bytes: int
    seconds: float


def send_weights(group: WeightGroup, state: Mapping[str, torch.Tensor], layout: Layout) -> BroadcastStats:
    """Broadcast ``state`` bucket by bucket in ``layout`` order (rank 0 only)."""
    if group.rank != 0:
        raise BroadcastError(f"only rank 0 sends weights; this member is rank {group.rank}")
    t0 = time.perf_counter()
    total = n = 0
    for dname, entries in layout:
        dt = getattr(torch, dname)
        parts = []
        for name, shape in entries:
            if name not in state:
                raise BroadcastError(f"layout names {name!r} but the state has no such tensor")
            t = state[name].detach()
            if list(t.shape) != list(shape):
                raise BroadcastError(f"{name!r}: layout shape {shape} != tensor shape {list(t.shape)}")
            parts.append(t.to(group.device, dt).reshape(-1))
        flat = torch.cat(parts)
        group.pg.broadcast(flat, 0).wait()
        total += flat.numel() * flat.element_size()
        n += len(entries)
    return BroadcastStats(n, len(layout), total, time.perf_counter() - t0)


def recv_tensors(group: WeightGroup, layout: Layout) -> Iterator[tuple[str, torch.Tensor]]:
    """Receive in ``layout`` order, yielding ``(name, tensor)`` as each bucket arrives. Every bucket
    must be consumed (the broadcasts are collective); tensors are views of the bucket buffer."""
    for dname, entries in layout:
        dt = getattr(torch, dname)
        numels = [_numel(shape) for _, shape in entries]
        flat = torch.empty(sum(numels), dtype=dt, device=group.device)
        group.pg.broadcast(flat, 0).wait()
        off = 0
        for (name, shape), k in zip(entries, numels, strict=True):
            yield str(name), flat[off : off + k].view(*shape)
            off += k


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n
