"""``docs/RELIABILITY.md``: every figure regenerated from fresh runs by one command.

``build_report(...)`` runs, in order: chaos over seeds ``0..seeds-1`` (``chaos.run_chaos``), the
controller kill -9 + restart experiment (``restart.kill_and_restart``), parser fuzzing
(``fuzz.run_hypothesis``; plus atheris runs when installed), the admin API security probe
(``security.run_security_probe``) and the load test (``load.run_load``, instant and emulated
engines), and writes the Markdown page. Nothing in the page is typed in by hand except the
list of bugs these tools found during development (each has a regression test named there).
Returns (text, ok) where ok is False if any run reported a violation or problem.
"""

from __future__ import annotations

import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: Bugs the reliability tools found during development, fixed, and the regression test of each.
FOUND_AND_FIXED: tuple[tuple[str, str, str, str], ...] = (
    ("fuzz (hypothesis)", "pearl/sim/traces.py", "trace JSON `data: [Infinity]` / `[NaN]` raised OverflowError / "
     "ValueError instead of TraceError", "tests/reliability/test_fuzz.py::test_trace_non_finite_numbers_are_trace_errors"),
    ("fuzz (hypothesis)", "pearl/sim/traces.py", "trace JSON `gap_seconds: Infinity` or `1e308` gave events at "
     "NaN / infinite times", "tests/reliability/test_fuzz.py::test_trace_non_finite_numbers_are_trace_errors"),
    ("fuzz (hypothesis)", "pearl/cli.py", "plan target `n_prefill: Infinity` raised OverflowError instead of "
     "CliError", "tests/reliability/test_fuzz.py::test_plan_target_infinite_count_is_a_cli_error"),
    ("chaos", "pearl/runtime/pipeline.py", "a crashed engine stayed dispatchable: every retry hit the dead server "
     "(hundreds of failures per crash) and could starve a trajectory", "tests/reliability/test_chaos.py"),
    ("chaos", "pearl/runtime/pipeline.py, elastic.py", "a worker whose weight load failed left the router but "
     "stayed `active` in the state: with it the only prefill worker, rollout stopped for good",
     "tests/reliability/test_chaos.py"),
    ("chaos", "pearl/runtime/elastic.py", "a failed expansion group (replacement worker that did not start) was "
     "never re-planned: the topology could stay unable to serve", "tests/reliability/test_chaos.py"),
    ("chaos", "pearl/runtime/elastic.py", "a re-plan while an expansion group was preparing planned a second "
     "server on the same GPU (two live servers on one GPU)", "tests/reliability/test_chaos.py"),
    ("security probe", "pearl/admin/app.py", "the access log wrote the query string: a token put in a URL by "
     "mistake reached the logs", "tests/reliability/test_security.py"),
)


def _table(head: list[str], rows: list[list[Any]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def build_report(seeds: int = 5, events: int = 100, fuzz_examples: int = 2000, load_trajectories: int = 10_000,
                 out: str | Path | None = "docs/RELIABILITY.md", atheris_runs: int = 5000,
                 log: Callable[[str], None] = lambda m: None, vllm: bool = False) -> tuple[str, bool]:
    from pearl.reliability import atheris_fuzz
    from pearl.reliability.chaos import FAULT_KINDS, run_chaos
    from pearl.reliability.fuzz import run_hypothesis
    from pearl.reliability.load import run_load
    from pearl.reliability.restart import kill_and_restart
    from pearl.reliability.security import run_security_probe

    t_start = time.perf_counter()
    ok = True
    # ---------------------------------------------------------------- chaos
    chaos = []
    for s in range(seeds):
        log(f"chaos seed {s} ({events} faults)...")
        chaos.append(run_chaos(seed=s, events=events).to_dict())
    by_kind: dict[str, int] = {k: 0 for k in FAULT_KINDS}
    not_reached: dict[str, int] = {}
    for c in chaos:
        for k, n in c["faults"].items():
            by_kind[k] = by_kind.get(k, 0) + n
        for k, n in c["faults_not_reached"].items():
            not_reached[k] = not_reached.get(k, 0) + n
    violations = sum(c["invariant_violations"] for c in chaos)
    worst_return = max((c["max_return_delay_s"] for c in chaos), default=0.0)
    ok &= violations == 0
    # ---------------------------------------------------------------- restart
    log("controller kill -9 + restart...")
    with tempfile.TemporaryDirectory(prefix="pearl-restart-") as d:
        restart = kill_and_restart(Path(d) / "journal.db", seed=0).to_dict()
    ok &= bool(restart["ok"])
    # ---------------------------------------------------------------- fuzzing
    log(f"fuzzing parsers ({fuzz_examples} examples each)...")
    fuzz = [r.to_dict() for r in run_hypothesis(max_examples=fuzz_examples, seed=0)]
    ok &= all(not r["crashes"] for r in fuzz)
    ath: list[tuple[str, int, bool]] = []
    if atheris_fuzz.available() and atheris_runs > 0:
        for t in ("state", "plan_target", "trace_json", "trace_csv", "trace_event_log", "cloud_eventbridge",
                  "cloud_instance_action"):
            log(f"atheris {t} ({atheris_runs} runs)...")
            done, crashed = atheris_fuzz.run_atheris(t, atheris_runs)
            ath.append((t, done, crashed))
            ok &= not crashed
    # ---------------------------------------------------------------- security
    log("admin API security probe...")
    sec = run_security_probe(fuzz_per_route=30).to_dict()
    ok &= bool(sec["ok"])
    # ---------------------------------------------------------------- load
    log(f"load: {load_trajectories} concurrent trajectories (instant, emulated)...")
    load = [run_load(load_trajectories, e).to_dict() for e in ("instant", "emulated")]
    ok &= all(r["completed"] == load_trajectories for r in load)
    # ---------------------------------------------------------------- real vLLM (optional: ~15 min)
    soak: dict[str, Any] | None = None
    if vllm:
        log("real vLLM faults (tests/reliability/test_vllm_faults.py)...")
        soak = run_vllm_soak()
        ok &= soak["passed"]
    elapsed = time.perf_counter() - t_start

    # ---------------------------------------------------------------- the page
    j, r = restart["journaled"], restart["recovered"]
    lines = [
        "# Reliability and security",
        "",
        "Regenerated by `make reliability` (`python -m pearl reliability`): every figure below comes from "
        f"runs made by that command (this page: {elapsed:.0f} s on {platform.machine()}, Python "
        f"{platform.python_version()}). The tools live in `pearl/reliability/`; their tests in "
        "`tests/reliability/`.",
        "",
        "## Summary",
        "",
        _table(["figure", "value"], [
            ["faults injected (all kinds, all seeds)", sum(by_kind.values())],
            ["invariant violations", violations],
            ["worst borrowed-GPU return delay", f"{worst_return:.1f} s"],
            ["restart: completed trajectories journaled / re-delivered as journaled",
             f"{j['completed_unconsumed']} / {r['completed_redelivered_as_journaled']} "
             f"(+{j['consumed']} consumed, {r['consumed_redelivered']} re-delivered)"],
            ["restart: partial-output tokens journaled / replayed / in final trajectories",
             f"{j['partial_tokens']} / {r['partial_tokens_replayed']} / {r['partial_tokens_in_final_trajectories']}"],
            ["fuzzing volume (hypothesis examples)", sum(f["examples"] for f in fuzz)],
            ["fuzzing volume (atheris runs)", sum(a[1] for a in ath) if ath else "atheris not installed"],
            ["crashes found now / found and fixed during development",
             f"{sum(len(f['crashes']) for f in fuzz) + sum(a[2] for a in ath)} / {len(FOUND_AND_FIXED)}"],
            ["load reached (concurrent trajectories in one batch)", f"{load[0]['peak_in_flight']}"],
            ["control-plane CPU per request", f"{load[0]['cpu_us_per_request']:.0f} us"],
        ]),
        "",
        "## Fault injection (`python -m pearl chaos --seed S --events N --json`)",
        "",
        "The real controller (pipeline, elastic scheduler, rebuilder, toggle manager, tracker) drives the "
        "emulated engine in virtual time behind `ChaosEngine` (`pearl/reliability/faults.py`); faults are drawn "
        "uniformly from the kinds below at exponential gaps (mean 20 virtual s); the invariants of "
        "`pearl/reliability/invariants.py` are checked after every fault, every 2 virtual s, on every batch the "
        "trainer takes and on every `TrainingStarted` acknowledgement; a quiet phase follows in which two more "
        "batches must complete (a stuck trajectory is a lost one). Cluster: 2 reserved, up to 6 preemptible, 4 "
        "training GPUs; cost gates off so every expansion and borrow happens.",
        "",
        _table(["seed", "faults", "violations", "trajectories completed", "trained", "worst return delay (s)",
                "returns", "virtual s", "wall s"],
               [[c["seed"], c["faults_total"], c["invariant_violations"], c["trajectories_completed"],
                 c["trajectories_trained"], c["max_return_delay_s"], c["returns"], c["virtual_s"], c["wall_s"]]
                for c in chaos]),
        "",
        "Faults by kind (all seeds; *not reached*: the phase did not occur within 120 virtual s of asking, "
        "so nothing was injected - counted, never hidden):",
        "",
        _table(["kind", "injected", "not reached"], [[k, by_kind.get(k, 0), not_reached.get(k, 0)] for k in FAULT_KINDS]),
        "",
    ]
    if violations:
        lines += ["Violations (first few per seed):", ""]
        for c in chaos:
            for v in c["violations"].get("first", []):
                lines.append(f"- seed {c['seed']} [{v['invariant']}] t={v['t']}: {v['detail']}")
        lines.append("")
    lines += [
        "## Controller restart (kill -9)",
        "",
        "A journaled controller (`pearl/runtime/journal.py`: SQLite, WAL mode) runs in a subprocess; it is "
        f"killed with SIGKILL after handing {restart['killed_after_batches']} batches to the trainer and "
        "completing 5 more trajectories (the rest of the batch mid-flight). A batch is journaled as consumed "
        "only once the update trained on it is done; one the trainer holds mid-update at the kill is delivered "
        "to it again after the restart. A new controller opens the same journal and runs until 3 more batches "
        "are consumed.",
        "",
        _table(["", "journaled at the kill", "after the restart"], [
            ["completed, consumed by the trainer (update done)", j["consumed"],
             f"{r['consumed_redelivered']} re-delivered"],
            ["held by the trainer mid-update (not consumed)", j.get("held_by_trainer", 0),
             f"{r.get('held_by_trainer_redelivered', 0)} delivered to the trainer again, as journaled"],
            ["completed, not yet consumed (the held batch among them)", j["completed_unconsumed"],
             f"{r['completed_redelivered_as_journaled']} delivered identical to the journal (not regenerated)"],
            ["in-flight trajectories with partial output", j["in_flight_trajectories"], "resumed"],
            ["partial-output parts", j["partial_parts"], f"{r['partial_parts_replayed']} replayed"],
            ["partial-output tokens", j["partial_tokens"],
             f"{r['partial_tokens_replayed']} replayed, {r['partial_tokens_in_final_trajectories']} in the final "
             "trajectories"],
            ["GPUs in the journaled table", j["gpus"], f"restart from batch {r['restart_first_batch']}"],
        ]),
        "",
        f"Problems: {restart['problems'] or 'none'}.",
        "",
        "## Fuzzing of parsers",
        "",
        "Hypothesis mutates valid documents (drop / replace with any JSON value incl. NaN, Infinity, 10^400 / add "
        "keys) and generates random JSON; a crash is any exception outside the parser's documented error types.",
        "",
        _table(["target", "documented errors", "examples", "crashes", "seconds"],
               [[f["target"], _allowed(f["target"]), f["examples"], len(f["crashes"]), f["seconds"]] for f in fuzz]),
        "",
    ]
    crashes = [(f["target"], c) for f in fuzz for c in f["crashes"]]
    if crashes:
        lines += ["Crashes found by this run (exception | falsifying input):", ""]
        lines += [f"- `{t}`: {c.replace('|', '/')}" for t, c in crashes]
        lines.append("")
    if ath:
        lines += ["Coverage-guided (atheris / libFuzzer, `python -m pearl.reliability.atheris_fuzz TARGET`):", "",
                  _table(["target", "runs", "crashed"], [[t, n, c] for t, n, c in ath]), ""]
    lines += [
        "Found and fixed during development (each has a regression test):",
        "",
        _table(["found by", "file", "bug", "regression test"], [list(x) for x in FOUND_AND_FIXED]),
        "",
        "## Admin API security (in front of the real controller)",
        "",
        _table(["check", "result"], [
            ["routes probed without / with a wrong token", f"{sec['unauthorized_probes']} requests over "
             f"{sec['routes']} routes: all 401 but /healthz"],
            ["fuzzed event / cloud bodies", f"{sec['fuzz_requests']} requests; statuses {sec['statuses']}"],
            ["log records scanned for the token", sec["log_records_scanned"]],
            ["event burst", f"{sec['burst_sent']} sent, {sec['burst_rate_limited']} answered 429, "
             f"{sec['burst_applied']} applied"],
            ["problems", sec["problems"] or "none"],
        ]),
        "",
        "Auth on every route, body-size and rate limits are also unit-tested in `tests/admin/` "
        "(`tests/admin/test_schemathesis.py` covers the OpenAPI document).",
        "",
        f"## Load ({load_trajectories} concurrent trajectories, `benchmarks/bench_load.py`)",
        "",
        "One rollout batch of N trajectories admitted at once through the real controller in virtual time; "
        "`instant` answers each request at once (CPU = control plane + sessions), `emulated` adds the emulator.",
        "",
        _table(["engine", "completed", "requests", "peak in flight", "CPU s", "CPU us / request", "wall s",
                "virtual makespan s"],
               [[x["engine"], x["completed"], x["requests"], x["peak_in_flight"], x["cpu_s"], x["cpu_us_per_request"],
                 x["wall_s"], x["virtual_makespan_s"]] for x in load]),
        "",
    ]
    lines += ["## The same key faults against real vLLM servers (`tests/reliability/test_vllm_faults.py`)", "",
              "One controller drives two tiny-Qwen3 vLLM servers on this CPU (1 prefill + 1 decode) behind "
              "`ChaosEngine`: (1) a KV transfer the decode side refuses; (2) `kill -9` of the decode server while a "
              "request is streaming (the partial output must reach the runtime, the worker is replaced); (3) a weight "
              "sync in which one server's load fails (that worker is replaced). After each, the batch in flight "
              "completes with every trajectory and every retried turn starts from the prompt plus all tokens already "
              "received. `make test` runs it (marker `soak`; `make test-soak` runs only it).", ""]
    if soak is None:
        lines += ["Not run for this page (`python -m pearl reliability --vllm` includes it; ~15 min on 2 cores).", ""]
    else:
        lines += [_table(["result", "seconds", "pytest says"],
                         [["passed" if soak["passed"] else "FAILED", soak["seconds"], soak["summary"]]]), ""]
    text = "\n".join(lines)
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text)
    return text, ok


def run_vllm_soak(timeout_s: float = 3600.0) -> dict[str, Any]:
    """Run the real-vLLM fault test in a pytest subprocess; ``{passed, seconds, summary}`` (the
    summary is pytest's last line, e.g. ``1 passed in 995.59s``)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent.parent
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "soak", "-p", "no:cacheprovider",
                               "tests/reliability/test_vllm_faults.py"], cwd=root, capture_output=True, text=True,
                              timeout=timeout_s, check=False)
        lines = [x for x in proc.stdout.splitlines() if x.strip()]
        summary, passed = (lines[-1] if lines else "no output"), proc.returncode == 0
    except subprocess.TimeoutExpired:
        summary, passed = f"timed out after {timeout_s:.0f} s", False
    return {"passed": passed, "seconds": round(time.perf_counter() - t0, 1), "summary": summary.strip("= ")}


def _allowed(name: str) -> str:
    from pearl.reliability.fuzz import targets

    return ", ".join(t.__name__ for t in targets()[name].allowed)
