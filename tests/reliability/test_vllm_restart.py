"""Kill -9 of ``pearl serve`` with a real vLLM server of the tiny Qwen3 and the CPU GRPO trainer after
one update, then a restart on the same ``output_dir`` (``pearl.reliability.vllm_restart``).

Checked, exactly: the grant answered 202 just before the kill is journaled and in effect after the
restart (its GPU in the table, the journaled event done) and the same grant with the same
``Idempotency-Key`` afterwards is a 200 duplicate; the restart resumes at the trainer's checkpoint
version, which equals the batches the journal holds as consumed at the kill; the restarted run trains
at least one more update; every trajectory of the trained batches is consumed exactly once (0 lost,
0 duplicated); no process of the killed service outlives it; SIGTERM then ends the restart with 0.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import MODELS_DIR

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(3600)
def test_kill_9_of_the_real_vllm_service_then_restart_resumes_with_nothing_lost(tmp_path: Path) -> None:
    from pearl.models import ensure_models

    ensure_models(MODELS_DIR, ("tiny-qwen3",))
    out = tmp_path / "vllm-restart"
    proc = subprocess.run([sys.executable, "-m", "pearl.reliability.vllm_restart", "--out", str(out)], cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=3300)
    assert (out / "vllm_restart.json").is_file(), proc.stdout + proc.stderr
    fig = json.loads((out / "vllm_restart.json").read_text())
    assert fig["problems"] == [] and proc.returncode == 0, (fig, proc.stderr[-4000:])
    assert fig["events_accepted"] == fig["events_journaled"] == fig["events_applied"] == 1, fig
    assert fig["event_status_final"] == "done" and fig["p0_in_table_after_restart"] is True, fig
    assert fig["duplicate_status_after_restart"] == 200 and fig["duplicate_after_restart"] is True, fig
    assert fig["checkpoint_version"] >= 1, fig
    assert fig["resumed_version"] == fig["checkpoint_version"] == fig["journal_trained_batches_at_kill"], fig
    assert fig["final_checkpoint_version"] >= fig["resumed_version"] + 1 and fig["steps_after_restart"] >= 1, fig
    assert fig["trajectories_lost"] == 0 and fig["trajectories_duplicated"] == 0, fig
    assert fig["trajectories_consumed"] == 4 * fig["final_checkpoint_version"], fig
    assert fig["processes_left_after_kill"] == 0 and fig["exit_code_after_sigterm"] == 0, fig
