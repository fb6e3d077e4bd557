"""Microbenchmarks: one engine step's parts, measured where they run (a GPU's step, the host's step,
this host's speed against another's), for the replay's projections (jobs/benchmark/replay.py)."""
