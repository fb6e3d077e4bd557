"""The job as users run it, for the benchmarks that measure it end to end (series-edits,
speculation): `python -m jobs.generate` in a process of its own, with a Ray of its own, its rows
read back by id."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def job_command(input_path: Path, output: Path, run_id: str, overrides: list[str]) -> list[str]:
    """`python -m jobs.generate` as a user types it, each override one --set."""
    command = [
        sys.executable,
        "-m",
        "jobs.generate",
        "--input",
        str(input_path),
        "--output",
        str(output),
        "--run-id",
        run_id,
    ]
    for override in overrides:
        command += ["--set", override]
    return command


def run_job(command: list[str], logs: Path, timeout: float) -> dict:
    """Runs one job in a process of its own, with a Ray of its own (a new RAY_TMPDIR; RAY_ADDRESS
    unset); returns its summary.json. Its stdout and stderr are kept in `logs`.*; a failed run
    raises with the end of its stderr."""
    ray_tmp = tempfile.mkdtemp(prefix="ngr-se-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    env.update(RAY_TMPDIR=ray_tmp, PYTHONUNBUFFERED="1")
    logs.parent.mkdir(parents=True, exist_ok=True)
    stdout, stderr = logs.with_suffix(".stdout"), logs.with_suffix(".stderr")
    try:
        with open(stdout, "wb") as out, open(stderr, "wb") as err:
            done = subprocess.run(command, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env, timeout=timeout)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    if done.returncode != 0:
        raise RuntimeError(
            f"exit status {done.returncode}: {' '.join(command)}\n{stderr.read_text(errors='replace')[-3000:]}"
        )
    return json.loads(Path(summary_path(stdout.read_text())).read_text())


def summary_path(stdout: str) -> str:
    """The summary.json a job's output names (its line `Summary: PATH`)."""
    lines = [line for line in stdout.splitlines() if line.startswith("Summary: ")]
    if not lines:
        raise RuntimeError("the job printed no `Summary: PATH` line")
    return lines[-1].removeprefix("Summary: ").strip()


def generated_by_id(run_dir: str) -> dict[str, list[int]]:
    """Each row's generated tokens, by id (a row's sample i > 0 of sampling.n by "id#i"), from the run's Parquet
    files."""
    import pyarrow.parquet as pq

    found = {}
    for path in sorted(Path(run_dir).glob("*.parquet")):
        table = pq.read_table(path, columns=["id", "sample_index", "generated_tokens"])
        keys = [
            f"{key}#{sample}" if sample else str(key)
            for key, sample in zip(table["id"].to_pylist(), table["sample_index"].to_pylist())
        ]
        found.update(zip(keys, table["generated_tokens"].to_pylist()))
    return found
