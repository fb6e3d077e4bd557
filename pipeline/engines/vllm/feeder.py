"""One vLLM engine kept full: any number of callers hand it batches, one thread steps it.

Every vLLM call runs on the engine's own thread (on a CPU vLLM binds the OpenMP threads of the
thread that starts it; another thread's are not bound). Callers, such as the Ray stage's
concurrent batches, hand it a batch of requests and wait for that batch's outputs. The thread
admits waiting requests whenever the engine has room (its slots, vLLM's `max_num_seqs`, plus a
few waiting in vLLM's own queue so that a slot freed is refilled at the very next step), steps the
engine, and returns each batch the moment its own last request ends. Nothing waits for another
batch to drain.

A failure of the engine itself (an error out of vLLM's step, a worker process gone, a step that
makes no progress for `hang_timeout_s`) fails every batch it holds or waits to admit with
EngineFailed (EngineHung), and every later call: the stage builds a new engine (pipeline/llm/stage.py).

Step accounting (EngineSteps) is measured from vLLM's scheduler: the requests that ran in a step
are those still running after it plus those it finished.

vLLM is reached through its public `LLM` (enqueue, llm_engine.step, its scheduler config) and, for
what LLM does not show (its scheduler's running requests, a shutdown, its request ids), compat.py.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import traceback
from collections import deque
from concurrent.futures import Future
from concurrent.futures import TimeoutError as WaitedTooLong  # the builtin TimeoutError only from Python 3.11
from dataclasses import dataclass, field, replace
from collections.abc import Callable

from pipeline.engines.base import EngineFailed, EngineHung, EngineSteps
from pipeline.engines.vllm.compat import external_request_id, running_count, shutdown

logger = logging.getLogger(__name__)

# Requests admitted beyond the slots wait in vLLM's own queue, ready for the next freed slot.
WAITING_SHARE = 0.1


@dataclass
class _Batch:
    outputs: list  # one vLLM RequestOutput per request, filled as they finish
    remaining: int
    done: Future = field(default_factory=Future)
    extras: dict = field(default_factory=dict)  # what on_finished returned, by vLLM request id


class EngineFeeder:
    """Starts the engine with `start()` (on its own thread) and feeds it from then on.

    `on_finished(outputs)`, run on the engine thread as requests end, may return per vLLM request
    id whatever the caller needs from the engine's side (the proposer's tracking). With
    `hang_timeout_s`, a caller waiting while requests are in the engine and no step has ended for
    that long fails the engine as hung."""

    def __init__(
        self,
        start: Callable[[], object],
        on_finished: Callable[[list], dict] | None = None,
        hang_timeout_s: float = 0.0,
    ):
        self.on_finished = on_finished or (lambda outputs: {})
        self.hang_timeout_s = hang_timeout_s
        self.last_progress = time.perf_counter()  # when a step last ended (or requests were admitted)
        self.lock = threading.Condition()
        self.calls: deque = deque()  # (function, args, future) to run on the engine thread
        self.pending: deque = deque()  # (batch, index, prompt, params) not yet admitted
        self.in_engine: dict[str, tuple[_Batch, int]] = {}
        self.failure: BaseException | None = None
        self.closed = False
        self.counts = EngineSteps()
        self.pending_idle = 0.0  # idle seconds since the last admission (counted if another comes)
        self.last_admission = self.last_finish = None
        started: Future = Future()
        self.thread = threading.Thread(target=self._run, args=(start, started), name="vllm-engine", daemon=True)
        self.thread.start()
        self.llm = started.result()
        self.running = running_count(self.llm)  # the requests vLLM's scheduler runs now
        self.slots = self.llm.llm_engine.vllm_config.scheduler_config.max_num_seqs
        self.capacity = self.slots + math.ceil(WAITING_SHARE * self.slots) + 1
        self.counts = EngineSteps(slots=self.slots)

    # --- callers' side ------------------------------------------------------------------------

    def call(self, function: Callable, *args):
        """Runs function(*args) on the engine thread between two steps; returns its result."""
        future: Future = Future()
        with self.lock:
            self._check_open()
            self.calls.append((function, args, future))
            self.lock.notify()
        return future.result()

    def generate(self, prompts: list, params: list) -> tuple[list, dict]:
        """The engine's RequestOutput for each prompt (or the exception with which vLLM refused
        it), in order, once all have ended, and what on_finished said of them."""
        if not prompts:
            return [], {}
        batch = _Batch([None] * len(prompts), len(prompts))
        with self.lock:
            self._check_open()
            self.pending.extend(
                (batch, index, prompt, param) for index, (prompt, param) in enumerate(zip(prompts, params))
            )
            self.lock.notify()
        while True:
            try:
                batch.done.result(timeout=min(1.0, self.hang_timeout_s / 4) if self.hang_timeout_s else None)
                return batch.outputs, batch.extras
            except WaitedTooLong:
                self._check_progress()

    def _check_progress(self) -> None:
        """Fails the engine as hung where requests are in it and no step has ended for hang_timeout_s."""
        with self.lock:
            stalled = time.perf_counter() - self.last_progress
            hung = self.in_engine and self.failure is None and stalled > self.hang_timeout_s
        if hung:
            self._fail(
                EngineHung(
                    f"the vLLM engine's step made no progress for {stalled:.0f} s "
                    f"(engine.hang_timeout_s is {self.hang_timeout_s:g})"
                )
            )

    def steps(self) -> EngineSteps:
        with self.lock:
            drain = 0.0
            if self.last_admission is not None and self.last_finish is not None:
                drain = max(0.0, self.last_finish - self.last_admission)
            return replace(self.counts, drain_seconds=drain)

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.lock.notify()

    def _check_open(self) -> None:
        if self.failure is not None:
            raise fresh(self.failure)
        if self.closed:
            raise RuntimeError("the vLLM engine was closed")

    # --- the engine thread ----------------------------------------------------------------------

    def _run(self, start: Callable[[], object], started: Future) -> None:
        try:
            llm = start()
        except BaseException as error:  # the caller re-raises it in the constructor
            started.set_exception(error)
            return
        started.set_result(llm)
        try:
            while self._next_round(llm):
                pass
        except BaseException as error:  # a failure of vLLM itself: every waiting batch learns of it
            # Formatted here: a log record that kept the traceback would keep the engine's memory.
            logger.error(
                "the vLLM engine failed; its waiting batches fail with it\n%s",
                "".join(traceback.format_exception(error)),
            )
            traceback.clear_frames(error.__traceback__)  # the step's frames hold the engine
            self._fail(error)
        try:  # closed or failed: the engine's worker processes (tensor parallel) end too
            shutdown(llm)
        except Exception as error:  # noqa: BLE001 - a failed engine may not shut down cleanly; it is dropped all the same
            logger.error("the vLLM engine did not shut down cleanly: %r", error)

    def _next_round(self, llm) -> bool:
        """Runs queued calls, admits what fits, takes one engine step. False once closed."""
        with self.lock:
            waited = time.perf_counter()
            while not (self.calls or self.pending or self.in_engine or self.closed):
                self.lock.wait()
            if self.last_admission is not None and not self.in_engine:
                self.pending_idle += time.perf_counter() - waited
            if self.closed or self.failure is not None:  # a hung step that returned after all: dropped
                return False
            calls, self.calls = list(self.calls), deque()
            admitted = [
                self.pending.popleft() for _ in range(min(len(self.pending), self.capacity - len(self.in_engine)))
            ]
        for function, args, future in calls:
            try:
                future.set_result(function(*args))
            except BaseException as error:
                future.set_exception(error)
        if calls:  # a call is progress too (a long one is not a hung step)
            with self.lock:
                self.last_progress = time.perf_counter()
        if admitted:
            self._admit(llm, admitted)
        if self.in_engine:
            self._step(llm)
        return True

    def _admit(self, llm, admitted: list) -> None:
        """Adds the requests to vLLM; one vLLM refuses (VLLMValidationError, ValueError, ...) ends
        with the refusal as its output, and nothing else."""
        added, refused = [], []
        for entry in admitted:
            batch, index, prompt, params = entry
            try:  # a prompt may name its LoRA adapter (VllmEngine.generate): vLLM takes it beside the prompt
                adapter = {key: value for key, value in prompt.items() if key != "lora_request"}
                added.append(
                    (
                        llm.enqueue([adapter], [params], lora_request=prompt.get("lora_request"), use_tqdm=False)[0],
                        entry,
                    )
                )
            except Exception as error:  # noqa: BLE001 - vLLM's refusals have several types; the engine goes on
                refused.append((batch, index, error))
        done = []
        with self.lock:
            for request_id, (batch, index, _, _) in added:
                self.in_engine[external_request_id(request_id)] = (batch, index)  # as its outputs name it
            for batch, index, error in refused:
                batch.outputs[index] = error
                batch.remaining -= 1
                if batch.remaining == 0:
                    done.append(batch)
            # The steps since the last admission were not the final drain: input remained.
            counts = self.counts
            self.counts = replace(
                counts,
                steps=counts.steps + counts.drain_steps,
                running=counts.running + counts.drain_running,
                drain_steps=0,
                drain_running=0,
                idle_seconds=counts.idle_seconds + self.pending_idle,
            )
            self.pending_idle = 0.0
            self.last_admission = self.last_progress = time.perf_counter()
        for batch in done:
            batch.done.set_result(None)

    def _step(self, llm) -> None:
        outputs = llm.llm_engine.step()
        finished = [output for output in outputs if output.finished]
        running = self.running() + len(finished)
        extras = self.on_finished(finished) if finished else {}
        done = []
        with self.lock:
            self.counts = replace(
                self.counts, drain_steps=self.counts.drain_steps + 1, drain_running=self.counts.drain_running + running
            )
            for output in finished:
                batch, index = self.in_engine.pop(output.request_id)
                batch.outputs[index] = output
                if output.request_id in extras:
                    batch.extras[output.request_id] = extras[output.request_id]
                batch.remaining -= 1
                if batch.remaining == 0:
                    done.append(batch)
            if finished:
                self.last_finish = time.perf_counter()
            self.last_progress = time.perf_counter()
        for batch in done:
            batch.done.set_result(None)

    def _fail(self, error: BaseException) -> None:
        if not isinstance(error, EngineFailed):
            failed = EngineFailed(f"the vLLM engine failed: {error!r}")
            failed.__cause__, error = error, failed
        with self.lock:
            if self.failure is not None:  # failed already (hung, then its step raised)
                return
            self.failure = error
            batches = {id(batch): batch for batch, _ in self.in_engine.values()}
            batches.update({id(batch): batch for batch, *_ in self.pending})
            calls = list(self.calls)
            self.in_engine.clear(), self.pending.clear(), self.calls.clear()
        for batch in batches.values():
            if not batch.done.done():
                batch.done.set_exception(fresh(error))
        for _, _, future in calls:
            future.set_exception(fresh(error))


def fresh(error: EngineFailed) -> EngineFailed:
    """A copy of the failure for one caller to raise: a raise adds the caller's frames to the
    exception's traceback, and one object shared by every caller would keep them all."""
    return type(error)(*error.args)
