"""How a corpus job went: acceptance plots and a summary from a pipeline run's Parquet.

    python -m jobs.report RUN_DIR [--out DIR]

RUN_DIR is a run's directory (<output>/run=<id>, holding its Parquet files), or an output
directory holding exactly one run; a local path or a URI (s3://, gs://, ...). Writes to DIR (default RUN_DIR/report): the paper's Figure 4 ablations
(accepted_length.png, accepted_rank.png, strategy_rows.png, strategy_wins.png) with one bar
group per decoder setting found in the run, tokens_per_call.png (its distribution over
requests), and report.json / report.md with the totals. Rows that errored are counted, not plotted.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

import pyarrow.fs as pafs

from pipeline import storage
from pipeline.plots import AcceptanceCounts, pyplot, save_acceptance_plots

COLUMNS = ("id", "error", "drafter", "k", "w", "auto_k", "auto_w", "verify", "num_generated_tokens",
           "num_target_calls", "num_verified_tokens", "tokens_per_call", "alpha", "total_seconds",
           "accepted_length_histogram", "accepted_rank_histogram", "strategy_rows", "strategy_wins")


class ReportError(ValueError):
    pass


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir")
    parser.add_argument("--out", type=Path, help="default: RUN_DIR/report")
    return parser.parse_args(argv)


def find_parts(run_dir: str) -> list[str]:
    """The run's Parquet files (run_dir, or the one run=* directory inside it)."""
    found = storage.info(run_dir, "RUN_DIR")
    if found.type != pafs.FileType.Directory:
        raise ReportError(f"{run_dir}: no such directory")
    filesystem, inner = storage.resolve(run_dir)
    entries = filesystem.get_file_info(pafs.FileSelector(inner))
    parts = sorted(e.path for e in entries if e.is_file and e.path.endswith(".parquet"))
    if parts:
        prefix = run_dir[:run_dir.find("://") + 3] if storage.is_uri(run_dir) else ""
        return [prefix + part for part in parts]
    runs = storage.list_directories(run_dir, "run=")
    if len(runs) == 1:
        return find_parts(storage.join(run_dir, runs[0]))
    if runs:
        raise ReportError(f"{run_dir} holds {len(runs)} runs ({', '.join(runs)}): pass one of them")
    raise ReportError(f"{run_dir}: no Parquet files (is it a run directory of python -m jobs.generate?)")


def read_rows(parts: list[str]) -> list[dict]:
    rows = []
    for part in parts:
        filesystem, inner = storage.resolve(part)
        schema = pq.read_schema(inner, filesystem=filesystem)
        columns = [name for name in COLUMNS if name in schema.names]  # runs written before a column existed
        rows += pq.read_table(inner, columns=columns, filesystem=filesystem).to_pylist()
    return rows


def setting_label(row: dict) -> str:
    k = "auto" if row.get("auto_k") else row.get("k")
    w = "auto" if row.get("auto_w") else row.get("w")
    tree = ", tree" if row.get("verify") == "tree" else ""
    return f"{row.get('drafter')} k={k} w={w}{tree}"


def totals(rows: list[dict]) -> dict:
    generated = sum(row["num_generated_tokens"] or 0 for row in rows)
    calls = sum(row["num_target_calls"] or 0 for row in rows)
    fed = sum(row.get("num_verified_tokens") or 0 for row in rows)
    alphas = [row["alpha"] for row in rows if row.get("alpha") is not None]
    return {"requests": len(rows), "generated_tokens": generated, "target_calls": calls,
            "tokens_per_call": round(generated / calls, 4) if calls else None,
            "verified_tokens_per_call": round(fed / calls, 3) if calls else None,
            "mean_request_alpha": round(float(np.mean(alphas)), 4) if alphas else None}


def save_tokens_per_call(groups: dict[str, list[dict]], path: Path) -> Path:
    plt = pyplot()
    figure, axes = plt.subplots(figsize=(5, 3.5))
    for label, rows in groups.items():
        values = [row["tokens_per_call"] for row in rows if row.get("tokens_per_call") is not None]
        axes.hist(values, bins=20, alpha=0.6, label=label)
    axes.set_xlabel("tokens per call (per request)")
    axes.set_ylabel("requests")
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def markdown(report: dict) -> str:
    lines = [f"# Run report: {report['run_dir']}", "",
             f"{report['rows']} rows, {report['errored_rows']} errored.", "",
             "| setting | requests | generated tokens | tokens/call | fed/call | mean α |", "|---|---|---|---|---|---|"]
    for label, total in report["settings"].items():
        lines.append(f"| {label} | {total['requests']} | {total['generated_tokens']} | {total['tokens_per_call']} | "
                     f"{total['verified_tokens_per_call']} | {total['mean_request_alpha']} |")
    lines += ["", *[f"![{path}]({path})" for path in report["plots"]]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    args = parse_args(argv)
    rows = read_rows(find_parts(args.run_dir))
    succeeded = [row for row in rows if row.get("error") is None]
    if not succeeded:
        raise ReportError(f"{args.run_dir}: none of its {len(rows)} rows succeeded; nothing to plot")
    groups: dict[str, list[dict]] = {}
    for row in succeeded:
        groups.setdefault(setting_label(row), []).append(row)
    if args.out is None and storage.is_uri(args.run_dir):
        raise ReportError(f"{args.run_dir} is not a local directory: give --out for the plots")
    out = args.out or Path(args.run_dir) / "report"
    paths = save_acceptance_plots({label: AcceptanceCounts.total(group) for label, group in groups.items()}, out)
    paths.append(save_tokens_per_call(groups, out / "tokens_per_call.png"))
    report = {"run_dir": str(args.run_dir), "rows": len(rows), "errored_rows": len(rows) - len(succeeded),
              "settings": {label: totals(group) for label, group in groups.items()},
              "plots": [path.name for path in paths]}
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "report.md").write_text(markdown(report))
    print(markdown(report))
    return report


if __name__ == "__main__":
    try:
        main()
    except ReportError as error:
        raise SystemExit(f"jobs.report: {error}")
