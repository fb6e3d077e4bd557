"""Generates for a prompt corpus on Ray Data and writes Parquet plus a summary.

    python -m jobs.generate [--config FILE] [--input PATH] [--output DIR] \\
        [--run-id ID] [--set section.key=value ...] [--show-config]

Settings: pipeline/config/'s defaults (a module per section), then --config's file, then --set (and --input, --output,
--run-id). With no cluster it starts a local Ray; under `ray job submit`, or with RAY_ADDRESS set, it joins
that cluster. Outputs go under <output>/run=<run-id>/; re-running a run id resumes it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

if __name__ == "__main__":
    # Token authentication stays on: RAY_AUTH_MODE defaults to `token` (an explicit setting wins).
    # Ray reads it once, on import, so it is set before Ray is imported; only when the job runs,
    # not when another program imports this module.
    os.environ.setdefault("RAY_AUTH_MODE", "token")

import ray  # noqa: E402

from pipeline.config import ConfigError, load_config  # noqa: E402
from pipeline.engines.build import checked_config  # noqa: E402
from pipeline.job.ray_job import JobFailed, new_run_id, run_job  # noqa: E402
from pipeline.storage import StorageError  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--config",
        default=None,
        help="a YAML file of the settings it changes from the defaults (pipeline/config/)",
    )
    parser.add_argument("--input", help="input file, directory or glob (overrides input.path)")
    parser.add_argument("--output", help="output directory (overrides job.output)")
    parser.add_argument("--run-id", help="run to write or resume (overrides job.run_id)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument(
        "--show-config",
        action="store_true",
        help="print every setting this run would use (the defaults, the file, --set) as YAML and exit",
    )
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    overrides = list(args.overrides)
    for flag, key in ((args.input, "input.path"), (args.output, "job.output"), (args.run_id, "job.run_id")):
        if flag is not None:
            overrides.append(f"{key}={json.dumps(flag)}")  # JSON-quoted: read back as a string by YAML
    config = checked_config(load_config(args.config, overrides))  # what the engine cannot honour fails here
    if args.show_config:
        print(config_yaml(config), end="")
        return {}
    run_id = config.job.run_id or new_run_id()
    join_or_start_ray()
    summary = run_job(config, run_id)
    print(json.dumps(summary, indent=2, default=list))
    print(rows_line(summary, config.input.limit))
    print(f"Parquet: {summary['run_dir']}/*.parquet\nSummary: {summary['run_dir']}/summary.json")
    return summary


def config_yaml(config) -> str:
    """Every setting of `config` as YAML that load_config reads back to the same Config."""
    import yaml

    def plain(value):
        return list(value) if isinstance(value, tuple) else value

    sections = {
        name: {key: plain(value) for key, value in section.items()}
        for name, section in dataclasses.asdict(config).items()
    }
    for section, name in (("transformers", "k"), ("drafting", "w")):
        # `auto`, not the engine's limit: the file then reads right on either engine
        if sections[section].pop(f"auto_{name}"):
            sections[section][name] = "auto"
    return yaml.safe_dump(sections, sort_keys=False)


def join_or_start_ray() -> None:
    """Joins RAY_ADDRESS (set by `ray job submit`) if there is one, else starts a local Ray (which
    makes ~/.ray/auth_token if missing). A client that sends no token to a token cluster would
    wait forever; in token mode without a token it fails at once, and the error says what to run."""
    try:
        ray.init()
    except ray.exceptions.AuthenticationError as error:
        where = os.environ.get("RAY_ADDRESS") or "this machine"
        raise JobFailed(
            f"Ray token authentication is on and no token was found for the Ray at {where}. For a local "
            "head run `ray get-auth-token --generate` once (it writes ~/.ray/auth_token), then "
            "`RAY_AUTH_MODE=token ray start --head`; for a remote cluster set RAY_AUTH_TOKEN (or "
            "RAY_AUTH_TOKEN_PATH) to that cluster's token; for a cluster without token authentication set "
            f"RAY_AUTH_MODE=disabled. Ray said: {error}"
        ) from error


def rows_line(summary: dict, limit: int) -> str:
    """What happened to the input's rows, in words; a partial read says so."""
    read = f"Read {summary['rows_read']} of the input's {summary['input_rows']} rows"
    if summary["rows_read"] < summary["input_rows"]:
        read += f" (input.limit={limit}: {summary['input_rows'] - summary['rows_read']} rows NOT read)"
    generated = summary["rows_this_invocation"] - summary["rows_errored_this_invocation"]
    return (
        f"{read}: {generated} generated, {summary['rows_errored_this_invocation']} errored, "
        f"{summary['rows_skipped_already_done']} skipped as already done."
    )


def cli(argv=None) -> None:
    """The command line (`ngrammys generate`, `python -m jobs.generate`): a job that cannot run exits
    with its error in one line, not a traceback."""
    try:
        main(argv)
    except (ConfigError, JobFailed, StorageError) as error:
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    cli()
