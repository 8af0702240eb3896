"""The one door (``pearl.runtime.door``) in front of a real Controller on the emulator, in virtual
time: a reclaim is identified by (instance or GPUs, grant generation), the earliest deadline wins,
a re-granted instance is reclaimed again, a cancelled notice can be re-armed, a notice's timer dies
with the GPUs it was armed for, and client ids never collide with the runtime's own."""

from __future__ import annotations

import pytest

from pearl.core.events import GpusGranted, GrantedGpu, NoticeCancelled, ReclaimNotice, TrainingStarted
from pearl.runtime.clock import LoopClock, run_virtual
from pearl.runtime.controller import Controller

from .test_controller import _cfg, _controller, _expansion_settled


def _grant(ids: list[str], eid: str, instance: str = "i-1") -> GpusGranted:
    return GpusGranted(tuple(GrantedGpu(g, "pnode0", instance) for g in ids), event_id=eid)


def _gpus(ctl: Controller) -> set[str]:
    return {g["gpu_id"] for g in ctl.state_dict()["gpus"]}


def test_a_later_notice_with_an_earlier_deadline_moves_the_shrink_forward() -> None:
    """Three notices for one instance: 3,000 s out, then 120 s, then 5 s. The shrink is done by the
    earliest deadline; none of the later notices is a duplicate."""

    async def main():
        clock = LoopClock()
        ctl, _eng, _ = _controller(clock, _cfg())
        await ctl.start()
        await ctl.submit(_grant(["p0", "p1"], "g1", "i-0abc"))
        await _expansion_settled(ctl)
        now = clock.now()
        r1 = await ctl.submit(ReclaimNotice(("p0", "p1"), now + 3000.0, event_id="imds-1", notice_id="i-0abc"))
        r2 = await ctl.submit(ReclaimNotice(("p0", "p1"), now + 120.0, event_id="eb-1", notice_id="i-0abc"))
        r3 = await ctl.submit(ReclaimNotice(("p0", "p1"), now + 5.0, event_id="imds-2", notice_id="i-0abc"))
        await clock.sleep(6.0)
        gone = not {"p0", "p1"} & _gpus(ctl)
        await ctl.stop()
        return (r1, r2, r3), gone, ctl.elastic.shrinks, now

    results, gone, shrinks, now = run_virtual(main())
    assert [r.duplicate for r in results] == [False, False, False]
    assert all(r.applied for r in results)
    assert gone
    (shrink,) = shrinks
    assert shrink["deadline"] == pytest.approx(now + 5.0) and shrink["met_deadline"]


def test_an_instance_granted_again_after_a_reclaim_is_reclaimed_again() -> None:
    """AWS stop / start keeps the instance id: the notice after the re-grant is a new notice."""

    async def main():
        clock = LoopClock()
        ctl, _eng, _ = _controller(clock, _cfg())
        await ctl.start()
        await ctl.submit(_grant(["p0"], "g1", "i-0abc"))
        await _expansion_settled(ctl)
        await ctl.submit(ReclaimNotice(("p0",), clock.now() + 10.0, event_id="n1", notice_id="i-0abc"))
        await clock.sleep(11.0)
        await ctl.elastic.idle()
        assert "p0" not in _gpus(ctl)
        await ctl.submit(_grant(["p0"], "g2", "i-0abc"))
        await _expansion_settled(ctl)
        assert "p0" in _gpus(ctl)
        second = await ctl.submit(ReclaimNotice(("p0",), clock.now() + 10.0, event_id="n2", notice_id="i-0abc"))
        await clock.sleep(11.0)
        await ctl.elastic.idle()
        out = _gpus(ctl)
        await ctl.stop()
        return second, out, ctl.elastic.shrinks

    second, gpus, shrinks = run_virtual(main())
    assert second.applied and not second.duplicate
    assert "p0" not in gpus and len(shrinks) == 2


def test_a_stale_notice_never_removes_a_regranted_gpu() -> None:
    """Notice A (p0, p1; far) and notice B (p0; near): B's shrink takes p0, p0 is granted again, then
    A's deadline passes: A shrinks p1 only; the re-granted p0 stays."""

    async def main():
        clock = LoopClock()
        ctl, _eng, _ = _controller(clock, _cfg())
        await ctl.start()
        await ctl.submit(_grant(["p0", "p1"], "g1"))
        await _expansion_settled(ctl)
        now = clock.now()
        await ctl.submit(ReclaimNotice(("p0", "p1"), now + 300.0, notice_id="far", event_id="a"))
        await ctl.submit(ReclaimNotice(("p0",), now + 20.0, notice_id="near", event_id="b"))
        await clock.sleep(30.0)
        await ctl.elastic.idle()
        assert "p0" not in _gpus(ctl)
        await ctl.submit(_grant(["p0"], "g2"))
        await _expansion_settled(ctl)
        await clock.sleep(400.0)
        await ctl.elastic.idle()
        out = _gpus(ctl)
        await ctl.stop()
        return out

    gpus = run_virtual(main())
    assert "p0" in gpus and "p1" not in gpus


def test_a_cancelled_notice_sent_again_is_armed_again() -> None:
    async def main():
        clock = LoopClock()
        ctl, _eng, _ = _controller(clock, _cfg())
        await ctl.start()
        await ctl.submit(_grant(["p0"], "g1"))
        await _expansion_settled(ctl)
        await ctl.submit(ReclaimNotice(("p0",), clock.now() + 60.0, notice_id="n1", event_id="e1"))
        await ctl.submit(NoticeCancelled("n1", event_id="c1"))
        again = await ctl.submit(ReclaimNotice(("p0",), clock.now() + 60.0, notice_id="n1", event_id="e2"))
        await clock.sleep(70.0)
        await ctl.elastic.idle()
        out = _gpus(ctl)
        await ctl.stop()
        return again, out

    again, gpus = run_virtual(main())
    assert again.applied and not again.duplicate and "p0" not in gpus


def test_client_ids_never_suppress_the_runtimes_own_events() -> None:
    """A grant whose id is ``train-start-2`` is applied, and the trainer's own training start of
    step 2 (id ``train-start-2``) still takes the lent GPUs back."""

    async def main():
        clock = LoopClock()
        ctl, _eng, _ = _controller(clock, _cfg())
        await ctl.start()
        grant = await ctl.submit(_grant(["p0"], "train-start-2"))
        await ctl.elastic.idle()
        started = await ctl.notify(TrainingStarted(2, event_id="train-start-2"))
        out = _gpus(ctl)
        await ctl.stop()
        return grant, started, out, ctl.elastic.trainer.steps_seen

    grant, started, gpus, steps = run_virtual(main())
    assert grant.applied and not grant.duplicate and "p0" in gpus
    assert started.applied and not started.duplicate and steps == 1


def test_path_like_ids_are_refused_at_the_door_from_any_source() -> None:
    """A trace or a cloud watcher reaches the door without the admin API's schemas: an id with a
    path separator or ``..`` is refused there, naming the field, and nothing is applied."""
    from pearl.runtime.door import EventRefused

    async def main():
        clock = LoopClock()
        ctl, _eng, _ = _controller(clock, _cfg())
        await ctl.start()
        refused = []
        for event in (_grant(["../../etc"], "g1"), _grant(["p0"], "g2", instance="i/1"),
                      GpusGranted((GrantedGpu("p0", "node/0"),), event_id="g3"), _grant(["p0"], "a/b"),
                      ReclaimNotice(("p0",), clock.now() + 10.0, event_id="n1", notice_id="..")):
            with pytest.raises(EventRefused) as err:
                await ctl.door.submit(event, "trace")
            refused.append((err.value.code, err.value.field))
        ok = await ctl.submit(_grant(["p0"], "g4", "i-0abc"))
        await ctl.stop()
        return refused, ok

    refused, ok = run_virtual(main())
    assert refused == [("invalid_id", "gpu_id"), ("invalid_id", "instance_id"), ("invalid_id", "node"),
                       ("invalid_id", "event_id"), ("invalid_id", "notice_id")]
    assert ok.applied
