"""The emulator's radix cache (``pearl.engines.radix_cache``) against SGLang's own ``RadixCache``.

The same seeded operations - inserts and matches of conversations that share a system prompt, a
task statement and their own turns, locks held and released as running requests do, evictions
under pressure - run on SGLang 0.5.23's tree in a child process (``tests/contract/sglang_radix.py``)
and on ours; every matched length, every insert's cached prefix, every eviction's freed tokens and
the evictable / protected sizes after every operation are equal.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from pearl.engines.radix_cache import Node, RadixCache

from .sglang_env import ROOT

pytestmark = pytest.mark.sglang_contract


def _ops(seed: int, n: int = 400) -> list[list]:
    """Conversations of [system][task][turn 1][turn 2]..., drawn from a few of each; an insert is
    followed by a match of the same ids (one operation later: the new leaf is the most recent, so no
    two leaves share an access time and LRU is a total order, as it is in time on a server)."""
    rng = random.Random(seed)
    system = list(range(1, 60))
    tasks = [list(range(1000 * (t + 1), 1000 * (t + 1) + rng.randint(5, 40))) for t in range(4)]
    convs: list[list[int]] = []
    ops: list[list] = []
    held: list[int] = []
    nxt = 100_000
    for _ in range(n):
        u = rng.random()
        if u < 0.35 or not convs:
            if convs and rng.random() < 0.6:  # a conversation's next turn
                c = rng.choice(convs)
                c.extend(range(nxt, nxt + rng.randint(1, 30)))
                nxt += 40
            else:
                c = system[: rng.randint(20, len(system))] + rng.choice(tasks)
                convs.append(c)
            cut = rng.randint(1, len(c))
            ops.append(["insert", c[:cut]])
            ops.append(["match", c[:cut]])
        elif u < 0.75:  # a request's admission: match its prompt, and (mostly) hold what it found
            c = rng.choice(convs)
            ids = c[: rng.randint(1, len(c))] + ([rng.randint(500_000, 600_000)] if rng.random() < 0.3 else [])
            ops.append(["match", ids])
            if rng.random() < 0.6:
                ops.append(["lock", len(ops) - 1])
                held.append(len(ops) - 2)
        elif u < 0.88 and held:
            ops.append(["unlock", held.pop(rng.randrange(len(held)))])
        else:
            ops.append(["evict", rng.randint(1, 120)])
    return ops


def _ours(ops: list[list]) -> list[list]:
    tree = RadixCache()
    nodes: dict[int, Node] = {}
    out: list[list] = []
    for i, op in enumerate(ops):
        now = float(i + 1)
        res: int | None = None
        if op[0] == "insert":
            res, nodes[i] = tree.insert(op[1], now)
        elif op[0] == "match":
            res, nodes[i] = tree.match(op[1], now)
        elif op[0] == "lock":
            tree.lock(nodes[op[1]])
        elif op[0] == "unlock":
            tree.unlock(nodes[op[1]])
        else:
            res = tree.evict(op[1])
        out.append([res, tree.evictable, tree.protected])
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_emulators_radix_cache_is_sglangs(sglang_installed: None, tmp_path: Path, seed: int) -> None:
    ops = _ops(seed)
    assert sum(op[0] == "evict" for op in ops) > 20 and sum(op[0] == "lock" for op in ops) > 20
    path = tmp_path / "ops.json"
    path.write_text(json.dumps(ops))
    run = subprocess.run([sys.executable, "-m", "tests.contract.sglang_radix", "--ops", str(path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    theirs = json.loads(run.stdout.strip().splitlines()[-1])
    ours = _ours(ops)
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert a == b, f"operation {i} {ops[i][0]} {ops[i][1] if ops[i][0] != 'insert' else len(ops[i][1])}: " \
                       f"ours {a}, SGLang's {b}"
    assert any(r[0] for r, op in zip(ours, ops, strict=True) if op[0] == "evict")  # evictions freed tokens


def test_the_emulators_scheduler_rules_are_sglangs(sglang_installed: None, tmp_path: Path) -> None:
    """Retraction order, the ratio after a retraction, the ratio tracker and the constants
    (``pearl.engines.emulated_sched``) against SGLang's own functions on random request sets."""
    from pearl.engines import emulated_sched as es

    rng = random.Random(5)
    sets = [[[rng.choice((0, 1, 5, 50, 400)), rng.choice((10, 200, 3000, 20_000)), rng.choice((30, 900, 4096, 32_768))]
             for _ in range(rng.randint(1, 12))] for _ in range(40)]
    path = tmp_path / "reqs.json"
    path.write_text(json.dumps(sets))
    run = subprocess.run([sys.executable, "-m", "tests.contract.sglang_sched_rules", "--reqs", str(path),
                          "--model", str(ROOT / ".models" / "tiny-qwen3")], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    theirs = json.loads(run.stdout.strip().splitlines()[-1])

    class R:
        def __init__(self, generated: int, prompt: int, max_new: int) -> None:
            self.generated, self.input_len, self.max_new = generated, prompt, max_new

    for rs, order, ratio in zip(sets, theirs["orders"], theirs["ratios"], strict=True):
        reqs = [R(*r) for r in rs]
        assert es.retraction_order(reqs) == order  # type: ignore[arg-type]
        assert es.ratio_after_retract(reqs) == pytest.approx(ratio, rel=1e-12)  # type: ignore[arg-type]
    t = es.NewTokenRatio()
    assert (t.init, t.min, t.decay) == pytest.approx((theirs["tracker"]["init"], theirs["tracker"]["min"],
                                                      theirs["tracker"]["decay"]), rel=1e-12)
    assert (
        theirs["clip"], theirs["retract_decode_steps"], theirs["num_reserved_decode_tokens"]) == (es.CLIP_MAX_NEW_TOKENS, es.RETRACT_DECODE_STEPS, es.NUM_RESERVED_DECODE_TOKENS)
    assert (theirs["schedule_policy"], theirs["retraction_policy"], theirs["decode_radix_cache"]) == (
        "fcfs", "length", False)
