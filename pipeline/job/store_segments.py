"""A series' store as segments, as an LSM tree keeps its runs: each run adds one segment of what it
generated, and the store's cost is what a run adds, not what the series holds.

    <store root>/seg=<time>/    a closed datastore (drafters/datastore.py) and documents.parquet:
                                each document's id, when its file was written, its length
    <store root>/v=<time>/      meta.json: the segments in use, oldest first, and the runs' files held

A document is live while no newer segment holds its id; the drafters search every segment (their
dead documents too, until a merge drops them: drafts are verified, a stale one costs a draft, never a
row). Kept small:
- two adjacent segments merge (their live documents) while there are more than MAX_SEGMENTS, the
  pair of fewest tokens first, never into one of more than a quarter of job.store_tokens;
- a segment whose live tokens are under half its tokens is rewritten with its live documents;
- while the segments hold more than job.store_tokens tokens, the oldest segment goes.
Each segment never changes once written: a node copies it once (pipeline/llm/actor_pool.py).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from drafters.datastore import Datastore, build_datastore
from pipeline import storage

DOCUMENTS = "documents.parquet"
Opener = Callable[[str], Datastore]  # a segment's path -> its datastore (a node's local copy)
MAX_SEGMENTS = 8
SEGMENT_SHARE = 4  # a segment holds at most job.store_tokens / SEGMENT_SHARE tokens (its eviction's grain)


@dataclass
class Segment:
    name: str  # seg=<time>, beside the versions
    documents: pa.Table  # key, written, length: in the order of its tokens
    live: np.ndarray  # [documents] bool: no newer segment holds the id

    @property
    def tokens(self) -> int:
        return int(pc.sum(self.documents["length"]).as_py() or 0)

    @property
    def live_tokens(self) -> int:
        return int(self.documents["length"].to_numpy()[self.live].sum())


def read_segments(root: str, names: list[str]) -> list[Segment]:
    """The segments `names` of the store at `root`, oldest first, each document's liveness marked."""
    segments = [Segment(name, read_documents(storage.join(root, name)), np.zeros(0, bool)) for name in names]
    mark_live(segments)
    return segments


def read_documents(segment: str) -> pa.Table:
    filesystem, inner = storage.resolve(storage.join(segment, DOCUMENTS))
    return pq.read_table(inner, filesystem=filesystem)


def mark_live(segments: list[Segment]) -> None:
    """A document is live where its id is in no newer segment."""
    newer: pa.Array = pa.array([], pa.string())
    for segment in reversed(segments):
        keys = segment.documents["key"]
        segment.live = pc.invert(pc.is_in(keys, value_set=newer)).to_numpy(zero_copy_only=False)
        newer = pa.concat_arrays([newer, keys.combine_chunks()]) if len(keys) else newer


def write_segment(root: str, documents: list[tuple[str, int, np.ndarray]], meta: dict) -> str:
    """A new closed segment of `documents` ((key, written, tokens), oldest first) at `root`; its name."""
    name = f"seg={time.time_ns()}"
    with tempfile.TemporaryDirectory() as staging:
        local = Path(staging) / "segment"
        build_datastore([tokens for _, _, tokens in documents], local, meta, closed=True)
        table = pa.table(
            {
                "key": pa.array([key for key, _, _ in documents], pa.string()),
                "written": pa.array([when for _, when, _ in documents], pa.int64()),
                "length": pa.array([len(tokens) for _, _, tokens in documents], pa.int64()),
            }
        )
        pq.write_table(table, local / DOCUMENTS)
        storage.copy_directory(str(local), storage.join(root, name))
    return name


def chunks(documents: list, limit: int) -> list[list]:
    """`documents` cut, in order, into runs of at most `limit` tokens (a longer document alone)."""
    runs, current, size = [], [], 0
    for document in documents:
        if current and size + len(document[2]) > limit:
            runs.append(current)
            current, size = [], 0
        current.append(document)
        size += len(document[2])
    return runs + ([current] if current else [])


def live_documents(segment: Segment, store: Datastore) -> list[tuple[str, int, np.ndarray]]:
    """The segment's live documents, (key, written, tokens), in order, from its datastore `store`."""
    lengths = segment.documents["length"].to_numpy()
    starts = np.concatenate([[0], np.cumsum(lengths + 1)[:-1]])
    keys, written = segment.documents["key"].to_pylist(), segment.documents["written"].to_numpy()
    tokens = np.asarray(store.tokens)
    return [
        (keys[i], int(written[i]), tokens[starts[i] : starts[i] + lengths[i]]) for i in np.flatnonzero(segment.live)
    ]


def kept_small(root: str, segments: list[Segment], limit: int, meta: dict, opener: Opener) -> tuple[list, dict]:
    """The segments after the module's rules: the half-dead rewritten, the oldest dropped past
    `limit` tokens, adjacent pairs merged while there are too many. Returns them and what was done."""
    done = {"rewritten": 0, "dropped_segments": 0, "dropped_documents": 0, "merged": 0}
    for i, segment in enumerate(segments):
        if segment.live_tokens * 2 < segment.tokens:
            segments[i] = rewritten(root, [segment], meta, opener)
            done["rewritten"] += 1
    segments = [segment for segment in segments if segment is not None]
    while sum(segment.tokens for segment in segments) > limit and len(segments) > 1:
        done["dropped_segments"] += 1
        done["dropped_documents"] += int(segments.pop(0).live.sum())
    while len(segments) > MAX_SEGMENTS:
        sizes = [a.tokens + b.tokens for a, b in zip(segments, segments[1:])]
        i = int(np.argmin(sizes))
        if sizes[i] > limit // SEGMENT_SHARE:
            break
        merged = rewritten(root, segments[i : i + 2], meta, opener)
        segments[i : i + 2] = [merged] if merged is not None else []
        done["merged"] += 1
    return segments, done


def rewritten(root: str, parts: list[Segment], meta: dict, opener: Opener) -> Segment | None:
    """One new segment of `parts`' live documents, in order; None where none is live."""
    documents = [doc for part in parts for doc in live_documents(part, opener(storage.join(root, part.name)))]
    if not documents:
        return None
    name = write_segment(root, documents, meta)
    table = read_documents(storage.join(root, name))
    return Segment(name, table, np.ones(len(table), bool))
