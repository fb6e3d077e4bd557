"""The laboratory: the research instruments behind docs/measurements/, apart from the product and
outside its wheel. They import the product (pipeline, drafters, jobs); nothing in the product imports them.

    python -m lab SUBCOMMAND [options]     (each subcommand's --help lists its options)

Each writes its report as JSON (--out) and a markdown table beside it, as `ngrammys bench` does
(jobs/benchmark/cli.py runs both):
- quality: every method on every prompt, one request at a time, against transformers' generate;
- grid: the N-Grammys paper's k x w figures for one drafter;
- throughput: batched generation on the transformers engine per batch size;
- sampling: sampled rows of vLLM plain, its own methods and ours checked against the model's
  distribution (log-likelihood, and a uniformity test of every token);
- edits: an edited corpus's rows drafted from their last outputs, method by method in one process;
- scale: a series over N documents run once, then again with a few edited;
- restarts: an engine that fails mid-run, built again in place;
- pipeline: the Ray job against its stage in-process;
- feeding: how full the engine is kept: our job end to end against vLLM's own LLM.generate over
  all prompts at once and against ray.data.llm's processor;
- occupancy RUN_DIR: the slots each feeding design keeps busy at any engine size, simulated;
- gpu-step, host-step, host-speed, sampling-draw: one engine step's parts, measured where they run.
"""
