"""Admin API in front of the real controller: auth, no secrets in logs, limits, fuzzed bodies."""

from __future__ import annotations

import pytest

from pearl.reliability.security import run_security_probe


def test_admin_api_probe_is_clean() -> None:
    rep = run_security_probe(fuzz_per_route=8).to_dict()
    assert rep["ok"], rep["problems"]
    assert rep["unauthorized_probes"] == 4 * rep["routes"]
    assert rep["fuzz_requests"] == 8 * 7
    assert all(code < 500 for code in rep["statuses"])
    assert rep["burst_rate_limited"] > 0
    assert rep["log_records_scanned"] > 50  # the access log and the app's own records were scanned


def test_probe_catches_a_token_in_the_access_log(monkeypatch: pytest.MonkeyPatch) -> None:
    """An access logger that logs the raw request line (query string included) is caught."""
    from pearl.admin import app

    def leaky(self, request, response, time):  # type: ignore[no-untyped-def]
        self.logger.info("%s %s", request.method, request.path_qs)

    monkeypatch.setattr(app.PathOnlyAccessLogger, "log", leaky)
    rep = run_security_probe(fuzz_per_route=1).to_dict()
    assert any("appears in" in p for p in rep["problems"]), rep["problems"]
