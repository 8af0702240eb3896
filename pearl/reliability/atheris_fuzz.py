"""Coverage-guided fuzzing (atheris / libFuzzer) of the parser targets of ``fuzz.py``.

``python -m pearl.reliability.atheris_fuzz TARGET [-runs=N] [libFuzzer flags]``: only ``pearl``
modules are instrumented (imported inside ``atheris.instrument_imports``), the seed corpus is the
target's valid document, inputs are UTF-8 text (JSON targets: ``json.loads`` first; text that is
not JSON is skipped). A crash (an exception outside the target's documented errors) makes
libFuzzer stop with the input saved as ``crash-*`` and exit code non-zero; ``run_atheris`` runs it
as a subprocess and returns (runs, crashed). atheris is optional: ``available()`` says whether it
is installed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

TEXT_TARGETS = {"trace_json", "trace_csv", "trace_event_log", "config_yaml"}


def available() -> bool:
    return importlib.util.find_spec("atheris") is not None


def run_atheris(target: str, runs: int, timeout_s: float = 300.0) -> tuple[int, bool]:
    """Fuzz ``target`` for ``runs`` executions in a subprocess; (runs done, crashed)."""
    with tempfile.TemporaryDirectory(prefix="pearl-atheris-") as d:
        p = subprocess.run([sys.executable, "-m", "pearl.reliability.atheris_fuzz", target, f"-runs={runs}",
                            f"-artifact_prefix={d}/"], capture_output=True, text=True, timeout=timeout_s,
                           cwd=d)
    m = re.findall(r"Done (\d+) runs", p.stderr)
    done = int(m[-1]) if m else 0
    return done, p.returncode != 0


def main(argv: list[str]) -> None:  # pragma: no cover - runs as its own process under libFuzzer
    import atheris  # type: ignore[import-untyped]  # atheris ships no type information

    with atheris.instrument_imports(include=["pearl"]):
        import yaml

        import pearl.admin.cloud
        import pearl.admin.schemas
        import pearl.cli
        import pearl.config
        import pearl.core.planner
        import pearl.core.state
        import pearl.sim.traces  # noqa: F401  (imported here so that they are instrumented)
        from pearl.reliability import fuzz

    name = argv[1]
    tgt = fuzz.targets()[name]

    def one(data: bytes) -> None:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return
        arg: Any = text
        if name not in TEXT_TARGETS:
            try:
                arg = json.loads(text)
            except (json.JSONDecodeError, RecursionError):
                return
            if name == "cloud_instance_action":
                arg = (arg, "i-0")
            elif name == "plan_target":
                arg = (arg, 4)
        with contextlib.suppress(*tgt.allowed):
            tgt.run(arg)

    seeds = {"trace_json": json.dumps(fuzz.BASE_TRACE_JSON), "trace_csv": fuzz.BASE_TRACE_CSV,
             "trace_event_log": fuzz.BASE_TRACE_EVENTS,
             "config_yaml": yaml.safe_dump(fuzz.base_config()), "config": json.dumps(fuzz.base_config()),
             "cloud_eventbridge": json.dumps(fuzz.BASE_AWS), "cloud_instance_action": json.dumps(fuzz.BASE_IMDS),
             "state": json.dumps(fuzz.BASE_STATE), "plan_target": json.dumps(fuzz.BASE_TARGETS[0])}
    seed_dir = Path(tempfile.mkdtemp(prefix=f"pearl-fuzz-{name}-"))
    (seed_dir / "seed").write_text(seeds[name])
    atheris.Setup([argv[0], *argv[2:], str(seed_dir)], one)
    atheris.Fuzz()


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv)
