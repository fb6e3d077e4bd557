"""Side-by-side benchmarks of our decoding against the baselines a user would otherwise run.

    python -m jobs.benchmark SUBCOMMAND [options]     (each subcommand's --help lists its options)

Every engine of ours is built through pipeline/engines/build.py, as a job builds it, so the
benchmark measures what users run; speed-ups are ratios within one run, the methods taking turns
so that drifts fall on all alike. Each writes its report as JSON (--out) and a markdown table beside it.
- engines: vLLM plain, its own ngram and suffix methods and ours on vLLM, side by side in rounds
  of new prompts;
- speculation: the job in drafting.speculation auto, on and off, side by side on the same rows;
- rows: the job's own cost per row against vLLM's LLM.generate;
- series-edits: a series' edited rerun through the job, against fresh runs of vLLM's suffix and plain;
- series-history: what a series' rerun costs after a long history (planning, the store, the rerun);
- replay RUN_DIR: a greedy run's outputs through our drafter, vLLM's suffix and n-gram drafters at
  any batch size, no model, and a projection of tokens/s on a GPU or this CPU;
- speculators: recorded answers through vLLM >= 0.34's own speculators, and their projection;
- gpu-check: our speculator end to end on a GPU with vLLM >= 0.34, against its suffix and plain.

The research instruments behind docs/measurements/ are the lab's (`python -m lab`, outside the wheel).
"""

from __future__ import annotations


def main(argv=None) -> dict:
    """Runs the subcommand argv names (jobs/benchmark/cli.py)."""
    from jobs.benchmark.cli import main as run

    return run(argv)
