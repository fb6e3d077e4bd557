"""A series' store of its earlier outputs, kept by the job: a series drafts from its history with
no manual step.

After each run of a series the job brings the series' store up to the files it does not hold yet
(this run's, and a killed run's that was never resumed), reading those files only. The store holds
one output per id, the newest (an edited row's new answer replaces its old one), and at most
job.store_tokens tokens (when full, the oldest outputs go): a token datastore
(drafters/datastore.py) under <output>/_checkpoints/series=<name>/store/model=<digest of the model>/,
one directory per version (`v=<time>`) and a file `CURRENT` naming the newest, written last, so a
run killed while extending leaves the version before it in use. The next run of the series drafts
from it (decoder.datastore) when the config names no datastore of its own and its drafter drafts
from one; the task that prepares the model puts it in the object store, shared by the actors like
a datastore from python -m jobs.build_datastore (which stays for stores of other corpora).

The store changes the speed, never a row's fingerprint: fingerprints come from the config as given.
"""

from __future__ import annotations

import dataclasses
import re
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import ray

from drafters.datastore import Datastore, build_datastore
from pipeline import storage
from pipeline.llm.actor_pool import local_datastore
from pipeline.config import Config
from pipeline.loading.drafters import needs_datastore
from pipeline.job.output_files import readable_columns
from pipeline.job.run import RunPaths
from pipeline.job.series import output_files

RUN = re.compile(r"/run=([^/]+)/")


def current_version(root: str) -> str | None:
    """The newest complete version of the store at `root`, or None before the series' first run
    (or where it was lost: the next extension builds it again from every run)."""
    name = storage.read_text(storage.join(root, "CURRENT"))
    version = storage.join(root, name.strip()) if name else None
    missing = version is None or storage.info(storage.join(version, "meta.json"), "job.output").type.name == "NotFound"
    return None if missing else version


def with_series_store(config: Config, root: str) -> Config:
    """The config a run of a series drafts with: decoder.datastore is the series' store (at `root`:
    RunPaths.store) where the config names none, its drafter drafts from one and an earlier run has built it."""
    if not config.job.series or config.decoder.datastore:
        return config
    version = current_version(root)
    decoder = dataclasses.replace(config.decoder, datastore=version or "")
    return dataclasses.replace(config, decoder=decoder) if version and needs_datastore(decoder) else config


DOCUMENTS = "documents.parquet"  # beside a version's arrays: each document's id, when written, its length


@ray.remote
def extend_store(config: Config, paths: RunPaths) -> dict | None:
    """Brings the series' store up to the outputs of its runs' files it does not hold (a resumed
    run's later files too): their newest output per id (this model's, no error) replaces the id's
    older one, and where the store would hold more than job.store_tokens tokens its oldest outputs
    go. Reads the new files only; returns the store's size (None while nothing is generated)."""
    root, runs_root = paths.store, paths.runs_root
    version = current_version(root)
    local = local_datastore(config, version) if version else None
    previous, stored = (Datastore.open(local), stored_documents(local)) if local else (None, None)
    if stored is None:  # none yet, or a store written before it kept its documents: built from every run
        previous = None
    inner = storage.resolve(runs_root)[1]
    held = {under(path, inner) for path in previous.meta["files"]} if previous else set()
    written = {under(path, inner): when for path, when in output_files(runs_root).items()}
    new_files = {name: when for name, when in written.items() if name not in held}
    started, counts = time.perf_counter(), {}
    meta = previous.meta if previous is not None else None
    if new_files:
        new = newest_outputs(runs_root, new_files, config.model.name)
        documents, counts = kept_documents(previous, stored, new, config.job.store_tokens)
        if documents:
            files = sorted(held | set(new_files))
            version, meta = write_version(
                root, documents, {"model": config.model.name, "series": config.job.series, "files": files}
            )
    if meta is None:
        return None
    runs = {match.group(1) for match in map(RUN.search, ("/" + name for name in meta["files"])) if match}
    return {
        "path": version,
        "runs": len(runs),
        "documents": meta["num_documents"],
        "tokens": meta["num_tokens"],
        **counts,
        "extend_seconds": round(time.perf_counter() - started, 3),
    }


def stored_documents(local: str) -> pa.Table | None:
    """A version's documents (key, written, length), in the order of its tokens; None where it has none."""
    path = Path(local) / DOCUMENTS
    return pq.read_table(path) if path.is_file() else None


def newest_outputs(runs_root: str, files: dict[str, int], model: str) -> dict[str, tuple[int, np.ndarray]]:
    """{id: (when its file was written, its generated tokens)}: each id's newest output that `model`
    generated without an error in `files` ({file under the runs root: when written}). A file without
    an id column (written by hand) keys each row by its place."""
    filesystem, inner = storage.resolve(runs_root)
    newest: dict[str, tuple[int, np.ndarray]] = {}
    for name, when in sorted(files.items(), key=lambda item: item[1]):
        path = f"{inner}/{name}"
        table = readable_columns(filesystem, path, ["generated_tokens", "error", "model", *id_column(filesystem, path)])
        if table is None:  # damaged after the run's check (pipeline/job/output_files.py): left out
            continue
        kept = pc.and_(pc.is_null(table["error"]), pc.equal(table["model"], model)).to_numpy(zero_copy_only=False)
        keys = table["id"].cast(pa.string()).to_pylist() if "id" in table.column_names else None
        for row in np.flatnonzero(kept):
            tokens = np.asarray(table["generated_tokens"][int(row)].values, dtype=np.uint32)
            if len(tokens):
                newest[keys[row] if keys is not None else f"{name}#{row}"] = (when, tokens)
    return newest


def id_column(filesystem, path: str) -> list[str]:
    try:
        return ["id"] if "id" in pq.read_schema(path, filesystem=filesystem).names else []
    except (OSError, ValueError):
        return []  # (readable_columns then names the damage)


def kept_documents(previous, stored, new: dict, limit: int) -> tuple[list, dict]:
    """The documents of the next version, oldest first, as (key, written, tokens): the previous
    version's whose id has no new output, then the new ones; the oldest dropped while they hold more
    than `limit` tokens. Returns them and how many were added, superseded and dropped."""
    documents = []
    superseded = 0
    if previous is not None:
        lengths = stored["length"].to_numpy()
        starts = np.concatenate([[0], np.cumsum(lengths + 1)[:-1]])
        tokens = previous.tokens
        for key, when, start, length in zip(stored["key"].to_pylist(), stored["written"].to_numpy(), starts, lengths):
            if key in new:
                superseded += 1
            else:
                documents.append((key, int(when), tokens[start : start + length]))
    documents += sorted(((key, when, tokens) for key, (when, tokens) in new.items()), key=lambda d: d[1])
    total, first = sum(len(d[2]) for d in documents), 0
    while total > limit and first < len(documents):
        total -= len(documents[first][2])
        first += 1
    counts = {"added": len(new), "superseded": superseded, "dropped_for_size": first}
    return documents[first:], counts


def write_version(root: str, documents: list, meta: dict) -> tuple[str, dict]:
    """A new version of the store from `documents`, written beside the old ones, then named CURRENT
    (last: a run killed before leaves the version before in use); the older versions removed.
    Returns its path and its meta.json."""
    name = f"v={time.time_ns()}"
    with tempfile.TemporaryDirectory() as staging:
        local = Path(staging) / "store"
        store = build_datastore([tokens for _, _, tokens in documents], local, meta)
        pq.write_table(
            pa.table(
                {
                    "key": pa.array([key for key, _, _ in documents], pa.string()),
                    "written": pa.array([when for _, when, _ in documents], pa.int64()),
                    "length": pa.array([len(tokens) for _, _, tokens in documents], pa.int64()),
                }
            ),
            local / DOCUMENTS,
        )
        version = storage.join(root, name)
        storage.copy_directory(str(local), version)
    storage.write_text(storage.join(root, "CURRENT"), name + "\n")
    drop_old_versions(root, name)
    return version, store.meta


def under(path: str, runs_root: str) -> str:
    """A run's file as the store names it: its path under the series' runs root, so that a series
    moved or copied elsewhere (another bucket, a renamed directory) finds its store holding its
    files. (Stores written before named files by their whole path: those under this root are read
    the same.)"""
    prefix = runs_root.rstrip("/") + "/"
    return path[len(prefix) :] if path.startswith(prefix) else path


def drop_old_versions(root: str, kept: str) -> None:
    """Removes the versions before `kept`, where it can (one left behind costs disk, not rows; an
    actor still mapping one keeps its open files)."""
    for name in storage.list_directories(root, "v="):
        if int(name[2:]) < int(kept[2:]):  # a newer one is another run's
            try:
                storage.delete_directory(storage.join(root, name))
            except OSError:
                pass
