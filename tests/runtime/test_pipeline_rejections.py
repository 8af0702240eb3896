"""A request the server refuses (``RequestRejectedError``) fails its trajectory with the refusal
as the counted reason, instead of being resent forever; the other trajectories are untouched."""

from __future__ import annotations

from pearl.core.profile import HardwareProfile, WorkloadProfile
from pearl.core.session import SessionSpec
from pearl.core.state import Role
from pearl.core.trajectory import TrajectoryStatus
from pearl.engines.base import RequestRejectedError, ServerSpec
from pearl.runtime.clock import LoopClock, run_virtual
from pearl.runtime.pipeline import PipelineScheduler
from pearl.runtime.tracker import RuntimeTracker

from .helpers import ScriptedSession, config, engine


class _RefuseOne:
    """The emulated engine, except that trajectory ``b0-g0-s1``'s requests are refused (400)."""

    def __init__(self, inner) -> None:
        self.inner, self.refused = inner, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def generate(self, worker_id, req):
        if req.conversation == "b0-g0-s1":
            self.refused += 1
            raise RequestRejectedError(worker_id, f"request {req.rid} refused (400): Input length exceeds the "
                                       "maximum allowed length", 400)
        return await self.inner.generate(worker_id, req)


def test_a_refused_request_fails_its_trajectory_once() -> None:
    async def main():
        clock = LoopClock()
        eng = engine(clock)
        wrapped = _RefuseOne(eng)
        cfg = config()
        tracker = RuntimeTracker(HardwareProfile.from_specs(cfg.model, cfg.hardware),
                                 WorkloadProfile.from_spec(cfg.workload))

        def factory(spec: SessionSpec) -> ScriptedSession:
            return ScriptedSession(spec, clock)

        pipe = PipelineScheduler(wrapped, clock, tracker, factory, batch_size=4, group_size=2, max_staleness=1,
                                 max_trajectory_tokens=32768)
        await eng.launch(ServerSpec("w0", ("w0",), Role.COLOCATED, ""))
        pipe.admit("w0", Role.COLOCATED, 0)
        recs = await pipe.run_batch(0)
        await eng.close()
        return recs, pipe, wrapped

    recs, pipe, wrapped = run_virtual(main())
    status = {r.traj_id: r.status for r in recs}
    assert status.pop("b0-g0-s1") is TrajectoryStatus.FAILED and wrapped.refused == 1
    assert set(status.values()) == {TrajectoryStatus.COMPLETED}
    assert pipe.stats.trajectories_failed == 1
    assert any("RequestRejectedError" in f and "refused (400)" in f for f in pipe.failures)
