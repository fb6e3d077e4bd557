"""The lab's command line, `python -m lab SUBCOMMAND [options]`: the benchmark's (jobs/benchmark/cli.py)
over the lab's instruments."""

from __future__ import annotations

# subcommand -> its module
SUBCOMMANDS = {
    "quality": "lab.quality",
    "grid": "lab.grid",
    "throughput": "lab.throughput",
    "sampling": "lab.sampling",
    "edits": "lab.edits",
    "scale": "lab.scale",
    "restarts": "lab.restarts",
    "pipeline": "lab.pipeline_overhead",
    "feeding": "lab.feeding",
    "occupancy": "lab.occupancy",
    "gpu-step": "lab.gpu_step",
    "host-step": "lab.host_step",
    "host-speed": "lab.host_speed",
    "sampling-draw": "lab.sampling_draw",
}


def parser():
    import lab
    from jobs.benchmark import cli

    return cli.parser("python -m lab", SUBCOMMANDS, lab.__doc__)


def main(argv=None) -> dict:
    import lab
    from jobs.benchmark import cli

    return cli.main(argv, "python -m lab", SUBCOMMANDS, lab.__doc__)
