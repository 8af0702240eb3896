"""Weight broadcast from trainer rank 0 to inference servers over a private gloo / NCCL group.

The group is *not* the trainer's default process group: it is a ``TCPStore`` hosted by the sender
(rank 0) plus a process group built on it, so inference servers join without being part of
``torch.distributed``'s world. Two forms, one per receiver:

- ``group_name=None`` (vLLM, ``pearl.engines.vllm_worker_ext``): a ``ProcessGroupGloo`` /
  ``ProcessGroupNCCL`` on the raw store;
- ``group_name="weight_update_group"`` (SGLang): the form of SGLang's ``init_custom_process_group``
  (``srt/utils/common.py``, which its weight updater calls for ``/init_weights_update_group``): the
  store wrapped in ``PrefixStore(group_name)`` and the group made by torch's
  ``_new_process_group_helper`` under that name. The two forms wait on different store keys, so a
  member of one never meets a member of the other. Each SGLang server joins with one rank per TP
  rank (``rank_offset + tp_rank``): ``sglang_ranks`` gives the world size and the offsets.

Wire format = the one ``pearl.engines.vllm_worker_ext.PearlWorkerExtension`` receives (and
``pearl.engines.vllm_broadcast.bucketize`` produces): a *layout* sent out of band (HTTP, JSON)::

    layout = [[dtype, [[name, shape], ...]], ...]     # buckets in send order

followed by one broadcast per bucket of the bucket's tensors flattened and concatenated in layout
order. ``layout_of(..., per_tensor=False)`` makes one bucket per dtype (fewest collectives: the
vLLM path); ``per_tensor=True`` one bucket per tensor, the order SGLang's default
``/update_weights_from_distributed {names, dtypes, shapes}`` receives (one broadcast per name, each
of its dtype and shape). SGLang's ``load_format="flattened_bucket"`` receives one bucket as a
single ``uint8`` tensor of the tensors' bytes back to back (``FlattenedTensorBucket``,
``srt/weight_sync/tensor_bucket.py``): ``send_weights`` sends each bucket's bytes when the group
was opened with ``load_format="flattened_bucket"`` (one dtype per bucket keeps every tensor's byte
offset aligned, which SGLang checks).

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
    #: None: PEARL's raw-store form (vLLM); else SGLang's group name
    group_name: str | None = None
    #: SGLang's receive format: None (one broadcast per tensor) or "flattened_bucket"
    load_format: str | None = None

    def close(self) -> None:
        if self.group_name is not None and self.pg is not None:
            dist.destroy_process_group(self.pg)  # frees its name for the next group of this process
        self.pg = None
        self.store = None


def sglang_ranks(tp_sizes: list[int]) -> tuple[int, list[int]]:
    """``(world_size, rank_offsets)`` of a group of the trainer (rank 0) and SGLang servers with
    ``tp_sizes[i]`` TP ranks each: server ``i`` joins at ``rank_offset = 1 + sum(tp_sizes[:i])``
    and ``world_size = 1 + sum(tp_sizes)`` (every TP rank receives)."""
    if not tp_sizes or any(t < 1 for t in tp_sizes):
        raise BroadcastError(f"every server needs >= 1 TP rank, got {tp_sizes}")
    offsets, nxt = [], 1
    for t in tp_sizes:
        offsets.append(nxt)
        nxt += t
    return nxt, offsets


def open_group(
    host: str, port: int, rank: int, world_size: int, backend: str = "gloo", timeout_s: float = 300.0,
    group_name: str | None = None, load_format: str | None = None,
) -> WeightGroup:
    """Join (rank 0: host) the broadcast group; blocks until all ``world_size`` members joined.
    ``group_name`` makes SGLang's form of the group (module docstring); ``load_format`` is the
    format its receivers are told (None or ``"flattened_bucket"``)."""
    if world_size < 2 or not 0 <= rank < world_size:
        raise BroadcastError(f"need world_size >= 2 and 0 <= rank < world_size, got rank={rank}, "
                             f"world_size={world_size}")
    if load_format not in (None, "flattened_bucket") or (load_format is not None and group_name is None):
        raise BroadcastError(f"load_format {load_format!r} needs SGLang's group form (a group_name) and is "
                             "None or 'flattened_bucket'")
    timeout = timedelta(seconds=timeout_s)
    if backend not in ("gloo", "nccl"):
        raise BroadcastError(f"unknown backend {backend!r}; use 'gloo' (CPU) or 'nccl' (GPUs)")
    try:
        # torch.distributed re-exports TCPStore from torch._C without marking it public (stub gap)
        store = dist.TCPStore(  # type: ignore[attr-defined]
            host, port, world_size, is_master=(rank == 0), timeout=timeout)
        if group_name is not None:
            return _sglang_group(store, rank, world_size, backend, timeout, group_name, load_format)
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


def _sglang_group(store: Any, rank: int, world_size: int, backend: str, timeout: timedelta, group_name: str,
                  load_format: str | None) -> WeightGroup:
    """The group as SGLang's ``init_custom_process_group`` makes it on the other side."""
    from torch.distributed import distributed_c10d as c10d

    prefixed = c10d.PrefixStore(group_name, store)
    pg, _ = c10d._new_process_group_helper(  # the helper SGLang's receiver uses (no public equivalent)
        world_size, rank, [], dist.Backend(backend), prefixed, group_name=group_name,  # type: ignore[arg-type]
        backend_options=None, timeout=timeout)
    c10d._world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    device = torch.device("cpu") if backend == "gloo" else torch.device("cuda", torch.cuda.current_device())
    return WeightGroup(rank, world_size, store, pg, device, group_name, load_format)


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
    as_bytes = group.load_format == "flattened_bucket"
    if group.group_name is not None and not as_bytes and any(len(entries) != 1 for _, entries in layout):
        raise BroadcastError("SGLang's default format receives one tensor per broadcast: use "
                             "layout_of(..., per_tensor=True) or open the group with load_format='flattened_bucket'")
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
        if as_bytes:
            flat = flat.view(torch.uint8)
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
