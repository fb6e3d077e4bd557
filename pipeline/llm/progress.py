"""What a run did so far, counted as it happens: one small actor per run that every stage actor
tells about each batch it finished. It stops the job when more rows than job.max_errored_rows
have failed, and gives the summary this invocation's counts without any row reaching the driver."""

from __future__ import annotations

import resource
import time
from collections import deque
from dataclasses import dataclass

import ray

from pipeline.engines.base import EngineSteps, engine_summary


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MB: Linux's VmHWM, which starts afresh when a
    program is executed. getrusage's ru_maxrss keeps the peak of the process it was forked from:
    a job started by a benchmark that had run vLLM in its own process reported that process's
    4.7 GB. ru_maxrss where there is no /proc."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class JobStopped(RuntimeError):
    """Raised in a stage actor when the run must stop (the message says why)."""


@dataclass(frozen=True)
class BatchReport:
    rows: int  # output rows: a row's samples each one
    errored_rows: int
    generated_tokens: int
    target_calls: int
    started: float  # time.time() when the batch's generation began
    finished: float
    node: str  # the Ray node that ran it
    actor: str = ""  # the Ray actor that ran it, its process and its engine (actor/pid/generation)
    engine_steps: EngineSteps | None = None  # that actor's engine's step accounting so far (None: not kept)
    peak_rss_mb: float = 0.0  # the actor process's peak resident memory so far
    input_rows: int = 0  # the rows the batch was given
    speculation: dict | None = None  # the actor's speculation mode (Chooser.report)


COUNTED = ("rows", "input_rows", "errored_rows", "generated_tokens", "target_calls")  # summed over the batches


class EngineCrashLoop(JobStopped):
    """An actor's engines failed more often than engine.max_restarts within engine.restart_window_s."""


class RestartWindow:
    """An actor's engine failures: more than `limit` within `window` seconds is a crash loop."""

    def __init__(self, limit: int, window: float):
        self.limit = limit
        self.window = window
        self.times: deque[float] = deque()
        self.total = 0

    def record(self, cause: str, now: float | None = None) -> str | None:
        """Counts a failure; returns why the run must stop where it is one too many."""
        now = time.monotonic() if now is None else now
        self.times.append(now)
        while self.times[0] < now - self.window:
            self.times.popleft()
        self.total += 1
        if len(self.times) > self.limit:
            return (
                f"the engine failed {len(self.times)} times within engine.restart_window_s "
                f"({self.window:g} s), more than engine.max_restarts ({self.limit}); the last failure: {cause}"
            )
        return None


def empty_totals() -> dict:
    """The totals of an invocation that generated nothing."""
    return {
        "batches": 0,
        **{name: 0 for name in COUNTED},
        "first_start": float("inf"),
        "last_finish": 0.0,
        "nodes": [],
        **engine_summary([]),
        "engine_series": [],
        "actor_peak_rss_mb": None,
        "engine_restarts": {"total": 0, "by_actor": {}, "causes": []},
        "speculation": {},
    }


@ray.remote(num_cpus=0)
class RunProgress:
    def __init__(
        self, max_errored_rows: int, output: str = "", max_restarts: int = 3, restart_window_s: float = 3600.0
    ):
        self.max_errored_rows, self.output = max_errored_rows, output  # -1: never stop for row errors
        # Each actor's engine failures, across the restarts of its process (Ray keeps its id).
        self.restarts: dict[str, RestartWindow] = {}
        self.restart_limits = (max_restarts, restart_window_s)
        self.causes: list[str] = []
        self.counts = {name: value for name, value in empty_totals().items() if name in ("batches", *COUNTED)}
        self.first_start = float("inf")
        self.last_finish = 0.0
        self.nodes: set[str] = set()
        self.stopped: str | None = None
        self.engines: dict[str, EngineSteps] = {}  # each engine's latest (a replaced engine's stay counted)
        self.peak_rss_mb = 0.0  # the largest of the actors'
        self.series: list[tuple[float, float | None]] = []  # (when, the run's occupancy so far)
        self.speculation: dict[str, dict] = {}  # each actor's latest speculation report, by its Ray actor id

    def report(self, batch: BatchReport) -> str | None:
        """Adds a finished batch; returns why the run must stop, if it must."""
        for name in COUNTED:
            self.counts[name] += getattr(batch, name)
        self.counts["batches"] += 1
        self.first_start, self.last_finish = min(self.first_start, batch.started), max(self.last_finish, batch.finished)
        self.nodes.add(batch.node)
        self.peak_rss_mb = max(self.peak_rss_mb, batch.peak_rss_mb)
        if batch.speculation is not None:
            self.speculation[batch.actor.split("/")[0] or batch.node] = batch.speculation
        if batch.engine_steps is not None:
            self.engines[batch.actor] = batch.engine_steps
            self.series.append((batch.finished, engine_summary(list(self.engines.values()))["engine_occupancy"]))
        if 0 <= self.max_errored_rows < self.counts["errored_rows"] and self.stopped is None:
            self.stopped = (
                f"{self.counts['errored_rows']} rows failed, more than job.max_errored_rows "
                f"({self.max_errored_rows}); see the 'error' column in {self.output}"
            )
        return self.stopped

    def engine_failed(self, actor: str, cause: str) -> str | None:
        """Counts a failure of an actor's engine (rebuilt in place, or its process ended and started
        again); returns why the run must stop, if it must."""
        window = self.restarts.setdefault(actor, RestartWindow(*self.restart_limits))
        stop = window.record(cause)
        if len(self.causes) < 10:
            self.causes.append(cause)
        if stop and self.stopped is None:
            self.stopped = stop
        return stop

    def stop_reason(self) -> str | None:
        return self.stopped

    def totals(self) -> dict:
        start = self.first_start
        return {
            **self.counts,
            "first_start": start,
            "last_finish": self.last_finish,
            "nodes": sorted(self.nodes),
            **engine_summary(list(self.engines.values())),
            "actor_peak_rss_mb": round(self.peak_rss_mb, 1) or None,
            # Engines that failed and were replaced (or whose actor was started again), per actor,
            # and the first causes.
            "engine_restarts": {
                "total": sum(w.total for w in self.restarts.values()),
                "by_actor": {actor: w.total for actor, w in self.restarts.items()},
                "causes": list(self.causes),
            },
            # Each actor's speculation mode: what it runs, why, its measured windows and switches.
            "speculation": dict(self.speculation),
            # The run's occupancy after each batch, by seconds since the first batch started.
            "engine_series": [[round(when - start, 2), occupancy] for when, occupancy in sorted(self.series)],
        }
