"""Generates for a prompt corpus on Ray Data and writes Parquet plus a summary.

    python -m jobs.generate --config configs/default.yaml [--input PATH] [--output DIR] \\
        [--run-id ID] [--set section.key=value ...]

With no cluster it starts a local Ray; under `ray job submit`, or with RAY_ADDRESS set, it joins
that cluster. Outputs go under <output>/run=<run-id>/; re-running a run id resumes it.
"""
from __future__ import annotations

import argparse
import json
import sys

import ray

from pipeline.config import ConfigError, load_config
from pipeline.ray_job import JobFailed, new_run_id, run_job


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/default.yaml")
    parser.add_argument("--input", help="input file, directory or glob (overrides input.path)")
    parser.add_argument("--output", help="output directory (overrides job.output)")
    parser.add_argument("--run-id", help="run to write or resume (overrides job.run_id)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    overrides = list(args.overrides)
    for flag, key in ((args.input, "input.path"), (args.output, "job.output"), (args.run_id, "job.run_id")):
        if flag is not None:
            overrides.append(f"{key}={json.dumps(flag)}")  # JSON-quoted: read back as a string by YAML
    config = load_config(args.config, overrides)
    run_id = config.job.run_id or new_run_id()
    ray.init()  # joins RAY_ADDRESS (set by `ray job submit`) if there is one, else starts a local Ray
    summary = run_job(config, run_id)
    print(json.dumps(summary, indent=2, default=list))
    run_dir = f"{config.job.output}/run={run_id}"
    print(f"Parquet: {run_dir}/part-*.parquet\nSummary: {run_dir}/summary.json")
    return summary


if __name__ == "__main__":
    try:
        main()
    except (ConfigError, JobFailed) as error:
        sys.exit(f"error: {error}")
