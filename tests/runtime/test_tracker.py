"""Runtime Tracker: refit from the window, then clear it; an empty window changes nothing."""

from __future__ import annotations

import pytest

from pearl.core.profile import HardwareProfile, TelemetryRecord, WorkloadProfile
from pearl.runtime.tracker import RuntimeTracker

from .helpers import config


def test_refit_uses_the_window_and_clears_it() -> None:
    cfg = config()
    hw0 = HardwareProfile.from_specs(cfg.model, cfg.hardware)
    wl0 = WorkloadProfile.from_spec(cfg.workload)
    tr = RuntimeTracker(hw0, wl0, alpha=1.0)
    assert tr.refit() == (hw0, wl0) and tr.refits == 0
    for i in range(40):  # every turn-1 response is 100 tokens, twice as slow to prefill as predicted
        tr.record(TelemetryRecord(f"t{i}", 1, prompt_tokens=2500, cached_tokens=0, output_tokens=100,
                                  prefill_s=2 * hw0.prefill_s(2500, 0), decode_s=1.0, env_s=3.0,
                                  decode_concurrency=8.0, final=True))
    hw1, wl1 = tr.refit()
    assert tr.window == [] and tr.refits == 1 and tr.records_total == 40
    assert hw1.prefill_s(2500, 0) == pytest.approx(2 * hw0.prefill_s(2500, 0))
    assert wl1.output_tokens[0] == pytest.approx(100.0) and wl1.env_s[0] == pytest.approx(3.0)
    assert wl1.survival == (1.0,)  # every trajectory ended after turn 1
    with pytest.raises(ValueError, match="alpha"):
        RuntimeTracker(hw0, wl0, alpha=0.0)
