"""The benchmark's command line, `python -m jobs.benchmark SUBCOMMAND [options]`, as `vllm bench`
has it: one module per subcommand, each with its own options (`add_cli_args`), its run (`run`,
returning the report) and its table (`markdown`); one writer for every report (report.py)."""

from __future__ import annotations

import argparse
import importlib

# subcommand -> its module
SUBCOMMANDS = {
    "quality": "jobs.benchmark.quality",
    "grid": "jobs.benchmark.grid",
    "throughput": "jobs.benchmark.throughput",
    "engines": "jobs.benchmark.engines",
    "sampling": "jobs.benchmark.sampling",
    "edits": "jobs.benchmark.edits",
    "series-edits": "jobs.benchmark.series_edits",
    "series-history": "jobs.benchmark.series_history",
    "scale": "jobs.benchmark.scale",
    "rows": "jobs.benchmark.row_path",
    "speculation": "jobs.benchmark.speculation",
    "restarts": "jobs.benchmark.restarts",
    "pipeline": "jobs.benchmark.pipeline_overhead",
    "feeding": "jobs.benchmark.feeding",
    "occupancy": "jobs.benchmark.occupancy",
    "replay": "jobs.benchmark.replay",
    "speculators": "jobs.benchmark.speculators",
    "gpu-check": "jobs.benchmark.gpu_check",
    "gpu-step": "jobs.benchmark.micro.gpu_step",
    "host-step": "jobs.benchmark.micro.host_step",
    "host-speed": "jobs.benchmark.micro.host_speed",
    "sampling-draw": "jobs.benchmark.micro.sampling_draw",
}


def parser(prog: str = "python -m jobs.benchmark") -> argparse.ArgumentParser:
    import jobs.benchmark

    top = argparse.ArgumentParser(
        prog=prog, description=jobs.benchmark.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    subcommands = top.add_subparsers(dest="command", required=True, metavar="SUBCOMMAND")
    for name, module_name in SUBCOMMANDS.items():
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


def main(argv=None, prog: str = "python -m jobs.benchmark") -> dict:
    from jobs.benchmark.report import write

    args = parser(prog).parse_args(argv)
    module = importlib.import_module(args.module)
    report = module.run(args)
    return write(report, args.out, module.markdown(report))


def cli(argv=None) -> None:
    main(argv, prog="ngrammys bench")
