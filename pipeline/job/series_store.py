"""A series' store of its earlier outputs, kept by the job: a series drafts from its history with
no manual step.

After each run of a series the job extends the series' store with the generated tokens of every
run it does not hold yet (this run's, and a killed run's that was never resumed): a token datastore
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

import pyarrow.compute as pc
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


@ray.remote
def extend_store(config: Config, paths: RunPaths) -> dict | None:
    """Extends the series' store with this model's outputs in the files of the series' runs it does
    not hold (a resumed run's later files too); returns its size (None while nothing is generated)."""
    root, runs_root = paths.store, paths.runs_root
    version = current_version(root)
    previous = Datastore.open(local_datastore(config, version)) if version else None
    inner = storage.resolve(runs_root)[1]
    held = {under(path, inner) for path in previous.meta["files"]} if previous else set()
    files = sorted({under(path, inner) for path in output_files(runs_root)} - held)
    documents = generated_tokens(runs_root, [f"{inner}/{name}" for name in files], config.model.name)
    started = time.perf_counter()
    if documents:
        with tempfile.TemporaryDirectory() as staging:
            meta = {"model": config.model.name, "series": config.job.series, "files": sorted(held | set(files))}
            previous = build_datastore(documents, Path(staging) / "store", meta, previous)
            version = storage.join(root, f"v={time.time_ns()}")
            storage.copy_directory(str(Path(staging) / "store"), version)
        storage.write_text(storage.join(root, "CURRENT"), version.rsplit("/", 1)[1] + "\n")
        drop_old_versions(root, version.rsplit("/", 1)[1])
    if previous is None:
        return None
    runs = {match.group(1) for match in map(RUN.search, ("/" + name for name in previous.meta["files"])) if match}
    return {
        "path": version,
        "runs": len(runs),
        "documents": previous.meta["num_documents"],
        "tokens": previous.meta["num_tokens"],
        "extend_seconds": round(time.perf_counter() - started, 3),
    }


def under(path: str, runs_root: str) -> str:
    """A run's file as the store names it: its path under the series' runs root, so that a series
    moved or copied elsewhere (another bucket, a renamed directory) finds its store holding its
    files. (Stores written before named files by their whole path: those under this root are read
    the same.)"""
    prefix = runs_root.rstrip("/") + "/"
    return path[len(prefix) :] if path.startswith(prefix) else path


def generated_tokens(runs_root: str, paths: list[str], model: str) -> list[list[int]]:
    """The generated tokens of the rows `model` generated (not errored, not empty) in the files `paths`."""
    filesystem, _ = storage.resolve(runs_root)
    found = []
    for path in paths:
        table = readable_columns(filesystem, path, ["generated_tokens", "error", "model"])
        if table is None:  # damaged after the run's check (pipeline/job/output_files.py): left out
            continue
        kept = pc.and_(pc.is_null(table["error"]), pc.equal(table["model"], model))
        found += [tokens for tokens in table.filter(kept)["generated_tokens"].to_pylist() if tokens]
    return found


def drop_old_versions(root: str, kept: str) -> None:
    """Removes the versions before `kept`, where it can (one left behind costs disk, not rows; an
    actor still mapping one keeps its open files)."""
    for name in storage.list_directories(root, "v="):
        if int(name[2:]) < int(kept[2:]):  # a newer one is another run's
            try:
                storage.delete_directory(storage.join(root, name))
            except OSError:
                pass
