from __future__ import annotations

import pytest

from pearl.core.state import (
    WORKER_TRANSITIONS,
    ClusterState,
    Gpu,
    Role,
    StateError,
    Worker,
    WorkerStatus,
    Zone,
    check_transition,
)

A, INACT, D, N = WorkerStatus.ACTIVE, WorkerStatus.INACTIVE, WorkerStatus.DRAINING, WorkerStatus.INITIALIZING


def base() -> ClusterState:
    gpus = [Gpu("r0", Zone.RESERVED), Gpu("r1", Zone.RESERVED), Gpu("p0", Zone.PREEMPTIBLE, instance_id="i-1"),
            Gpu("o0", Zone.OVERLAP), Gpu("o1", Zone.OVERLAP)]
    workers = [Worker("w0", ("r0",), Role.COLOCATED, A), Worker("wo", ("o0",), Role.DECODE, INACT)]
    return ClusterState.build(gpus, workers)


def test_gpu_bound_twice_is_rejected_naming_both_workers() -> None:
    s = base()
    with pytest.raises(StateError, match=r"GPU 'r0' bound twice: to 'w0' and 'w1'"):
        s.add_worker(Worker("w1", ("r0",), Role.PREFILL, N))


def test_unknown_gpu_and_mixed_zone_are_rejected() -> None:
    s = base()
    with pytest.raises(StateError, match="unknown GPU 'zz'"):
        s.add_worker(Worker("w1", ("zz",), Role.PREFILL, N))
    with pytest.raises(StateError, match="one zone and one node"):
        s.add_worker(Worker("w1", ("r1", "p0"), Role.PREFILL, N))


def test_overlap_worker_active_only_while_lent() -> None:
    s = base()
    with pytest.raises(StateError, match="not all lent"):
        s.set_status("wo", A)
    s2 = s.set_lent(["o0"], True).set_status("wo", A)
    assert s2.worker("wo").status is A
    with pytest.raises(StateError, match="not all lent"):
        s2.set_lent(["o0"], False)
    s3 = s2.set_status("wo", D)
    with pytest.raises(StateError, match="not all lent"):
        s3.set_lent(["o0"], False)
    assert s3.set_status("wo", INACT).set_lent(["o0"], False).gpu("o0").lent is False


def test_only_overlap_gpus_can_be_lent() -> None:
    with pytest.raises(StateError, match="only overlap GPUs are lent"):
        base().set_lent(["r1"], True)


def test_transition_table_is_the_only_authority() -> None:
    for old in WorkerStatus:
        for new in WorkerStatus:
            if new in WORKER_TRANSITIONS[old]:
                check_transition(old, new)
            else:
                with pytest.raises(StateError, match=f"{old.value} -> {new.value}"):
                    check_transition(old, new)


def test_illegal_status_change_names_worker_and_states() -> None:
    with pytest.raises(StateError, match=r"worker 'w0': illegal worker transition active -> inactive"):
        base().set_status("w0", INACT)


def test_role_change_requires_a_non_serving_worker() -> None:
    s = base()
    with pytest.raises(StateError, match="drain it before changing role colocated -> prefill"):
        s.set_role("w0", Role.PREFILL)
    s2 = s.set_status("w0", D).set_role("w0", Role.PREFILL).set_status("w0", A)
    assert s2.worker("w0").role is Role.PREFILL


def test_remove_gpus_takes_their_workers_and_versions_advance() -> None:
    s = base().add_worker(Worker("wp", ("p0",), Role.DECODE, N))
    s2 = s.remove_gpus(["p0"])
    assert "wp" not in s2.workers and "p0" not in s2.gpus
    assert s2.version == s.version + 1
    assert s.workers["wp"].gpus == ("p0",)  # the old value is untouched


def test_new_worker_must_start_initializing_or_inactive() -> None:
    with pytest.raises(StateError, match="must start initializing or inactive"):
        base().add_worker(Worker("w1", ("r1",), Role.PREFILL, A))


def test_round_trip_and_queries() -> None:
    s = base()
    s2 = ClusterState.from_dict(s.to_dict())
    assert s2.to_dict() == s.to_dict()
    assert s.owner_of("r0") == "w0" and s.owner_of("r1") is None
    assert s.free_gpus() == ("o1", "p0", "r1")
    assert s.free_gpus([Zone.RESERVED]) == ("r1",)
    assert s.gpus_of_instance("i-1") == ("p0",)
    assert [w.worker_id for w in s.active_workers()] == ["w0"]


def test_from_dict_errors_name_the_entry() -> None:
    with pytest.raises(StateError, match=r"gpus\[0\]"):
        ClusterState.from_dict({"gpus": [{"zone": "reserved"}], "workers": []})
    with pytest.raises(StateError, match=r"workers\[0\].*role in colocated\|prefill\|decode"):
        ClusterState.from_dict({"gpus": [{"gpu_id": "a"}], "workers": [{"worker_id": "w", "gpus": ["a"], "role": "x"}]})
    with pytest.raises(StateError, match="JSON object"):
        ClusterState.from_dict([])  # type: ignore[arg-type]
