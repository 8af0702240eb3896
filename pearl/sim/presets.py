"""The replays' workload: a named overlay on ``WorkloadSpec`` (dotted config overrides).

Every replay (``pearl simulate``, ``pearl experiments``, ``pearl calibrate``, the benchmarks) runs
the one ``paper`` workload, the one the emulator's constants in ``configs/emulator/`` were fitted
on (their files are per model and accelerator, not per workload). A run config's own ``workload``
section (the defaults in ``pearl/config.py``) is what ``pearl run`` and ``pearl serve`` use with
real engines and environments, and what a test that builds a config with ``load_config`` gets;
it is not a replay workload: next to constants fitted on another workload its replays measure
neither the paper nor the predictor (its predictor error was 8.3-12.3 % on replays of traces the
project does not ship), so the replay commands do not offer it.

``paper``   calibrated to the paper's *single-system* measurements for Qwen3-8B on SWE-bench (Sec.
            2.1 / 3.1 / 3.2), never to the systems' ranking. Qwen3 in thinking mode writes long
            turns (~1K tokens of reasoning + tool call), SWE-agent style prompts carry
            instructions, tool documentation and the task (~12K tokens, the first 2K the same in
            every task), tool calls (ls, grep, edit) return in seconds, and test runs are rarer
            (5 %, ~8 s). The agent sends ``max_new_tokens`` = the trajectory's remaining budget
            (``max_response_tokens``; the pipeline cuts it to the budget), and the emulated model
            ends each turn where the plan says (its EOS): the engine's scheduler estimates output
            as SGLang's does, from the cap.

            Prefix reuse is not a constant: it comes out of the emulated engine's radix cache
            (``pearl/engines/radix_cache.py``; docs/calibration.md). The predictor's prior
            (``workload.prefix_cache_hit``) is 0.85, the low end of what coding agents measure
            (TraceLab, arXiv 2606.30560: 85-96 % of steps' prompts served from cache); telemetry
            refits it after every batch.

            The means of the response, observation and tool-call lengths of ``paper`` are set
            per model in ``configs/emulator/<model>-<hardware>.yaml`` (``workload``:
            ``WorkloadMeans``; ``python -m pearl calibrate`` fits them): ``load_preset_config``
            applies them over the preset, the distributions' other parameters unchanged.

Public names: ``PRESETS``, ``preset_overrides``, ``load_preset_config``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pearl.config import RunConfig, load_config
from pearl.engines.emulated_physics import WorkloadMeans, load_physics

PRESETS: dict[str, dict[str, Any]] = {
    "paper": {
        "workload.system_prompt_tokens": 12000,
        "workload.turns": {"mean": 30, "cv": 0.4, "min": 2, "max": 60},
        "workload.response_tokens": {"mean": 1000, "cv": 0.5, "min": 16, "max": 4096},
        "workload.observation_tokens": {"mean": 400, "cv": 1.0, "min": 20, "max": 6000},
        "workload.env_step_s": {"mean": 1.0, "cv": 1.0, "min": 0.1, "max": 60},
        "workload.test_run_prob": 0.05,
        "workload.test_run_s": {"mean": 8, "cv": 0.6, "min": 2, "max": 120},
        "workload.prefix_cache_hit": 0.85,
        "workload.shared_prompt_tokens": 2000,
        "workload.max_response_tokens": 32768,
    },
}


def preset_overrides(name: str) -> dict[str, Any]:
    try:
        return dict(PRESETS[name])
    except KeyError:
        raise ValueError(f"unknown workload preset {name!r}; known: {', '.join(PRESETS)}") from None


#: WorkloadMeans field -> the workload distribution it sets the mean of
_MEAN_FIELDS = {"response_tokens": "workload.response_tokens", "observation_tokens": "workload.observation_tokens",
                "env_step_s": "workload.env_step_s"}


def means_overrides(means: WorkloadMeans, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """Dotted overrides setting each given mean on the ``paper`` preset's distribution."""
    base = PRESETS["paper"] if base is None else base
    out: dict[str, Any] = {}
    for field, key in _MEAN_FIELDS.items():
        v = getattr(means, field)
        if v is not None:
            out[key] = {**base[key], "mean": float(v)}
    return out


def load_preset_config(config: str | Path, workload: str, overrides: dict[str, Any] | None = None,
                       means: WorkloadMeans | None = None) -> RunConfig:
    """``config`` under the workload preset, then the model's calibrated workload means (``paper``
    only; ``means`` replaces the file's), then ``overrides``."""
    ov = preset_overrides(workload)
    if workload == "paper":
        if means is None:
            plain = load_config(config)
            means = load_physics(plain.model.name, plain.hardware.name).workload
        ov.update(means_overrides(means))
    ov.update(overrides or {})
    return load_config(config, ov or None)
