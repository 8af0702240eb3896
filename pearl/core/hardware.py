"""The cost surface of one worker (``tp`` GPUs): prefill, decode step and KV transfer.

``HardwareProfile`` holds the coefficients and the three costs, each written once. Every cost
takes scalars or numpy arrays (they broadcast) and returns the same kind: the makespan models
evaluate it over candidates x turn groups, the fitting and the router for one request.

* prefill of ``x`` new tokens on top of ``c`` cached tokens (compute-bound)::

      P(x, c) = a0 + a1 x + a2 x (c + x / 2)

  ``a1 = 2 N_active / F`` (2 FLOPs per active parameter per token), ``a2 = 4 n_layers n_heads
  head_dim / F`` (QK^T and AV over the causal context), ``F = tp * peak * MFU``, ``a0`` the
  per-iteration overhead. Where the prefilled turn is a mixture whose mean tokens do not give the
  mean bilinear term (``workload.colocated_tokens``), the caller passes that term
  ``q = E[x (c + x / 2)]`` and ``P = a0 + a1 x + a2 q``.
* one decode iteration of a batch of ``n`` sequences of mean context ``L``: a roofline, the slower
  of the memory reads and the compute (they overlap)::

      tau(n, L) = max( b0 + b_e f_E(n) + b2 n L,      memory: weights, experts, KV reads
                       a0 + n (b1 + b3 L) )            compute: matmuls, attention
      f_E(n)    = f + (1 - f) (1 - (1 - k/E)^n)          routed experts read by n tokens (0 if dense)

  ``1 - (1 - k/E)^n`` is the share of the ``E`` experts that ``n`` tokens of ``k`` experts each
  touch; ``f`` (``HardwareSpec.moe_kernel_floor``) the fused-MoE kernel's floor, the share of a
  full expert read that one token already costs (0: the plain count; SGLang's H200 kernel table:
  0.165, ``emulated_physics.fit_moe_curve``). ``b0 = W_dense / BW + overhead`` (non-expert weights
  read once per step), ``b_e = W_experts / BW``, ``b2 = kv_bytes_per_token / BW`` (KV read), ``BW = tp * HBM * efficiency``; ``b1 = 2
  N_active / F``, ``b3 = 4 n_layers n_heads head_dim / F``. Below the ridge (``n`` up to hundreds
  of sequences on the configured models and GPUs) decode is memory-bound. The memory branch is
  the sum of a fixed part ``b0 + b_e f_E(n)`` and a per-sequence part ``b2 n L``; the fitting
  scales the two apart (``fitting.fit_hardware``).
* KV transfer of ``t`` tokens from a prefill to a decode worker::

      X(t) = g0 + g1 t,    g1 = kv_bytes_per_token / interconnect_bandwidth

* ``kv_capacity_tokens`` H_max = ``(tp * memory * utilisation - weights) / kv_bytes_per_token``.

Token counts are clipped at 0. The prior (``from_specs``) comes from the model's and the GPU's
data sheets; telemetry calibrates its scales (``fitting.fit_hardware``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from pearl.core.telemetry import DecodeSamples, Rejections

#: a cost's argument and result: a float, or a float64 array (broadcast together)
Num = TypeVar("Num", float, npt.NDArray[np.float64])


class ProfileError(ValueError):
    """A profile could not be built (e.g. a hardware that cannot hold the model's weights)."""


class _ModelLike(Protocol):
    @property
    def n_layers(self) -> int: ...
    @property
    def n_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def total_params_b(self) -> float: ...
    @property
    def active_params_b(self) -> float: ...
    @property
    def n_experts(self) -> int: ...
    @property
    def experts_per_token(self) -> int: ...
    @property
    def expert_params_b(self) -> float: ...
    @property
    def dtype_bytes(self) -> int: ...
    @property
    def kv_bytes_per_token(self) -> int: ...


class _HardwareLike(Protocol):
    @property
    def memory_gb(self) -> float: ...
    @property
    def hbm_bandwidth_tbs(self) -> float: ...
    @property
    def bf16_tflops(self) -> float: ...
    @property
    def interconnect_gbs(self) -> float: ...
    @property
    def interconnect_latency_s(self) -> float: ...
    @property
    def memory_utilization(self) -> float: ...
    @property
    def prefill_mfu(self) -> float: ...
    @property
    def decode_bw_efficiency(self) -> float: ...
    @property
    def step_overhead_s(self) -> float: ...
    @property
    def moe_kernel_floor(self) -> float: ...


def _clip0(v: Num) -> Num:
    """max(v, 0) of a float or elementwise of an array."""
    if isinstance(v, np.ndarray):
        return np.maximum(v, 0.0)
    return max(v, 0.0)


def _larger(a: Num, b: Num) -> Num:
    """max(a, b) of floats or elementwise of arrays."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        out: Num = np.maximum(a, b)
        return out
    return max(a, b)


def _expm1(v: Num) -> Num:
    if isinstance(v, np.ndarray):
        return np.expm1(v)
    return math.expm1(v)


@dataclass(frozen=True, slots=True)
class HardwareProfile:
    """Per-worker cost coefficients and the costs (module docstring)."""

    a0: float
    a1: float
    a2: float
    b0: float
    b_e: float
    b1: float
    b2: float
    g0: float
    g1: float
    experts_frac: float  # k / E (0 for dense models)
    kv_capacity_tokens: float  # H_max
    b3: float = 0.0  # decode attention compute per sequence per token of context (roofline's compute branch)
    expert_floor: float = 0.0  # f: the fused-MoE kernel's floor in f_E(n)
    samples: int = 0  # telemetry records the fit has seen
    #: telemetry the fits screened out, by reason (``telemetry.Rejections``; not compared or hashed)
    rejected: Rejections = field(default=Rejections(), compare=False)
    #: the decode-step samples from iteration telemetry (``iteration_fit``; not compared or hashed)
    decode_samples: DecodeSamples = field(default=DecodeSamples(), compare=False, repr=False)
    #: ``(n_lo, n_hi, L_lo, L_hi)``: the batch and context range the decode step was fitted on
    #: (``iteration_fit.fit_decode_step``); () before such a fit. Outside it a prediction is
    #: extrapolated (``decision``)
    decode_measured: tuple[float, ...] = field(default=(), compare=False)

    @staticmethod
    def from_specs(model: _ModelLike, hw: _HardwareLike, tp_size: int = 1) -> HardwareProfile:
        """The prior from data sheets (module docstring for each coefficient)."""
        flops = tp_size * hw.bf16_tflops * 1e12 * hw.prefill_mfu
        bw = tp_size * hw.hbm_bandwidth_tbs * 1e12 * hw.decode_bw_efficiency
        total_w = model.total_params_b * 1e9 * model.dtype_bytes
        expert_w = model.expert_params_b * 1e9 * model.dtype_bytes if model.n_experts else 0.0
        dense_w = total_w - expert_w
        kvb = model.kv_bytes_per_token
        mem = tp_size * hw.memory_gb * 1e9 * hw.memory_utilization
        if mem <= total_w:
            raise ProfileError(
                f"weights ({total_w / 1e9:.1f} GB) do not fit in {tp_size} x {hw.memory_gb} GB x "
                f"{hw.memory_utilization} usable memory"
            )
        return HardwareProfile(
            a0=hw.step_overhead_s,
            a1=2.0 * model.active_params_b * 1e9 / flops,
            a2=4.0 * model.n_layers * model.n_heads * model.head_dim / flops,
            b0=dense_w / bw + hw.step_overhead_s,
            b_e=expert_w / bw,
            b1=2.0 * model.active_params_b * 1e9 / flops,
            b2=kvb / bw,
            b3=4.0 * model.n_layers * model.n_heads * model.head_dim / flops,
            g0=hw.interconnect_latency_s,
            g1=kvb / (hw.interconnect_gbs * 1e9),
            experts_frac=(model.experts_per_token / model.n_experts) if model.n_experts else 0.0,
            kv_capacity_tokens=(mem - total_w) / kvb,
            expert_floor=hw.moe_kernel_floor if model.n_experts else 0.0,
        )

    def physical(self) -> bool:
        """Every cost coefficient and the KV capacity finite and non-negative, ``k/E`` in [0, 1), the
        kernel floor in [0, 1]: a profile the makespan models can run on (a refit that breaks it is
        not used, ``fitting.fit_hardware``; the decision evaluates nothing on it)."""
        coeffs = (self.a0, self.a1, self.a2, self.b0, self.b_e, self.b1, self.b2, self.b3, self.g0, self.g1,
                  self.kv_capacity_tokens)
        return (all(math.isfinite(v) and v >= 0.0 for v in coeffs) and 0.0 <= self.experts_frac < 1.0
                and 0.0 <= self.expert_floor <= 1.0)

    # prefill ---------------------------------------------------------------------------------
    def prefill_s(self, new_tokens: Num, cached_tokens: Num, quad: Num | None = None) -> Num:
        """``P(x, c) = a0 + a1 x + a2 x (c + x / 2)``; with ``quad``: ``a0 + a1 x + a2 quad``."""
        x = _clip0(new_tokens)
        if quad is None:
            return self.a0 + self.a1 * x + self.a2 * x * (_clip0(cached_tokens) + x / 2.0)
        return self.a0 + self.a1 * x + self.a2 * quad

    # decode ----------------------------------------------------------------------------------
    def experts_touched(self, batch: Num) -> Num:
        """``f_E(n) = f + (1 - f) (1 - (1 - k/E)^n)``, the count as ``-expm1(n log1p(-k/E))``; 0 for
        dense models."""
        if self.experts_frac <= 0.0:
            return 0.0 * batch
        touched = -_expm1(_clip0(batch) * math.log1p(-self.experts_frac))
        if self.expert_floor <= 0.0:
            return touched
        return self.expert_floor + (1.0 - self.expert_floor) * touched

    def decode_fixed_s(self, batch: Num) -> Num:
        """The memory branch's fixed part ``b0 + b_e f_E(n)`` (weights and experts read once)."""
        return self.b0 + self.decode_experts_s(batch)

    def decode_var_s(self, batch: Num, context: Num) -> Num:
        """The memory branch's per-sequence part ``b2 n L`` (KV reads)."""
        return batch * self.decode_slopes(context)[0]

    def decode_slopes(self, context: Num) -> tuple[Num, Num]:
        """The per-sequence slopes of the two branches at context ``L``: ``(b2 L, b1 + b3 L)``. A
        caller that evaluates ``tau`` at many batches and one context computes them once."""
        return self.b2 * context, self.b1 + self.b3 * context

    def decode_experts_s(self, batch: Num) -> Num:
        """The memory branch's expert term ``b_e f_E(n)``."""
        return self.b_e * self.experts_touched(batch)

    def decode_branches(self, batch: Num, context: Num, slopes: tuple[Num, Num] | None = None,
                        experts: Num | None = None) -> tuple[Num, Num]:
        """The roofline's ``(memory, compute)`` branches ``(b0 + b2 n L + b_e f_E(n), a0 + n (b1 +
        b3 L))`` (the expert term only for MoE). ``slopes``: ``decode_slopes(context)`` and
        ``experts``: ``decode_experts_s(batch)``, where the caller holds them already."""
        kv, cp = self.decode_slopes(context) if slopes is None else slopes
        memory = self.b0 + batch * kv
        if self.experts_frac > 0.0:
            memory = memory + (self.decode_experts_s(batch) if experts is None else experts)
        return memory, self.a0 + batch * cp

    def decode_step_s(self, batch: Num, context: Num, slopes: tuple[Num, Num] | None = None,
                      experts: Num | None = None) -> Num:
        """``tau(n, L) = max(b0 + b_e f_E(n) + b2 n L, a0 + n (b1 + b3 L))`` (``decode_branches``)."""
        memory, compute = self.decode_branches(batch, context, slopes, experts)
        return _larger(memory, compute)

    # transfer --------------------------------------------------------------------------------
    def transfer_s(self, tokens: Num) -> Num:
        """``X(t) = g0 + g1 t``."""
        return self.g0 + self.g1 * _clip0(tokens)


def memory_fixed(hw: HardwareProfile) -> Callable[[npt.NDArray[np.float64]], npt.NDArray[np.float64]]:
    """``F(n) = b0 + b_e f_E(n)`` (``HardwareProfile.decode_fixed_s``) for ``n >= 1``, written with
    one exponential: ``b_e f_E(n) = b_e - b_e (1 - f) (1 - k/E)^n`` (a dense model: ``F = b0``)."""
    if hw.experts_frac <= 0.0:
        b0 = hw.b0

        def dense(nn: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
            out: npt.NDArray[np.float64] = b0 + 0.0 * nn
            return out
        return dense
    c0, c1, lg = hw.b0 + hw.b_e, hw.b_e * (1.0 - max(hw.expert_floor, 0.0)), math.log1p(-hw.experts_frac)

    def moe(nn: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        out: npt.NDArray[np.float64] = c0 - c1 * np.exp(nn * lg)
        return out
    return moe


def decode_memory_bound(hw: HardwareProfile, contexts: npt.NDArray[np.float64], n_max: float) -> bool:
    """Whether ``tau(n, L)`` is on the roofline's memory branch for every ``1 <= n <= n_max`` at
    every context ``L`` of ``contexts``: ``memory - compute = (b0 - a0) + b_e f_E(n) + n (b2 L - b1
    - b3 L)`` is concave in ``n`` (``f_E`` is, ``b_e >= 0``), so checking ``n = 1`` and ``n =
    n_max`` decides it."""
    if hw.b_e < 0.0 or not 0.0 <= hw.experts_frac < 1.0 or hw.expert_floor > 1.0:
        return False
    for n in (1.0, max(n_max, 1.0)):
        memory, compute = hw.decode_branches(np.full_like(contexts, n), contexts)
        if not bool(np.all(memory >= compute)):
            return False
    return True
