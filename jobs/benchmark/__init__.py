"""Side-by-side benchmarks of our decoding against the baselines a user would otherwise run.

    python -m jobs.benchmark SUBCOMMAND [options]     (each subcommand's --help lists its options)

Every engine of ours is built through pipeline/engines/build.py, as a job builds it, so the
benchmark measures what users run; speed-ups are ratios within one run, the methods taking turns
so that drifts fall on all alike. Each writes its report as JSON (--out) and a markdown table beside it.
- quality: every method on every prompt, one request at a time, against transformers' generate;
- grid: the N-Grammys paper's k x w figures for one drafter;
- throughput: batched generation on the transformers engine per batch size;
- engines: vLLM plain, its own ngram and suffix methods and ours on vLLM, side by side in rounds
  of new prompts;
- sampling: sampled rows of vLLM plain, its own methods and ours checked against the model's
  distribution (log-likelihood, and a uniformity test of every token);
- pipeline: the Ray job against its stage in-process;
- feeding: how full the engine is kept: our job end to end against vLLM's own LLM.generate over
  all prompts at once and against ray.data.llm's processor;
- occupancy RUN_DIR: the slots each feeding design keeps busy at any engine size, simulated with a
  run's real output lengths;
- replay RUN_DIR: a greedy run's outputs through our drafter, vLLM's suffix and n-gram drafters at
  any batch size, no model, and a projection of tokens/s on a GPU or this CPU;
- gpu-step, host-step, host-speed: one engine step's parts, measured where they run (micro/).
"""

from __future__ import annotations


def main(argv=None) -> dict:
    """Runs the subcommand argv names (jobs/benchmark/cli.py)."""
    from jobs.benchmark.cli import main as run

    return run(argv)
