from __future__ import annotations

import math
from dataclasses import replace

import pytest

from pearl.config import RunConfig
from pearl.core.profile import (
    HardwareProfile,
    ProfileError,
    TelemetryRecord,
    WorkloadProfile,
    fit_hardware,
    fit_workload,
)
from pearl.core.stages import stages
from pearl.core.telemetry import Mode
from pearl.core.workload import colocated_tokens, prefill_pool_tokens, prefill_pool_windows


def test_first_principles_coefficients(cfg8b: RunConfig, cfg30b: RunConfig) -> None:
    assert cfg8b.model.kv_bytes_per_token == 144 * 1024
    assert cfg30b.model.kv_bytes_per_token == 96 * 1024
    hw = HardwareProfile.from_specs(cfg8b.model, cfg8b.hardware, 1)
    # a1 = 2 * 8.2e9 / (790e12 * 0.45)
    assert hw.a1 == pytest.approx(2 * 8.2e9 / (790e12 * 0.45))
    # b2 = 147456 B / (4.8e12 * 0.7) per token of context per sequence
    assert hw.b2 == pytest.approx(147456 / (4.8e12 * 0.7))
    # H_max = (141e9 * 0.9 - 16.4e9) / 147456
    assert hw.kv_capacity_tokens == pytest.approx((141e9 * 0.9 - 16.4e9) / 147456)
    assert hw.experts_touched(64) == 0.0
    moe = HardwareProfile.from_specs(cfg30b.model, cfg30b.hardware, 1)
    # one token touches 8 of 128 experts, above the H200 fused-MoE kernel's floor 0.165
    assert moe.experts_touched(1) == pytest.approx(0.165 + 0.835 * 8 / 128)
    assert moe.experts_touched(1) < moe.experts_touched(8) < moe.experts_touched(64) < 1.0
    # decode per step grows with batch and context; per token it falls with batch
    assert moe.decode_step_s(1, 1000) < moe.decode_step_s(8, 1000) < moe.decode_step_s(8, 20000)
    assert moe.decode_step_s(64, 1000) / 64 < moe.decode_step_s(8, 1000) / 8


@pytest.mark.parametrize("which", ["8b", "30b"])
def test_decode_step_is_a_roofline(which: str, prof8b: tuple[HardwareProfile, WorkloadProfile],
                                   prof30b: tuple[HardwareProfile, WorkloadProfile]) -> None:
    """Below the ridge a decode iteration is the memory reads alone (the matmuls overlap them):
    one more sequence adds its KV read, not its compute; far above it the compute binds."""
    import numpy as np

    hw = (prof8b if which == "8b" else prof30b)[0]
    for ctx in (2000.0, 12000.0, 30000.0):
        for n in (1, 4, 9, 16, 64):
            memory = hw.decode_fixed_s(n) + hw.b2 * n * ctx
            assert hw.decode_step_s(n, ctx) == pytest.approx(memory, rel=1e-12)
            assert hw.decode_branches(n, ctx)[1] < memory
        # the per-sequence slope of a dense model is the KV read alone (b1 is hidden)
        if which == "8b":
            assert hw.decode_step_s(10, ctx) - hw.decode_step_s(9, ctx) == pytest.approx(hw.b2 * ctx, rel=1e-9)
    # the matmuls bind only for a huge batch of short contexts (above ~1000 tokens the KV read
    # outweighs a sequence's whole compute, at any batch)
    huge, short = 1e5, 100.0
    assert hw.decode_step_s(huge, short) == pytest.approx(hw.decode_branches(huge, short)[1], rel=1e-12)
    assert hw.decode_branches(huge, short)[1] > hw.decode_fixed_s(huge) + hw.decode_var_s(huge, short)
    # the vectorised form is the same function
    ns = np.array([[1.0, 3.0, 9.5, 40.0, 1e5]])
    ctxs = np.array([[500.0, 4000.0, 12000.0, 24000.0, 30000.0]])
    got = hw.decode_step_s(ns, ctxs)[0]
    want = [hw.decode_step_s(float(a), float(b)) for a, b in zip(ns[0], ctxs[0], strict=True)]
    assert got == pytest.approx(want, rel=1e-12)


def test_model_that_does_not_fit_is_refused(cfg30b: RunConfig) -> None:
    small = cfg30b.hardware.model_copy(update={"memory_gb": 40.0})
    with pytest.raises(ProfileError, match="do not fit"):
        HardwareProfile.from_specs(cfg30b.model, small, 1)
    HardwareProfile.from_specs(cfg30b.model, small, 2)  # tensor parallel spreads the weights


def test_workload_prior_is_consistent(cfg8b: RunConfig) -> None:
    wl = WorkloadProfile.from_spec(cfg8b.workload)
    assert wl.survival[0] == 1.0
    assert all(a >= b for a, b in zip(wl.survival, wl.survival[1:], strict=False))
    assert 15 < wl.mean_turns < 30
    assert wl.k_seq <= cfg8b.workload.max_trajectory_tokens
    # context grows with turns; turn 1 has no cache
    ctx = [n + c for n, c in zip(wl.new_tokens, wl.cached_tokens, strict=True)]
    assert ctx == sorted(ctx) and wl.cached_tokens[0] == 0
    # the length limit truncates the number of turns
    short = WorkloadProfile.from_spec(cfg8b.workload.model_copy(update={"max_trajectory_tokens": 8192}))
    assert short.max_turns < wl.max_turns


def synthetic(hw: HardwareProfile, scale_p: float, scale_f: float, scale_v: float, n: int,
              mode: str = "disaggregated") -> list[TelemetryRecord]:
    out = []
    for i in range(n):
        prompt, cached, outp, conc = 2000 + 700 * i, 500 * i, 200 + 13 * i, 1 + (i % 16)
        pre = scale_p * hw.prefill_s(prompt - cached, cached)
        ctx = prompt + outp / 2
        dec = outp * (scale_f * hw.decode_fixed_s(conc) + scale_v * hw.decode_var_s(conc, ctx))
        out.append(TelemetryRecord(f"t{i}", 1 + i % 5, prompt, cached, outp, prefill_s=pre, decode_s=dec,
                                   decode_concurrency=conc, env_s=2.0, mode=mode))
    return out


def test_fit_recovers_known_scales(prof30b: tuple[HardwareProfile, WorkloadProfile]) -> None:
    hw, _ = prof30b
    fit = fit_hardware(hw, synthetic(hw, 1.7, 1.3, 2.5, 40), alpha=1.0)
    assert fit.a1 / hw.a1 == pytest.approx(1.7, rel=1e-6)
    assert fit.b0 / hw.b0 == pytest.approx(1.3, rel=1e-6)
    assert fit.b2 / hw.b2 == pytest.approx(2.5, rel=1e-6)
    # the first window replaces the first-principles prior (first_window_alpha) ...
    first = fit_hardware(hw, synthetic(hw, 1.7, 1.3, 2.5, 40), alpha=0.5)
    assert first.a1 / hw.a1 == pytest.approx(1.7, rel=1e-6) and first.samples == 40
    # ... later windows blend with alpha
    half = fit_hardware(replace(hw, samples=1), synthetic(hw, 1.7, 1.3, 2.5, 40), alpha=0.5)
    assert half.a1 / hw.a1 == pytest.approx(1.35, rel=1e-6)


def test_compute_bound_records_stay_out_of_the_two_scale_fit(prof8b: tuple[HardwareProfile, WorkloadProfile]) -> None:
    """The two scales are the memory branch's; a record whose prior step is compute-bound does not
    pull them (its time says nothing about the weight and KV reads)."""
    hw, _ = prof8b
    recs = synthetic(hw, 1.0, 1.3, 2.5, 40)
    for i in range(6):  # compute-bound batches, timed at 1.6x the prior's compute branch
        n, ctx, out = 4000.0 + 500 * i, 100.0, 100  # short contexts: the KV read is small
        assert hw.decode_branches(n, ctx)[1] > hw.decode_fixed_s(n) + hw.decode_var_s(n, ctx)
        recs.append(TelemetryRecord(f"c{i}", 1, 50, 0, out, prefill_s=hw.prefill_s(50, 0),
                                    decode_s=out * 1.6 * hw.decode_branches(n, ctx)[1], decode_concurrency=n,
                                    env_s=1.0, mode="disaggregated"))
    fit = fit_hardware(hw, recs, alpha=1.0)
    assert fit.b0 / hw.b0 == pytest.approx(1.3, rel=1e-6)
    assert fit.b2 / hw.b2 == pytest.approx(2.5, rel=1e-6)
    # the compute branch follows the per-sequence scale
    assert fit.b1 / hw.b1 == pytest.approx(2.5, rel=1e-6) and fit.b3 / hw.b3 == pytest.approx(2.5, rel=1e-6)


def test_colocated_decode_telemetry_calibrates_one_common_scale(prof30b: tuple[HardwareProfile, WorkloadProfile]) -> None:
    """Colocated records do not identify the fixed / per-sequence split: one scale, the median ratio."""
    hw, _ = prof30b
    recs = synthetic(hw, 1.0, 1.3, 1.3, 40, mode="colocated")
    recs[5] = replace(recs[5], decode_s=recs[5].decode_s * 1.5)  # one noisy record moves no scale
    fit = fit_hardware(hw, recs, alpha=1.0)
    assert fit.b0 / hw.b0 == pytest.approx(1.3, rel=1e-6)
    assert fit.b2 / hw.b2 == pytest.approx(1.3, rel=1e-6)


def test_colocated_decode_split_is_read_within_one_workers_decode_batch(
        prof8b: tuple[HardwareProfile, WorkloadProfile]) -> None:
    """Colocated records of one worker and one decode batch share their prefill-stall error; the
    slope / intercept of their per-token time against context gives the fixed / per-sequence split
    free of that error, even where the error grows with the batch (which biases a pooled fit)."""
    hw, _ = prof8b
    sf, sv = 1.0, 0.47  # e.g. a KV cache read at twice the weights' bandwidth share
    recs = []
    for w in range(4):
        for n in (2, 3, 4, 5, 6):
            err = 0.05 * (n - 4)  # the group's stall error, correlated with the batch
            for j in range(10):
                prompt, outp = 12000 + 2500 * j + 300 * w, 800
                ctx = prompt + outp / 2
                y = sf * hw.decode_fixed_s(n) + sv * hw.decode_var_s(n, ctx)
                recs.append(TelemetryRecord(f"w{w}n{n}j{j}", 1 + j, prompt, prompt, outp,
                                            decode_s=outp * y * (1 + err), decode_concurrency=n,
                                            worker_id=f"w{w}", env_s=1.0))
    fit = fit_hardware(hw, recs, alpha=1.0)
    assert fit.b0 / hw.b0 == pytest.approx(sf, rel=0.01)
    assert fit.b2 / hw.b2 == pytest.approx(sv, rel=0.01)
    # without the worker that served them the split is not identified: one common scale
    anon = fit_hardware(hw, [replace(r, worker_id="") for r in recs], alpha=1.0)
    assert anon.b0 / hw.b0 == pytest.approx(anon.b2 / hw.b2, rel=1e-9)


def test_fit_is_robust_to_outliers_and_bad_records(prof8b: tuple[HardwareProfile, WorkloadProfile]) -> None:
    hw, _ = prof8b
    recs = synthetic(hw, 2.0, 2.0, 2.0, 30)
    bad = [replace(recs[0], prefill_s=recs[0].prefill_s * 1000, decode_s=recs[0].decode_s * 1000),
           replace(recs[1], decode_s=math.nan), replace(recs[2], prefill_s=-1.0),
           replace(recs[3], cached_tokens=recs[3].prompt_tokens + 1)]
    fit = fit_hardware(hw, recs[4:] + bad, alpha=1.0)
    assert fit.a1 / hw.a1 == pytest.approx(2.0, rel=0.01)
    assert fit.b0 / hw.b0 == pytest.approx(2.0, rel=0.01)
    assert all(math.isfinite(v) and v > 0 for v in (fit.a0, fit.a1, fit.b0, fit.b1, fit.b2))


def test_empty_or_invalid_window_returns_the_prior(prof8b: tuple[HardwareProfile, WorkloadProfile]) -> None:
    hw, wl = prof8b
    assert fit_hardware(hw, []) is hw
    assert fit_workload(wl, []) is wl
    nan = TelemetryRecord("t", 1, 10, 0, 5, decode_s=math.nan)
    # the same profile (equal: the counts are not compared), with the rejected record counted
    fh, fw = fit_hardware(hw, [nan]), fit_workload(wl, [nan])
    assert fh == hw and fw == wl and (fh.samples, fw.samples) == (0, 0)
    assert fh.rejected.to_dict() == fw.rejected.to_dict() == {"non_finite": 1}


def test_fit_workload_learns_turns_and_tokens(prof8b: tuple[HardwareProfile, WorkloadProfile]) -> None:
    _, wl = prof8b
    recs = []
    for t in range(10):
        turns = 5 if t < 5 else 10
        for k in range(1, turns + 1):
            recs.append(TelemetryRecord(f"t{t}", k, 1000 * k, 800 * (k - 1), 100, env_s=1.0, final=k == turns))
    fit = fit_workload(wl, recs, alpha=1.0)
    assert fit.max_turns == 10
    assert fit.survival[4] == 1.0 and fit.survival[5] == 0.5
    assert fit.output_tokens[0] == 100 and fit.env_s[3] == 1.0
    assert fit.k_seq == pytest.approx((5 * (5 * 1000 + 100) + 5 * (10 * 1000 + 100)) / 10)


def test_prior_env_counts_test_runs_and_the_final_test(cfg8b: RunConfig) -> None:
    w = cfg8b.workload
    no_tests = WorkloadProfile.from_spec(w.model_copy(update={"test_run_prob": 0.0}))
    wl = WorkloadProfile.from_spec(w)
    e_tool, e_test = no_tests.env_s[0], wl.env_s[-1]
    # the last reachable turn always ends the trajectory: it always runs the tests
    assert e_test > 2 * e_tool
    for k, (s, e) in enumerate(zip(wl.survival, wl.env_s, strict=True)):
        s_next = wl.survival[k + 1] if k + 1 < wl.max_turns else 0.0
        q = (s - s_next) / s + (s_next / s) * w.test_run_prob
        assert e == pytest.approx((1 - q) * e_tool + q * e_test)
    # without test runs only the hazard of ending adds test time
    assert no_tests.env_s[0] == pytest.approx(e_tool) and wl.env_s[0] > e_tool


def test_fit_workload_uses_means_of_skewed_turn_costs(prof8b: tuple[HardwareProfile, WorkloadProfile]) -> None:
    _hw, wl0 = prof8b
    # nine 1-s tool calls and one 11-s test run after turn 1; outputs 100 x 9 and 1000 x 1
    recs = [TelemetryRecord(f"t{i}", 1, prompt_tokens=2500, cached_tokens=0, output_tokens=1000 if i == 0 else 100,
                            env_s=11.0 if i == 0 else 1.0) for i in range(10)]
    wl = fit_workload(wl0, recs, alpha=1.0)
    assert wl.env_s[0] == pytest.approx(2.0)  # the mean (the median would say 1.0)
    assert wl.output_tokens[0] == pytest.approx(190.0)


def test_moved_turns_do_not_lower_the_cached_share(prof8b: tuple[HardwareProfile, WorkloadProfile]) -> None:
    """A turn that left its cache-holding worker (cost-aware affinity, an interruption) found no
    cache: the profile keeps the share the turns that stayed got (what a PD prefill pool, which
    keeps conversations, gets), and the total prompt per turn from every record."""
    _, wl = prof8b
    recs = []
    for t in range(12):
        moved = t % 3 == 0
        for k in range(1, 4):
            prompt, cached = 1000 * k, (0 if moved or k == 1 else 800 * (k - 1))
            recs.append(TelemetryRecord(f"t{t}", k, prompt, cached, 100, decode_s=0.1 * (t + 1) + (5.0 if moved else 0.0), env_s=1.0,
                                        final=k == 3, moved=moved and k > 1))
    fit = fit_workload(wl, recs, alpha=1.0)
    assert fit.cached_tokens[1] == pytest.approx(800) and fit.cached_tokens[2] == pytest.approx(1600)
    assert fit.new_tokens[1] == pytest.approx(2000 - 800) and fit.new_tokens[2] == pytest.approx(3000 - 1600)
    # the slowest trajectory (t9) moved at every turn after the first: its path carries the kept share, not 0
    slowest = fit.tail_paths[0]
    assert slowest[1][:2] == pytest.approx((2000 - 800, 800)) and slowest[2][:2] == pytest.approx((3000 - 1600, 1600))
    # without the flag the same records read as a lower share (the bias this corrects)
    plain = fit_workload(wl, [replace(r, moved=False) for r in recs], alpha=1.0)
    assert plain.cached_tokens[1] == pytest.approx(800 * 8 / 12)


def test_colocated_view_charges_moved_turns_their_whole_prompt(prof8b: tuple[HardwareProfile, WorkloadProfile]) -> None:
    _, wl = prof8b
    recs = [TelemetryRecord(f"t{t}", k, 1000 * k, 0 if (t < 3 and k > 1) else 800 * (k - 1), 100, env_s=1.0,
                            final=k == 3, moved=t < 3 and k > 1) for t in range(12) for k in (1, 2, 3)]
    fit = fit_workload(wl, recs, alpha=1.0)
    assert fit.moved_share == pytest.approx(3 / 12)
    view = colocated_tokens(fit)
    assert view.cached[1] == pytest.approx(0.75 * 800) and view.new[1] == pytest.approx(2000 - 600)
    assert [a + b for a, b in zip(view.new, view.cached, strict=True)] == pytest.approx(
        [a + b for a, b in zip(fit.new_tokens, fit.cached_tokens, strict=True)])  # the prompt is the same; only the cached part moves
    # PD records say nothing about colocated moves: the share is kept
    pd = [replace(r, mode="disaggregated", moved=False) for r in recs]
    assert fit_workload(fit, pd, alpha=1.0).moved_share == pytest.approx(3 / 12)


def test_prefill_scale_is_the_service_time_not_the_shared_response_time(
        prof8b: tuple[HardwareProfile, WorkloadProfile]) -> None:
    """A prefill worker batches several requests' chunks per iteration, so most requests' measured
    prefill spans others' compute; the fit takes the uncontended requests' ratio (the makespan
    model adds the sharing), and stays robust to jitter of either sign around it."""
    hw, _ = prof8b
    recs = []
    for i in range(200):
        x, c = 2000 + 37 * i, 1000
        own = 1.3 * hw.prefill_s(x, c)  # the worker is 1.3x slower than the prior
        if i % 4 == 0:
            obs = own * (1.0 + 0.03 * ((i % 7) - 3) / 3)  # alone, +-3 % jitter
        else:
            obs = own * (1.5 + (i % 5))  # shared with 1.5-5.5 requests' worth of chunks
        recs.append(TelemetryRecord(f"t{i}", 2, x + c, c, 10, prefill_s=obs, decode_s=0.5, mode="disaggregated"))
    fit = fit_hardware(hw, recs, alpha=1.0)
    assert fit.a1 / hw.a1 == pytest.approx(1.3, rel=0.03)
    # the plain median would read the sharing as a slower worker
    ratios = sorted(r.prefill_s / hw.prefill_s(r.prompt_tokens - r.cached_tokens, r.cached_tokens) for r in recs)
    assert ratios[len(ratios) // 2] > 2.5


def _ideal_profile(h: float = 1.0, turns: int = 6, sys_p: float = 4000.0, o: float = 500.0, obs: float = 300.0,
                   paths: bool = True) -> WorkloadProfile:
    """A colocated-basis profile: turn k's prompt is ``sys + (k - 1)(o + obs)`` and a worker holding
    the conversation finds ``h`` of the previous prompt *and* output cached."""
    prompt = [sys_p + (k - 1) * (o + obs) for k in range(1, turns + 1)]
    cached = [0.0] + [h * (prompt[i - 1] + o) for i in range(1, turns)]
    new = [p - c for p, c in zip(prompt, cached, strict=True)]
    path = tuple((x, c, o, 1.0) for x, c in zip(new, cached, strict=True))
    return WorkloadProfile(tuple(1.0 - 0.1 * i for i in range(turns)), tuple(new), tuple(cached), (o,) * turns,
                           (1.0,) * turns, prompt[-1] + o, tail_paths=(path, path[:3]) if paths else ())


@pytest.mark.parametrize("h", [1.0, 0.3])
def test_prefill_pool_view_holds_the_prompts_not_the_outputs(h: float) -> None:
    """c^P_k = c_k P_{k-1} / (P_{k-1} + o_{k-1}): with an ideal cache (h = 1) the prefill pool
    recomputes the previous output and the new observation, x^P_k = o + obs; with proportional
    reuse it finds h of the previous prompt. The prompt itself is unchanged, turn 1 too."""
    o, obs = 500.0, 300.0
    wl = _ideal_profile(h, o=o, obs=obs)
    v = prefill_pool_tokens(wl)
    prompt = [x + c for x, c in zip(wl.new_tokens, wl.cached_tokens, strict=True)]
    assert [x + c for x, c in zip(v.new, v.cached, strict=True)] == pytest.approx(prompt)
    assert (v.new[0], v.cached[0]) == (wl.new_tokens[0], wl.cached_tokens[0]) and v.quad is None
    for k in range(2, len(prompt) + 1):
        assert v.cached[k - 1] == pytest.approx(h * prompt[k - 2])
        if h == 1.0:
            assert v.new[k - 1] == pytest.approx(o + obs)
    # the slowest paths are restated turn by turn from their own previous turn
    ((weight, vpaths),) = prefill_pool_windows(wl)
    assert weight == 1.0
    for path, vpath in zip(wl.tail_paths, vpaths, strict=True):
        assert len(vpath) == len(path) and vpath[0] == path[0]
        for j in range(1, len(path)):
            assert vpath[j][1] == pytest.approx(h * (path[j - 1][0] + path[j - 1][1]))
            assert vpath[j][0] + vpath[j][1] == pytest.approx(path[j][0] + path[j][1])
            assert vpath[j][2:] == path[j][2:]
    # nothing cached: nothing to restate
    none = replace(wl, new_tokens=tuple(prompt), cached_tokens=(0.0,) * len(prompt), tail_paths=())
    assert prefill_pool_tokens(none) == (none.new_tokens, none.cached_tokens, None)
    assert prefill_pool_windows(none) == ()


def test_fit_restates_turns_served_disaggregated_on_the_colocated_basis(
        prof8b: tuple[HardwareProfile, WorkloadProfile]) -> None:
    """A PD prefill worker found h of the previous prompt; the fit stores what a worker holding
    prompt + output would have found, so the prefill-pool view gives the measured hit back."""
    _, prior = prof8b
    h, o, obs, sys_p = 0.5, 400, 200, 3000
    recs = []
    for t in range(10):
        for k in (1, 2, 3):
            prompt = sys_p + (k - 1) * (o + obs)
            prev_prompt = sys_p + (k - 2) * (o + obs)
            cached = 0 if k == 1 else round(h * prev_prompt)
            recs.append(TelemetryRecord(f"t{t}", k, prompt, cached, o, env_s=1.0, mode="disaggregated",
                                        final=k == 3))
    fit = fit_workload(prior, recs, alpha=1.0)
    assert fit.cached_tokens[1] == pytest.approx(h * (sys_p + o), abs=1)
    assert fit.cached_tokens[2] == pytest.approx(h * (sys_p + o + obs + o), abs=1)
    back = prefill_pool_tokens(fit)
    assert back.cached[1] == pytest.approx(h * sys_p, abs=1)
    assert back.cached[2] == pytest.approx(h * (sys_p + o + obs), abs=1)
    # the same turns served colocated are taken as measured
    coloc = fit_workload(prior, [replace(r, mode="colocated") for r in recs], alpha=1.0)
    assert coloc.cached_tokens[1] == pytest.approx(h * sys_p, abs=1)
    # a turn whose previous turn is not in the window stays as measured
    alone = fit_workload(prior, [r for r in recs if r.turn == 2], alpha=1.0)
    assert alone.cached_tokens[1] == pytest.approx(round(h * sys_p), abs=1)


def test_moved_turns_find_the_measured_share_cached_and_the_view_keeps_the_mixtures_prefill(
        prof8b: tuple[HardwareProfile, WorkloadProfile]) -> None:
    """A moved colocated turn finds ``moved_hit`` of its prompt cached where it runs
    (token-weighted over the moved turns), and since ``P(x, c)`` is bilinear the view carries the
    mixture's mean bilinear term: per turn ``P`` of the view is the mean of kept and moved turns'."""
    hw, wl = prof8b
    # 3 of 12 trajectories move at turns 2-3 and find a quarter of their prompt cached there
    recs = [TelemetryRecord(f"t{t}", k, 1000 * k, (250 * k if k > 1 else 0) if t < 3 else 800 * (k - 1), 100,
                            env_s=1.0, final=k == 3, moved=t < 3 and k > 1) for t in range(12) for k in (1, 2, 3)]
    fit = fit_workload(wl, recs, alpha=1.0)
    assert fit.moved_share == pytest.approx(3 / 12) and fit.moved_hit == pytest.approx(0.25)
    view = colocated_tokens(fit)
    # turn 1 has no earlier worker: the moves are of later turns
    assert (view.new[0], view.cached[0]) == (fit.new_tokens[0], fit.cached_tokens[0])
    st = stages(fit, Mode.COLOCATED, fit.max_turns)
    for k in (1, 2):  # turns 2 and 3
        x, c = fit.new_tokens[k], fit.cached_tokens[k]
        xm, cm = 0.75 * (x + c), 0.25 * (x + c)
        assert view.new[k] + view.cached[k] == pytest.approx(x + c)
        assert view.new[k] == pytest.approx(0.75 * x + 0.25 * xm)
        want = 0.75 * hw.prefill_s(x, c) + 0.25 * hw.prefill_s(xm, cm)
        assert float(st.prefill(hw)[0, k]) == pytest.approx(want)
        # the mean tokens alone would charge more: the bilinear term is convex in the moved share
        assert hw.prefill_s(view.new[k], view.cached[k]) > want
    # a profile without moves is its own view; without the mixture term P is that of the mean tokens
    plain = replace(fit, moved_share=0.0)
    assert colocated_tokens(plain) == (plain.new_tokens, plain.cached_tokens, None)
    st = stages(plain, Mode.COLOCATED, plain.max_turns)
    assert st.q is None and float(st.prefill(hw)[0, 1]) == pytest.approx(hw.prefill_s(plain.new_tokens[1], plain.cached_tokens[1]))
    # the next window blends the share with alpha (a window without moved turns keeps it)
    again = fit_workload(fit, [replace(r, moved=False) for r in recs], alpha=0.5)
    assert again.moved_hit == pytest.approx(0.25) and again.moved_share == pytest.approx(0.125)


def test_first_window_replaces_the_priors_guesses_and_blends_the_configured_distributions(
        prof8b: tuple[HardwareProfile, WorkloadProfile]) -> None:
    """``first_window_alpha``: the cache and router statistics and the hardware
    scales start from the first window; the workload's distributions blend with the prior."""
    _, wl = prof8b
    assert wl.samples == 0
    # every turn-2 prompt of 3000 tokens finds 2700 cached (90 %); the prior guessed less
    recs = [TelemetryRecord(f"t{t}", k, 1500 * k, 0 if k == 1 else 1350 * k, 200, env_s=1.0, final=k == 2,
                            moved=t == 0 and k == 2) for t in range(10) for k in (1, 2)]
    fit = fit_workload(wl, recs, alpha=0.5)
    prompt = wl.new_tokens[1] + wl.cached_tokens[1] + 0.5 * (3000 - wl.new_tokens[1] - wl.cached_tokens[1])
    assert fit.new_tokens[1] + fit.cached_tokens[1] == pytest.approx(prompt)  # the prompt blends ...
    assert fit.cached_tokens[1] / prompt == pytest.approx(0.9)  # ... its cached share is the window's
    assert fit.output_tokens[1] == pytest.approx(wl.output_tokens[1] + 0.5 * (200 - wl.output_tokens[1]))
    assert fit.moved_share == pytest.approx(0.1) and fit.moved_hit == pytest.approx(0.9)  # no half of a 0 prior
    # the second window blends everything with alpha
    again = fit_workload(fit, [replace(r, cached_tokens=0 if r.turn == 2 else r.cached_tokens, moved=False)
                               for r in recs], alpha=0.5)
    assert again.cached_tokens[1] == pytest.approx(0.5 * fit.cached_tokens[1])
    assert again.moved_share == pytest.approx(0.05)
