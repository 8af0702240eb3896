"""The NIXL progress-thread pacing of the vLLM worker extension (docs/engines.md): an agent created
with a progress thread and no pause gets the configured pause; others are left alone; installing it
twice wraps once. Runs in a subprocess so that the wrap never touches this test process."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent('''
    import nixl._api as api
    seen = []
    api.nixlBind.nixlAgent = lambda name, cfg: seen.append((cfg.useProgThread, cfg.pthrDelay))
    from pearl.engines.vllm_worker_ext import pace_nixl_progress_thread
    assert not pace_nixl_progress_thread(0)
    assert pace_nixl_progress_thread(500) and pace_nixl_progress_thread(700)  # second call: no re-wrap
    for prog, delay in [(True, 0), (True, 50), (False, 0)]:
        cfg = api.nixlBind.nixlAgentConfig()
        cfg.useProgThread, cfg.pthrDelay = prog, delay
        api.nixlBind.nixlAgent("agent", cfg)
    print(seen)
''')


def test_spinning_progress_thread_gets_a_pause() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[(True, 500), (True, 50), (False, 0)]"
