"""A run as values: where everything of it lives (RunPaths), what it will do, decided once at its
start (RunPlan), and what it did (RunSummary, written as summary.json).

    <output>/run=<id>/                         a lone run's Parquet files and summary.json
    <output>/series=<name>/run=<id>/           a series' runs
    <output>/_checkpoints/run=<id>/            a lone run's checkpoint (the ids written)
    <output>/_checkpoints/series=<name>/rows/  a series' checkpoint (the fingerprints written)
    <output>/_checkpoints/series=<name>/store/model=<digest>/   the series' store of earlier outputs
    <output>/_checkpoints/series=<name>/outputs/index.parquet  each id's latest output (series_index.py)
    <output>/_set_aside/<path under output>    output files that could not be read (output_files.py)
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass
from datetime import datetime, timezone

from ray.data.checkpoint import CheckpointConfig

from pipeline import storage
from pipeline.config import Config
from pipeline.job.output_files import SET_ASIDE
from pipeline.job.series import digest
from pipeline.llm.progress import peak_rss_mb


@dataclass(frozen=True)
class RunPaths:
    """Every path of a run and of its series, named as the store names them (a URI keeps its
    scheme, a local path is absolute)."""

    output: str
    run_id: str
    series: str = ""  # "" : a lone run
    model: str = ""  # the model's name: a series keeps one store per model

    @classmethod
    def of(cls, config: Config, run_id: str) -> RunPaths:
        return cls(storage.uri(config.job.output), run_id, config.job.series, config.model.name)

    @property
    def runs_root(self) -> str:
        """Where the run directories are: <output>/, or <output>/series=<name>/."""
        return storage.join(self.output, f"series={self.series}") if self.series else self.output

    @property
    def run_dir(self) -> str:
        return storage.join(self.runs_root, f"run={self.run_id}")

    @property
    def checkpoints(self) -> str:
        """A lone run's checkpoint (the ids it wrote), or its series' (the fingerprints all its runs wrote)."""
        root = storage.join(self.output, "_checkpoints")
        return (
            storage.join(root, f"series={self.series}", "rows")
            if self.series
            else storage.join(root, f"run={self.run_id}")
        )

    @property
    def store(self) -> str:
        """The series' store of earlier outputs (pipeline/job/series_store.py), one per model."""
        return storage.join(
            self.output, "_checkpoints", f"series={self.series}", "store", f"model={digest(self.model)}"
        )

    @property
    def outputs_index(self) -> str:
        """The series' kept index of each id's latest output (pipeline/job/series_index.py)."""
        return storage.join(self.output, "_checkpoints", f"series={self.series}", "outputs", "index.parquet")

    @property
    def earlier_outputs(self) -> str:
        """The outputs a run reads before it writes: its series' runs, or its own (a resumed run)."""
        return self.runs_root if self.series else self.run_dir

    @property
    def set_aside(self) -> str:
        return storage.join(self.output, SET_ASIDE)


@dataclass(frozen=True)
class Resolved:
    """What a run decides at its start beyond its config."""

    datastore: str = ""  # what the actors draft from: drafting.datastore (checked), or the series' store
    batch_size: int = 0  # the rows of an actor's batch: ray.batch_size, or auto's size for this run (0: not sized yet)


@dataclass(frozen=True)
class RunPlan:
    """What a run does, decided at its start: the rest of the job reads it."""

    config: Config  # as given (its datastore checked): what decides the rows' text and fingerprints
    paths: RunPaths
    fingerprint: str  # pipeline/job/series.settings_fingerprint of `config`
    checkpoint: CheckpointConfig  # what the read skips and the write records
    resolved: Resolved

    @property
    def actor_config(self) -> Config:
        """The config the actors run, derived here only: `config` with what the run resolved."""
        config, resolved = self.config, self.resolved
        decoder = dataclasses.replace(config.drafting, datastore=resolved.datastore)
        ray_settings = dataclasses.replace(config.ray, batch_size=resolved.batch_size or config.ray.batch_size)
        return dataclasses.replace(config, drafting=decoder, ray=ray_settings)


@dataclass(frozen=True)
class Reading:
    """What the run found before generating: the input's rows, those it reads, those not yet written."""

    input_rows: int
    rows_read: int
    new_rows: int
    set_aside: list  # earlier output files set aside (output_files.set_aside_unreadable)
    predicted: bool = False  # whether the input has a prediction column
    openai_batch: bool = False  # whether the input is an OpenAI Batch request file


@dataclass(frozen=True)
class RunSummary:
    """summary.json: whole-run counts from the run's files; this invocation's from the progress actor."""

    run_id: str
    run_dir: str
    series: str | None
    finished_at: str
    rows: int
    errored_rows: int
    generated_tokens: int
    # Per request step (num_target_calls), and per forward call of the target (a call shared by B
    # requests counted once; null where the engine does not report it).
    tokens_per_call: float | None  # the run's generated tokens per target call
    tokens_per_forward_call: float | None
    acceptance_rate: float | None  # over every checked draft token of the run (null: nothing drafted)
    # The rows' predictions drafted and accepted, and drafted and rejected (OpenAI's names).
    accepted_prediction_tokens: int
    rejected_prediction_tokens: int
    fingerprint: str  # what produced the rows (RunPlan.fingerprint)
    input_rows: int
    rows_read: int
    # From the job's start to the first batch's: reading, placing actors (an autoscaler bringing a
    # node up) and loading the model.
    seconds_to_first_batch: float | None
    series_store: dict | None  # the series' store after this run (pipeline/job/series_store.py)
    set_aside: list  # earlier output files that could not be read, moved aside (the file, where, why)
    rows_this_invocation: int
    rows_errored_this_invocation: int
    rows_skipped_already_done: int
    # A series: the run's rows regenerated because their input changed (drafted from their last
    # output), and those new to the series.
    changed_rows: int
    new_rows: int
    generated_tokens_this_invocation: int
    wall_seconds: float
    tokens_per_second: float | None
    # From the first batch's start to the last one's end: start-up (reading, actors loading the model) left out.
    tokens_per_second_after_startup: float | None
    rows_per_second_after_startup: float | None
    actor_nodes: list
    # The engines' slots kept busy (summed over actors; null where the engine keeps no count): mean
    # running requests per step over max_num_seqs while input remained, all steps, the seconds an
    # engine waited with nothing to run while input remained, and the final drain.
    engine_occupancy: float | None
    engine_steps: int | None
    engine_idle_seconds: float | None
    engine_drain_seconds: float | None
    # The step cost our proposer's draft budget measured, averaged over the engines: a step's
    # seconds, the seconds per token it feeds and their ratio (`EngineSteps.step_cost`).
    engine_step_cost: dict | None
    engine_series: list
    actor_peak_rss_mb: float | None  # the largest actor process's peak resident memory
    engine_restarts: dict  # engines that failed inside a live actor and were built again (or their actor restarted)
    # drafting.speculation, and each actor's mode: the drafter it runs ("none": plain), decided by the
    # rule, the setting or measurement, its measured windows (tokens per busy second) and its
    # switches with their drain and restart seconds (pipeline/engines/speculation.py).
    speculation: dict
    driver_peak_rss_mb: float
    settings: dict  # the actors' config's sections as run (RunPlan.actor_config)
    # An OpenAI Batch input's output and error files (pipeline/job/openai_batch.py), their requests;
    # null for other inputs.
    openai_batch: dict | None

    @classmethod
    def of(
        cls,
        plan: RunPlan,
        reading: Reading,
        after: dict,
        this_time: dict,
        wall: float,
        first_batch: float | None,
        series_store: dict | None,
        openai_batch: dict | None = None,
    ) -> RunSummary:
        """From the run's files' totals (`after`) and this invocation's (`this_time`, the progress actor's)."""
        return cls(
            run_id=plan.paths.run_id,
            run_dir=plan.paths.run_dir,
            series=plan.paths.series or None,
            finished_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            fingerprint=plan.fingerprint,
            input_rows=reading.input_rows,
            rows_read=reading.rows_read,
            seconds_to_first_batch=first_batch,
            series_store=series_store,
            set_aside=reading.set_aside,
            **run_counts(after),
            **invocation_counts(this_time, reading, wall),
            speculation={"setting": plan.config.drafting.speculation, "actors": this_time["speculation"]},
            driver_peak_rss_mb=round(peak_rss_mb(), 1),
            settings={section: asdict(getattr(plan.actor_config, section)) for section in SECTIONS},
            openai_batch=openai_batch,
        )

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def write(self) -> dict:
        """Writes summary.json in the run's directory (whole: a temporary name, then a move); returns it as a dict."""
        summary = self.as_dict()
        storage.write_text(
            storage.join(self.run_dir, "summary.json"), json.dumps(summary, indent=2, default=list) + "\n"
        )
        return summary


# The config's sections the summary records as run, and the engines' counts it takes from the progress actor.
SECTIONS = ("model", "engine", "vllm", "drafting", "sampling", "transformers", "input", "ray")
ENGINE_COUNTS = (
    "engine_occupancy",
    "engine_steps",
    "engine_idle_seconds",
    "engine_drain_seconds",
    "engine_step_cost",
    "engine_series",
    "actor_peak_rss_mb",
    "engine_restarts",
)


def run_counts(after: dict) -> dict:
    """The summary's whole-run fields, from the totals of the run's files."""
    return {
        "rows": after["rows"],
        "errored_rows": after["errored_rows"],
        "generated_tokens": after["generated_tokens"],
        "tokens_per_call": ratio(after["generated_tokens"], after["target_calls"], 4),
        "tokens_per_forward_call": ratio(after["generated_tokens"], after["forward_calls"], 4),
        "acceptance_rate": ratio(after["acceptance_probability_sum"], after["checked_draft_tokens"], 4),
        "accepted_prediction_tokens": after["accepted_prediction_tokens"],
        "rejected_prediction_tokens": after["rejected_prediction_tokens"],
        "changed_rows": after["changed_rows"],
        "new_rows": after["rows"] - after["changed_rows"],
    }


def invocation_counts(this_time: dict, reading: Reading, wall: float) -> dict:
    """The summary's fields of this invocation, from the progress actor's counts."""
    generated = this_time["generated_tokens"]
    generating = this_time["last_finish"] - this_time["first_start"] if this_time["batches"] else 0
    return {
        "rows_this_invocation": this_time["rows"],
        "rows_errored_this_invocation": this_time["errored_rows"],
        "rows_skipped_already_done": reading.rows_read - this_time["input_rows"],
        "generated_tokens_this_invocation": generated,
        "wall_seconds": round(wall, 3),
        "tokens_per_second": ratio(generated, wall, 3),
        "tokens_per_second_after_startup": ratio(generated, generating, 3),
        "rows_per_second_after_startup": ratio(this_time["rows"], generating, 3),
        "actor_nodes": this_time["nodes"],
        **{name: this_time[name] for name in ENGINE_COUNTS},
    }


def ratio(numerator: float, denominator: float, digits: int) -> float | None:
    return round(numerator / denominator, digits) if denominator else None
