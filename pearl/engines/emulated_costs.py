"""Cost model of the emulated engine: per-iteration times of one worker, and their span sums.

Cost model (symbols: ``N_act`` active parameters, ``W`` weight bytes, ``W_d``/``W_e`` non-expert /
routed-expert weight bytes, ``E`` experts, ``k`` experts per token, ``L`` layers, ``H`` query
heads, ``d`` head dim, ``kv`` KV bytes per token, ``F = tp * bf16_tflops``, ``BW_w = tp * HBM *
weight_read_efficiency``, ``BW_kv = tp * HBM * kv_read_efficiency``, ``o_d = decode_step_s``,
``o_p = prefill_forward_s``; the constants come from ``EmulatorPhysics``, each defaulting to the
``HardwareSpec`` value: both efficiencies to ``decode_bw_efficiency``, both fixed costs to
``step_overhead_s``)::

    decode iteration, n running requests, total context C tokens:
        share(n)   = 1 - (1 - k/E)^n                 expected share of experts touched (uniform routing)
        moe(n)     = f + (1 - f) share(n)^g          fused-MoE read, kernel curve (f = moe_floor,
                                                     g = moe_exponent; f = 0, g = 1: share(n) itself)
        t_mem      = (W_d + W_e moe(n)) / BW_w + kv C / BW_kv
        t_compute  = (2 N_act n + 4 L H d C) / (F * decode_mfu)
        t_step     = o_d + max(t_mem, t_compute)     (roofline: the slower resource binds)
    prefill chunk, requests i with x_i new tokens over c_i tokens already in KV:
        t_chunk    = o_p + max((2 N_act sum x_i + 4 L H d sum x_i (c_i + x_i/2)) / (F * prefill_mfu),
                               (W_d + W_e moe(sum x_i)) / BW_w + kv sum(c_i + x_i) / BW_kv)
    mixed step (emulator.mixed_chunk: a chunk and n decoding requests of total context C in one pass):
        t_mix      = t_chunk of the parts plus n requests of 1 new token over C / n cached ones
                     (the weights are read once for both; compute and KV reads add)
    KV transfer of a prompt of p tokens:  interconnect_latency_s + p * kv / interconnect_gbs

Within a decode *span* (no arrival, no departure) ``C`` grows by ``n`` per iteration, so
``t_step(j) = o_d + max(a0 + a1 j, m0 + m1 j)`` and the span's duration ``S(K) = sum_{j<K}
t_step(j)`` has a closed form. A worker sleeps once per span until the first request finishes
(``K = min remaining tokens``) - never once per token. An arrival cuts the span at the next
iteration boundary; an abort returns exactly the tokens completed by the abort time (the largest
``j`` with ``S(j) <= elapsed``).

Public names: ``WorkerCosts``, ``span_sum``, ``steps_within``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pearl.config import EmulatorSpec, HardwareSpec, ModelSpec
from pearl.engines.emulated_physics import EmulatorPhysics, moe_curve
from pearl.engines.emulated_tables import CostTables, TableSpan, load_tables, resolve_model_id, table_key


@dataclass(frozen=True, slots=True)
class WorkerCosts:
    """The emulator's cost model for one worker (``tp`` GPUs); formulas in the module docstring."""

    overhead_s: float  # o_d, per decode iteration
    prefill_overhead_s: float  # o_p, per prefill forward
    dense_bytes: float
    expert_bytes: float
    n_experts: int
    experts_per_token: int
    kv_bytes: float
    bw: float  # bytes/s, weights (BW_w)
    kv_bw: float  # bytes/s, KV cache (BW_kv)
    moe_floor: float
    moe_exponent: float
    flops_per_token: float  # 2 N_act
    attn_flops_per_pair: float  # 4 L H d
    decode_flops: float  # F * decode_mfu
    prefill_flops: float  # F * prefill_mfu
    link_bw: float  # bytes/s
    link_latency_s: float
    kv_capacity_tokens: int

    @staticmethod
    def from_specs(model: ModelSpec, hw: HardwareSpec, emu: EmulatorSpec, tp: int = 1,
                   physics: EmulatorPhysics | None = None) -> WorkerCosts:
        ph = (physics or EmulatorPhysics()).resolved(hw, emu)
        total = model.total_params_b * 1e9 * model.dtype_bytes
        experts = model.expert_params_b * 1e9 * model.dtype_bytes if model.is_moe else 0.0
        mem = tp * hw.memory_gb * 1e9 * ph.value("memory_utilization", 0.0)
        if mem <= total:
            raise ValueError(f"{model.name} weights ({total / 1e9:.1f} GB) do not fit in {tp} x {hw.name}")
        f = tp * hw.bf16_tflops * 1e12
        hbm = tp * hw.hbm_bandwidth_tbs * 1e12
        return WorkerCosts(
            overhead_s=ph.value("decode_step_s", 0.0),
            prefill_overhead_s=ph.value("prefill_forward_s", 0.0),
            dense_bytes=total - experts,
            expert_bytes=experts,
            n_experts=model.n_experts,
            experts_per_token=model.experts_per_token,
            kv_bytes=float(model.kv_bytes_per_token),
            bw=hbm * ph.value("weight_read_efficiency", 0.0),
            kv_bw=hbm * ph.value("kv_read_efficiency", 0.0),
            moe_floor=ph.value("moe_floor", 0.0),
            moe_exponent=ph.value("moe_exponent", 1.0),
            flops_per_token=2.0 * model.active_params_b * 1e9,
            attn_flops_per_pair=4.0 * model.n_layers * model.n_heads * model.head_dim,
            decode_flops=f * emu.decode_mfu,
            prefill_flops=f * ph.value("prefill_mfu", 0.0),
            link_bw=hw.interconnect_gbs * 1e9,
            link_latency_s=hw.interconnect_latency_s,
            kv_capacity_tokens=int((mem - total) // model.kv_bytes_per_token),
        )

    def experts_touched(self, tokens: float) -> float:
        """touched(n) = E (1 - (1 - k/E)^n): expected distinct experts per layer (0 if dense)."""
        if not self.n_experts:
            return 0.0
        # base in [0, 1) (the config checks 1 <= k <= E), so a real float; typeshed types float ** float as Any
        untouched: float = (1.0 - self.experts_per_token / self.n_experts) ** max(tokens, 0.0)
        return self.n_experts * (1.0 - untouched)

    def weight_read_bytes(self, tokens: float) -> float:
        """W_d + W_e moe(tokens) (the MoE kernel curve of the module docstring)."""
        if not self.n_experts:
            return self.dense_bytes
        if self.moe_floor == 0.0 and self.moe_exponent == 1.0:
            return self.dense_bytes + self.expert_bytes * self.experts_touched(tokens) / self.n_experts
        share = moe_curve(tokens, self.n_experts, self.experts_per_token, self.moe_floor, self.moe_exponent)
        return self.dense_bytes + self.expert_bytes * share

    def _mem_s(self, weight_bytes: float, kv_bytes: float) -> float:
        """W / BW_w + KV / BW_kv (one division where both rates are the same: identical floats)."""
        if self.kv_bw == self.bw:
            return (weight_bytes + kv_bytes) / self.bw
        return weight_bytes / self.bw + kv_bytes / self.kv_bw

    def decode_line(self, n: int, context: float) -> tuple[float, float, float, float]:
        """(a0, a1, m0, m1): t_step(j) = o + max(a0 + a1 j, m0 + m1 j) for a span of n requests whose
        total context is ``context`` at j = 0 (it grows by n per iteration)."""
        a0 = (self.flops_per_token * n + self.attn_flops_per_pair * context) / self.decode_flops
        a1 = self.attn_flops_per_pair * n / self.decode_flops
        m0 = self._mem_s(self.weight_read_bytes(n), self.kv_bytes * context)
        m1 = self.kv_bytes * n / self.kv_bw
        return a0, a1, m0, m1

    def decode_step_s(self, n: int, context: float) -> float:
        a0, _, m0, _ = self.decode_line(n, context)
        return self.overhead_s + max(a0, m0)

    def prefill_chunk_s(self, parts: list[tuple[int, int]]) -> float:
        """``parts``: (new tokens x_i, tokens already in KV c_i) per request in the chunk."""
        x = sum(p[0] for p in parts)
        pairs = sum(p[0] * (p[1] + p[0] / 2.0) for p in parts)
        ctx = sum(p[0] + p[1] for p in parts)
        compute = (self.flops_per_token * x + self.attn_flops_per_pair * pairs) / self.prefill_flops
        memory = self._mem_s(self.weight_read_bytes(x), self.kv_bytes * ctx)
        return self.prefill_overhead_s + max(compute, memory)

    def mixed_step_s(self, parts: list[tuple[int, int]], n: int, context: float) -> float:
        """The chunk ``parts`` with n decoding requests holding ``context`` tokens in all, one pass."""
        return self.prefill_chunk_s(parts + [(1, round(context / n))] * n if n > 0 else parts)

    def transfer_s(self, tokens: int) -> float:
        return self.link_latency_s + tokens * self.kv_bytes / self.link_bw

    def span(self, n: int, context: float, k_max: int) -> LineSpan:
        """The decode span of n requests holding ``context`` tokens (``k_max`` unused: closed form)."""
        a0, a1, m0, m1 = self.decode_line(n, context)
        return LineSpan((self.overhead_s, a0, a1, m0, m1))


class LineSpan:
    """A decode span of the datasheet model: ``S(k) = span_sum``, its inverse ``steps_within``."""

    __slots__ = ("line",)

    def __init__(self, line: tuple[float, float, float, float, float]) -> None:
        self.line = line

    def total(self, k: int) -> float:
        return span_sum(k, *self.line)

    def within(self, elapsed: float, k_max: int) -> int:
        return steps_within(elapsed, k_max, self.line)


@dataclass(frozen=True)
class MeasuredCosts:
    """The emulator's cost model from the measured database (``emulated_tables``): decode
    iterations and prefill chunks from ``CostTables``; the KV pool and the KV link stay ours
    (``kv_capacity_tokens = (tp memory u - W) / kv``, transfer as ``WorkerCosts``)."""

    tables: CostTables
    kv_bytes: float
    kv_capacity_tokens: int
    link_bw: float
    link_latency_s: float

    @staticmethod
    def from_specs(model: ModelSpec, hw: HardwareSpec, emu: EmulatorSpec, tp: int = 1,
                   physics: EmulatorPhysics | None = None, cache: Path | None = None) -> MeasuredCosts:
        ph = (physics or EmulatorPhysics()).resolved(hw, emu)
        total = model.weight_bytes
        mem = tp * hw.memory_gb * 1e9 * ph.value("memory_utilization", 0.0)
        if mem <= total:
            raise ValueError(f"{model.name} weights ({total / 1e9:.1f} GB) do not fit in {tp} x {hw.name} at "
                             f"memory_utilization {ph.value('memory_utilization', 0.0)}: raise cluster.tp_size")
        key = table_key(resolve_model_id(model.name, emu.database_model), hw.database_system or hw.name,
                        emu.backend, emu.backend_version, tp)
        return MeasuredCosts(
            tables=load_tables(key, cache),
            kv_bytes=float(model.kv_bytes_per_token),
            kv_capacity_tokens=int((mem - total) // model.kv_bytes_per_token),
            link_bw=hw.interconnect_gbs * 1e9,
            link_latency_s=hw.interconnect_latency_s,
        )

    def decode_step_s(self, n: int, context: float) -> float:
        """One decode iteration of n requests holding ``context`` tokens in all."""
        return self.tables.decode_step_s(n, context / n) if n > 0 else 0.0

    def prefill_chunk_s(self, parts: list[tuple[int, int]]) -> float:
        return self.tables.prefill_chunk_s(parts)

    def mixed_step_s(self, parts: list[tuple[int, int]], n: int, context: float) -> float:
        """The chunk ``parts`` with n decoding requests holding ``context`` tokens in all, one pass
        (``CostTables.mixed_step_s``)."""
        return self.tables.mixed_step_s(parts, n, context / n if n > 0 else 0.0)

    def transfer_s(self, tokens: int) -> float:
        return self.link_latency_s + tokens * self.kv_bytes / self.link_bw

    def span(self, n: int, context: float, k_max: int) -> TableSpan:
        return self.tables.span(n, context, k_max)


def worker_costs(model: ModelSpec, hw: HardwareSpec, emu: EmulatorSpec, tp: int = 1,
                 physics: EmulatorPhysics | None = None) -> WorkerCosts | MeasuredCosts:
    """The cost model ``emu.costs`` names: ``database`` (measured tables) or ``datasheet``."""
    if emu.costs == "database":
        return MeasuredCosts.from_specs(model, hw, emu, tp, physics)
    return WorkerCosts.from_specs(model, hw, emu, tp, physics)


def span_sum(k: int, o: float, a0: float, a1: float, m0: float, m1: float) -> float:
    """S(k) = sum_{j=0}^{k-1} (o + max(a0 + a1 j, m0 + m1 j)), closed form (two linear pieces)."""
    if k <= 0:
        return 0.0

    def lin(c0: float, c1: float, lo: int, hi: int) -> float:  # sum_{j=lo}^{hi-1} c0 + c1 j
        m = hi - lo
        return m * c0 + c1 * (lo + hi - 1) * m / 2.0 if m > 0 else 0.0

    # d(j) = (a0 - m0) + (a1 - m1) j; compute binds where d(j) >= 0.
    d0, d1 = a0 - m0, a1 - m1
    if d1 == 0:
        body = lin(a0, a1, 0, k) if d0 >= 0 else lin(m0, m1, 0, k)
    else:
        x = -d0 / d1  # crossover
        split = min(max(int(np.ceil(x)), 0), k)
        if d1 > 0:  # memory binds before the crossover, compute after
            body = lin(m0, m1, 0, split) + lin(a0, a1, split, k)
        else:
            body = lin(a0, a1, 0, split) + lin(m0, m1, split, k)
    return k * o + body


def steps_within(elapsed: float, k_max: int, line: tuple[float, float, float, float, float]) -> int:
    """The largest j <= k_max with S(j) <= elapsed.

    Closed form per linear piece: the iterations from ``start`` cost ``A + B i`` (i = 0, 1, ...), so
    m of them take ``A m + B m (m - 1) / 2``; the largest m within a budget E is the floor of the
    positive root of ``B/2 m^2 + (A - B/2) m - E = 0``. The result is then checked (and nudged by
    one) against the exact sum ``_span_sum`` so float rounding never miscounts a token.
    """
    o, a0, a1, m0, m1 = line
    eps = 1e-9 * max(1.0, elapsed)
    d0, d1 = a0 - m0, a1 - m1
    if d1 == 0:
        split = k_max
        first = (a0, a1) if d0 >= 0 else (m0, m1)
        second = first
    else:
        split = min(max(int(np.ceil(-d0 / d1)), 0), k_max)
        first, second = ((m0, m1), (a0, a1)) if d1 > 0 else ((a0, a1), (m0, m1))

    def fit(c0: float, c1: float, start: int, budget: float, limit: int) -> int:
        big_a = o + c0 + c1 * start
        if budget <= 0 or limit <= 0:
            return 0
        if c1 <= 0:
            m = int(budget / big_a) if big_a > 0 else limit
        else:
            h = big_a - c1 / 2.0
            m = int((-h + math.sqrt(h * h + 2.0 * c1 * budget)) / c1)
        return min(max(m, 0), limit)

    k = fit(*first, 0, elapsed + eps, split)
    if k == split and split < k_max:
        k = split + fit(*second, split, elapsed + eps - span_sum(split, *line), k_max - split)
    while k < k_max and span_sum(k + 1, *line) <= elapsed + eps:
        k += 1
    while k > 0 and span_sum(k, *line) > elapsed + eps:
        k -= 1
    return k
