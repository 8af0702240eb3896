"""Observability: JSON logs with redaction, the run observer (TensorBoard + report)."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

from pearl.admin.local import StateControlPlane
from pearl.core.events import GpusGranted, GrantedGpu, TrainingFinished
from pearl.obs.logs import setup_logging
from pearl.obs.observer import RunObserver, Sample
from pearl.obs.report import completion_times
from pearl.runtime.control import Progress
from tests.admin.conftest import ManualClock, small_cluster


def test_json_logs_carry_extra_fields_and_hide_secrets() -> None:
    buf = io.StringIO()
    handler = setup_logging("INFO", json_lines=True, secrets=["s3cret-token-value"], stream=buf)
    try:
        logging.getLogger("pearl.test").info("granted %d GPUs with s3cret-token-value", 2, extra={"event_id": "e1"})
        logging.getLogger("pearl.test").debug("hidden")
    finally:
        logging.getLogger().removeHandler(handler)
    lines = [json.loads(x) for x in buf.getvalue().splitlines()]
    assert len(lines) == 1
    rec = lines[0]
    assert rec["msg"] == "granted 2 GPUs with ***" and rec["event_id"] == "e1"
    assert rec["level"] == "INFO" and rec["logger"] == "pearl.test" and rec["rank"] == 0


def test_sample_scalars() -> None:
    s = Sample(5.0, Progress(trajectories_completed=3, throughput_traj_per_h=120.0,
                             extra={"reward_mean": 0.25, "staleness": 1}),
               {"prefill": 2, "decode": 1}, {"mode": "disaggregated", "n_prefill": 2, "n_decode": 1,
                                             "n_colocated": 0, "label": "2P1D"})
    sc = s.scalars()
    assert sc["pd/mode"] == 1.0 and sc["pd/n_prefill"] == 2.0 and sc["gpus/prefill"] == 2.0
    assert sc["gpus/idle"] == 0.0 and sc["rollout/reward_mean"] == 0.25 and sc["rollout/staleness"] == 1.0
    assert sc["rollout/throughput_traj_per_h"] == 120.0


def test_completion_times_from_counter() -> None:
    assert completion_times([(0.0, 0), (5.0, 2), (10.0, 2), (15.0, 3)]) == [5.0, 5.0, 15.0]


async def test_observer_writes_tensorboard_and_report(tmp_path: Path) -> None:
    clock = ManualClock(100.0)
    control = StateControlPlane(small_cluster(), clock, {"admin": {"token": "abcdefabcdefabcdef"}})

    async def no_sleep(_: float) -> None:  # the observer task is not started in this test
        raise AssertionError("not used")

    obs = RunObserver(control, clock, no_sleep, tmp_path, period_s=5.0, tensorboard=True)
    from torch.utils.tensorboard import SummaryWriter

    obs._tb = SummaryWriter(log_dir=str(tmp_path / "tensorboard"))
    obs.sample()
    clock.t += 5
    await control.submit(GpusGranted((GrantedGpu("p9", "node4", "i-9"),), event_id="g"))
    await control.submit(TrainingFinished(1, 1, event_id="f"))
    obs.sample()
    clock.t += 5
    report = await obs.stop()
    assert report is not None and report.name == "report.md"
    text = report.read_text()
    assert "GPU-hours by role" in text and "abcdefabcdefabcdef" not in text and '"token": "***"' in text
    assert (tmp_path / "gpu-roles.png").stat().st_size > 1000
    assert (tmp_path / "throughput.png").stat().st_size > 1000
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    borrowed = [e.value for e in acc.Scalars("gpus/borrowed")]
    assert borrowed == [0.0, 1.0, 1.0]  # o0 lent and active after TrainingFinished
    # segments: o0 appears as borrowed from t=105 to t=110
    segs = [s for s in obs.record.ledger.segments if s[0] == "o0"]
    assert segs == [["o0", 105.0, 110.0, "borrowed"]]


def test_batch_stats_reward_and_staleness() -> None:
    from pearl.core.trajectory import Segment, TrajectoryRecord
    from pearl.obs.observer import batch_stats

    def rec(reward: float, *versions: int) -> TrajectoryRecord:
        segs = (Segment((1, 2), False), *(Segment((3,), True, (-0.1,), v) for v in versions))
        return TrajectoryRecord(f"t{reward}{versions}", "g", segs, reward)

    assert batch_stats([rec(1.0, 3, 4), rec(0.0, 2)], trainer_version=4) == {"reward_mean": 0.5, "staleness": 2.0}
    assert batch_stats([], 4) == {}


def test_live_progress_renders_a_sample() -> None:
    from rich.console import Console

    from pearl.obs.progress import LiveProgress

    buf = io.StringIO()
    live = LiveProgress("demo", Console(file=buf, width=120, force_terminal=False))
    live.start()
    live.update(Sample(1.0, Progress(trajectories_completed=7, throughput_traj_per_h=12.5, uptime_s=3.0),
                       {"decode": 2}, {"label": "1P1D", "mode": "disaggregated"}, {"reward_mean": 0.5}))
    live.stop()
    out = buf.getvalue()
    assert "7 done" in out and "1P1D (disaggregated)" in out and "decode 2" in out and "reward mean" in out
