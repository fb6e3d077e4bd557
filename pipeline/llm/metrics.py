"""Live metrics of a run, exported by its actors through Ray's metrics (`ray.util.metrics`), so
Ray's dashboard, and any Prometheus that scrapes Ray's metrics endpoint, show a run's speed and
acceptance while it goes on. Counters, named like vLLM's (`vllm:generation_tokens_total`) with
our prefix; Ray exports each with its own `ray_` prefix (`ray_ngrammys_generation_tokens_total`).
Every sample is tagged with the run's engine and run id.

  ngrammys_rows_total                  rows written (errored rows included)
  ngrammys_errored_rows_total          rows written with an error
  ngrammys_generation_tokens_total     tokens generated
  ngrammys_target_calls_total          verification steps of the target, per request
  ngrammys_accepted_draft_tokens_total draft tokens the target accepted
  ngrammys_engine_steps_total          engine steps (vLLM engine)
  ngrammys_engine_running_total        running requests summed over those steps
  ngrammys_engine_slot_steps_total     the engine's slots (max_num_seqs) summed over those steps
  ngrammys_engine_idle_seconds_total   seconds an engine waited with nothing to run, input remaining
  ngrammys_engine_restarts_total       engines that failed and were built again (or their actor restarted)
  ngrammys_speculation_switches_total  engines an actor built for another speculation mode

Every sample is tagged with the drafter that ran the batch ("none": plain decoding), so the
speculation mode each actor chose is in every counter (pipeline/engines/speculation.py).

Live occupancy: rate(..._engine_running_total) / rate(..._engine_slot_steps_total).
"""

from __future__ import annotations

COUNTERS = {
    "rows": ("ngrammys_rows_total", "Rows written, errored rows included"),
    "errored_rows": ("ngrammys_errored_rows_total", "Rows written with an error"),
    "generated_tokens": ("ngrammys_generation_tokens_total", "Tokens generated"),
    "target_calls": ("ngrammys_target_calls_total", "Verification steps of the target, counted per request"),
    "accepted_draft_tokens": ("ngrammys_accepted_draft_tokens_total", "Draft tokens the target accepted"),
}
ENGINE_COUNTERS = {
    "steps": ("ngrammys_engine_steps_total", "Engine steps"),
    "running": ("ngrammys_engine_running_total", "Running requests summed over the engine's steps"),
    "slot_steps": ("ngrammys_engine_slot_steps_total", "The engine's slots (max_num_seqs) summed over its steps"),
    "idle_seconds": ("ngrammys_engine_idle_seconds_total", "Seconds an engine waited with nothing to run"),
}
TAG_KEYS = ("engine", "drafter", "run_id")


class RunMetrics:
    """The counters of one stage actor (Ray aggregates the actors' samples per tag set)."""

    def __init__(self, engine: str, run_id: str):
        from ray.util.metrics import Counter

        self.drafter = ""  # the drafter of the last batch recorded
        self.counters = {}
        self.engine_counters = {}
        for counters, names in ((self.counters, COUNTERS), (self.engine_counters, ENGINE_COUNTERS)):
            for field, (name, description) in names.items():
                counter = Counter(name, description, tag_keys=TAG_KEYS)
                counter.set_default_tags({"engine": engine, "run_id": run_id})
                counters[field] = counter
        self.restarts = Counter(
            "ngrammys_engine_restarts_total", "Engines that failed and were built again", tag_keys=TAG_KEYS
        )
        self.switches = Counter(
            "ngrammys_speculation_switches_total", "Engines built for another speculation mode", tag_keys=TAG_KEYS
        )
        self.switches_seen = 0
        for counter in (self.restarts, self.switches):
            counter.set_default_tags({"engine": engine, "run_id": run_id})

    def engine_failed(self) -> None:
        self.restarts.inc(1, tags={"drafter": self.drafter})

    def record(self, counts: dict, steps=None, previous=None, drafter: str = "", switches: int = 0) -> None:
        """Adds one finished batch's counts (a dict with the COUNTERS' fields), run by `drafter`, and
        what the engine's steps did since the `previous` report (EngineSteps, pipeline/engines/base.py;
        None: not kept); `switches`: the actor's switches of speculation mode so far."""
        self.drafter, tags = drafter, {"drafter": drafter}
        for field, counter in self.counters.items():
            if counts[field] > 0:  # Ray counters refuse increments of 0
                counter.inc(counts[field], tags=tags)
        if switches > self.switches_seen:
            self.switches.inc(switches - self.switches_seen, tags=tags)
            self.switches_seen = switches
        if steps is None:
            return
        all_steps = steps.steps + steps.drain_steps - previous.steps - previous.drain_steps
        increments = {
            "steps": all_steps,
            "running": steps.running + steps.drain_running - previous.running - previous.drain_running,
            "slot_steps": all_steps * steps.slots,
            "idle_seconds": steps.idle_seconds - previous.idle_seconds,
        }
        for field, counter in self.engine_counters.items():
            if increments[field] > 0:
                counter.inc(increments[field], tags=tags)
