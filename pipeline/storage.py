"""Paths that may be local or in object storage (s3://, gs://, abfs://, hdfs://), through pyarrow.fs.

Credentials and endpoints come from the standard environment of each store (AWS_ACCESS_KEY_ID,
AWS_ENDPOINT_URL, GOOGLE_APPLICATION_CREDENTIALS, ...), never from the config file.
`FileSystem.from_uri` honours AWS_ENDPOINT_URL; a bare `S3FileSystem()` would not.
"""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path

import pyarrow.fs as pafs


class StorageError(OSError):
    """A path that cannot be reached or used; the message names the setting."""


def is_uri(path: str) -> bool:
    return "://" in path


def resolve(path: str) -> tuple[pafs.FileSystem, str]:
    """(file system, path within it) for a local path (made absolute) or a URI."""
    if is_uri(path):
        return pafs.FileSystem.from_uri(path)
    return pafs.LocalFileSystem(), str(Path(path).expanduser().resolve())


def uri(path: str) -> str:
    """The path as Ray and pyarrow take it: URIs as given, local paths absolute."""
    return path.rstrip("/") if is_uri(path) else str(Path(path).expanduser().resolve())


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *parts])


def info(path: str, setting: str) -> pafs.FileInfo:
    """What is at `path`; a store that cannot be reached fails naming the setting."""
    try:
        filesystem, inner = resolve(path)
        return filesystem.get_file_info(inner)
    except (OSError, ValueError) as error:
        raise StorageError(f"{setting}: {path!r} cannot be reached: {error}") from error


def glob(pattern: str, setting: str) -> list[str]:
    """Files matching a glob (`*`, `?`, `[...]` in the last parts of the path), sorted."""
    filesystem, inner = resolve(pattern)
    first_wild = min(i for i, ch in enumerate(inner) if ch in "*?[")
    base = inner[: inner.rfind("/", 0, first_wild)] or "/"
    try:
        found = filesystem.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
    except OSError as error:
        raise StorageError(f"{setting}: {pattern!r} cannot be reached: {error}") from error
    matches = sorted(entry.path for entry in found if entry.is_file and fnmatch.fnmatchcase(entry.path, inner))
    prefix = pattern[: pattern.find("://") + 3] if is_uri(pattern) else ""
    return [prefix + path for path in matches]


def list_files(path: str, recursive: bool = False) -> list[str]:
    """The files in the directory at `path` (under it, with `recursive`), named as `path` is (a URI
    keeps its scheme), sorted; none where there is no such directory."""
    filesystem, inner = resolve(path)
    found = filesystem.get_file_info(pafs.FileSelector(inner, recursive=recursive, allow_not_found=True))
    prefix = path[: path.find("://") + 3] if is_uri(path) else ""
    return sorted(prefix + entry.path for entry in found if entry.is_file)


def unreadable_parquet(paths: list[str], threads: int = 16) -> dict[str, str]:
    """{each of `paths` whose Parquet footer cannot be read (a file cut short, not Parquet): why}.
    The footers are read in threads: a store's latency, not its bandwidth, is what they cost."""
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow.parquet as pq

    def problem(path: str) -> str | None:
        filesystem, inner = resolve(path)
        try:
            pq.read_metadata(inner, filesystem=filesystem)
        except (OSError, ValueError) as error:  # pyarrow's ArrowInvalid is a ValueError
            return f"not a readable Parquet file ({error})"
        return None

    with ThreadPoolExecutor(max_workers=threads) as pool:
        return {path: why for path, why in zip(paths, pool.map(problem, paths)) if why is not None}


def move(path: str, to: str) -> None:
    """Moves a file within its store (local paths and URIs alike), making `to`'s directory."""
    filesystem, inner = resolve(path)
    target = resolve(to)[1]
    filesystem.create_dir(target.rsplit("/", 1)[0], recursive=True)
    filesystem.move(inner, target)


def make_directory(path: str, setting: str) -> None:
    """Creates a directory (a no-op prefix in object stores) and checks it can be written."""
    filesystem, inner = resolve(path)
    probe = f"{inner}/.write-probe-{os.getpid()}"
    try:
        filesystem.create_dir(inner, recursive=True)
        with filesystem.open_output_stream(probe) as stream:
            stream.write(b"")
        filesystem.delete_file(probe)
    except (OSError, ValueError) as error:
        raise StorageError(f"{setting}: cannot write to {path!r}: {error}") from error


def read_text(path: str) -> str | None:
    """The file's text, or None when there is none."""
    filesystem, inner = resolve(path)
    if filesystem.get_file_info(inner).type != pafs.FileType.File:
        return None
    with filesystem.open_input_stream(inner) as stream:
        return stream.read().decode()


def write_text(path: str, text: str) -> None:
    """Writes whole (a temporary name, then a move, where the store has moves that replace)."""
    with WholeFile(path) as file:
        file.write(text)


class WholeFile:
    """A text file written in pieces and seen whole or not at all: under a temporary name, moved to
    its own once closed (where the store has moves that replace); a failure leaves no file."""

    def __init__(self, path: str):
        self.filesystem, self.inner = resolve(path)
        self.staging = f"{self.inner}.{os.getpid()}.tmp"

    def __enter__(self) -> WholeFile:
        self.filesystem.create_dir(str(Path(self.inner).parent), recursive=True)
        self.stream = self.filesystem.open_output_stream(self.staging)
        return self

    def write(self, text: str) -> None:
        self.stream.write(text.encode())

    def __exit__(self, kind, error, trace) -> None:
        self.stream.close()
        if kind is None:
            self.filesystem.move(self.staging, self.inner)
        else:
            self.filesystem.delete_file(self.staging)


def list_directories(path: str, prefix: str = "") -> list[str]:
    """Names of the directories right under `path` that start with `prefix`, sorted."""
    filesystem, inner = resolve(path)
    entries = filesystem.get_file_info(pafs.FileSelector(inner, allow_not_found=True))
    return sorted(
        Path(e.path).name for e in entries if e.type == pafs.FileType.Directory and Path(e.path).name.startswith(prefix)
    )


def local_copy(path: str, cache: str | os.PathLike) -> str:
    """A local directory with the files of the directory at `path`: the path itself where it is
    local, else a copy under `cache` (made once per URI: copy a directory that never changes)."""
    if not is_uri(path):
        return str(Path(path).expanduser())
    import hashlib
    import shutil
    import tempfile

    target = Path(cache).expanduser() / hashlib.sha256(path.encode()).hexdigest()[:16]
    if not target.is_dir():
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-")
        filesystem, inner = resolve(path)
        pafs.copy_files(inner, staging, source_filesystem=filesystem, destination_filesystem=pafs.LocalFileSystem())
        try:
            os.replace(staging, target)
        except OSError:  # another process made it first
            shutil.rmtree(staging, ignore_errors=True)
    return str(target)


def copy_directory(local: str, path: str) -> None:
    """Copies a local directory's files to `path` (local or a URI)."""
    filesystem, inner = resolve(path)
    filesystem.create_dir(inner, recursive=True)
    pafs.copy_files(local, inner, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=filesystem)


def delete_directory(path: str) -> None:
    filesystem, inner = resolve(path)
    filesystem.delete_dir(inner)
