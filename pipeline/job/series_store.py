"""A series' store of its earlier outputs, kept by the job: a series drafts from its history with
no manual step.

After each run of a series the job brings the series' store up to the files it does not hold yet
(this run's, and a killed run's that was never resumed), reading those files only. The store holds
one output per id, the newest (an edited row's new answer replaces its old one), and at most
job.store_tokens tokens (when full, the oldest outputs go): a token datastore
(drafters/datastore.py) under <output>/_checkpoints/series=<name>/store/model=<digest of the model>/,
one directory per version (`v=<time>`) and a file `CURRENT` naming the newest, written last, so a
run killed while extending leaves the version before it in use. The next run of the series drafts
from it (drafting.datastore) when the config names no datastore of its own and its drafter drafts
from one; the task that prepares the model puts it in the object store, shared by the actors like
a datastore from python -m jobs.build_datastore (which stays for stores of other corpora).

The store changes the speed, never a row's fingerprint: fingerprints come from the config as given.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import ray

from drafters.datastore import Datastore
from pipeline import storage
from pipeline.job import store_segments
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
    if version is None or storage.info(storage.join(version, "meta.json"), "job.output").type.name == "NotFound":
        return None
    for segment in read_meta(version).get("segments", []):  # one lost: built again from every run
        if storage.info(storage.join(root, segment, "meta.json"), "job.output").type.name == "NotFound":
            return None
    return version


def series_datastore(config: Config, root: str) -> str:
    """The datastore a run of a series drafts from: the series' store (at `root`: RunPaths.store)
    where the config names none, its drafter drafts from one and an earlier run has built it;
    drafting.datastore otherwise."""
    if not config.job.series or config.drafting.datastore:
        return config.drafting.datastore
    version = current_version(root)
    decoder = dataclasses.replace(config.drafting, datastore=version or "")
    return version if version and needs_datastore(decoder) else config.drafting.datastore


@ray.remote
def extend_store(config: Config, paths: RunPaths) -> dict | None:
    """Brings the series' store up to the outputs of its runs' files it does not hold (a resumed
    run's later files too), reading those files only: their newest output per id (this model's, no
    error) becomes a new segment, which supersedes the ids' older outputs, and the segments are kept
    small (pipeline/job/store_segments.py). Returns the store's size (None while nothing is generated)."""
    root, runs_root = paths.store, paths.runs_root
    version = current_version(root)
    meta = read_meta(version) if version else None
    if meta is not None and "segments" not in meta:  # a store written whole before: built anew from every run
        meta = None
    inner = storage.resolve(runs_root)[1]
    held = {under(path, inner) for path in meta["files"]} if meta else set()
    written = {under(path, inner): when for path, when in output_files(runs_root).items()}
    new_files = {name: when for name, when in written.items() if name not in held}
    started, counts = time.perf_counter(), {}
    if new_files:
        new = newest_outputs(runs_root, new_files, config.model.name)
        about = {"model": config.model.name, "series": config.job.series}
        segments, counts = added(root, list(meta["segments"]) if meta else [], new, config, about)
        meta = {
            **about,
            "segments": [s.name for s in segments],
            "files": sorted(held | set(new_files)),
            **size(segments),
        }
        version = write_version(root, meta)
    if meta is None:
        return None
    runs = {match.group(1) for match in map(RUN.search, ("/" + name for name in meta["files"])) if match}
    return {
        "path": version,
        "runs": len(runs),
        "documents": meta["num_documents"],
        "live_tokens": meta["num_live_tokens"],
        "tokens": meta["num_tokens"],
        "segments": len(meta["segments"]),
        **counts,
        "extend_seconds": round(time.perf_counter() - started, 3),
    }


def added(root: str, names: list[str], new: dict, config: Config, about: dict) -> tuple[list, dict]:
    """The store's segments `names` with the new outputs as a new segment (cut at a quarter of
    job.store_tokens), then kept small (store_segments.kept_small); and what that did."""
    limit = config.job.store_tokens
    grain = max(limit // store_segments.SEGMENT_SHARE, 1)
    documents = sorted(((key, when, tokens) for key, (when, tokens) in new.items()), key=lambda d: d[1])
    old = len(names)
    names = names + [store_segments.write_segment(root, run, about) for run in store_segments.chunks(documents, grain)]
    segments = store_segments.read_segments(root, names)
    keys = pa.array(list(new), pa.string())
    superseded = sum(int(pc.sum(pc.is_in(s.documents["key"], value_set=keys)).as_py() or 0) for s in segments[:old])
    segments, done = store_segments.kept_small(root, segments, limit, about, lambda path: open_local(config, path))
    return segments, {"added": len(new), "superseded": superseded, **done}


def size(segments: list) -> dict:
    """What the store holds: its live documents, and the tokens of its segments (dead ones too)."""
    return {
        "num_documents": sum(int(s.live.sum()) for s in segments),
        "num_live_tokens": sum(s.live_tokens for s in segments),
        "num_tokens": sum(s.tokens for s in segments),
    }


def read_meta(version: str) -> dict:
    return json.loads(storage.read_text(storage.join(version, "meta.json")))


def segments_of(version: str) -> set[str]:
    """The segments a version names (none where it is gone, or was written whole)."""
    try:
        return set(read_meta(version).get("segments", []))
    except (OSError, TypeError, ValueError):  # removed meanwhile by another run (read_text: None)
        return set()


def open_local(config: Config, path: str) -> Datastore:
    """A segment (or a whole store), from the copy its node keeps (one copy per node, ever)."""
    return Datastore.open(local_datastore(config, path))


def write_version(root: str, meta: dict) -> str:
    """A new version naming the segments in use, then CURRENT naming it (last: a run killed before
    leaves the version before in use); the older versions, and segments no version names, removed."""
    name = f"v={time.time_ns()}"
    version = storage.join(root, name)
    storage.write_text(storage.join(version, "meta.json"), json.dumps(meta, indent=1, sort_keys=True) + "\n")
    storage.write_text(storage.join(root, "CURRENT"), name + "\n")
    drop_old_versions(root, name, set(meta["segments"]))
    return version


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


def under(path: str, runs_root: str) -> str:
    """A run's file as the store names it: its path under the series' runs root, so that a series
    moved or copied elsewhere (another bucket, a renamed directory) finds its store holding its
    files. (Stores written before named files by their whole path: those under this root are read
    the same.)"""
    prefix = runs_root.rstrip("/") + "/"
    return path[len(prefix) :] if path.startswith(prefix) else path


# A segment no version names (its extension killed, or another run's, not yet named) is removed only
# once it is this old: a concurrent extension names its new segments within it.
ORPHAN_AGE_NS = 24 * 3600 * 10**9


def drop_old_versions(root: str, kept: str, segments: set[str]) -> None:
    """Removes the versions before `kept` and the segments they alone named (none that `kept`, or a
    newer version another run wrote, names), and segments no version names that are older than
    ORPHAN_AGE_NS, where it can (one left behind costs disk, not rows; an actor still mapping one
    keeps its open files)."""
    time_of = lambda name: int(name.split("=", 1)[1])  # noqa: E731
    versions = storage.list_directories(root, "v=")
    old = [name for name in versions if time_of(name) < time_of(kept)]
    named = {name: segments_of(storage.join(root, name)) for name in versions}
    in_use = set(segments).union(*(named[name] for name in versions if name not in old))
    once_named = set().union(*(named[name] for name in old)) if old else set()
    stale = time_of(kept) - ORPHAN_AGE_NS
    for name in storage.list_directories(root, "seg="):
        if name not in in_use and (name in once_named or time_of(name) < stale):
            old.append(name)
    for name in old:
        try:
            storage.delete_directory(storage.join(root, name))
        except OSError:
            pass
