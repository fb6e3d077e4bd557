"""Options several subcommands share."""

from __future__ import annotations

import argparse

from pipeline.config import ModelConfig


def add_prompt_args(parser: argparse.ArgumentParser, limit: int = 40, max_new_tokens: int = 128) -> None:
    parser.add_argument(
        "--dataset",
        default="humaneval",
        help="humaneval, gsm8k, sharegpt, a corpus task (corpus-extract-json, corpus-rewrite-code, "
        "corpus-edit-text, corpus-summarize) or a JSONL file with a 'prompt' per line",
    )
    parser.add_argument("--limit", type=int, default=limit, help="prompts")
    parser.add_argument("--max-new-tokens", type=int, default=max_new_tokens)
    parser.add_argument("--model", default=ModelConfig().name)


def add_job_settings(parser: argparse.ArgumentParser) -> None:
    """--set SECTION.KEY=VALUE (repeated): a job setting for every run, as `python -m jobs.generate --set`."""
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="a job setting for every run (as python -m jobs.generate --set)",
    )


def add_sampling_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0, help="request i samples with a seed derived from it")


def numbers(text: str) -> list[float]:
    """A comma-separated list of numbers (--actor-hours 1,8)."""
    return [float(part) for part in text.split(",") if part.strip()]


def integers(text: str) -> list[int]:
    """A comma-separated list of integers (--batch 1,16)."""
    return [int(part) for part in text.split(",") if part.strip()]
