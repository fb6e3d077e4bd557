"""grid: the N-Grammys paper's figures for one drafter on this machine.

    python -m lab grid [--drafter mixed] --dataset humaneval,gsm8k --plots DIR ...

sweeps DRAFTER:k:w over k in {1, 2, 4, 8, 16} and w in {1, 2, 4, 8} next to hf_greedy,
hf_prompt_lookup:10, plain and DRAFTER:auto:auto (quality mode, lab/quality.py), and
draws per dataset the paper's Figure 3 (tokens per call) and Figure 5 (wall-time speed-up) as
k x w heatmaps, and Figure 4's ablations (accepted-length distribution, rank of the winning row,
rows and wins per strategy) for the best fixed (k, w), auto and the largest (k, w).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lab import quality
from jobs.plots import AcceptanceCounts, save_acceptance_plots, save_heatmap

GRID_K, GRID_W = (1, 2, 4, 8, 16), (1, 2, 4, 8)


def add_cli_args(parser) -> None:
    quality.add_cli_args(parser)
    parser.set_defaults(methods="")  # the grid's own methods; --methods adds others
    parser.add_argument("--drafter", default="mixed", help="the drafter whose k x w grid is swept")
    parser.add_argument("--plots", default="", help="the figures' directory (default: plots/ beside --out)")


def run(args) -> dict:
    drafter = args.drafter
    grid = [
        "hf_prompt_lookup:10",
        "plain",
        f"{drafter}:auto:auto",
        *(f"{drafter}:{k}:{w}" for k in GRID_K for w in GRID_W),
    ]
    report = quality.run(args, grid)
    plots = Path(args.plots) if args.plots else Path(args.out).parent / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    for dataset in report["datasets"]:
        dataset["grid"] = grid_plots(dataset, drafter, plots)
    return report


def markdown(report: dict) -> str:
    lines = [quality.markdown(report), ""]
    lines += [f"{dataset['dataset']}: {dataset['grid']}" for dataset in report["datasets"]]
    return "\n".join(lines)


def grid_plots(report: dict, drafter: str, out: Path) -> dict:
    """Figures 3, 5 and 4 for one dataset's grid; returns the best fixed (k, w) and auto's numbers."""
    runs = {run["method"]: run for run in report["runs"]}
    reference = "hf_greedy" if "hf_greedy" in runs else "hf_sample"
    speedup = f"speedup_vs_{reference}"

    def table(key):
        return np.array([[runs[f"{drafter}:{k}:{w}"][key] or np.nan for w in GRID_W] for k in GRID_K])  # [K, W]

    name = report["dataset"].replace("/", "_")
    labels = ([str(k) for k in GRID_K], [str(w) for w in GRID_W])
    auto, plain = runs[f"{drafter}:auto:auto"], runs["plain"]
    save_heatmap(
        table("tokens_per_call"),
        *labels,
        out / f"{name}_tokens_per_call.png",
        f"{report['dataset']}: tokens per call, {drafter}\n(auto: {auto['tokens_per_call']:.2f})",
        fmt=".2f",
    )
    save_heatmap(
        table(speedup),
        *labels,
        out / f"{name}_speedup.png",
        f"{report['dataset']}: speed-up vs {reference}, {drafter}\n"
        f"(auto {auto[speedup]:.2f}, plain {plain[speedup]:.2f})",
        fmt=".2f",
    )
    best = max((runs[f"{drafter}:{k}:{w}"] for k in GRID_K for w in GRID_W), key=lambda run: run[speedup])
    largest = runs[f"{drafter}:{GRID_K[-1]}:{GRID_W[-1]}"]
    groups = {f"best fixed {best['k']}:{best['w']}": best, "auto": auto, f"{largest['k']}:{largest['w']}": largest}
    save_acceptance_plots({label: AcceptanceCounts.total([run]) for label, run in groups.items()}, out, f"{name}_")
    return {
        "best_fixed": best["method"],
        "best_fixed_speedup": best[speedup],
        "auto_speedup": auto[speedup],
        "plain_speedup": plain[speedup],
        "hf_prompt_lookup_speedup": runs["hf_prompt_lookup:10"][speedup],
        "auto_vs_best_fixed": round(auto[speedup] / best[speedup], 3),
        "auto_vs_plain": round(auto[speedup] / plain[speedup], 3),
        "auto_vs_hf_prompt_lookup": round(auto[speedup] / runs["hf_prompt_lookup:10"][speedup], 3),
    }
