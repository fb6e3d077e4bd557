"""Side-by-side benchmarks of our decoding against the baselines a user would otherwise run.

    python -m jobs.benchmark [MODE] --dataset humaneval|gsm8k|sharegpt|PATH.jsonl --limit N ...

One module per mode; every engine of ours is built through pipeline/engines/build.py, as a job
builds it, so the benchmark measures what users run:
- quality (the default; jobs/benchmark/quality.py): every method on every prompt, one request at
  a time, against transformers' generate; speed-ups, tokens per call, identity;
- --grid (grid.py): the N-Grammys paper's k x w figures for one drafter;
- --throughput (throughput.py): batched generation on the transformers engine per batch size;
- --throughput --engine vllm (comparison.py): vLLM plain, its own ngram and suffix methods and ours
  on vLLM, side by side in rounds of new prompts;
- --sampling (sampling.py): sampled rows of vLLM plain, its own methods and ours checked against
  the model's distribution (log-likelihood, and a uniformity test of every token);
- --pipeline (pipeline_overhead.py): the Ray job against its stage in-process;
- --feeding (feeding.py): how full the engine is kept: our job end to end against vLLM's own
  LLM.generate over all prompts at once and against ray.data.llm's processor;
- --occupancy RUN_DIR (occupancy.py): the slots each feeding design keeps busy at any engine size,
  simulated with a run's real output lengths;
- --replay RUN_DIR (replay.py): a greedy run's outputs through our drafter, vLLM's suffix and n-gram
  drafters at any batch size, no model (tokens and draft tokens per step, drafting time, memory),
  and a roofline projection of tokens/s on a named GPU.
Speed-ups are ratios within one run, the methods taking turns so that drifts fall on all alike.
"""
from __future__ import annotations


def main(argv=None) -> dict:
    """Runs the mode the options pick (jobs/benchmark/cli.py). The modes are imported here, not
    above, so that `python -m jobs.benchmark` can set Ray's environment before anything imports Ray."""
    from jobs.benchmark.cli import main as run

    return run(argv)
