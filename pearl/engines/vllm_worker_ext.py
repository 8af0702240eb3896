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

import contextlib
import datetime
import os
from typing import Any

#: environment variable (set by ``VllmServer.env``) with the NIXL progress thread's pause, in µs
NIXL_DELAY_ENV = "PEARL_NIXL_PROGRESS_DELAY_US"


def pace_nixl_progress_thread(delay_us: int) -> bool:
    """Make NIXL's progress thread pause ``delay_us`` µs between progress passes (vLLM's KV
    connector creates its agent with ``pthrDelay = 0``: the thread spins).

    Measured on this 2-core CPU host (tiny Qwen3, 1 prefill + 1 decode server, one core each): with
    ``pthrDelay = 0`` every idle PD server kept a core at 100 % (the spin of NIXL's progress thread),
    so the two servers starved each other and every other process on the machine (4 PD requests of
    24 tokens: 3.3-33 s, against 0.35 s colocated). The nixl Python API hard-codes the delay, so the
    agent constructor of its bindings is wrapped: an agent created with a progress thread and no
    delay gets ``delay_us``. Runs at import of this module, which vLLM performs in each worker
    process before the KV connector creates its agent. Returns whether the wrap was installed.
    """
    if delay_us <= 0:
        return False
    try:
        # the platform package (nixl_cu12 ...) behind the ``nixl`` alias; it ships no type information
        import nixl._api as api  # type: ignore[import-untyped]
    except ImportError:
        return False
    bindings = getattr(api, "nixlBind", None)
    create = getattr(bindings, "nixlAgent", None)
    if create is None or getattr(create, "_pearl_paced", False):
        return create is not None

    def paced_agent(name: str, config: Any) -> Any:
        if getattr(config, "useProgThread", False) and getattr(config, "pthrDelay", 1) == 0:
            config.pthrDelay = delay_us
        return create(name, config)

    paced_agent._pearl_paced = True  # type: ignore[attr-defined]
    bindings.nixlAgent = paced_agent  # type: ignore[union-attr]
    return True


with contextlib.suppress(ValueError):
    pace_nixl_progress_thread(int(os.environ.get(NIXL_DELAY_ENV, "0") or 0))


class PearlWorkerExtension:
    """Mixed into vLLM's worker class; ``self`` is the worker (``reload_weights`` comes from it)."""

    _pearl_group: Any = None
    _pearl_store: Any = None

    def pearl_join_group(self, host: str, port: int, rank: int, world_size: int, timeout_s: float = 120.0) -> str:
        import torch.distributed as dist

        timeout = datetime.timedelta(seconds=float(timeout_s))
        # torch.distributed re-exports TCPStore from torch._C without marking it public (stub gap)
        self._pearl_store = dist.TCPStore(  # type: ignore[attr-defined]
            str(host), int(port), int(world_size), is_master=False, timeout=timeout)
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
