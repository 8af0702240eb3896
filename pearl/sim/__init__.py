"""Trace-driven replay of PEARL and its baselines on the emulated engine, in virtual time.

Modules (arrows point down: sim sits on top of runtime, engines and core):

    traces.py       availability traces (spot-traces JSON / CSV), segments, picker, elastic events
    workload.py     seeded SWE-like trajectory plans (turns, tokens, env times, length limit)
    sessions.py     AgentSession that plays a plan against the Pipeline Scheduler
    emulated_trainer.py  emulated trainer (sleeps train.step_time_s; TrainingStarted / Finished)
    systems.py      roll, roll-large, rlboost+, pearl, oracle and ablations as policy knobs
    oracle.py       hindsight knowledge: grant lifetimes, budget intervals, the per-interval Viterbi plan
    presets.py      workload presets (the config's own, or calibrated to the paper)
    metrics.py      sampler of the controller's state: GPU-hours, role timeline, cost
    simulate.py     one replay per system through the real Controller; batch-makespan search
    replay_report.py  markdown + PNG report of a replay
    experiments.py  the paper's Fig. 5 / 7 / 8 and Tables 2 / 3
    cli.py          ``python -m pearl simulate | experiments`` (add_*_parser)

User guide: docs/simulation.md.
"""
