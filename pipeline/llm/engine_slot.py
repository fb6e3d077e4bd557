"""An actor's engine, kept: built in the speculation mode the actor's chooser picks
(pipeline/engines/speculation.py), replaced when it fails, built again when the chooser asks for
another mode. Every batch of the stage runs through it.

An engine that fails (EngineFailed: the engine's, not a row's) is closed and built again, once,
whichever batch meets the failure first, and every batch it held runs again on the new one: the
same rows, the same seeds, so greedy rows and seeded sampled rows come out as they would have. A
hung engine (EngineHung) cannot be closed: the actor's process ends and Ray starts it again,
retrying its batches. A failure the stage's `count_failure` counts as one too many stops the run
(EngineCrashLoop), naming the last failure.

A finished batch may ask for another mode: the batches in the engine finish, new ones wait, and the
engine is closed and built again for that mode, as a failed one is replaced. The mode never changes
a row.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from collections.abc import Callable

import torch

from pipeline.config import Config
from pipeline.engines import speculation
from pipeline.engines.base import Engine, EngineFailed, EngineHung, Failed, Request, Result
from pipeline.engines.build import build_engine, build_timed
from pipeline.llm.progress import EngineCrashLoop

logger = logging.getLogger(__name__)


class EngineSlot:
    """The engine of `config` in the mode of `chooser` (`engine`: one built already, in its own
    mode); `count_failure(cause)` says why the run must stop where a failure is one too many."""

    def __init__(
        self,
        config: Config,
        tables,
        chooser: speculation.Chooser,
        count_failure: Callable[[str], str | None],
        engine: Engine | None = None,
    ):
        self.config = config
        self.tables = tables
        self.chooser = chooser
        self.count_failure = count_failure
        self.engine_config = speculation.mode_config(config, chooser.mode)  # what a rebuild builds
        if engine is None:
            engine, chooser.restart_seconds = build_timed(self.engine_config, tables)
        # The engine and how many were built before it; replaced under engine_lock.
        self.current: tuple[Engine | None, int] = (engine, 0)
        self.engine_lock = threading.Lock()
        self.choice_lock = threading.Lock()  # the chooser's: batches finish on several threads
        # What runs now, for an error row (nothing of it ran for that row; a generated row has the
        # columns of the engine that ran it).
        self.ran = {"model": config.model.name, **engine.columns()}
        # Batches in the engine, and whether a switch of mode holds new ones back; the seconds with
        # a batch in the engine (the actor's busy seconds, which the speculation windows count).
        self.gate = threading.Condition()
        self.in_flight = 0
        self.switching = False
        self.busy = 0.0
        self.busy_since = 0.0
        self.stopped: str | None = None  # why its engines may not be replaced again

    @property
    def engine(self) -> Engine | None:
        """The engine now (None while one is being replaced)."""
        return self.current[0]

    def run(self, requests: list[Request]) -> tuple[list[Result | Failed], dict]:
        """The engine's results for `requests` and the columns of the engine that ran them. A batch
        waits while the mode is being switched, and counts as the actor's busy time while it runs."""
        with self.gate:
            while self.switching:
                self.gate.wait()
            if not self.in_flight:
                self.busy_since = time.perf_counter()
            self.in_flight += 1
        try:
            return self.run_on_current(requests)
        finally:
            with self.gate:
                self.in_flight -= 1
                if not self.in_flight:
                    self.busy += time.perf_counter() - self.busy_since
                self.gate.notify_all()

    def run_on_current(self, requests: list[Request]) -> tuple[list[Result | Failed], dict]:
        """run's results; where the engine fails, on a new engine."""
        while True:
            engine, generation = self.current  # one read: an engine and its generation together
            if engine is None:  # another batch is replacing it: the lock is free once it is done
                with self.engine_lock:
                    if self.stopped:
                        raise EngineCrashLoop(self.stopped)
                continue
            try:
                with torch.no_grad():
                    return engine.generate(requests), {"model": self.config.model.name, **engine.columns()}
            except EngineFailed as error:  # left here: its traceback holds the failed engine's frames
                failure = (repr(error), isinstance(error, EngineHung))
            engine = None  # nor does this batch hold the failed engine: its memory can go
            self.replace(*failure, generation)

    def replace(self, cause: str, hung: bool, generation: int) -> None:
        """Closes the failed engine (the `generation`-th) and builds a new one, or ends a hung
        engine's process (the module's docstring); a crash loop raises EngineCrashLoop."""
        with self.engine_lock:
            if self.stopped:
                raise EngineCrashLoop(self.stopped)
            if self.current[1] != generation:
                return  # replaced already, by the batch that met the failure first
            self.stopped = self.count_failure(cause)
            if self.stopped:
                raise EngineCrashLoop(self.stopped)
            if hung and in_ray_actor():
                logger.error("%s: ending this actor's process; Ray starts it again and retries its batches", cause)
                os._exit(75)  # the hung step's thread cannot be stopped
            logger.warning("the engine failed (%s): closing it and building a new one", cause)
            try:
                self.swap(self.engine_config)
            except Exception as error:
                self.stopped = f"the engine failed ({cause}) and could not be built again: {error!r}"
                raise EngineCrashLoop(self.stopped) from error

    def swap(self, config: Config) -> None:
        """Under engine_lock: closes the engine and builds one from `config` in its place (counted
        as the next generation); raises what the build raised, with no engine in place."""
        closing, generation = self.current
        self.current = (None, generation)
        try:
            closing.close()
        except Exception as error:  # noqa: BLE001 - a failed engine may not close cleanly; it is dropped all the same
            logger.error("the engine did not close cleanly: %r", error)
        del closing
        gc.unfreeze()  # vLLM froze the heap it started with (gc.freeze): its cycles are collected only so
        gc.collect()
        engine = build_engine(config, self.tables)
        self.current = (engine, generation + 1)
        self.engine_config = config
        self.ran = {"model": self.config.model.name, **engine.columns()}

    def observe(self, requests: list[Request], results: list, drafter: str) -> None:
        """Tells the chooser of a finished batch (run by `drafter`); makes the switch it asks for."""
        tokens = sum(len(r.token_ids) for r in results if not isinstance(r, Failed))
        predicted = sum(bool(r.prediction) for r in requests)
        sampled = sum(not r.sampling.greedy for r in requests)
        with self.gate:
            busy = self.busy + (time.perf_counter() - self.busy_since if self.in_flight else 0.0)
        with self.choice_lock:
            target = None
            if drafter == self.chooser.mode:
                target = self.chooser.observe(busy, tokens, len(requests), predicted, sampled)
        if target is not None:
            self.switch(target)

    def switch(self, drafter: str) -> None:
        """Lets the batches in the engine finish, holds new ones back, and builds the engine of
        `drafter` in place of the current one. A mode whose engine cannot start is dropped from the
        candidates, and the mode before it built again."""
        asked = time.perf_counter()
        with self.gate:
            self.switching = True
            while self.in_flight:
                self.gate.wait()
        try:
            drained = time.perf_counter()
            with self.engine_lock:
                if self.stopped:
                    raise EngineCrashLoop(self.stopped)
                before = self.engine_config
                try:
                    self.swap(speculation.mode_config(self.config, drafter))
                except Exception as error:  # noqa: BLE001 - that mode cannot run here: the one before it goes on
                    logger.error("the engine for speculation mode %r could not start (%r); dropped", drafter, error)
                    with self.choice_lock:
                        self.chooser.dropped(drafter)
                    drafter = before.drafting.drafter if before.drafting.w > 0 else speculation.PLAIN
                    try:
                        self.swap(before)
                    except Exception as again:
                        self.stopped = f"no engine could be built after a change of speculation mode: {again!r}"
                        raise EngineCrashLoop(self.stopped) from again
            with self.choice_lock:
                self.chooser.switched(drafter, drained - asked, time.perf_counter() - drained)
            logger.info("speculation mode: %s (%s)", drafter, self.chooser.switches[-1])
        finally:
            with self.gate:
                self.switching = False
                self.gate.notify_all()


def in_ray_actor() -> bool:
    import ray

    return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None
