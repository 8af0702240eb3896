"""A request says who it is in typed fields, and an engine says what it can do in a declaration
(``pearl.engines.base``): the wire id is formatted from ``conversation`` / ``turn`` / ``attempt``
and never read back; ``EngineCapabilities`` is what the runtime asks, wrappers forward it."""

from __future__ import annotations

import pytest

from pearl.config import load_config
from pearl.core.state import Role
from pearl.engines.base import (
    EngineCapabilities,
    EngineError,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    PauseMode,
    SamplingParams,
    ServerSpec,
)
from pearl.engines.emulated import EmulatedEngine
from pearl.engines.resume import continuation_request
from pearl.engines.sglang import SglangEngine, SglangSettings
from pearl.engines.vllm import VllmEngine
from pearl.reliability.faults import ChaosEngine
from pearl.runtime.clock import LoopClock, run_virtual
from pearl.runtime.journal import Journal, PartialOutput
from pearl.runtime.journal_replay import JournaledEngine
from pearl.runtime.node.wire import (
    capabilities_from_dict,
    capabilities_to_dict,
    common_capabilities,
    request_from_dict,
    request_to_dict,
)


def _req(conv: str = "b0-g1-s2", turn: int = 3, attempt: int = 0, n: int = 8) -> GenerateRequest:
    return GenerateRequest(conv, (1, 2, 3), SamplingParams(max_new_tokens=n), turn=turn, attempt=attempt)


def test_the_wire_id_is_formatted_from_the_fields() -> None:
    assert _req().rid == "b0-g1-s2/3"
    assert _req(attempt=2).rid == "b0-g1-s2/3#2"
    back = request_from_dict(request_to_dict(_req(attempt=2)))
    assert (back.conversation, back.turn, back.attempt) == ("b0-g1-s2", 3, 2)


def test_a_continuation_keeps_conversation_and_turn_and_counts_the_attempt() -> None:
    original = _req(n=10)
    part = GenerateResult(original.rid, (7, 8, 9), (-0.1,) * 3, FinishReason.ABORT, 0, 3)
    cont = continuation_request(original, [part], attempt=4)
    assert cont is not None
    assert (cont.conversation, cont.turn, cont.attempt) == ("b0-g1-s2", 3, 4)
    assert cont.input_ids == (1, 2, 3, 7, 8, 9) and cont.sampling.max_new_tokens == 7


@pytest.mark.parametrize("conv", ["", "a/b", "../x", "t#1"])
def test_a_conversation_id_the_wire_id_could_not_hold_is_refused(conv: str) -> None:
    with pytest.raises(ValueError, match=r"conversation .* must be non-empty without '/' or '#'"):
        _req(conv)


def test_turn_and_attempt_are_never_negative() -> None:
    with pytest.raises(ValueError, match="turn=-1, attempt=0 must both be >= 0"):
        _req(turn=-1)


def test_every_engine_declares_its_capabilities(tmp_path) -> None:
    emu = EmulatedEngine.from_config(load_config("qwen3-8b-h200"), LoopClock())
    assert emu.capabilities == EngineCapabilities(in_place_role_switch=True)
    v = VllmEngine(tmp_path).capabilities
    assert v.split_pd and v.weight_broadcast and not v.in_place_role_switch
    assert v.pause_modes == {PauseMode.KEEP, PauseMode.ABORT, PauseMode.WAIT}
    assert VllmEngine(tmp_path, kv_mode="both").capabilities.in_place_role_switch
    s = SglangEngine(tmp_path).capabilities
    assert s.split_pd and s.weight_broadcast and s.pause_modes == {PauseMode.KEEP, PauseMode.ABORT, PauseMode.RETRACT}
    assert not s.in_place_role_switch  # nixl's KV manager has no role switch
    assert SglangEngine(tmp_path, SglangSettings(transfer_backend="mooncake",
                                                 enable_pd_role_switch=True)).capabilities.in_place_role_switch


def test_wrappers_forward_the_declaration_and_it_crosses_the_wire(tmp_path) -> None:
    inner = VllmEngine(tmp_path)
    with Journal(tmp_path / "j.db") as j:
        assert JournaledEngine(inner, j, {}).capabilities == inner.capabilities
    assert ChaosEngine(inner).capabilities == inner.capabilities
    assert capabilities_from_dict(capabilities_to_dict(inner.capabilities)) == inner.capabilities
    both = common_capabilities([inner.capabilities, EngineCapabilities(in_place_role_switch=True)])
    assert both == EngineCapabilities()  # only what both can: no split PD, pause keep


def test_a_pause_mode_the_engine_does_not_declare_is_refused_by_name() -> None:
    async def main() -> None:
        eng = EmulatedEngine.from_config(load_config("qwen3-8b-h200"), LoopClock())
        await eng.launch(ServerSpec("w", ("w",), Role.COLOCATED, ""))
        try:
            with pytest.raises(EngineError, match=r"pause mode 'retract' is not supported .* \['keep'\]"):
                await eng.pause("w", PauseMode.RETRACT)
            await eng.pause("w", PauseMode.KEEP)
            await eng.resume("w")
        finally:
            await eng.close()

    run_virtual(main())


def test_the_journal_replays_by_conversation_and_turn(tmp_path) -> None:
    """A journaled part is found by the request's fields (any attempt), never by its wire id."""
    part = PartialOutput("b0-g1-s2", 3, (5, 6), (-0.5, -0.25), 1, input_len=3)

    async def main() -> tuple[GenerateResult, int]:
        eng = EmulatedEngine.from_config(load_config("qwen3-8b-h200"), LoopClock())
        with Journal(tmp_path / "j.db") as j:
            je = JournaledEngine(eng, j, {"b0-g1-s2": (part,)})
            res = await je.generate("w", _req(attempt=1))
            return res, je.replayed_parts

    res, replayed = run_virtual(main())
    assert replayed == 1 and res.output_ids == (5, 6) and res.rid == "b0-g1-s2/3#1"
    assert res.finish_reason is FinishReason.ABORT  # unfinished: the pipeline continues it
