"""Generates for a prompt dataset with the configured decoder and writes Parquet plus a summary.

    python -m jobs.generate --config configs/default.yaml [--set decoder.k=4 ...]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from pipeline.config import load_config
from pipeline.output import summarize, write_parquet, write_summary
from pipeline.prompts import load_prompts
from pipeline.stage import GenerationStage


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/default.yaml")
    parser.add_argument("--output", help="output directory (overrides job.output)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    config = load_config(args.config, args.overrides)
    output = Path(args.output or config.job.output)
    prompts = load_prompts(config.job.dataset, config.job.limit)
    stage = GenerationStage(config)
    started = time.perf_counter()
    batch = stage({"id": [p.request_id for p in prompts], "prompt": [p.prompt for p in prompts]})
    rows = [dict(zip(batch, values)) for values in zip(*batch.values())]
    wall = time.perf_counter() - started
    write_parquet(rows, output / "generations.parquet")
    summary = summarize(rows, wall, stage.settings)
    write_summary(summary, output / "summary.json")
    print(json.dumps(summary, indent=2))
    print(f"Parquet: {output / 'generations.parquet'}\nSummary: {output / 'summary.json'}")
    return summary


if __name__ == "__main__":
    main()
