"""Retiring a series' old runs: a nightly series writes a run a night, and most of an old run's rows
are superseded by newer outputs of the same ids.

The policy keeps the newest `keep_runs` runs whole and, of the older ones, removes each output file
that holds no id's latest output (its newest row that is no error row, or its newest row where that
is an error row: the series' kept index, pipeline/job/series_index.py, says which). A row that is
its id's latest is never removed, whatever its age, nor is a file the index could not read. A run's
order is the time its newest file was written; its summary.json stays (the series' report reads it).
A dry run says what it would remove. Retire between a series' runs, not while one runs: a running
run reads last outputs from the files its index named when it started.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field

import pyarrow.compute as pc

from pipeline import storage
from pipeline.job import series_index
from pipeline.job.run import RunPaths
from pipeline.job.series import output_files

logger = logging.getLogger(__name__)


@dataclass
class Retirement:
    """What a retirement removes (or would, in a dry run) and what it keeps."""

    runs: int  # the series' runs with output files
    kept_runs: list[str]  # the newest keep_runs runs, kept whole
    removed: list[str] = field(default_factory=list)  # files under the runs root
    kept_for_latest: list[str] = field(default_factory=list)  # older runs' files that hold an id's latest
    dry_run: bool = False

    def as_dict(self) -> dict:
        return {
            "runs": self.runs,
            "kept_runs": self.kept_runs,
            "would_remove" if self.dry_run else "removed": self.removed,
            "kept_for_latest": self.kept_for_latest,
        }


def run_of(name: str) -> str:
    """The run a file under the runs root belongs to: 'run=<id>/part.parquet' -> '<id>'."""
    return name.split("/", 1)[0].removeprefix("run=")


def retire(paths: RunPaths, keep_runs: int, dry_run: bool = False) -> Retirement:
    """Retires the series' runs older than its newest `keep_runs` (the module's docstring)."""
    if keep_runs < 1:
        raise ValueError(f"keep_runs must be at least 1 (the newest run is always kept), got {keep_runs}")
    runs_root = paths.runs_root
    written = output_files(runs_root)
    index = series_index.updated(runs_root, paths.outputs_index, written)
    covered = series_index.load(paths.outputs_index)[1]  # a file it could not read is kept
    inner = storage.resolve(runs_root)[1]
    files = {series_index.relative(path, inner): when for path, when in written.items()}
    by_run: dict[str, list[str]] = defaultdict(list)
    for name in files:
        by_run[run_of(name)].append(name)
    newest_first = sorted(by_run, key=lambda run: max(files[name] for name in by_run[run]), reverse=True)
    held = set(pc.unique(index["file"].cast("string")).to_pylist()) | (set(files) - set(covered))
    plan = Retirement(len(by_run), newest_first[:keep_runs], dry_run=dry_run)
    for run in newest_first[keep_runs:]:
        for name in sorted(by_run[run]):
            (plan.kept_for_latest if name in held else plan.removed).append(name)
    if not dry_run and plan.removed:
        filesystem, _ = storage.resolve(runs_root)
        for name in plan.removed:
            filesystem.delete_file(f"{inner}/{name}")
        remaining = {
            path: when for path, when in written.items() if series_index.relative(path, inner) not in plan.removed
        }
        series_index.updated(runs_root, paths.outputs_index, remaining)  # the index no longer covers them
        logger.info("retired %d output files of %d runs", len(plan.removed), len(newest_first) - keep_runs)
    return plan
