"""How a corpus job went: acceptance plots and a summary from a pipeline run's Parquet.

    python -m jobs.report RUN_DIR [--out DIR]

RUN_DIR is a run's directory (<output>/run=<id>, holding its Parquet files), or an output
directory holding exactly one run; a local path or a URI (s3://, gs://, ...). A series'
directory (<output>/series=<name>) gives the series' history instead: one point per run of
rows generated, skipped as done and errored, tokens/s, tokens per call and acceptance, from each
run's summary.json (series.png, series.json, series.md). Writes to DIR (default RUN_DIR/report): the paper's Figure 4
ablations
(accepted_length.png, accepted_rank.png, strategy_rows.png, strategy_wins.png) with one bar
group per decoder setting found in the run, tokens_per_call.png (its distribution over
requests), occupancy.png (the engines' occupancy), speculation.png (each actor's speculation mode and
its measured windows, where it measured any), and report.json / report.md with the totals. Rows that
errored are counted, not plotted.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from jobs.plots import AcceptanceCounts, pyplot, save_acceptance_plots
from pipeline import storage
from pipeline.job.output_files import readable_columns

COLUMNS = (
    "id",
    "error",
    "drafter",
    "k",
    "w",
    "auto_k",
    "auto_w",
    "verify",
    "num_generated_tokens",
    "num_target_calls",
    "num_verified_tokens",
    "tokens_per_call",
    "acceptance_rate",
    "accepted_length_histogram",
    "accepted_rank_histogram",
    "strategy_rows",
    "strategy_wins",
)


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
    parts = [path for path in storage.list_files(run_dir) if path.endswith(".parquet")]
    if parts:
        return parts
    runs = storage.list_directories(run_dir, "run=")
    if len(runs) == 1:
        return find_parts(storage.join(run_dir, runs[0]))
    if runs:
        raise ReportError(f"{run_dir} holds {len(runs)} runs ({', '.join(runs)}): pass one of them")
    raise ReportError(f"{run_dir}: no Parquet files (is it a run directory of python -m jobs.generate?)")


def read_rows(parts: list[str]) -> tuple[list[dict], list[str]]:
    """The rows of the files `parts`, and the files that cannot be read (named in the report)."""
    rows, unreadable = [], []
    for part in parts:
        filesystem, inner = storage.resolve(part)
        try:
            schema = pq.read_schema(inner, filesystem=filesystem)
        except (OSError, ValueError):
            unreadable.append(part)
            continue
        columns = [name for name in COLUMNS if name in schema.names]  # runs written before a column existed
        table = readable_columns(filesystem, inner, columns)
        if table is None:
            unreadable.append(part)
            continue
        rows += table.to_pylist()
    return rows, unreadable


def setting_label(row: dict) -> str:
    k = "auto" if row.get("auto_k") else row.get("k")
    w = "auto" if row.get("auto_w") else row.get("w")
    tree = ", tree" if row.get("verify") == "tree" else ""
    return f"{row.get('drafter')} k={k} w={w}{tree}"


def totals(rows: list[dict]) -> dict:
    generated = sum(row["num_generated_tokens"] or 0 for row in rows)
    calls = sum(row["num_target_calls"] or 0 for row in rows)
    fed = sum(row.get("num_verified_tokens") or 0 for row in rows)
    rates = [row["acceptance_rate"] for row in rows if row.get("acceptance_rate") is not None]
    return {
        "requests": len(rows),
        "generated_tokens": generated,
        "target_calls": calls,
        "tokens_per_call": round(generated / calls, 4) if calls else None,
        "verified_tokens_per_call": round(fed / calls, 3) if calls else None,
        "mean_row_acceptance_rate": round(float(np.mean(rates)), 4) if rates else None,
    }


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


def save_occupancy(summary: dict, path: Path) -> Path | None:
    """The engines' occupancy over the run (summary.json's engine_series): the mean running
    requests per step over the slots so far, after each batch; None when the engine keeps no count."""
    series = [(seconds, value) for seconds, value in summary.get("engine_series") or [] if value is not None]
    if not series:
        return None
    plt = pyplot()
    figure, axes = plt.subplots(figsize=(5, 3.5))
    axes.plot(*zip(*series), marker=".")
    axes.set_ylim(0, 1.05)
    axes.set_xlabel("seconds since the first batch started")
    axes.set_ylabel("engine occupancy so far")
    axes.set_title(
        f"occupancy {summary.get('engine_occupancy')}, drain {summary.get('engine_drain_seconds')} s", fontsize=9
    )
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def save_speculation(summary: dict, path: Path) -> Path | None:
    """Each actor's speculation mode over its busy seconds (summary.json's speculation): every
    measured window a segment at its tokens per second, coloured by the mode that ran it ("none":
    plain), and a dotted line where the actor switched; None when no actor measured a window."""
    actors = (summary.get("speculation") or {}).get("actors") or {}
    if not any(report["windows"] for report in actors.values()):
        return None
    plt = pyplot()
    figure, axes = plt.subplots(figsize=(6, 3.5))
    colours: dict[str, str] = {}
    for number, report in enumerate(actors.values()):
        for window in report["windows"]:
            colour = colours.setdefault(mode_of(window), f"C{len(colours)}")
            start = window["at_busy_seconds"]
            axes.plot(
                [start, start + window["seconds"]],
                [window["tokens_per_second"]] * 2,
                color=colour,
                linewidth=3,
                label=mode_of(window) if mode_of(window) not in axes.get_legend_handles_labels()[1] else None,
            )
        for switch in report["switches"]:
            axes.axvline(switch["at_busy_seconds"], color=f"C{number}", linestyle=":", linewidth=1)
    axes.set_xlabel("an actor's busy seconds (dotted: it switched mode)")
    axes.set_ylabel("tokens/s in the window")
    axes.legend(fontsize=7, title="mode", title_fontsize=7)
    modes = ", ".join(f"{mode_of(r)} ({r['decided_by']})" for r in actors.values())
    axes.set_title(f"speculation {summary['speculation']['setting']}: {modes}", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def run_summary(run_dir: str) -> dict:
    """The run's summary.json ({} for a directory without one)."""
    text = storage.read_text(storage.join(run_dir, "summary.json"))
    return json.loads(text) if text else {}


def markdown(report: dict) -> str:
    lines = [
        f"# Run report: {report['run_dir']}",
        "",
        f"{report['rows']} rows, {report['errored_rows']} errored.",
        "",
        *[f"Left out, not readable: {path}" for path in report["unreadable_files"]],
        "| setting | requests | generated tokens | tokens/call | fed/call | mean acceptance rate |",
        "|---|---|---|---|---|---|",
    ]
    for label, total in report["settings"].items():
        lines.append(
            f"| {label} | {total['requests']} | {total['generated_tokens']} | {total['tokens_per_call']} | "
            f"{total['verified_tokens_per_call']} | {total['mean_row_acceptance_rate']} |"
        )
    if report["speculation"]:
        lines += [
            "",
            "| actor | mode now | decided by | switches | restart s | windows: mode tokens/s |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['actor']} | {r['mode']} | {r['decided_by']} | {r['switches']} | {r['restart_seconds']} | "
            f"{r['windows']} |"
            for r in report["speculation"]
        ]
    lines += ["", *[f"![{path}]({path})" for path in report["plots"]]]
    return "\n".join(lines) + "\n"


def mode_of(entry: dict) -> str:
    """An actor's or a window's mode in summary.json (`drafter` in runs written before it was `mode`)."""
    return entry["mode"] if "mode" in entry else entry["drafter"]


def speculation_rows(summary: dict) -> list[dict]:
    """A line per actor of summary.json's speculation: its mode now, why, and its windows."""
    actors = (summary.get("speculation") or {}).get("actors") or {}
    return [
        {
            "actor": actor[:12],
            "mode": mode_of(r),
            "decided_by": r["decided_by"],
            "switches": len(r["switches"]),
            "restart_seconds": r["restart_seconds"],
            "windows": ", ".join(f"{mode_of(w)} {w['tokens_per_second']}" for w in r["windows"][-6:]),
        }
        for actor, r in actors.items()
    ]


SERIES_PANELS = (
    ("rows_this_invocation", "rows generated"),
    ("rows_skipped_already_done", "rows skipped (done)"),
    ("errored_rows", "errored rows"),
    ("tokens_per_second_after_startup", "tokens/s after start-up"),
    ("tokens_per_call", "tokens per call"),
    ("acceptance_rate", "acceptance rate"),
)


def series_history(series_dir: str) -> list[dict]:
    """Every finished run's summary, oldest first."""
    summaries = []
    for run in storage.list_directories(series_dir, "run="):
        text = storage.read_text(storage.join(series_dir, run, "summary.json"))
        if text is not None:
            summaries.append(json.loads(text))
    if not summaries:
        raise ReportError(f"{series_dir}: no finished run (no run=*/summary.json)")
    return sorted(summaries, key=lambda summary: summary.get("finished_at") or summary["run_id"])


def series_report(series_dir: str, out: Path) -> dict:
    history = series_history(series_dir)
    plt = pyplot()
    figure, axes = plt.subplots(2, 3, figsize=(12, 6), sharex=True)
    runs = [summary["run_id"] for summary in history]
    for axis, (field, title) in zip(axes.flat, SERIES_PANELS):
        axis.plot(
            range(len(runs)),
            [summary.get(field) if summary.get(field) is not None else np.nan for summary in history],
            marker="o",
        )
        axis.set_title(title, fontsize=9)
        axis.set_xticks(range(len(runs)), runs, rotation=45, ha="right", fontsize=6)
    figure.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    figure.savefig(out / "series.png", dpi=120)
    plt.close(figure)
    table = [
        {
            "run_id": s["run_id"],
            "fingerprint": s.get("fingerprint"),
            "wall_seconds": s.get("wall_seconds"),
            **{field: s.get(field) for field, _ in SERIES_PANELS},
        }
        for s in history
    ]
    (out / "series.json").write_text(json.dumps(table, indent=2) + "\n")
    header = ["run_id", "fingerprint", "wall_seconds", *(field for field, _ in SERIES_PANELS)]
    lines = [f"# Series: {series_dir}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(row[name]) for name in header) + " |" for row in table]
    (out / "series.md").write_text("\n".join(lines + ["", "![series](series.png)"]) + "\n")
    print("\n".join(lines))
    return {"series_dir": series_dir, "runs": table, "plots": ["series.png"]}


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.out is None and storage.is_uri(args.run_dir):
        raise ReportError(f"{args.run_dir} is not a local directory: give --out for the plots")
    if args.run_dir.rstrip("/").rsplit("/", 1)[-1].startswith("series="):
        return series_report(args.run_dir, args.out or Path(args.run_dir) / "report")
    rows, unreadable = read_rows(find_parts(args.run_dir))
    succeeded = [row for row in rows if row.get("error") is None]
    if not succeeded:
        raise ReportError(f"{args.run_dir}: none of its {len(rows)} rows succeeded; nothing to plot")
    groups: dict[str, list[dict]] = {}
    for row in succeeded:
        groups.setdefault(setting_label(row), []).append(row)
    out = args.out or Path(args.run_dir) / "report"
    paths = save_acceptance_plots({label: AcceptanceCounts.total(group) for label, group in groups.items()}, out)
    paths.append(save_tokens_per_call(groups, out / "tokens_per_call.png"))
    summary = run_summary(args.run_dir)
    paths += [
        path
        for path in (save_occupancy(summary, out / "occupancy.png"), save_speculation(summary, out / "speculation.png"))
        if path is not None
    ]
    report = {
        "run_dir": str(args.run_dir),
        "rows": len(rows),
        "errored_rows": len(rows) - len(succeeded),
        "unreadable_files": unreadable,
        "speculation": speculation_rows(summary),
        "settings": {label: totals(group) for label, group in groups.items()},
        "plots": [path.name for path in paths],
    }
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "report.md").write_text(markdown(report))
    print(markdown(report))
    return report


def cli(argv=None) -> None:
    try:
        main(argv)
    except ReportError as error:
        raise SystemExit(f"jobs.report: {error}") from None


if __name__ == "__main__":
    cli()
