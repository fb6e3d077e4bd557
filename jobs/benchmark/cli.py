"""The benchmark's command line, `python -m jobs.benchmark SUBCOMMAND [options]`, as `vllm bench`
has it: one module per subcommand, each with its own options (`add_cli_args`), its run (`run`,
returning the report) and its table (`markdown`); one writer for every report (report.py)."""

from __future__ import annotations

import argparse
import importlib

# subcommand -> its module: what a user runs to decide (modes and engines on their own rows, the
# row path, a series' costs, the replay and its projections). The research instruments are the
# lab's (lab/cli.py: python -m lab), outside the wheel.
SUBCOMMANDS = {
    "engines": "jobs.benchmark.engines",
    "speculation": "jobs.benchmark.speculation",
    "rows": "jobs.benchmark.row_path",
    "series-edits": "jobs.benchmark.series_edits",
    "series-history": "jobs.benchmark.series_history",
    "replay": "jobs.benchmark.replay",
    "speculators": "jobs.benchmark.speculators",
    "gpu-check": "jobs.benchmark.gpu_check",
}


def parser(
    prog: str = "python -m jobs.benchmark", commands: dict[str, str] | None = None, description: str = ""
) -> argparse.ArgumentParser:
    """The command line of `commands` (SUBCOMMANDS by default), each subcommand's options its module's."""
    import jobs.benchmark

    top = argparse.ArgumentParser(
        prog=prog,
        description=description or jobs.benchmark.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    subcommands = top.add_subparsers(dest="command", required=True, metavar="SUBCOMMAND")
    for name, module_name in (commands or SUBCOMMANDS).items():
        module = importlib.import_module(module_name)
        sub = subcommands.add_parser(
            name,
            help=module.__doc__.splitlines()[0],
            description=module.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_cli_args(sub)
        sub.add_argument(
            "--out", default=f"{name}.json", help="the report: JSON here, its markdown table beside it (.md)"
        )
        sub.set_defaults(module=module_name)
    return top


def main(
    argv=None, prog: str = "python -m jobs.benchmark", commands: dict[str, str] | None = None, description: str = ""
) -> dict:
    from jobs.benchmark.report import write

    args = parser(prog, commands, description).parse_args(argv)
    module = importlib.import_module(args.module)
    report = module.run(args)
    return write(report, args.out, module.markdown(report))


def cli(argv=None) -> None:
    main(argv, prog="ngrammys bench")
