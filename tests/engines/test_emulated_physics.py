"""The emulator's named constants: defaults reproduce the run config, bounds hold, the MoE curve
matches its kernel table, the memory bound is the paper's 5P3D feasibility."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from pearl.config import load_config
from pearl.engines.emulated_costs import WorkerCosts
from pearl.engines.emulated_physics import (
    MOE_KERNEL_TABLES,
    EmulatorPhysics,
    PhysicsError,
    PhysicsFile,
    fit_moe_curve,
    load_physics,
    min_memory_utilization,
    moe_curve,
)


@pytest.mark.parametrize("name", ["qwen3-8b-h200", "qwen3-30b-a3b-h200"])
def test_unset_physics_is_the_run_config(name: str) -> None:
    cfg = load_config(name)
    a = WorkerCosts.from_specs(cfg.model, cfg.hardware, cfg.emulator)
    b = WorkerCosts.from_specs(cfg.model, cfg.hardware, cfg.emulator, physics=EmulatorPhysics())
    assert a == b
    assert a.bw == a.kv_bw == cfg.hardware.hbm_bandwidth_tbs * 1e12 * cfg.hardware.decode_bw_efficiency
    assert a.overhead_s == a.prefill_overhead_s == cfg.hardware.step_overhead_s
    assert (a.moe_floor, a.moe_exponent) == (cfg.hardware.moe_kernel_floor, 1.0)  # the H200 kernel's floor


def test_each_constant_reaches_its_term() -> None:
    cfg = load_config("qwen3-8b-h200")
    base = WorkerCosts.from_specs(cfg.model, cfg.hardware, cfg.emulator)
    ph = EmulatorPhysics(kv_read_efficiency=1.4, weight_read_efficiency=0.7, decode_step_s=0.002,
                         prefill_forward_s=0.02, prefill_mfu=0.6, memory_utilization=0.85)
    c = WorkerCosts.from_specs(cfg.model, cfg.hardware, cfg.emulator, physics=ph)
    assert c.kv_bw == pytest.approx(2 * base.kv_bw) and c.bw == base.bw
    _, _, m0, m1 = c.decode_line(16, 100_000)
    _, _, b0, b1 = base.decode_line(16, 100_000)
    assert m1 == pytest.approx(b1 / 2)
    assert m0 == pytest.approx(base.dense_bytes / base.bw + (b0 - base.dense_bytes / base.bw) / 2)
    assert c.decode_step_s(1, 0) == pytest.approx(0.002 + base.dense_bytes / base.bw)
    assert c.prefill_overhead_s == 0.02 and c.prefill_flops == pytest.approx(base.prefill_flops * 0.6 / 0.45)
    assert c.kv_capacity_tokens < base.kv_capacity_tokens


def test_bounds_reject_values_outside_the_public_ranges() -> None:
    for field, bad in [("kv_read_efficiency", 2.5), ("weight_read_efficiency", 0.3), ("decode_step_s", 0.1),
                       ("prefix_reuse_prefill", 1.2), ("memory_utilization", 0.99), ("moe_exponent", 1.5)]:
        with pytest.raises(ValidationError, match=field):
            EmulatorPhysics(**{field: bad})


def test_moe_curve_fits_the_h200_kernel_table() -> None:
    floor, exponent, rms = fit_moe_curve(["sglang#11730"])
    assert rms < 0.05
    tab = dict(MOE_KERNEL_TABLES["sglang#11730"]["table"])
    fitted = moe_curve(8, 128, 8, floor, exponent) / moe_curve(4, 128, 8, floor, exponent)
    assert fitted == pytest.approx(tab[8] / tab[4], rel=0.06)  # 1.35 measured
    plain = moe_curve(8, 128, 8, 0.0, 1.0) / moe_curve(4, 128, 8, 0.0, 1.0)
    assert plain == pytest.approx(1.772, abs=0.001)  # the plain touched-expert count: steeper


def test_moe_curve_reaches_the_expert_read() -> None:
    cfg = load_config("qwen3-30b-a3b-h200")
    c = WorkerCosts.from_specs(cfg.model, cfg.hardware, cfg.emulator,
                               physics=EmulatorPhysics(moe_floor=0.2, moe_exponent=1.0))
    share = moe_curve(4, 128, 8, 0.2, 1.0)
    assert c.weight_read_bytes(4) == pytest.approx(c.dense_bytes + c.expert_bytes * share)
    assert c.weight_read_bytes(10_000) == pytest.approx(c.dense_bytes + c.expert_bytes)


def test_memory_bound_is_the_5p3d_feasibility_at_batch_64() -> None:
    cfg = load_config("qwen3-30b-a3b-h200")
    m = cfg.model
    u = min_memory_utilization(m.total_params_b * 1e9 * m.dtype_bytes, m.kv_bytes_per_token, cfg.hardware.memory_gb,
                               64, 32768, 3)
    assert u == pytest.approx(0.92, abs=0.001)
    c = WorkerCosts.from_specs(m, cfg.hardware, cfg.emulator, physics=EmulatorPhysics(memory_utilization=u + 1e-4))
    assert 3 * c.kv_capacity_tokens >= 64 * 32768


@pytest.mark.parametrize("retired", ["prefix_reuse_colocated", "prefix_reuse_prefill", "decode_kv_reserve"])
def test_reuse_and_the_kv_reservation_are_mechanisms_not_constants(retired: str) -> None:
    """The radix cache and SGLang's admission and retraction replaced the fitted reuse and rho: a
    physics file that still sets one is refused, naming it."""
    with pytest.raises(ValidationError, match=retired):
        EmulatorPhysics.model_validate({retired: 0.5})


def test_shipped_physics_files_load(tmp_path: Path) -> None:
    for model in ("qwen3-8b", "qwen3-30b-a3b"):
        pf = load_physics(model, "h200")
        assert (pf.model, pf.hardware) == (model, "h200")
        # the measured kernel tables cover the datasheet formulas' constants: the files leave them out
        retired = ("weight_read_efficiency", "kv_read_efficiency", "decode_step_s", "prefill_forward_s",
                   "prefill_mfu", "moe_floor", "moe_exponent")
        assert all(getattr(pf.engine, k) is None for k in retired)
    assert load_physics("nope", "h200", tmp_path) == PhysicsFile(model="nope", hardware="h200")
    (tmp_path / "a-h200.yaml").write_text("model: b\nhardware: h200\n")
    with pytest.raises(PhysicsError, match="names b/h200"):
        load_physics("a", "h200", tmp_path)
    (tmp_path / "c-h200.yaml").write_text("model: c\nhardware: h200\nengine: {kv_read_efficiency: 9}\n")
    with pytest.raises(PhysicsError, match="kv_read_efficiency"):
        load_physics("c", "h200", tmp_path)
