"""PNG plots (matplotlib, headless) shared by jobs.plot_costs, jobs.benchmark --grid and jobs.report.

Acceptance counts are the RequestStats columns summed over requests:
accepted_length_histogram (steps by draft tokens accepted), accepted_rank_histogram (won steps by
the rank of the winning row), strategy_rows (rows verified per strategy) and strategy_wins.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Iterable

import numpy as np


def pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: jobs run headless
    import matplotlib.pyplot as plt

    return plt


def save_heatmap(
    table: np.ndarray,
    row_labels: list[str],
    column_labels: list[str],
    path: Path,
    title: str,
    xlabel: str = "w (draft tokens per row)",
    ylabel: str = "k (draft rows)",
    fmt: str = ".1f",
) -> Path:
    """table: [rows, columns]; NaN cells (not measured) are left blank."""
    plt = pyplot()
    figure, axes = plt.subplots(figsize=(5, 4))
    image = axes.imshow(np.ma.masked_invalid(table), origin="lower", cmap="viridis")
    axes.set_xticks(range(len(column_labels)), column_labels)
    axes.set_yticks(range(len(row_labels)), row_labels)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    for i in range(table.shape[0]):
        for j in range(table.shape[1]):
            if np.isfinite(table[i, j]):
                axes.text(j, i, format(table[i, j], fmt), ha="center", va="center", color="white", fontsize=8)
    axes.set_title(title, fontsize=10)
    figure.colorbar(image, ax=axes)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


@dataclass
class AcceptanceCounts:
    accepted_length_histogram: list[int] = field(default_factory=list)
    accepted_rank_histogram: list[int] = field(default_factory=list)
    strategy_rows: dict[str, int] = field(default_factory=dict)
    strategy_wins: dict[str, int] = field(default_factory=dict)

    def add(self, row) -> None:
        """Adds one request's counts (a RequestStats, or an output row as a dict; maps may arrive
        from Parquet as lists of (key, value) pairs)."""
        get = row.get if isinstance(row, dict) else lambda name: getattr(row, name)
        _add_list(self.accepted_length_histogram, get("accepted_length_histogram") or [])
        _add_list(self.accepted_rank_histogram, get("accepted_rank_histogram") or [])
        for name in ("strategy_rows", "strategy_wins"):
            counts = getattr(self, name)
            for key, value in _pairs(get(name)):
                counts[key] = counts.get(key, 0) + value

    @classmethod
    def total(cls, rows: Iterable) -> AcceptanceCounts:
        counts = cls()
        for row in rows:
            counts.add(row)
        return counts


def _add_list(total: list[int], values: list[int]) -> None:
    total.extend([0] * (len(values) - len(total)))
    for index, value in enumerate(values):
        total[index] += value


def _pairs(counts) -> list[tuple[str, int]]:
    if not counts:
        return []
    return list(counts.items()) if isinstance(counts, dict) else [tuple(pair) for pair in counts]


def save_acceptance_plots(groups: dict[str, AcceptanceCounts], out: Path, prefix: str = "") -> list[Path]:
    """The paper's Figure 4 ablations, one bar group per label: accepted-length distribution, rank
    of the winning row, and rows verified / steps won per strategy."""
    plt = pyplot()
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    panels = (
        (
            "accepted_length",
            "draft tokens accepted in a step",
            "fraction of steps",
            lambda c: dict(enumerate(c.accepted_length_histogram)),
        ),
        (
            "accepted_rank",
            "rank of the winning row",
            "fraction of won steps",
            lambda c: dict(enumerate(c.accepted_rank_histogram)),
        ),
        ("strategy_rows", "strategy", "fraction of rows verified", lambda c: c.strategy_rows),
        ("strategy_wins", "strategy", "fraction of won steps", lambda c: c.strategy_wins),
    )
    for name, xlabel, ylabel, select in panels:
        series = {label: select(counts) for label, counts in groups.items()}
        keys = sorted({key for values in series.values() for key in values}, key=lambda key: (str(type(key)), key))
        figure, axes = plt.subplots(figsize=(min(9, max(5, 0.4 * len(keys) * max(1, len(series)) ** 0.5)), 3.5))
        width = 0.8 / max(len(series), 1)
        for index, (label, values) in enumerate(series.items()):
            total = sum(values.values()) or 1
            axes.bar(
                np.arange(len(keys)) + index * width, [values.get(key, 0) / total for key in keys], width, label=label
            )
        axes.set_xticks(np.arange(len(keys)) + width * (len(series) - 1) / 2, [str(key) for key in keys])
        axes.set_xlabel(xlabel)
        axes.set_ylabel(ylabel)
        if len(series) > 1:
            axes.legend(fontsize=7)
        figure.tight_layout()
        paths.append(out / f"{prefix}{name}.png")
        figure.savefig(paths[-1], dpi=120)
        plt.close(figure)
    return paths


def save_calibration_plot(series: dict[str, list[dict]], path: Path, title: str) -> Path:
    """Predicted against observed acceptance by draft depth (jobs.benchmark --replay's calibration
    rows: depth, predicted_model, predicted_calibrated, observed), one panel per series."""
    plt = pyplot()
    columns = min(4, len(series))
    lines = -(-len(series) // columns)
    figure, panels = plt.subplots(lines, columns, figsize=(4.2 * columns, 3.4 * lines), squeeze=False)
    for axes in panels.flat[len(series) :]:
        axes.set_visible(False)
    for axes, (label, rows) in zip(panels.flat, series.items()):
        depth = [r["depth"] for r in rows]
        axes.plot(depth, [r["observed"] for r in rows], "o-", color="black", label="observed")
        axes.plot(depth, [r["predicted_calibrated"] for r in rows], "s--", label="predicted (calibrated: the budget's)")
        axes.plot(depth, [r["predicted_model"] for r in rows], "^:", label="predicted (drafter's model)")
        axes.set_ylim(0, 1)
        axes.set_xlabel("draft depth j (first j tokens accepted)")
        axes.set_title(label, fontsize=9)
    for line in panels:
        line[0].set_ylabel("P(first j draft tokens accepted)")
    panels[0][0].legend(fontsize=7)
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
