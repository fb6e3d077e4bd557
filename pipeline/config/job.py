"""The `job` section: where a run writes, what it is called, when it fails, and its series."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.config.typed import require as _require


@dataclass(frozen=True)
class JobConfig:
    # Outputs go under <output>/run=<run_id>/; re-running a run id skips ids already written.
    output: str = "outputs"
    # "" starts a new run named after the current UTC time.
    run_id: str = ""
    # The job fails once more rows than this have failed; -1 never fails for row errors.
    max_errored_rows: int = -1
    # A named series of runs (a nightly job over a growing corpus): its runs write under
    # <output>/series=<name>/run=<run_id>/, and a run generates only the ids no earlier run of the
    # series generated unchanged (pipeline/job/series.py, by row fingerprint); "" : a lone run.
    series: str = ""
    # The most tokens a series' store of earlier outputs holds (pipeline/job/series_store.py): one
    # output per id, the newest kept when full. 2**26 tokens: 256 MiB of tokens and as much suffix array.
    store_tokens: int = 1 << 26

    def __post_init__(self):
        _require(bool(self.output), "job.output", "a directory path")
        _require(
            "/" not in self.series and ".." not in self.series and "=" not in self.series,
            "job.series",
            "a name without '/', '..' or '='",
        )
        _require(self.max_errored_rows >= -1, "job.max_errored_rows", "-1 (never fail) or an integer >= 0")
        _require("/" not in self.run_id and ".." not in self.run_id, "job.run_id", "a name without '/' or '..'")
        _require(1 <= self.store_tokens < 1 << 31, "job.store_tokens", "an integer from 1 to 2**31 - 1")
