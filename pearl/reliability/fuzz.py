"""Fuzzing of every parser that reads outside input: configs, traces, cloud notices, state and plan
targets.

Contract under test: each parser either returns a value or raises one of its *documented* error
types (``FuzzTarget.allowed``); anything else (``KeyError``, ``OverflowError``, a bare
``ValueError`` from ``int(nan)``...) is a crash - in the controller it would be an unhandled
exception instead of a clear 4xx / exit-code-2 message.

Inputs are built by hypothesis strategies that *mutate valid documents* (drop a field, replace a
value with any JSON value - NaN and Infinity included, since Python's ``json`` accepts them - or
add a key) plus fully random JSON, so most examples get past the first check and reach deep code.

Two drivers:

* ``run_hypothesis(max_examples, seed)`` - in-process, deterministic for a seed, counts examples
  and reports the first crash of each target with its shrunk falsifying input (the ``pearl
  reliability`` report and ``tests/reliability/test_fuzz.py`` use it);
* ``python -m pearl.reliability.atheris_fuzz TARGET [-runs=N]`` - coverage-guided (libFuzzer via
  atheris, if installed) over the text of the same targets (``atheris_fuzz.py``).
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import yaml

from pearl.config import CONFIG_DIR, ClusterSpec, ConfigError, load_config, parse_config

if TYPE_CHECKING:  # hypothesis is a dev dependency, imported lazily at run time
    from hypothesis.strategies import SearchStrategy


@dataclass(frozen=True)
class FuzzTarget:
    name: str
    run: Callable[[Any], object]
    allowed: tuple[type[BaseException], ...]
    doc: str


class TargetResultDict(TypedDict):
    target: str
    examples: int
    seconds: float
    crashes: list[str]


@dataclass
class TargetResult:
    name: str
    examples: int = 0
    seconds: float = 0.0
    crashes: list[str] = field(default_factory=list)

    def to_dict(self) -> TargetResultDict:
        return {"target": self.name, "examples": self.examples, "seconds": round(self.seconds, 2),
                "crashes": list(self.crashes)}


# ------------------------------------------------------------------------------ base documents
def base_config() -> dict[str, Any]:
    """The Qwen3-8B run config with its model and hardware parts inlined (no file look-ups)."""
    data: dict[str, Any] = yaml.safe_load((CONFIG_DIR / "qwen3-8b-h200.yaml").read_text())
    data["model"] = yaml.safe_load((CONFIG_DIR / "models" / "qwen3-8b.yaml").read_text())
    data["hardware"] = yaml.safe_load((CONFIG_DIR / "hardware" / "h200.yaml").read_text())
    return data


BASE_STATE: dict[str, Any] = {
    "version": 3,
    "gpus": [
        {"gpu_id": "r0", "zone": "reserved", "node": "n0", "instance_id": None, "lent": False},
        {"gpu_id": "r1", "zone": "reserved", "node": "n0", "instance_id": None, "lent": False},
        {"gpu_id": "s0", "zone": "preemptible", "node": "n1", "instance_id": "i-0", "lent": False},
        {"gpu_id": "t0", "zone": "overlap", "node": "n2", "instance_id": None, "lent": True},
    ],
    "workers": [
        {"worker_id": "w0", "gpus": ["r0"], "role": "prefill", "status": "active"},
        {"worker_id": "w1", "gpus": ["r1"], "role": "decode", "status": "active"},
        {"worker_id": "w2", "gpus": ["s0"], "role": "decode", "status": "initializing"},
    ],
}
BASE_TARGETS: list[dict[str, Any]] = [
    {"allocation": "2P2D", "rollout_gpus": ["r0", "r1", "s0", "t0"]},
    {"mode": "disaggregated", "n_prefill": 1, "n_decode": 2, "tp_size": 1},
    {"mode": "colocated", "n_colocated": 3},
]
BASE_TRACE_JSON: dict[str, Any] = {"metadata": {"gap_seconds": 300}, "data": [3, 4, 4, 2, 0, 5, 12, 16, 1]}
BASE_TRACE_CSV = "time_s,available\n0,4\n300,2\n900,6\n1200,0\n"
BASE_TRACE_EVENTS = "0,add,node1\n60000,add,node2\n60000,add,node3\n180000,remove,node2\n240000,remove,node1\n"
BASE_AWS: dict[str, Any] = {
    "version": "0", "id": "7193a0b6-0f4b-1d57-9d54-f8a6a1f1c2a0",
    "detail-type": "EC2 Spot Instance Interruption Warning", "source": "aws.ec2",
    "account": "123456789012", "time": "2026-11-29T14:00:00Z", "region": "us-east-2",
    "resources": ["arn:aws:ec2:us-east-2a:instance/i-0"],
    "detail": {"instance-id": "i-0", "instance-action": "terminate"},
}
BASE_IMDS: dict[str, Any] = {"action": "terminate", "time": "2026-11-29T14:02:00Z"}


# ------------------------------------------------------------------------------ mutation
def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.extend(_paths(v, (*prefix, k)))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out.extend(_paths(v, (*prefix, i)))
    return out


def mutate(doc: Any, ops: list[tuple[int, str, Any]]) -> Any:
    """Apply ``(selector, op, value)`` mutations to a deep copy: ``set`` replaces the value at the
    selected path, ``del`` removes it, ``add`` inserts ``value`` under a new key / at list end."""
    doc = json.loads(json.dumps(doc))
    for sel, op, value in ops:
        paths = _paths(doc)
        path = paths[sel % len(paths)]
        if not path:
            if op == "set":
                doc = value
            continue
        parent = doc
        for p in path[:-1]:
            parent = parent[p]
        last = path[-1]
        if op == "set":
            parent[last] = value
        elif op == "del":
            del parent[last]
        elif isinstance(parent, dict):
            parent[f"x{sel}"] = value
        else:
            parent.append(value)
    return doc


def strategies() -> dict[str, SearchStrategy[Any]]:
    """Hypothesis strategies per target (imported lazily: hypothesis is a dev dependency)."""
    from hypothesis import strategies as st

    scalars = (
        st.none()
        | st.booleans()
        | st.integers(min_value=-(2**70), max_value=2**70)
        | st.floats(allow_nan=True, allow_infinity=True)
        | st.text(max_size=12)
        | st.sampled_from(["", "0", "-1", "1e400", "nan", "coloc", "4P4D", "0:0", "reserved", "overlap", "active",
                           "decode", "2026-11-29T14:00:00Z", "9999-12-31T23:59:59-23:59", "terminate"])
    )
    # Edge values that break numeric code: drawn often, not left to chance.
    nasty: SearchStrategy[Any] = st.sampled_from([math.inf, -math.inf, math.nan, 1e308, -0.0, 0.5, -1, 0, 2**63,
                                                  10**400, True, False, None, "", [], {}])
    values = st.recursive(scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                          max_leaves=8)
    op = st.tuples(st.integers(0, 10_000), st.sampled_from(["set", "set", "del", "add"]), nasty | nasty | values)
    ops = st.lists(op, min_size=1, max_size=4)

    def mutated(base: Any) -> SearchStrategy[Any]:
        m = ops.map(lambda o: mutate(base, o))
        return st.one_of(m, m, m, values)

    cfg = base_config()
    text_edits = st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 8), st.text(max_size=6)), max_size=4)

    def edit_text(base: str, edits: list[tuple[int, int, str]]) -> str:
        s = base
        for pos, cut, ins in edits:
            p = pos % (len(s) + 1)
            s = s[:p] + ins + s[p + cut:]
        return s

    return {
        "config": mutated(cfg),
        "config_yaml": text_edits.map(lambda e: edit_text(yaml.safe_dump(cfg, sort_keys=False), e)),
        "trace_json": st.one_of(
            mutated(BASE_TRACE_JSON).map(lambda d: json.dumps(d)),
            text_edits.map(lambda e: edit_text(json.dumps(BASE_TRACE_JSON), e)),
        ),
        "trace_csv": text_edits.map(lambda e: edit_text(BASE_TRACE_CSV, e)),
        "trace_event_log": text_edits.map(lambda e: edit_text(BASE_TRACE_EVENTS, e)),
        "cloud_eventbridge": mutated(BASE_AWS),
        "cloud_instance_action": st.tuples(mutated(BASE_IMDS), st.text(min_size=1, max_size=10)),
        "state": mutated(BASE_STATE),
        "plan_target": st.tuples(st.sampled_from(BASE_TARGETS).flatmap(mutated), st.integers(-3, 40)),
    }


# ------------------------------------------------------------------------------ targets
def _config(data: Any) -> object:
    return parse_config(data, "<fuzz>", CONFIG_DIR)


def _config_yaml(text: str) -> object:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(text)
    try:
        return load_config(f.name)
    finally:
        Path(f.name).unlink()


def _trace(text: str, suffix: str) -> object:
    """``load_trace``'s parsers on the text itself (no temporary file: file-system hiccups on a
    shared machine must not read as parser crashes; ``load_trace`` only adds ``read_text``)."""
    from pearl.sim import traces

    src = Path(f"<fuzz>{suffix}")
    if suffix == ".log":
        tr = traces._load_event_log(src, text)
    else:
        tr = traces._load_csv(src, text) if suffix == ".csv" else traces._load_json(src, text)
    tl = traces.gpu_timeline(tr, ClusterSpec())
    evs = traces.trace_events(tl)
    for e in evs:  # a parsed trace must yield events on finite times
        if not math.isfinite(e.at_s):
            raise AssertionError(f"trace event at non-finite time {e.at_s}")
    return evs


def _eventbridge(data: Any) -> object:
    from pearl.admin.cloud import from_eventbridge
    from pearl.admin.schemas import AwsSpotInterruptionIn

    n = from_eventbridge(AwsSpotInterruptionIn.model_validate(data))
    if not math.isfinite(n.deadline_wall):
        raise AssertionError(f"non-finite deadline {n.deadline_wall}")
    return n


def _instance_action(arg: tuple[Any, str]) -> object:
    from pearl.admin.cloud import from_instance_action
    from pearl.admin.schemas import InstanceActionIn

    data, instance = arg
    return from_instance_action(InstanceActionIn.model_validate(data), instance)


def _state(data: Any) -> object:
    from pearl.core.state import ClusterState

    st = ClusterState.from_dict(data)
    if ClusterState.from_dict(st.to_dict()) != st:  # the parse is a fixed point of to_dict
        raise AssertionError("ClusterState.from_dict(to_dict()) changed the state")
    return st


def _plan_target(arg: tuple[Any, int]) -> object:
    from pearl.cli import parse_target
    from pearl.core.planner import plan
    from pearl.core.state import ClusterState

    data, n = arg
    state = ClusterState.from_dict(BASE_STATE)
    target, gpus, tp = parse_target(data, n)
    return plan(state, target, frozenset(gpus if gpus is not None else ["r0", "r1", "s0", "t0"]), tp)


def targets() -> dict[str, FuzzTarget]:
    from pydantic import ValidationError

    from pearl.cli import CliError
    from pearl.core.decision import DecisionError
    from pearl.core.planner import PlanError
    from pearl.core.state import StateError
    from pearl.sim.traces import TraceError

    return {
        "config": FuzzTarget("config", _config, (ConfigError,), "pearl.config.parse_config on a mutated run config"),
        "config_yaml": FuzzTarget("config_yaml", _config_yaml, (ConfigError,),
                                  "pearl.config.load_config on edited YAML text"),
        "trace_json": FuzzTarget("trace_json", lambda t: _trace(t, ".json"), (TraceError,),
                                 "sim.traces.load_trace (spot-traces JSON) -> gpu_timeline -> trace_events"),
        "trace_csv": FuzzTarget("trace_csv", lambda t: _trace(t, ".csv"), (TraceError,),
                                "sim.traces.load_trace (time_s,available CSV) -> gpu_timeline -> trace_events"),
        "trace_event_log": FuzzTarget("trace_event_log", lambda t: _trace(t, ".log"), (TraceError,),
                                      "sim.traces.load_trace (Bamboo time_ms,add|remove,node log) -> gpu_timeline "
                                      "-> trace_events"),
        "cloud_eventbridge": FuzzTarget("cloud_eventbridge", _eventbridge, (ValidationError,),
                                        "admin AWS EventBridge spot warning -> CloudNotice"),
        "cloud_instance_action": FuzzTarget("cloud_instance_action", _instance_action, (ValidationError,),
                                            "admin IMDS spot/instance-action -> CloudNotice"),
        "state": FuzzTarget("state", _state, (StateError,), "core.state.ClusterState.from_dict"),
        "plan_target": FuzzTarget("plan_target", _plan_target, (CliError, DecisionError, PlanError, StateError),
                                  "cli.parse_target -> core.planner.plan"),
    }


# ------------------------------------------------------------------------------ hypothesis driver
def run_hypothesis(max_examples: int = 2000, seed: int = 0, only: list[str] | None = None) -> list[TargetResult]:
    """Run every target for ``max_examples`` examples; a crash is recorded (with its shrunk input)
    and ends that target's run."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hseed
    from hypothesis.errors import HypothesisException

    strats = strategies()
    out: list[TargetResult] = []
    for name, tgt in targets().items():
        if only and name not in only:
            continue
        res = TargetResult(name)

        def make(tgt: FuzzTarget, res: TargetResult) -> Callable[[Any], None]:
            def body(x: Any) -> None:
                res.examples += 1
                with contextlib.suppress(*tgt.allowed):
                    tgt.run(x)

            return body

        test = hseed(seed)(
            settings(max_examples=max_examples, database=None, deadline=None,
                     suppress_health_check=list(HealthCheck), print_blob=False)(given(strats[name])(make(tgt, res)))
        )
        t0 = time.perf_counter()
        try:
            test()
        except HypothesisException:
            raise
        except Exception as e:  # a crash: record it with hypothesis' falsifying example
            for sub in e.exceptions if isinstance(e, ExceptionGroup) else [e]:
                notes = " ".join(n for n in getattr(sub, "__notes__", []) if not n.startswith("Explanation"))
                res.crashes.append(f"{type(sub).__name__}: {sub} | {' '.join(notes.split())[:300]}")
        res.seconds = time.perf_counter() - t0
        out.append(res)
    return out


if __name__ == "__main__":  # pragma: no cover
    for r in run_hypothesis(int(sys.argv[1]) if len(sys.argv) > 1 else 500):
        print(json.dumps(r.to_dict()))
