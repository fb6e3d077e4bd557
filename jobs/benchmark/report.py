"""The one report writer of the benchmark's subcommands: the report as JSON, and its markdown
table beside it (the same path with .md), printed too."""

from __future__ import annotations

import json
from pathlib import Path


def write(report: dict, out: str, table: str) -> dict:
    """Writes `report` to `out` (JSON) and `table` to `out` with .md; returns the report."""
    path = Path(out)
    if path.parent != Path("."):
        path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    path.with_suffix(".md").write_text(table + "\n")
    print(table)
    return report


def markdown_table(rows: list[dict], columns: dict[str, str] | list[str] | None = None) -> str:
    """Rows as a markdown table: `columns` names the keys shown (a dict: each key's header), by
    default every key; a missing value shows as "-", a float with four significant digits, nested
    values as JSON."""
    columns = columns or list(dict.fromkeys(key for row in rows for key in row))
    headers = columns if isinstance(columns, dict) else {key: key for key in columns}

    def rounded(value):
        if isinstance(value, float):
            return float(f"{value:.4g}")
        if isinstance(value, (list, tuple)):
            return [rounded(item) for item in value]
        return {key: rounded(item) for key, item in value.items()} if isinstance(value, dict) else value

    def cell(value) -> str:
        if value is None:
            return "-"
        value = rounded(value)
        return json.dumps(value) if isinstance(value, (dict, list)) else str(value)

    lines = ["| " + " | ".join(headers.values()) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(row.get(key)) for key in headers) + " |" for row in rows]
    return "\n".join(lines)
