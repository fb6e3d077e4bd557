"""Live metrics of a run, exported by its actors through Ray's metrics (`ray.util.metrics`), so
Ray's dashboard, and any Prometheus that scrapes Ray's metrics endpoint, show a run's speed and
acceptance while it goes on. Counters, named like vLLM's (`vllm:generation_tokens_total`) with
our prefix; Ray exports each with its own `ray_` prefix (`ray_ngrammys_generation_tokens_total`).
Every sample is tagged with the run's engine, drafter and run id.

  ngrammys_rows_total                  rows written (errored rows included)
  ngrammys_errored_rows_total          rows written with an error
  ngrammys_generation_tokens_total     tokens generated
  ngrammys_target_calls_total          verification steps of the target, per request
  ngrammys_accepted_draft_tokens_total draft tokens the target accepted
"""
from __future__ import annotations

COUNTERS = {
    "rows": ("ngrammys_rows_total", "Rows written, errored rows included"),
    "errored_rows": ("ngrammys_errored_rows_total", "Rows written with an error"),
    "generated_tokens": ("ngrammys_generation_tokens_total", "Tokens generated"),
    "target_calls": ("ngrammys_target_calls_total", "Verification steps of the target, counted per request"),
    "accepted_draft_tokens": ("ngrammys_accepted_draft_tokens_total", "Draft tokens the target accepted"),
}
TAG_KEYS = ("engine", "drafter", "run_id")


class RunMetrics:
    """The counters of one stage actor (Ray aggregates the actors' samples per tag set)."""

    def __init__(self, engine: str, drafter: str, run_id: str):
        from ray.util.metrics import Counter

        self.counters = {}
        for field, (name, description) in COUNTERS.items():
            counter = Counter(name, description, tag_keys=TAG_KEYS)
            counter.set_default_tags({"engine": engine, "drafter": drafter, "run_id": run_id})
            self.counters[field] = counter

    def record(self, counts: dict) -> None:
        """Adds one finished batch's counts (a dict with the COUNTERS' fields)."""
        for field, counter in self.counters.items():
            if counts[field] > 0:  # Ray counters refuse increments of 0
                counter.inc(counts[field])
