"""What a run did so far, counted as it happens: one small actor per run that every stage actor
tells about each batch it finished. It stops the job when more rows than job.max_errored_rows
have failed, and gives the summary this invocation's counts without any row reaching the driver."""
from __future__ import annotations

from dataclasses import dataclass

import ray

from pipeline.engines.base import EngineSteps, engine_summary


class JobStopped(RuntimeError):
    """Raised in a stage actor when the run must stop (the message says why)."""


@dataclass(frozen=True)
class BatchReport:
    rows: int
    errored_rows: int
    generated_tokens: int
    target_calls: int
    started: float  # time.time() when the batch's generation began
    finished: float
    node: str  # the Ray node that ran it
    actor: str = ""  # the Ray actor that ran it
    engine_steps: EngineSteps | None = None  # that actor's engine's step accounting so far (None: not kept)
    peak_rss_mb: float = 0.0  # the actor process's peak resident memory so far


COUNTED = ("rows", "errored_rows", "generated_tokens", "target_calls")  # summed over the batches


def empty_totals() -> dict:
    """The totals of an invocation that generated nothing."""
    return {"batches": 0, **{name: 0 for name in COUNTED}, "first_start": float("inf"), "last_finish": 0.0,
            "nodes": [], **engine_summary([]), "engine_series": [], "actor_peak_rss_mb": None}


@ray.remote(num_cpus=0)
class RunProgress:
    def __init__(self, max_errored_rows: int):
        self.max_errored_rows = max_errored_rows  # -1: never stop for row errors
        self.counts = {name: value for name, value in empty_totals().items() if name in ("batches", *COUNTED)}
        self.first_start, self.last_finish = float("inf"), 0.0
        self.nodes: set[str] = set()
        self.stopped: str | None = None
        self.engines: dict[str, EngineSteps] = {}  # each actor's latest
        self.peak_rss_mb = 0.0  # the largest of the actors'
        self.series: list[tuple[float, float | None]] = []  # (when, the run's occupancy so far)

    def report(self, batch: BatchReport) -> str | None:
        """Adds a finished batch; returns why the run must stop, if it must."""
        for name in COUNTED:
            self.counts[name] += getattr(batch, name)
        self.counts["batches"] += 1
        self.first_start, self.last_finish = min(self.first_start, batch.started), max(self.last_finish, batch.finished)
        self.nodes.add(batch.node)
        self.peak_rss_mb = max(self.peak_rss_mb, batch.peak_rss_mb)
        if batch.engine_steps is not None:
            self.engines[batch.actor] = batch.engine_steps
            self.series.append((batch.finished, engine_summary(list(self.engines.values()))["engine_occupancy"]))
        if 0 <= self.max_errored_rows < self.counts["errored_rows"] and self.stopped is None:
            self.stopped = (f"{self.counts['errored_rows']} rows failed, more than job.max_errored_rows "
                            f"({self.max_errored_rows})")
        return self.stopped

    def stop_reason(self) -> str | None:
        return self.stopped

    def totals(self) -> dict:
        start = self.first_start
        return {**self.counts, "first_start": start, "last_finish": self.last_finish, "nodes": sorted(self.nodes),
                **engine_summary(list(self.engines.values())), "actor_peak_rss_mb": round(self.peak_rss_mb, 1) or None,
                # The run's occupancy after each batch, by seconds since the first batch started.
                "engine_series": [[round(when - start, 2), occupancy] for when, occupancy in sorted(self.series)]}
