"""Environment costs on this machine: task generation, tool latencies, sandbox overhead, session overhead.

Prints figures, compares variants side by side as ratios (nothing is asserted):

- repofix task generation (validated mutants) for N tasks;
- per-tool latency of a repofix episode (view, edit, run_tests, submit), mean over episodes;
- the sandbox guard's cost: ``run_tests`` under the guard (rlimits + audit hook) vs a plain
  ``python -m unittest`` of the same checkout, as a ratio;
- ``EnvSession`` overhead per turn (decode + parse + template render + encode, env step excluded:
  the tiny env's step is a few microseconds) at growing context lengths, with the SmolLM2 tokenizer.

Usage: ``python benchmarks/bench_envs.py [--tasks 16] [--episodes 4]``
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

from envs.repofix import RepoFixEnv, generate_tasks
from envs.repofix.mutate import revert_mutation
from envs.sandbox import SandboxLimits, run_limited
from envs.toolcall import ToolCall

ROOT = Path(__file__).resolve().parent.parent


async def bench_repofix(n_tasks: int, episodes: int) -> None:
    t0 = time.perf_counter()
    tasks = await generate_tasks(n_tasks, seed=0)
    gen_s = time.perf_counter() - t0
    print(f"repofix: generate_tasks({n_tasks}) = {gen_s:.2f} s ({gen_s / n_tasks * 1000:.0f} ms per task)")
    lat: dict[str, list[float]] = {k: [] for k in ("reset", "view", "edit", "run_tests", "submit", "close")}
    guarded: list[float] = []
    plain: list[float] = []
    rewards = []
    for task in tasks[:episodes]:
        env = RepoFixEnv()
        t = time.perf_counter()
        await env.reset(task)
        lat["reset"].append(time.perf_counter() - t)
        root = env._checkout.root  # type: ignore[union-attr]
        m = task.mutation
        fixed = revert_mutation((root / m.file).read_text(), m)
        for name, call in (("view", ToolCall("view", {"path": m.file})),
                           ("edit", ToolCall("write", {"path": m.file, "content": fixed})),
                           ("run_tests", ToolCall("run_tests"))):
            t = time.perf_counter()
            await env.step(call)
            lat[name].append(time.perf_counter() - t)
        guarded.append(lat["run_tests"][-1])
        t = time.perf_counter()
        await run_limited([sys.executable, "-B", "-m", "unittest", "discover", "-v", "-s", "tests", "-t", "."], root,
                          SandboxLimits(time_s=30))
        plain.append(time.perf_counter() - t)
        t = time.perf_counter()
        res = await env.step(ToolCall("submit"))
        lat["submit"].append(time.perf_counter() - t)
        rewards.append(res.reward)
        t = time.perf_counter()
        await env.close()
        lat["close"].append(time.perf_counter() - t)
    print(f"repofix: {episodes} episodes, reference-fix reward {statistics.mean(rewards):.2f}; mean latency per call:")
    for k, v in lat.items():
        print(f"  {k:<10} {statistics.mean(v) * 1000:8.1f} ms")
    g, p = statistics.mean(guarded), statistics.mean(plain)
    print(f"sandbox guard: run_tests guarded {g * 1000:.0f} ms vs plain unittest {p * 1000:.0f} ms "
          f"(ratio {g / p:.2f})")


async def bench_session() -> None:
    model = ROOT / ".models" / "smollm2-135m"
    if not (model / "tokenizer.json").is_file():
        print(f"session: skipped, no tokenizer at {model} (python -m pearl.models build)")
        return
    from envs.env_session import EnvSession, SessionLimits
    from envs.factory import load_tokenizer
    from envs.tiny import TinyEnv, TinyTask
    from pearl.core.session import TurnInput

    tok = load_tokenizer(model)
    turns = 64
    s = EnvSession(TinyEnv(), TinyTask("b", tuple(["river"] * turns)), tok,
                   SessionLimits(max_trajectory_tokens=1_000_000, max_new_tokens=64, max_turns=turns + 1))
    await s.start()
    answer = (*tok.encode("river", add_special_tokens=False), tok.eos_token_id)
    per_turn = []
    for _ in range(turns - 1):
        t = time.perf_counter()
        ti = await s.step(answer)
        per_turn.append(time.perf_counter() - t)
        assert isinstance(ti, TurnInput)
    first, last = statistics.mean(per_turn[:8]), statistics.mean(per_turn[-8:])
    print(f"session: per-turn overhead {first * 1000:.2f} ms (turns 1-8) vs {last * 1000:.2f} ms "
          f"(turns {turns - 8}-{turns - 1}, context {len(s.token_ids)} tokens); ratio {last / first:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--episodes", type=int, default=4)
    args = ap.parse_args()
    asyncio.run(bench_repofix(args.tasks, args.episodes))
    asyncio.run(bench_session())


if __name__ == "__main__":
    main()
