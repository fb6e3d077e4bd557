"""The replay's answers (jobs/benchmark/replay.py): a finished greedy run's rows, each with its
prediction where --predictions names earlier runs of the same rows (a series' last outputs)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Answer:
    prompt: np.ndarray  # [P] int64
    output: np.ndarray  # [G] int64, the greedy output
    max_tokens: int  # what the run allowed it (its output, where the run's cap cut it)
    id: str = ""  # the row's id in its run ("" where the run has no id column)
    prediction: np.ndarray | None = None  # [Q] int64: what its answer should resemble (--predictions), if any


def load_answers(
    run_dirs: list[str], max_tokens: int, predictions: dict[str, np.ndarray] | None = None
) -> list[Answer]:
    """The runs' answers; with `predictions` (load_predictions) each with its id's prediction."""
    import pyarrow.parquet as pq

    from jobs.report import find_parts

    answers, names = [], ["prompt_token_ids", "generated_tokens", "finish_reason"]
    for run_dir in run_dirs:
        parts = find_parts(run_dir)
        has_ids = "id" in pq.read_schema(parts[0]).names
        table = pq.read_table(parts, columns=names + (["id"] if has_ids else []))
        if predictions is not None and not has_ids:
            raise SystemExit(f"--predictions: {run_dir} has no id column to join the earlier runs' rows on")
        ids = table.column("id").to_pylist() if has_ids else [""] * len(table)
        for key, prompt, output, finish in zip(ids, *(table.column(name).to_pylist() for name in names)):
            if prompt and output:  # a request cut by its token budget had exactly that many
                answers.append(
                    Answer(
                        np.array(prompt, np.int64),
                        np.array(output, np.int64),
                        len(output) if finish == "length" else max(max_tokens, len(output)),
                        str(key or ""),
                        (predictions or {}).get(str(key)),
                    )
                )
    if not answers:
        raise SystemExit(f"--replay {run_dirs}: no rows with prompt_token_ids and generated_tokens")
    return answers


def load_predictions(run_dirs: list[str]) -> dict[str, np.ndarray]:
    """{id: its generated_tokens} of the earlier runs (a series' last outputs), a later run's over
    an earlier's; rows without tokens (an error row) give none."""
    import pyarrow.parquet as pq

    from jobs.report import find_parts

    found = {}
    for run_dir in run_dirs:
        table = pq.read_table(find_parts(run_dir), columns=["id", "generated_tokens"])
        for key, tokens in zip(table.column("id").to_pylist(), table.column("generated_tokens").to_pylist()):
            if key is not None and tokens:
                found[str(key)] = np.array(tokens, np.int64)
    if not found:
        raise SystemExit(f"--predictions {run_dirs}: no rows with id and generated_tokens")
    return found
