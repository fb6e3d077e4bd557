"""Reading a run's outputs back in tests: every Parquet file in the run's directory."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def run_files(run_dir: Path) -> list[Path]:
    return sorted(Path(run_dir).glob("*.parquet"))


def read_run(run_dir: Path) -> list[dict]:
    files = run_files(run_dir)
    return pa.concat_tables([pq.read_table(path) for path in files]).to_pylist() if files else []
