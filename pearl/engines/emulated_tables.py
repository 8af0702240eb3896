"""Measured per-iteration costs of the emulated engine: tables from NVIDIA's aiconfigurator database.

``aiconfigurator-core`` (Apache-2.0; per-kernel GEMM / attention / MoE / communication tables
measured per GPU and serving-engine version) composes a model's forward pass from its operators.
PEARL asks it once per (model, system, backend, backend version, tp) for four tables, then
interpolates; no query runs during a replay. Symbols: ``n`` decoding sequences, ``s`` context
tokens per sequence, ``x_i`` / ``c_i`` new / cached tokens of request ``i`` in a prefill chunk,
``m`` requests in the chunk, ``X = sum x_i``, ``W = sum x_i (c_i + x_i / 2)`` its attention work::

    decode iteration   t_dec(n, s)   = D[n, s]                       decode_step_latency(n, s, 2)
        N[n]         its non-attention operators (GEMMs, norms, logits) on n tokens: D[n, s] less the
                     generation_attention of decode_step_per_op(n, s, 2) (it does not depend on s)
    prefill chunk      t_pre(parts)  = G[X] + A[m, X / m, c_eq],     c_eq = W / X - X / (2 m)  (>= 0)
        G[X]         the non-attention operators (GEMMs, norms, activation, logits) on X tokens: the
                     database's whole prefill predict_prefill_latency(1, X, 0) less its attention
        A[m, x, c]   the attention of a batch of m requests of x new tokens over c cached ones each:
                     predict_prefill_latency(m, x + c, c) - G[m x] (the context_attention operator of
                     run_static_per_op where m x is past G's grid)
    (c_eq makes the chunk the uniform batch of the same tokens and the same attention work; one
    request: G[x] + A[1, x, c] = predict_prefill_latency(1, x + c, c), the database's own sum)
    mixed step         t_mix(parts, n, s) = G[X + n] + A[m, X / m, c_eq] + (D[n, s] - N[n])
        a prefill chunk and n decoding sequences of s context tokens in one forward pass (SGLang
        ``--enable-mixed-chunk``): the database's mixed_step_latency composition - the non-attention
        operators run once on the X + n tokens of both, then each attention. It is *not* the chunk
        plus a decode iteration: that pays N[n] (the weights read for the decodes) again, 4.6 ms
        for Qwen3-8B, 3.3-17 ms for Qwen3-30B-A3B on h200_sxm (its decode MoE reads the experts the
        batch touches; inside a chunk's X tokens they are read anyway).

Grids: ``D`` on every batch 1-256 x ``DECODE_CTX``, ``G`` on every token count 1-16384 (the GEMM
tables' kinks make ``G`` saw-toothed: it is not interpolated), ``A`` on ``ATTN_BATCH`` x ``ATTN_NEW``
x ``ATTN_CACHED``. Between grid points: piecewise-linear in ``s``; ``A`` linear in ``m`` and ``c``
and linear in the attention work ``x (c + x / 2)`` between two grid values of ``x``; outside the
grid the end segment is extended. The error against the database at random off-grid points
(``tests/engines/test_emulated_tables.py``, <= 2 % asserted): decode <= 0.5 %, one request's prefill
<= 1.4 %, a chunk of m equal requests <= 2 % (Qwen3-8B, Qwen3-30B-A3B on h200_sxm / sglang 0.5.14).
The mixed step runs only where ``emulator.mixed_chunk`` is set: SGLang's default, and the way PEARL
launches SGLang (``pearl/engines/sglang.py``), runs a prefill chunk as its own iteration while the
decodes wait (``enable_mixed_chunk = False``), and so does the emulator by default. Against
``mixed_step_latency``: <= 2 % (``tests/engines/test_emulated_tables.py``).

A decode span (n fixed, every sequence one token longer per iteration) costs ``t(j) = D_n(s0 + j)``
at iteration ``j`` with ``s0 = C / n``; ``D_n`` is piecewise-linear in ``s``, so ``t`` is
piecewise-linear in ``j`` with breakpoints ``ceil(s_k - s0)`` at the grid's contexts ``s_k`` and
the span's sum ``S(K) = sum_{j<K} t(j)`` is closed form per piece (``TableSpan``): one bisection,
never a sum per token.

Per replay event the tables cost what the datasheet formulas do (``benchmarks/bench_replay.py``):
``CostTables`` keeps each batch's row slopes ``(D[n, s_{k+1}] - D[n, s_k]) / (s_{k+1} - s_k)`` and
the price of each distinct prefill chunk (up to ``CHUNK_MEMO`` of them; a prompt with no cache hit
is cut into the same chunks as every other, so about 2 of 3 chunks of a paper replay repeat). Both
are the same floats the formulas give (``tests/engines/test_emulated_tables.py``).

Built once per (model, system, backend, version, tp): ~20 s of CPU. The tables are written to a JSON file under ``cache_dir()`` (``$PEARL_COST_CACHE`` or
``~/.cache/pearl/emulator-costs``) named by the key; a file whose key, grids, values or checksum do
not match is rebuilt with a WARNING naming why (never read silently).

Public names: ``CostTables``, ``TableKey``, ``TableSpan``, ``CostDatabaseError``, ``table_key``,
``load_tables``, ``build_tables``, ``database_catalog``, ``cache_dir``, ``row_slopes``.
"""

from __future__ import annotations

import bisect
import difflib
import functools
import hashlib
import importlib.metadata
import json
import logging
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: format of the cache file; a file of another format is rebuilt
TABLE_FORMAT = 2
PACKAGE = "aiconfigurator-core"

def _steps(*runs: tuple[int, int, int]) -> tuple[int, ...]:
    """The union of ``range(lo, hi + 1, step)`` over ``runs``, sorted."""
    return tuple(sorted({v for lo, hi, step in runs for v in range(lo, hi + 1, step)}))


#: decode batch n: every batch to 64 (the GEMM tables' tile steps show there), then every 8
DECODE_BATCH = _steps((1, 256, 1))
#: decode context per sequence s
DECODE_CTX = _steps((128, 1024, 128), (1536, 8192, 512), (9216, 65536, 1024))
#: new tokens of a prefill chunk X (and of a request x): the GEMMs' kinks need this density
PREFILL_TOKENS = _steps((1, 16384, 1))
#: mean new tokens per request x of the attention table
ATTN_NEW = (1, 2, 4, 8, 16, 32, 64, 128, 192, 256, 320, 384, 448, 512, 768, 1024, 1536, 2048, 2560, 3072, 3584, *range(4096, 16385, 1024))
#: requests per chunk m of the attention table
ATTN_BATCH = (1, 2, 3, 4, 5, 6, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64)
#: distinct prefill chunks ``CostTables`` keeps priced (then it starts over: bounded memory)
CHUNK_MEMO = 1 << 16
#: mean cached tokens per request c of the attention table
ATTN_CACHED = (0, 256, 512, 768, *range(1024, 8192, 512), *range(8192, 32768, 1024), *range(32768, 65537, 2048))


class CostDatabaseError(ValueError):
    """The database cannot give costs for this configuration (model, system, backend, version)."""


@dataclass(frozen=True, slots=True)
class TableKey:
    """What a set of tables was built for (the cache file's name is its hash)."""

    model_id: str  # the database's model, e.g. "Qwen/Qwen3-8B"
    system: str  # e.g. "h200_sxm"
    backend: str  # e.g. "sglang"
    backend_version: str  # a literal version or the database's "current" slot
    tp: int
    package_version: str

    def digest(self) -> str:
        raw = json.dumps([asdict(self), TABLE_FORMAT, _grids()])
        return hashlib.sha256(raw.encode()).hexdigest()[:16]


# ------------------------------------------------------------------------- the catalogue
def _package_root() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or not spec.submodule_search_locations:
        raise CostDatabaseError(f"{PACKAGE} is not installed: run `make setup` (or pip install {PACKAGE}==0.12.0), "
                                "or set emulator.costs: datasheet")
    return Path(next(iter(spec.submodule_search_locations)))


def package_version() -> str:
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise CostDatabaseError(f"{PACKAGE} is not installed: run `make setup` (or pip install "
                                f"{PACKAGE}==0.12.0), or set emulator.costs: datasheet") from None


def database_models() -> list[str]:
    """The models the database ships a config for (``Org/Name``)."""
    folder = _package_root() / "model_configs"
    return sorted(p.name[: -len("_config.json")].replace("--", "/", 1)
                  for p in folder.glob("*_config.json"))


def database_catalog() -> dict[str, dict[str, list[str]]]:
    """``system -> backend -> [versions]`` the database holds measured tables for."""
    from aiconfigurator_core.sdk import perf_database

    return {s: {b: list(v) for b, v in sorted(bk.items())}
            for s, bk in sorted(perf_database.get_supported_databases().items())}


def resolve_model_id(name: str, explicit: str | None = None) -> str:
    """The database's model for PEARL's model ``name``: ``explicit`` if given, else the one whose
    ``Name`` (after ``Org/``) equals ``name`` ignoring case (``qwen3-8b`` -> ``Qwen/Qwen3-8B``)."""
    models = database_models()
    if explicit is not None:
        if explicit not in models:
            raise CostDatabaseError(f"emulator.database_model={explicit!r} is not in the {PACKAGE} database (its "
                                    f"{len(models)} models: python -m pearl costs --list)")
        return explicit
    hits = [m for m in models if m.split("/", 1)[-1].lower() == name.lower()]
    if len(hits) == 1:
        return hits[0]
    if hits:
        raise CostDatabaseError(f"model {name!r} matches several database models {hits}: set "
                                "emulator.database_model to one of them")
    names = {m.split("/", 1)[-1].lower(): m for m in models}
    near = [names[n] for n in difflib.get_close_matches(name.lower(), list(names), n=6, cutoff=0.4)]
    raise CostDatabaseError(f"model {name!r} is not in the {PACKAGE} database (closest of its {len(models)}: "
                            f"{', '.join(near) or '-'}; all: python -m pearl costs --list); set "
                            "emulator.database_model to one of them, or emulator.costs: datasheet for the "
                            "datasheet formulas")


def table_key(model_id: str, system: str, backend: str, backend_version: str | None, tp: int) -> TableKey:
    return TableKey(model_id, system, backend, backend_version or "current", tp, package_version())


# ------------------------------------------------------------------------- interpolation
def _seg(grid: tuple[int, ...] | list[float], x: float) -> tuple[int, float]:
    """(i, w): x = grid[i] + w (grid[i+1] - grid[i]), i clamped to the end segments (w may leave [0, 1])."""
    i = bisect.bisect_right(grid, x) - 1
    i = min(max(i, 0), len(grid) - 2)
    lo, hi = grid[i], grid[i + 1]
    return i, (x - lo) / (hi - lo)


def _work_lerp(grid: tuple[int, ...], vals: list[float], x: float, c: float) -> float:
    """vals at x, linear in the attention work x (c + x / 2) between grid points."""
    i, _ = _seg(grid, x)
    lo, hi = grid[i], grid[i + 1]
    w_lo, w_hi = lo * (c + lo / 2.0), hi * (c + hi / 2.0)
    return vals[i] + (x * (c + x / 2.0) - w_lo) / (w_hi - w_lo) * (vals[i + 1] - vals[i])


def _lerp(grid: tuple[int, ...], vals: list[float], x: float) -> float:
    i, w = _seg(grid, x)
    return vals[i] + w * (vals[i + 1] - vals[i])


def _chunk_sums(parts: list[tuple[int, int]]) -> tuple[int, int, float]:
    """(m, X, W) over the parts with x_i > 0: their count, sum x_i and sum x_i (c_i + x_i / 2),
    summed in the parts' order."""
    m = big_x = 0
    work = 0.0
    for x, c in parts:
        if x > 0:
            m += 1
            big_x += x
            work += x * (c + x / 2.0)
    return m, big_x, work


@dataclass(frozen=True)
class CostTables:
    """The four tables of one (model, system, backend, version, tp), in seconds (module docstring)."""

    key: TableKey
    literal_version: str
    decode: list[list[float]]  # [len(DECODE_BATCH)][len(DECODE_CTX)] seconds
    nonattn: list[float]  # [len(PREFILL_TOKENS)] seconds
    attn: list[list[list[float]]]  # [len(ATTN_BATCH)][len(ATTN_NEW)][len(ATTN_CACHED)] seconds
    decode_nonattn: list[float]  # [len(DECODE_BATCH)] seconds: N[n]
    #: n -> (D_n, its slopes) of the batches a replay has asked for (a span per event reads them)
    _rows: dict[int, tuple[list[float], list[float]]] = field(default_factory=dict, init=False, repr=False,
                                                              compare=False)
    #: parts -> t_pre of the chunks priced so far (a prompt with no cache hit is cut into the same
    #: (chunk_tokens, 0), (chunk_tokens, chunk_tokens), ... chunks as every other: ~2 of 3 repeat)
    _chunks: dict[tuple[tuple[int, int], ...], float] = field(default_factory=dict, init=False, repr=False,
                                                              compare=False)

    def decode_row(self, n: float) -> list[float]:
        """D_n on ``DECODE_CTX`` (past the grid's batches: extended from its last two rows)."""
        if 1 <= n <= len(self.decode) and n == int(n):
            return self.decode[int(n) - 1]  # DECODE_BATCH is every batch from 1
        i, w = _seg(DECODE_BATCH, n)
        lo, hi = self.decode[i], self.decode[i + 1]
        return [a + w * (b - a) for a, b in zip(lo, hi, strict=True)]

    def decode_step_s(self, n: int, context_per_seq: float) -> float:
        return _lerp(DECODE_CTX, self.decode_row(n), context_per_seq) if n > 0 else 0.0

    def nonattn_s(self, tokens: int) -> float:
        if 1 <= tokens <= len(self.nonattn):
            return self.nonattn[tokens - 1]  # PREFILL_TOKENS is every count from 1
        return _lerp(PREFILL_TOKENS, self.nonattn, tokens)

    def attn_s(self, m: int, new: float, cached: float) -> float:
        """A[m, x, c]: the attention of m requests of x new tokens over c cached ones each (linear in
        the attention work x (c + x / 2) between grid points of x; linear in c and m)."""
        k, wm = _seg(ATTN_BATCH, m)
        i = min(max(bisect.bisect_right(ATTN_NEW, new) - 1, 0), len(ATTN_NEW) - 2)
        j, wc = _seg(ATTN_CACHED, cached)
        lo_x, hi_x = ATTN_NEW[i], ATTN_NEW[i + 1]
        w_lo, w_hi = lo_x * (cached + lo_x / 2.0), hi_x * (cached + hi_x / 2.0)
        wx = (new * (cached + new / 2.0) - w_lo) / (w_hi - w_lo)
        # the plane of batch k, then of k + 1: bilinear in (work, c) on each
        a, b = self.attn[k][i], self.attn[k][i + 1]
        lo = a[j] + wc * (a[j + 1] - a[j])
        p0 = float(lo + wx * (b[j] + wc * (b[j + 1] - b[j]) - lo))
        a, b = self.attn[k + 1][i], self.attn[k + 1][i + 1]
        lo = a[j] + wc * (a[j + 1] - a[j])
        p1 = float(lo + wx * (b[j] + wc * (b[j + 1] - b[j]) - lo))
        return p0 + wm * (p1 - p0)

    def prefill_chunk_s(self, parts: list[tuple[int, int]]) -> float:
        """G[X] + A[m, X / m, c_eq] for ``parts`` = (new x_i, cached c_i) of m requests, ``c_eq = W / X
        - X / (2 m)`` with ``W = sum x_i (c_i + x_i / 2)``: the uniform batch of the same tokens and
        the same attention work (c_eq >= 0 by Cauchy-Schwarz). Kept per distinct ``parts``."""
        key = tuple(parts)
        got = self._chunks.get(key)
        if got is None:
            if len(self._chunks) >= CHUNK_MEMO:
                self._chunks.clear()
            got = self._chunks[key] = self._prefill_chunk_s(parts)
        return got

    def _prefill_chunk_s(self, parts: list[tuple[int, int]]) -> float:
        m, big_x, work = _chunk_sums(parts)
        if not m:
            return 0.0
        c_eq = max(work / big_x - big_x / (2.0 * m), 0.0)
        return self.nonattn_s(big_x) + self.attn_s(m, big_x / m, c_eq)

    def mixed_step_s(self, parts: list[tuple[int, int]], n: int, context_per_seq: float) -> float:
        """t_mix = G[X + n] + A[m, X / m, c_eq] + D[n, s] - N[n]: the prefill chunk ``parts`` and
        one decode iteration of n sequences of ``context_per_seq`` tokens in one forward pass."""
        if n <= 0:
            return self.prefill_chunk_s(parts)
        m, big_x, work = _chunk_sums(parts)
        if not m:
            return self.decode_step_s(n, context_per_seq)
        c_eq = max(work / big_x - big_x / (2.0 * m), 0.0)
        n_row = _lerp(DECODE_BATCH, self.decode_nonattn, n) if n > len(self.decode_nonattn) else self.decode_nonattn[n - 1]
        return (self.nonattn_s(big_x + n) + self.attn_s(m, big_x / m, c_eq)
                + self.decode_step_s(n, context_per_seq) - n_row)

    def span(self, n: int, context: float, k_max: int) -> TableSpan:
        """The decode span of n sequences holding ``context`` tokens in all, up to ``k_max``
        iterations (module docstring)."""
        got = self._rows.get(n)
        if got is None:
            row = self.decode_row(n)
            got = self._rows[n] = (row, row_slopes(row))
        return TableSpan(got[0], context / n, k_max, got[1])

    # ---------------------------------------------------------------- file
    def payload(self) -> dict[str, Any]:
        return {"decode": self.decode, "nonattn": self.nonattn, "attn": self.attn,
                "decode_nonattn": self.decode_nonattn}

    def to_json(self) -> str:
        body = self.payload()
        return json.dumps({
            "format": TABLE_FORMAT, "key": asdict(self.key), "literal_version": self.literal_version,
            "grids": _grids(),
            "tables": body, "sha256": _checksum(body),
        })

    @staticmethod
    def from_json(text: str, key: TableKey) -> CostTables:
        """The tables in ``text``; ``ValueError`` naming the first thing that does not match ``key``,
        the grids, the shapes, the checksum or a positive finite value."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"not JSON ({e})") from None
        if not isinstance(data, dict) or data.get("format") != TABLE_FORMAT:
            raise ValueError(f"format {data.get('format') if isinstance(data, dict) else None!r}, "
                             f"expected {TABLE_FORMAT}")
        if data.get("key") != asdict(key):
            raise ValueError(f"built for {data.get('key')}, expected {asdict(key)}")
        if data.get("grids") != json.loads(json.dumps(_grids())):
            raise ValueError("its grids differ from this version's")
        body = data.get("tables")
        if not isinstance(body, dict) or data.get("sha256") != _checksum(body):
            raise ValueError("checksum mismatch (the file was altered or truncated)")
        shapes = {"decode": (len(DECODE_BATCH), len(DECODE_CTX)), "nonattn": (len(PREFILL_TOKENS),),
                  "attn": (len(ATTN_BATCH), len(ATTN_NEW), len(ATTN_CACHED)),
                  "decode_nonattn": (len(DECODE_BATCH),)}
        for name, shape in shapes.items():
            flat = _flatten(body.get(name), shape, name)
            if not all(isinstance(v, float | int) and math.isfinite(v) and v > 0 for v in flat):
                raise ValueError(f"table {name} holds a value that is not a positive finite number")
        return CostTables(key, str(data.get("literal_version", "")), body["decode"], body["nonattn"], body["attn"],
                          body["decode_nonattn"])


def _grids() -> dict[str, tuple[int, ...]]:
    return {"decode_batch": DECODE_BATCH, "decode_ctx": DECODE_CTX, "prefill_tokens": PREFILL_TOKENS,
            "attn_batch": ATTN_BATCH, "attn_new": ATTN_NEW, "attn_cached": ATTN_CACHED}


def _checksum(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _flatten(v: Any, shape: tuple[int, ...], name: str) -> list[Any]:
    if not isinstance(v, list) or len(v) != shape[0]:
        raise ValueError(f"table {name} has the wrong shape (expected {shape})")
    if len(shape) == 1:
        return v
    out: list[Any] = []
    for row in v:
        out += _flatten(row, shape[1:], name)
    return out


# ------------------------------------------------------------------------- decode spans
class TableSpan:
    """sum_{j<K} D_n(s0 + j) in closed form, D_n piecewise-linear on ``DECODE_CTX``.

    Piece ``i`` covers iterations ``j`` in ``[b_i, b_{i+1})`` with ``b_i = ceil(s_i - s0)`` (clamped
    at 0; the first and last pieces extend past the grid) and costs ``u_i + v_i j`` there;
    ``P_i = S(b_i)`` is kept so ``total(K)`` and its inverse ``within`` bisect over the pieces.
    """

    __slots__ = ("_b", "_p", "_u", "_v")

    def __init__(self, row: list[float], s0: float, limit: int, slopes: list[float] | None = None) -> None:
        """``slopes``: ``(row[i + 1] - row[i]) / (s_{i + 1} - s_i)`` per grid segment (``row_slopes``),
        when the caller keeps them per row; computed here otherwise."""
        grid = DECODE_CTX
        if slopes is None:
            slopes = row_slopes(row)
        b: list[int] = [0]
        u: list[float] = []
        v: list[float] = []
        p: list[float] = [0.0]
        last = len(grid) - 2
        i = min(max(bisect.bisect_right(grid, s0) - 1, 0), last)
        start = 0
        total = 0.0
        while True:
            end = -1  # the last piece: it extends past the grid or past ``limit``
            if i < last and start < limit:
                end = math.ceil(grid[i + 1] - s0)
                if end <= start:  # the span starts past this piece
                    i += 1
                    continue
            slope = slopes[i]
            c0 = row[i] + slope * (s0 - grid[i])
            u.append(c0)
            v.append(slope)
            if end < 0:
                break
            m = end - start  # >= 1: total += sum_{j=start}^{end-1} (c0 + slope j) (``_lin``)
            total = total + (m * c0 + slope * (start + end - 1) * m / 2.0)
            p.append(total)
            b.append(end)
            start = end
            i += 1
        self._b, self._u, self._v, self._p = b, u, v, p

    def total(self, k: int) -> float:
        """S(k)."""
        if k <= 0:
            return 0.0
        i = bisect.bisect_right(self._b, k - 1) - 1  # the piece holding iteration k - 1
        return self._p[i] + _lin(self._u[i], self._v[i], self._b[i], k)

    def within(self, elapsed: float, k_max: int) -> int:
        """The largest k <= k_max with S(k) <= elapsed (closed form per piece, checked exactly)."""
        eps = 1e-9 * max(1.0, elapsed)
        budget = elapsed + eps
        i = bisect.bisect_right(self._p, budget) - 1
        i = min(max(i, 0), len(self._u) - 1)
        start, rest = self._b[i], budget - self._p[i]
        a, c1 = self._u[i] + self._v[i] * start, self._v[i]  # iteration start + m costs a + c1 m
        if rest <= 0:
            m = 0
        elif abs(c1) < 1e-15:
            m = int(rest / a) if a > 0 else k_max
        else:
            h = a - c1 / 2.0
            disc = h * h + 2.0 * c1 * rest
            m = int((-h + math.sqrt(disc)) / c1) if disc >= 0 else k_max
        k = min(max(start + m, 0), k_max)
        while k < k_max and self.total(k + 1) <= budget:
            k += 1
        while k > 0 and self.total(k) > budget:
            k -= 1
        return k


def row_slopes(row: list[float]) -> list[float]:
    """The slope of ``row`` (a decode row on ``DECODE_CTX``) on each grid segment, seconds per token."""
    grid = DECODE_CTX
    return [(row[i + 1] - row[i]) / (grid[i + 1] - grid[i]) for i in range(len(grid) - 1)]


def _lin(c0: float, c1: float, lo: int, hi: int) -> float:
    """sum_{j=lo}^{hi-1} (c0 + c1 j)."""
    m = hi - lo
    return m * c0 + c1 * (lo + hi - 1) * m / 2.0 if m > 0 else 0.0


# ------------------------------------------------------------------------- build / cache
def cache_dir() -> Path:
    env = os.environ.get("PEARL_COST_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "pearl" / "emulator-costs"


def _handle(key: TableKey) -> tuple[Any, str]:
    """The database's compiled engine for ``key`` and the literal backend version (named errors
    for a system, backend or version it lacks)."""
    logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
    from aiconfigurator_core.sdk import EngineHandle, perf_database

    catalog = database_catalog()
    if key.system not in catalog:
        raise CostDatabaseError(f"system {key.system!r} is not in the {PACKAGE} database; it has: "
                                f"{', '.join(catalog)} (set hardware.database_system, or emulator.costs: datasheet)")
    if key.backend not in catalog[key.system]:
        raise CostDatabaseError(f"backend {key.backend!r} has no tables on {key.system}; there: "
                                f"{', '.join(catalog[key.system])}")
    try:
        literal = perf_database.resolve_query_version(key.system, key.backend, key.backend_version)
    except ValueError as e:
        raise CostDatabaseError(f"backend version {key.backend_version!r} of {key.backend} on {key.system}: {e}; "
                                f"listed: {catalog[key.system][key.backend]}") from None
    kwargs: dict[str, Any] = {"backend_version": literal, "tp_size": key.tp}
    try:
        return EngineHandle.compile(key.model_id, key.system, key.backend, **kwargs), literal
    except Exception as e:  # the package raises ValueError / its own errors: name the configuration
        raise CostDatabaseError(f"{PACKAGE} cannot compile {key.model_id} on {key.system}/{key.backend} "
                                f"{literal} tp={key.tp}: {type(e).__name__}: {e}") from None


def _context_split(handle: Any, m: int, new: int, cached: int) -> tuple[float, float]:
    """(non-attention ms, attention ms) of the prefill of m requests of ``new`` tokens over ``cached``."""
    ops, _gen = handle.run_static_per_op(batch_size=m, isl=new + cached, osl=1, prefix=cached)
    attn = sum(v[1] for v in ops if v[0] == "context_attention")
    return sum(v[1] for v in ops) - attn, attn


def build_tables(key: TableKey) -> CostTables:
    """Query the database on the grids (a few seconds; module docstring)."""
    h, literal = _handle(key)
    decode = [[h.decode_step_latency(n, s, 2) / 1e3 for s in DECODE_CTX] for n in DECODE_BATCH]
    # A[1, x, 0] from the operator split, then G at every token count: the database's whole prefill less
    # that (smooth) attention; then A elsewhere: the whole prefill less G (the split where m x is past G)
    dense = _steps((1, 16, 1), (32, 512, 32), (768, 16384, 256))
    first = [_context_split(h, 1, x, 0)[1] / 1e3 for x in dense]
    nonattn: list[float] = [h.predict_prefill_latency(1, x, 0) / 1e3 - _work_lerp(dense, first, x, 0.0) for x in PREFILL_TOKENS]

    def attention(m: int, x: int, c: int) -> float:
        if m * x <= len(nonattn):
            return float(h.predict_prefill_latency(m, x + c, c)) / 1e3 - nonattn[m * x - 1]
        return _context_split(h, m, x, c)[1] / 1e3

    attn = [[[attention(m, x, c) for c in ATTN_CACHED] for x in ATTN_NEW] for m in ATTN_BATCH]
    dec_nonattn = [sum(v[1] for v in h.decode_step_per_op(n, DECODE_CTX[0], 2) if v[0] != "generation_attention") / 1e3
                   for n in DECODE_BATCH]
    return CostTables(key, literal, decode, nonattn, attn, dec_nonattn)


@functools.lru_cache(maxsize=4)
def _parse_validated(text: str, key: TableKey) -> CostTables:
    """``CostTables.from_json``, parsed and checked once per process for the same file text (a
    calibration builds an engine per batch; the text itself is still read and compared each time)."""
    return CostTables.from_json(text, key)


def load_tables(key: TableKey, folder: Path | None = None) -> CostTables:
    """The cached tables of ``key``, built (and written) when absent; a file that does not match is
    rebuilt, with a WARNING naming why."""
    folder = folder or cache_dir()
    path = folder / f"{key.system}-{key.model_id.replace('/', '--')}-{key.backend}-tp{key.tp}-{key.digest()}.json"
    if path.is_file():
        try:
            return _parse_validated(path.read_text(), key)
        except (OSError, ValueError) as e:
            log.warning("emulator cost cache %s is unusable (%s): rebuilding it from the %s database",
                        path, e, PACKAGE)
    tables = build_tables(key)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(tables.to_json())
    tmp.replace(path)
    return tables
