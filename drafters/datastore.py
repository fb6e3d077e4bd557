"""Token datastore for retrieval drafting (REST, He et al. 2023, arXiv 2311.08252).

A corpus is tokenized with the target model's tokenizer and its documents are joined into one
uint32 array, with SEPARATOR between documents. A suffix array lists every position sorted by
the token sequence starting there, so all occurrences of a pattern form one contiguous range
[lo, hi) found by binary search in O(len(pattern) * log N), without scanning the corpus (the one
search: drafters/suffix/store_search.py, compiled).

On disk a datastore is a directory with `tokens.npy`, `suffix_array.npy` (memory-mapped when
opened, so a 50 MB datastore costs no load time) and `meta.json`. Build one with
`python -m jobs.build_datastore`. A store of segments (a series' store: pipeline/job/series_store.py)
is a directory with a meta.json alone, whose "segments" names datastores beside it (or, in a local
copy, inside it): opened, they are joined, each segment's suffix array searched on its own
(drafters/suffix/store_search.py).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Iterable, Sequence

import numpy as np

# SEPARATOR: written between documents (store_search.py says why it can be).
from drafters.suffix.store_search import SEPARATOR, gather_continuations, longest_match, whole

FORMAT_VERSION = 1
FILES = ("tokens.npy", "suffix_array.npy", "meta.json")
BUILD_HINT = "build one with: python -m jobs.build_datastore --corpus PATH --out DIR"


@dataclass(frozen=True, eq=False)
class Datastore:
    tokens: np.ndarray  # [N] uint32, documents joined by SEPARATOR
    # [N] int32 (int64 past 2**31 tokens): positions of `tokens` sorted by the suffix starting there.
    suffix_array: np.ndarray
    meta: dict  # meta.json: sizes, build times, and the model/tokenizer it was built for
    # [S, 2] int64: each segment's suffix-array range, oldest first (None: one segment, the whole array)
    segments: np.ndarray | None = None

    def __post_init__(self):
        assert self.tokens.ndim == 1 and self.tokens.dtype == np.uint32, (
            f"datastore tokens must be a 1-D uint32 array, got {self.tokens.dtype} {self.tokens.shape}"
        )
        assert self.suffix_array.shape == self.tokens.shape, (
            f"suffix array {self.suffix_array.shape} does not match tokens {self.tokens.shape}"
        )
        if self.segments is None:
            object.__setattr__(self, "segments", whole(self.suffix_array))

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def open(cls, directory: str | os.PathLike) -> Datastore:
        """Maps the arrays read-only (no copy into memory) and reads meta.json; a store of segments
        is opened segment by segment and joined (a copy)."""
        directory = Path(directory).expanduser()
        meta, found = cls.check(directory)
        if found:
            return cls.join([cls.open(path) for path in found], meta)
        tokens = np.load(directory / "tokens.npy", mmap_mode="r", allow_pickle=False)
        suffix_array = np.load(directory / "suffix_array.npy", mmap_mode="r", allow_pickle=False)
        return cls(tokens=tokens, suffix_array=suffix_array, meta=meta)

    @classmethod
    def check(cls, directory: Path) -> tuple[dict, list[Path]]:
        """That the store at `directory` is whole, reading no array (a driver checks the one its
        actors will map: joining a series' segments there cost it 1.5 GB at 62M tokens): its
        meta.json, and its segments' directories (a store of segments) or its own files."""
        meta_path = directory / "meta.json"
        meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
        if "segments" in meta:
            found = [
                directory / name if (directory / name).is_dir() else directory.parent / name
                for name in meta["segments"]
            ]
            for path in found:
                cls.check(path)
            return meta, found
        for name in FILES:
            if not (directory / name).is_file():
                raise FileNotFoundError(f"datastore file {directory / name} does not exist; {BUILD_HINT}")
        return meta, []

    @classmethod
    def join(cls, stores: list[Datastore], meta: dict) -> Datastore:
        """One store of `stores`' segments, oldest first: their tokens one after the other, their
        suffix arrays too (positions moved with their tokens). Each but the last must end with a
        SEPARATOR (build_datastore(..., closed=True)): its suffixes were sorted as ending there,
        which they still do, whatever follows."""
        tokens, arrays, segments, offset, index = [], [], [], 0, 0
        for number, store in enumerate(stores):
            closed = len(store.tokens) == 0 or store.tokens[-1] == SEPARATOR
            assert closed or number == len(stores) - 1, "a segment joined before another must end with SEPARATOR"
            for lo, hi in np.asarray(store.segments):
                arrays.append(np.asarray(store.suffix_array[lo:hi], dtype=np.int64) + offset)
                segments.append((index, index + hi - lo))
                index += hi - lo
            tokens.append(np.asarray(store.tokens))
            offset += len(store.tokens)
        joined = np.concatenate(tokens) if tokens else np.zeros(0, np.uint32)
        suffix_array = np.concatenate(arrays) if arrays else np.zeros(0, np.int64)
        dtype = np.int32 if len(joined) < 2**31 else np.int64
        return cls(joined, suffix_array.astype(dtype), meta, np.array(segments, dtype=np.int64).reshape(-1, 2))

    # The lookups read the maps as plain arrays: indexing an np.memmap wraps every slice in a new
    # memmap object, which tripled the cost of a step's binary searches.
    def match(self, context: Sequence[int], max_len: int = 16, min_len: int = 2) -> tuple[int, int, int]:
        """The longest suffix of `context` (max_len tokens down to min_len) that occurs: (its length,
        its suffix-array range [lo, hi)), or (0, 0, 0). The context holds real token ids, never
        SEPARATOR, so a match never crosses a document's end."""
        assert min_len >= 1, f"min_len must be >= 1, got {min_len}"
        values = np.asarray(context[-max_len:] if max_len > 0 else [], dtype=np.int64)
        tokens, suffix_array = np.asarray(self.tokens), np.asarray(self.suffix_array)
        length, lo, hi = longest_match(tokens, suffix_array, self.segments, values, max_len, min_len)
        return int(length), int(lo), int(hi)

    def continuations(
        self, lo: int, hi: int, match_len: int, length: int = 10, max_occurrences: int = 5000
    ) -> np.ndarray:
        """[n, length] uint32: the tokens after the occurrences of a match (its range [lo, hi)),
        min(hi - lo, max_occurrences) of them spread evenly over the range, each cut at a document's
        end and padded with SEPARATOR from there (an occurrence at a document's end gives none)."""
        count = max(0, min(hi - lo, max_occurrences))
        rows = np.full((count, length), SEPARATOR, dtype=np.int64)
        tokens, suffix_array = np.asarray(self.tokens), np.asarray(self.suffix_array)
        kept = gather_continuations(tokens, suffix_array, lo, hi, match_len, length, rows, np.zeros(count, np.int64))
        return rows[:kept].astype(np.uint32)


# ---------------------------------------------------------------------------------------------
# Build
# ---------------------------------------------------------------------------------------------


def concatenate_documents(token_lists: Iterable[Sequence[int] | np.ndarray]) -> tuple[np.ndarray, int, int]:
    """Joins non-empty documents with SEPARATOR: ([N] uint32, documents joined, empty ones skipped)."""
    pieces: list[np.ndarray] = []
    separator = np.array([SEPARATOR], dtype=np.uint32)
    num_documents = num_empty = 0
    for index, document in enumerate(token_lists):
        ids = np.asarray(document)
        if ids.size == 0:
            num_empty += 1
            continue
        if ids.ndim != 1 or ids.dtype.kind not in "iu":
            raise ValueError(
                f"document {index}: expected a flat list of integer token ids, got {ids.dtype} {ids.shape}"
            )
        if ids.min() < 0 or ids.max() >= SEPARATOR:
            raise ValueError(
                f"document {index}: token ids must be in [0, {int(SEPARATOR)}), got {ids.min()}..{ids.max()}"
            )
        if pieces:
            pieces.append(separator)
        pieces.append(ids.astype(np.uint32, copy=False))
        num_documents += 1
    if not pieces:
        raise ValueError("the corpus has no tokens: every document was empty (or there were none)")
    return np.concatenate(pieces), num_documents, num_empty


def build_suffix_array(tokens: np.ndarray) -> np.ndarray:
    """[N] positions sorted by suffix. pydivsufsort sorts bytes; for a uint32 array it rebases to
    the minimum, writes each token as fixed-width big-endian bytes, sorts the byte suffixes and
    keeps those at multiples of the width: byte order is then token order."""
    from pydivsufsort import divsufsort

    suffix_array = divsufsort(np.ascontiguousarray(tokens, dtype=np.uint32))
    dtype = np.int32 if len(tokens) < 2**31 else np.int64
    return np.asarray(suffix_array).astype(dtype, copy=False)


def staging_directory(out_dir: Path) -> Path:
    """A fresh directory next to out_dir (same filesystem, so the final rename is atomic)."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.building-"))
    staging.chmod(0o755)  # mkdtemp makes it private; a datastore is read by other users' workers too
    return staging


def replace_directory(staging: Path, out_dir: Path) -> None:
    """Moves staging to out_dir; an existing datastore there is replaced, anything else refused."""
    if not out_dir.exists():
        os.replace(staging, out_dir)
        return
    if not out_dir.is_dir() or (any(out_dir.iterdir()) and not (out_dir / "meta.json").is_file()):
        raise FileExistsError(f"{out_dir} exists and is not a datastore (no meta.json); refusing to replace it")
    retired = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.old-"))
    os.replace(out_dir, retired / out_dir.name)
    os.replace(staging, out_dir)
    shutil.rmtree(retired, ignore_errors=True)


def build_datastore(
    token_lists: Iterable[Sequence[int] | np.ndarray],
    out_dir: str | os.PathLike,
    meta: dict,
    closed: bool = False,
) -> Datastore:
    """Joins the documents, builds the suffix array, writes the datastore to out_dir and opens it.
    `closed`: a SEPARATOR after the last document too (a segment that others may be joined after).

    Files are written into a temporary directory next to out_dir and renamed at the end, so a
    crash never leaves a half-written datastore. `meta` (the model name, fingerprint, vocab size,
    corpus, ...) is stored in meta.json next to the sizes and build times computed here.
    """
    out_dir = Path(out_dir).expanduser()
    started = time.perf_counter()
    tokens, num_documents, num_empty = concatenate_documents(token_lists)
    if closed:  # a segment of a store: its suffixes end at its end, whatever is joined after it
        tokens = np.concatenate([tokens, np.array([SEPARATOR], dtype=np.uint32)])
    concatenated = time.perf_counter()
    suffix_array = build_suffix_array(tokens)
    sorted_at = time.perf_counter()
    staging = staging_directory(out_dir)
    try:
        np.save(staging / "tokens.npy", tokens, allow_pickle=False)
        np.save(staging / "suffix_array.npy", suffix_array, allow_pickle=False)
        array_bytes = sum((staging / name).stat().st_size for name in FILES[:2])
        full_meta = {
            **meta,
            "format_version": FORMAT_VERSION,
            "separator": int(SEPARATOR),
            "num_tokens": int(len(tokens) - (num_documents - 1) - closed),  # corpus tokens, separators excluded
            "array_length": int(len(tokens)),
            "num_documents": num_documents,
            "num_empty_documents": num_empty,
            "suffix_array_dtype": str(suffix_array.dtype),
            "bytes_on_disk": array_bytes,
            "concatenate_seconds": round(concatenated - started, 3),
            "suffix_array_seconds": round(sorted_at - concatenated, 3),
            "build_seconds": round(time.perf_counter() - started, 3),
        }
        (staging / "meta.json").write_text(json.dumps(full_meta, indent=2, sort_keys=True) + "\n")
        replace_directory(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Datastore.open(out_dir)
