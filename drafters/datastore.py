"""Token datastore for retrieval drafting (REST, He et al. 2023, arXiv 2311.08252).

A corpus is tokenized with the target model's tokenizer and its documents are joined into one
uint32 array, with SEPARATOR between documents. A suffix array lists every position sorted by
the token sequence starting there, so all occurrences of a pattern form one contiguous range
[lo, hi) found by binary search in O(len(pattern) * log N), without scanning the corpus.

On disk a datastore is a directory with `tokens.npy`, `suffix_array.npy` (memory-mapped when
opened, so a 50 MB datastore costs no load time) and `meta.json`. Build one with
`python -m jobs.build_datastore`.
"""
from __future__ import annotations

import bisect
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

# Written between documents. It is the largest uint32 and never a token id, so a pattern (a
# model context) never matches across it, and it sorts after every real token.
SEPARATOR = np.uint32(2**32 - 1)
FORMAT_VERSION = 1
FILES = ("tokens.npy", "suffix_array.npy", "meta.json")
BUILD_HINT = "build one with: python -m jobs.build_datastore --corpus PATH --out DIR"


@dataclass(frozen=True, eq=False)
class Datastore:
    tokens: np.ndarray  # [N] uint32, documents joined by SEPARATOR
    # [N] int32 (int64 past 2**31 tokens): positions of `tokens` sorted by the suffix starting there.
    suffix_array: np.ndarray
    meta: dict  # meta.json: sizes, build times, and the model/tokenizer it was built for

    def __post_init__(self):
        assert self.tokens.ndim == 1 and self.tokens.dtype == np.uint32, (
            f"datastore tokens must be a 1-D uint32 array, got {self.tokens.dtype} {self.tokens.shape}")
        assert self.suffix_array.shape == self.tokens.shape, (
            f"suffix array {self.suffix_array.shape} does not match tokens {self.tokens.shape}")

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def open(cls, directory: str | os.PathLike) -> Datastore:
        """Maps the arrays read-only (no copy into memory) and reads meta.json."""
        directory = Path(directory).expanduser()
        for name in FILES:
            if not (directory / name).is_file():
                raise FileNotFoundError(f"datastore file {directory / name} does not exist; {BUILD_HINT}")
        tokens = np.load(directory / "tokens.npy", mmap_mode="r", allow_pickle=False)
        suffix_array = np.load(directory / "suffix_array.npy", mmap_mode="r", allow_pickle=False)
        meta = json.loads((directory / "meta.json").read_text())
        return cls(tokens=tokens, suffix_array=suffix_array, meta=meta)

    # The lookups read the maps as plain arrays: indexing an np.memmap wraps every slice in a new
    # memmap object, which tripled the cost of a step's binary searches.
    def match(self, context: Sequence[int], max_len: int = 16, min_len: int = 2) -> tuple[int, int, int]:
        return find_longest_suffix_match(np.asarray(self.tokens), np.asarray(self.suffix_array), context, max_len, min_len)

    def continuations(self, lo: int, hi: int, match_len: int, length: int = 10,
                      max_occurrences: int = 5000) -> np.ndarray:
        return continuations(np.asarray(self.tokens), np.asarray(self.suffix_array), lo, hi, match_len, length,
                             max_occurrences)


# ---------------------------------------------------------------------------------------------
# Lookup (pure helpers: the drafter's hot path)
# ---------------------------------------------------------------------------------------------

def suffix_range(tokens: np.ndarray, suffix_array: np.ndarray, pattern: list[int],
                 lo: int = 0, hi: int | None = None) -> tuple[int, int]:
    """The half-open suffix-array range of the suffixes that start with `pattern` (empty: lo == hi).

    tokens: [N] uint32; suffix_array: [N]. Each suffix is cut to len(pattern) tokens and compared
    as a Python list: lexicographic, with a prefix (a suffix that hits the array's end) smaller.
    """
    hi = len(suffix_array) if hi is None else hi
    width = len(pattern)

    def head(position) -> list[int]:
        return tokens[position:position + width].tolist()

    first = bisect.bisect_left(suffix_array, pattern, lo, hi, key=head)
    last = bisect.bisect_right(suffix_array, pattern, first, hi, key=head)
    return first, last


def occurs(tokens: np.ndarray, suffix_array: np.ndarray, pattern: list[int]) -> bool:
    """Whether `pattern` occurs: one lower-bound search and a look at the suffix found there."""
    first = bisect.bisect_left(suffix_array, pattern, key=lambda p: tokens[p:p + len(pattern)].tolist())
    return first < len(suffix_array) and tokens[suffix_array[first]:][:len(pattern)].tolist() == pattern


def find_longest_suffix_match(tokens: np.ndarray, suffix_array: np.ndarray, context: Sequence[int],
                              max_len: int = 16, min_len: int = 2) -> tuple[int, int, int]:
    """The longest suffix of `context`, of length min(max_len, len(context)) down to min_len,
    that occurs in the datastore: (match_len, lo, hi) with [lo, hi) its suffix-array range, or
    (0, 0, 0) when none does.

    If the last L tokens occur at position p, the last L-1 occur at p+1, so "occurs" is monotone
    in L and the longest L is found by binary search over L: about log2(max_len) range searches
    instead of one per length. The context holds real token ids, never SEPARATOR, so a match
    never crosses a document boundary.
    """
    assert min_len >= 1, f"min_len must be >= 1, got {min_len}"
    tail = [int(t) for t in context[-max_len:]] if max_len > 0 else []
    shortest, longest = min_len - 1, len(tail)  # invariant: `shortest` occurs (or is min_len - 1)
    while shortest < longest:
        middle = (shortest + longest + 1) // 2
        if occurs(tokens, suffix_array, tail[len(tail) - middle:]):
            shortest = middle
        else:
            longest = middle - 1
    if shortest < min_len:
        return 0, 0, 0
    lo, hi = suffix_range(tokens, suffix_array, tail[len(tail) - shortest:])
    return shortest, lo, hi


def continuations(tokens: np.ndarray, suffix_array: np.ndarray, lo: int, hi: int, match_len: int,
                  length: int = 10, max_occurrences: int = 5000) -> np.ndarray:
    """[n, length] uint32: the `length` tokens after n = min(hi - lo, max_occurrences) of the
    occurrences, spread evenly over the range (the first n in suffix-array order would be the
    alphabetically smallest continuations); each row is cut at its first SEPARATOR (or the
    array's end) and padded with SEPARATOR from there, for the caller to drop.
    """
    count = max(0, min(hi - lo, max_occurrences))
    picks = lo + (np.arange(count, dtype=np.int64) * (hi - lo)) // max(count, 1)  # [n] evenly spread
    starts = np.asarray(suffix_array[picks], dtype=np.int64) + match_len  # [n]
    positions = starts[:, None] + np.arange(length, dtype=np.int64)[None, :]  # [n, length]
    inside = positions < len(tokens)
    rows = np.where(inside, tokens[np.minimum(positions, len(tokens) - 1)], SEPARATOR)  # [n, length]
    rows[np.cumsum(rows == SEPARATOR, axis=1) > 0] = SEPARATOR
    return rows.astype(np.uint32, copy=False)


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
            raise ValueError(f"document {index}: expected a flat list of integer token ids, "
                             f"got {ids.dtype} {ids.shape}")
        if ids.min() < 0 or ids.max() >= SEPARATOR:
            raise ValueError(f"document {index}: token ids must be in [0, {int(SEPARATOR)}), "
                             f"got {ids.min()}..{ids.max()}")
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


def build_datastore(token_lists: Iterable[Sequence[int] | np.ndarray], out_dir: str | os.PathLike,
                    meta: dict) -> Datastore:
    """Joins the documents, builds the suffix array, writes the datastore to out_dir and opens it.

    Files are written into a temporary directory next to out_dir and renamed at the end, so a
    crash never leaves a half-written datastore. `meta` (the model name, fingerprint, vocab size,
    corpus, ...) is stored in meta.json next to the sizes and build times computed here.
    """
    out_dir = Path(out_dir).expanduser()
    started = time.perf_counter()
    tokens, num_documents, num_empty = concatenate_documents(token_lists)
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
            "num_tokens": int(len(tokens) - (num_documents - 1)),  # corpus tokens, separators excluded
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
