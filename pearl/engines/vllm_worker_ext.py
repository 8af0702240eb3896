"""vLLM worker extension: receive a trainer's weight broadcast over gloo (CPU) and apply it.

Loaded inside each vLLM worker process with ``--worker-extension-cls
pearl.engines.vllm_worker_ext.PearlWorkerExtension``; its methods are called through the dev-mode
``POST /collective_rpc {"method": ..., "kwargs": {...}}`` route. Life cycle per broadcast::

    pearl_join_group(host, port, rank, world_size, timeout_s)   # TCPStore client + ProcessGroupGloo
    pearl_receive(layout)                                       # one broadcast per dtype bucket,
                                                                # then reload_weights(iterator)
    pearl_leave_group()                                         # drop the group

The trainer side is ``pearl.engines.vllm_broadcast.GlooBroadcaster`` (rank 0). Tensors travel as one
flat buffer per dtype (``layout`` = ``[[dtype, [[name, shape], ...]], ...]`` in send order), which
costs one collective per dtype instead of one per tensor. The group is a private
``ProcessGroupGloo`` built on its own ``TCPStore``: it never touches vLLM's default process group.
Weights are applied with vLLM's own ``reload_weights(weights_iterator=...)``, so checkpoint names
(``model.layers.0.self_attn.q_proj.weight`` ...) are mapped to vLLM's fused layers by the model's
loader. Models must be untied (``pearl.models``): a tied ``lm_head`` would keep stale weights.
"""

from __future__ import annotations

import datetime
from typing import Any


class PearlWorkerExtension:
    """Mixed into vLLM's worker class; ``self`` is the worker (``reload_weights`` comes from it)."""

    _pearl_group: Any = None
    _pearl_store: Any = None

    def pearl_join_group(self, host: str, port: int, rank: int, world_size: int, timeout_s: float = 120.0) -> str:
        import torch.distributed as dist

        timeout = datetime.timedelta(seconds=float(timeout_s))
        self._pearl_store = dist.TCPStore(str(host), int(port), int(world_size), is_master=False, timeout=timeout)
        self._pearl_group = dist.ProcessGroupGloo(self._pearl_store, int(rank), int(world_size), timeout)
        return f"joined rank {rank}/{world_size}"

    def pearl_receive(self, layout: list[Any]) -> int:
        """Receive every dtype bucket of ``layout`` from rank 0 and reload; returns the tensor count."""
        import torch

        if self._pearl_group is None:
            raise RuntimeError("pearl_receive before pearl_join_group: join the broadcast group first")
        named: list[tuple[str, torch.Tensor]] = []
        for dtype_name, entries in layout:
            dtype = getattr(torch, str(dtype_name))
            numels = [_numel(shape) for _, shape in entries]
            flat = torch.empty(sum(numels), dtype=dtype)
            self._pearl_group.broadcast(flat, 0).wait()
            offset = 0
            for (name, shape), n in zip(entries, numels, strict=True):
                named.append((str(name), flat[offset:offset + n].view(*shape)))
                offset += n
        self.reload_weights(weights_iterator=iter(named))  # type: ignore[attr-defined]
        return len(named)

    def pearl_leave_group(self) -> None:
        self._pearl_group = None
        self._pearl_store = None


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n
