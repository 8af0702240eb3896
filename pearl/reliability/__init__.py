"""Reliability tooling: parser fuzzing, fault injection (chaos), invariant checks, the load test
and the ``docs/RELIABILITY.md`` report. The CLI entry points live in ``pearl.reliability.cli``."""
