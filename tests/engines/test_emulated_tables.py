"""The emulator's measured cost tables against the aiconfigurator database they are built from:
interpolation within 2 % off the grid, closed-form decode spans, the on-disk cache (a corrupt or
stale file is rebuilt, loudly), named errors for what the database lacks, any system it has."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path
from typing import Any

import pytest

from pearl.config import load_config
from pearl.engines import emulated_tables as et
from pearl.engines.emulated_costs import MeasuredCosts, worker_costs
from pearl.engines.emulated_tables import (
    CostDatabaseError,
    CostTables,
    TableSpan,
    load_tables,
    resolve_model_id,
    table_key,
)

#: the interpolation error the module docstring promises
TOL = 0.02


def _key(model: str = "Qwen/Qwen3-8B", system: str = "h200_sxm") -> et.TableKey:
    return table_key(model, system, "sglang", None, 1)


@pytest.fixture(scope="module")
def tables_8b() -> CostTables:
    return load_tables(_key())


@pytest.fixture(scope="module")
def db_8b() -> Any:
    return et._handle(_key())[0]


def test_model_names_map_to_the_database() -> None:
    assert resolve_model_id("qwen3-8b") == "Qwen/Qwen3-8B"
    assert resolve_model_id("qwen3-30b-a3b") == "Qwen/Qwen3-30B-A3B"
    with pytest.raises(CostDatabaseError, match=r"'tiny-qwen3' is not in the aiconfigurator-core database \(closest "
                       r"of its \d+: Qwen/Qwen3-8B, .*all: python -m pearl costs --list\).*emulator.costs: datasheet"):
        resolve_model_id("tiny-qwen3")
    with pytest.raises(CostDatabaseError, match="database_model='Qwen/Qwen9' is not in"):
        resolve_model_id("qwen3-8b", "Qwen/Qwen9")


def test_a_system_the_database_lacks_is_a_named_error() -> None:
    with pytest.raises(CostDatabaseError, match=r"system 'tpu_v5' is not in the .* database; it has: .*h100_sxm.*"
                                                r"h200_sxm"):
        et._handle(_key(system="tpu_v5"))
    with pytest.raises(CostDatabaseError, match=r"backend version '9.9' of sglang on h200_sxm.*0\.5\.14"):
        et._handle(table_key("Qwen/Qwen3-8B", "h200_sxm", "sglang", "9.9", 1))


def test_decode_interpolates_within_two_percent(tables_8b: CostTables, db_8b: Any) -> None:
    rng = random.Random(7)
    worst = 0.0
    for _ in range(150):
        n, s = rng.randint(1, 256), rng.randint(200, 40_000)
        worst = max(worst, abs(tables_8b.decode_step_s(n, s) / (db_8b.decode_step_latency(n, s, 2) / 1e3) - 1))
    assert worst <= TOL


def test_prefill_interpolates_within_two_percent(tables_8b: CostTables, db_8b: Any) -> None:
    rng = random.Random(8)
    worst = 0.0
    for _ in range(150):
        x, c = rng.randint(1, 8192), rng.choice([0, rng.randint(1, 40_000)])
        db = db_8b.predict_prefill_latency(1, x + c, c) / 1e3
        worst = max(worst, abs(tables_8b.prefill_chunk_s([(x, c)]) / db - 1))
    for _ in range(80):  # a chunk of m equal requests is the database's batched prefill
        m = rng.randint(2, 40)
        x, c = rng.randint(1, 8192 // m), rng.choice([0, rng.randint(1, 30_000)])
        db = db_8b.predict_prefill_latency(m, x + c, c) / 1e3
        worst = max(worst, abs(tables_8b.prefill_chunk_s([(x, c)] * m) / db - 1))
    assert worst <= TOL


def test_a_mixed_chunk_costs_the_uniform_batch_of_its_tokens_and_work(tables_8b: CostTables) -> None:
    # two requests, (1000 new over 0) and (3000 new over 9000): X = 4000, W = 1000*500 + 3000*10500
    x, w = 4000, 1000 * 500 + 3000 * 10_500
    c_eq = w / x - x / 4
    assert tables_8b.prefill_chunk_s([(1000, 0), (3000, 9000)]) == pytest.approx(
        tables_8b.nonattn_s(x) + tables_8b.attn_s(2, x / 2, c_eq))
    assert tables_8b.prefill_chunk_s([(0, 500)]) == 0.0


@pytest.mark.parametrize("model", ["Qwen/Qwen3-8B", "Qwen/Qwen3-30B-A3B"])
def test_the_mixed_step_is_the_databases_and_not_chunk_plus_decode(model: str) -> None:
    """t_mix against the database's mixed step (one request of x new tokens over c cached, n decodes
    at the same context), off the grids: its shared non-attention pass and its decode attention within
    2 %, the whole step within 2 % where nothing is cached (the database prices a mixed chunk's
    attention as if it had no cached tokens; t_mix keeps the chunk's attention of its prefill, the
    cost the emulator gives that chunk alone). And it is below the chunk plus a decode iteration by
    the decode's non-attention operators N[n], which the shared pass does not run twice."""
    tables = load_tables(_key(model))
    db = et._handle(_key(model))[0]
    rng = random.Random(7)
    saved: list[tuple[float, float]] = []
    for i in range(16):
        x, n = rng.randint(300, 8000), rng.randint(1, 200)
        c = 0 if i % 2 else rng.randint(200, 20_000)
        total, shared, _ctx_attn, dec_attn = (v / 1e3 for v in db.mixed_step_breakdown(x, n, x + c, 2, c))
        got = tables.mixed_step_s([(x, c)], n, x + c)
        assert tables.nonattn_s(x + n) == pytest.approx(shared, rel=TOL), (x, c, n)
        assert tables.decode_step_s(n, x + c) - tables.decode_nonattn[n - 1] == pytest.approx(dec_attn, rel=TOL)
        assert got - tables.nonattn_s(x + n) - (tables.decode_step_s(n, x + c) - tables.decode_nonattn[n - 1]) == (
            pytest.approx(tables.attn_s(1, x, c)))
        if c == 0:
            assert got == pytest.approx(total, rel=TOL), (x, n)
        apart = tables.prefill_chunk_s([(x, c)]) + tables.decode_step_s(n, x + c)
        assert apart - got == pytest.approx(tables.decode_nonattn[n - 1] - (tables.nonattn_s(x + n) - tables.nonattn_s(x)))
        saved.append((apart - got, tables.decode_nonattn[n - 1]))
    # the GEMM tables' kinks make G[x + n] - G[x] jump, so one step may save little; on average over half N[n]
    assert sum(a for a, _ in saved) > 0.5 * sum(b for _, b in saved) > 16 * 1e-3  # a millisecond and more per step
    assert tables.mixed_step_s([(500, 0)], 0, 0.0) == tables.prefill_chunk_s([(500, 0)])
    assert tables.mixed_step_s([], 8, 4000.0) == tables.decode_step_s(8, 4000.0)


@pytest.mark.parametrize(("n", "context", "k"), [(1, 100, 3000), (7, 7 * 5000, 20_000), (64, 64 * 30_000, 40_000),
                                                  (200, 200 * 127.5, 500)])
def test_span_sum_is_the_sum_of_its_steps_and_inverts(tables_8b: CostTables, n: int, context: float, k: int) -> None:
    span = tables_8b.span(n, context, k)
    steps = [tables_8b.decode_step_s(n, context / n + j) for j in range(k)]
    assert span.total(k) == pytest.approx(sum(steps), rel=1e-9)
    assert span.total(k // 3) == pytest.approx(sum(steps[: k // 3]), rel=1e-9)
    for j in (0, 1, k // 2, k - 1):
        t, margin = sum(steps[:j]), 1e-8 * max(1.0, sum(steps[:j]))  # within allows 1e-9 relative rounding
        assert span.within(t + margin, k) == j
        if j:
            assert span.within(t - margin, k) == j - 1
    assert span.within(1e9, k) == k
    assert isinstance(span, TableSpan)


def _reference_attn(t: CostTables, m: int, new: float, cached: float) -> float:
    """A[m, x, c] written out from the module docstring: linear in m and c, linear in the attention
    work x (c + x / 2) between the two grid values of x around ``new`` (end segments extended)."""
    def seg(grid: tuple[int, ...], v: float) -> int:
        return min(max(max(i for i, g in enumerate(grid) if g <= v) if v >= grid[0] else 0, 0), len(grid) - 2)

    k, i, j = seg(et.ATTN_BATCH, m), seg(et.ATTN_NEW, new), seg(et.ATTN_CACHED, cached)
    wm = (m - et.ATTN_BATCH[k]) / (et.ATTN_BATCH[k + 1] - et.ATTN_BATCH[k])
    wc = (cached - et.ATTN_CACHED[j]) / (et.ATTN_CACHED[j + 1] - et.ATTN_CACHED[j])
    lo_x, hi_x = et.ATTN_NEW[i], et.ATTN_NEW[i + 1]
    work = [x * (cached + x / 2.0) for x in (lo_x, new, hi_x)]
    wx = (work[1] - work[0]) / (work[2] - work[0])

    def at(kk: int) -> float:
        lo = [t.attn[kk][i][j] * (1 - wc) + t.attn[kk][i][j + 1] * wc,
              t.attn[kk][i + 1][j] * (1 - wc) + t.attn[kk][i + 1][j + 1] * wc]
        return lo[0] * (1 - wx) + lo[1] * wx

    return at(k) * (1 - wm) + at(k + 1) * wm


def test_a_chunk_is_priced_as_its_formula_and_the_same_on_every_call(tables_8b: CostTables) -> None:
    """t_pre = G[X] + A[m, X / m, c_eq] from the written-out formula on random chunks (repeats
    included: a priced chunk is kept and must come back unchanged, and equal to a fresh table's)."""
    rng = random.Random(11)
    chunks = [[(rng.choice([0, rng.randint(1, 8192)]), rng.randint(0, 60_000)) for _ in range(rng.randint(1, 5))]
              for _ in range(300)]
    chunks += [[(rng.randint(1, 400), rng.randint(0, 30_000)) for _ in range(rng.randint(6, 60))] for _ in range(100)]
    chunks += [*chunks[:100], [(8192, 0)], [(8192, 8192)], [(0, 10)], []]
    fresh = CostTables(tables_8b.key, "", tables_8b.decode, tables_8b.nonattn, tables_8b.attn,
                       tables_8b.decode_nonattn)
    for parts in chunks:
        live = [(x, c) for x, c in parts if x > 0]
        if not live:
            assert tables_8b.prefill_chunk_s(parts) == 0.0
            continue
        m, big_x = len(live), sum(x for x, _ in live)
        c_eq = max(sum(x * (c + x / 2) for x, c in live) / big_x - big_x / (2 * m), 0.0)
        want = tables_8b.nonattn_s(big_x) + _reference_attn(tables_8b, m, big_x / m, c_eq)
        got = tables_8b.prefill_chunk_s(parts)
        assert got == pytest.approx(want, rel=1e-12)
        assert got == tables_8b.prefill_chunk_s(list(parts)) == fresh.prefill_chunk_s(parts)


def test_the_priced_chunks_kept_are_bounded(tables_8b: CostTables, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(et, "CHUNK_MEMO", 8)
    t = CostTables(tables_8b.key, "", tables_8b.decode, tables_8b.nonattn, tables_8b.attn, tables_8b.decode_nonattn)
    costs = [t.prefill_chunk_s([(100 + i, 0)]) for i in range(20)]
    assert len(t._chunks) <= 8
    assert costs == [t.prefill_chunk_s([(100 + i, 0)]) for i in range(20)]


def test_a_span_is_the_sum_of_its_steps_on_random_batches(tables_8b: CostTables) -> None:
    """The closed-form span (its rows' slopes kept per batch) against the plain per-step sum, and
    its inverse, on random batches, contexts and lengths (batches repeat: the kept slopes are reused)."""
    rng = random.Random(12)
    for _ in range(40):
        n = rng.choice([1, 2, 3, 8, 64, 255, 256])
        s0, k = rng.uniform(1, 60_000), rng.randint(1, 3000)
        span = tables_8b.span(n, s0 * n, k)
        steps = [tables_8b.decode_step_s(n, s0 * n / n + j) for j in range(k)]
        assert span.total(k) == pytest.approx(sum(steps), rel=1e-9)
        plain = TableSpan(tables_8b.decode_row(n), s0 * n / n, k)  # slopes computed from the row itself
        for j in (0, 1, rng.randint(0, k), k):
            assert span.total(j) == plain.total(j)
            assert span.total(j) == pytest.approx(sum(steps[:j]), rel=1e-9)
        for _ in range(3):
            e = rng.uniform(0, span.total(k) * 1.1)
            j = span.within(e, k)
            assert j == plain.within(e, k)
            assert sum(steps[:j]) <= e * (1 + 1e-9) and (j == k or sum(steps[: j + 1]) > e * (1 - 1e-9))


def test_cache_is_reused_and_a_corrupt_or_stale_file_is_rebuilt_loudly(
        tables_8b: CostTables, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    built: list[et.TableKey] = []

    def build(key: et.TableKey) -> CostTables:  # the database build itself: test_*_interpolates_*
        built.append(key)
        return CostTables(key, tables_8b.literal_version, tables_8b.decode, tables_8b.nonattn, tables_8b.attn,
                          tables_8b.decode_nonattn)

    monkeypatch.setattr(et, "build_tables", build)
    key = _key()
    load_tables(key, tmp_path)
    (path,) = tmp_path.glob("*.json")
    assert len(built) == 1
    load_tables(key, tmp_path)
    assert len(built) == 1  # read back, not rebuilt
    data = json.loads(path.read_text())
    data["tables"]["decode"][3][5] *= 1.5  # altered without its checksum
    path.write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING, logger="pearl.engines.emulated_tables"):
        again = load_tables(key, tmp_path)
    assert len(built) == 2 and "checksum mismatch" in caplog.text and "rebuilding" in caplog.text
    assert again.decode[3][5] == tables_8b.decode[3][5]
    path.write_text(path.read_text()[:1000])  # truncated
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pearl.engines.emulated_tables"):
        load_tables(key, tmp_path)
    assert len(built) == 3 and "not JSON" in caplog.text
    other = et.TableKey(*[*list(key.__getattribute__(f) for f in key.__slots__)][:-1], "0.0.1")
    path.write_text(CostTables(other, "", tables_8b.decode, tables_8b.nonattn, tables_8b.attn, tables_8b.decode_nonattn).to_json())
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pearl.engines.emulated_tables"):
        load_tables(key, tmp_path)  # a file of another package version under this name: stale
    assert len(built) == 4 and "built for" in caplog.text
    assert other.digest() != key.digest()  # and each version has its own file name


def test_the_engine_runs_on_the_tables_when_the_config_says_so() -> None:
    cfg = load_config("qwen3-8b-h200", {"emulator.costs": "database"})
    costs = worker_costs(cfg.model, cfg.hardware, cfg.emulator, cfg.cluster.tp_size)
    assert isinstance(costs, MeasuredCosts)
    assert costs.decode_step_s(1, 2048) == pytest.approx(5.07e-3, rel=0.01)  # the database: 5.07 ms
    assert costs.prefill_chunk_s([(4096, 0)]) == pytest.approx(96.1e-3, rel=0.01)  # 96.1 ms
    # the KV pool stays the config's: (141 GB * 0.9 - 16.4 GB) / 144 KiB per token
    assert costs.kv_capacity_tokens == int((141e9 * 0.9 - 8.2e9 * 2) // 147456)


def test_any_system_the_database_has_can_be_chosen() -> None:
    cfg = load_config("qwen3-8b-h200", {"hardware": "h100_sxm", "emulator.costs": "database"})
    costs = worker_costs(cfg.model, cfg.hardware, cfg.emulator, cfg.cluster.tp_size)
    assert isinstance(costs, MeasuredCosts) and costs.tables.key.system == "h100_sxm"
    db = et._handle(costs.tables.key)[0]
    for n, s in ((1, 3000), (24, 9000)):
        assert costs.decode_step_s(n, n * s) == pytest.approx(db.decode_step_latency(n, s, 2) / 1e3, rel=TOL)
    h200 = worker_costs(cfg.model, load_config("qwen3-8b-h200").hardware, cfg.emulator)
    assert costs.decode_step_s(16, 16 * 16_000) > h200.decode_step_s(16, 16 * 16_000)  # 3.35 vs 4.8 TB/s
    assert costs.kv_capacity_tokens < h200.kv_capacity_tokens  # 80 GiB vs 141 GB


def test_a_model_that_does_not_fit_is_a_clear_error() -> None:
    cfg = load_config("qwen3-30b-a3b-h200", {"emulator.costs": "database"})
    small = cfg.hardware.model_copy(update={"memory_gb": 40.0})
    with pytest.raises(ValueError, match=r"qwen3-30b-a3b weights \(61.0 GB\) do not fit in 1 x h200.*raise "
                                         r"cluster.tp_size"):
        MeasuredCosts.from_specs(cfg.model, small, cfg.emulator)
