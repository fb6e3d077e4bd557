"""ngrammys retire: removes a series' old output files that hold no id's latest output, keeping its
newest runs whole (pipeline/job/series_retire.py); --dry-run says what it would remove. Run it between
the series' runs, not while one runs.

    ngrammys retire --output OUT --series NAME --keep-runs 30 [--dry-run]

It prints one JSON object: the runs, the runs kept whole, the files removed (or that would be), and
the older files kept because they hold some id's latest output.
"""

from __future__ import annotations

import argparse
import json
import logging

from pipeline import storage
from pipeline.job.run import RunPaths
from pipeline.job.series_retire import retire


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(prog="ngrammys retire", description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", required=True, help="the job's output (job.output), local or a URI")
    parser.add_argument("--series", required=True, help="the series (job.series)")
    parser.add_argument("--keep-runs", type=int, required=True, help="the newest runs kept whole (at least 1)")
    parser.add_argument("--dry-run", action="store_true", help="say what would be removed, remove nothing")
    args = parser.parse_args(argv)
    if args.keep_runs < 1:
        parser.error("--keep-runs must be at least 1 (the newest run is always kept)")
    paths = RunPaths(storage.uri(args.output), "", args.series)
    if storage.info(paths.runs_root, "--output").type.name == "NotFound":
        parser.error(f"--series {args.series!r}: no series under {args.output!r} ({paths.runs_root} does not exist)")
    result = retire(paths, args.keep_runs, args.dry_run).as_dict()
    print(json.dumps(result, indent=1))
    return result


def cli(argv=None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    main(argv)


if __name__ == "__main__":
    cli()
