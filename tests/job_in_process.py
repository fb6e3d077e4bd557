"""The job's three steps in this process, for tests: its preprocess, the stage with the job's
settings (pipeline/job/rows.py), its postprocess."""

from __future__ import annotations

import pyarrow as pa

from pipeline.job import rows as job_rows
from pipeline.config import Config
from pipeline.llm.row_values import rows_table
from pipeline.llm.stage import GenerationStage


def job_stage(config: Config) -> GenerationStage:
    """The stage as the job's actors build it (no progress actor, no metrics)."""
    return GenerationStage(config, job_rows.stage_settings(config))


def generate(stage: GenerationStage, batch: dict[str, list]) -> pa.Table:
    """A batch of job rows (columns of values) through the preprocess, the stage, the postprocess."""
    convert = job_rows.request_row(stage.config)
    rows = [dict(zip(batch, values)) for values in zip(*batch.values())]
    return job_rows.output_table(stage(rows_table([{**row, **convert(row)} for row in rows])))
