"""The vLLM engine: vLLM's `LLM` runs the model; our drafter, if any, is its proposer.

The engine runs inside the process that builds it (VLLM_ENABLE_V1_MULTIPROCESSING=0): on this
2-core CPU that is 1.4-1.5x faster than vLLM's separate engine and worker processes and starts in
seconds, and it lets the proposer take the drafter tables by reference (one read-only copy in
Ray's object store per node). One engine per Ray actor; tensor parallelism is not offered.

Statistics: vLLM's per-request speculative metrics (`per_request_spec_decode_metrics`) give the
accepted-length histogram of the steps that verified a draft; the proposer gives the steps the
request took and which strategy proposed each draft; judging each draft against the tokens the
request emitted gives the strategies' accepted tokens. Greedy acceptance probabilities are 0 or
1; when sampling, vLLM does not expose them, so the realised acceptances stand in (α stays an
unbiased estimate).
"""
from __future__ import annotations

import dataclasses
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

from drafters.registry import DrafterTables, make_drafter
from pipeline.config import Config, DecoderConfig
from pipeline.drafter_kinds import VLLM_METHODS
from pipeline.engines.base import (
    Failed,
    Request,
    RequestError,
    Result,
    budget,
    cut_at_stop,
)
from pipeline.engines.vllm.proposer import (
    Proposal,
    Tracked,
    attach_drafter,
    take_tracked,
)
from pipeline.model_loading import load_tokenizer
from pipeline.stats import RequestStats

PROPOSER = "pipeline.engines.vllm.proposer.NgrammysProposer"
NO_DRAFT = "none"


def set_vllm_environment(config: Config) -> None:
    """vLLM reads these from the environment when the engine starts: set before that."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine runs in this process
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    # vLLM's n-gram method runs numba's parallel loops; numba's default (OpenMP) threads spin after
    # each loop and, here, slowed the torch work of the whole process 4-5x. Its own work queue blocks.
    os.environ.setdefault("NUMBA_THREADING_LAYER", "workqueue")
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(config.engine.cpu_kv_cache_gib)
    # On a CPU, vLLM binds its threads to cores and keeps one core for a scheduler process that
    # does not exist in-process: bind to this process's cores (model.num_threads of them, if set).
    cores = sorted(os.sched_getaffinity(0))
    if config.model.num_threads:
        cores = cores[:config.model.num_threads]
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, cores))
    os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"


def eager(config: Config) -> bool:
    """Whether vLLM runs eagerly (engine.execution; auto: eager on a CPU, compiled on a GPU)."""
    if config.engine.execution == "auto":
        import torch

        return not torch.cuda.is_available()
    return config.engine.execution == "eager"


class VllmEngine:
    name = "vllm"

    def __init__(self, config: Config, model_dir: str, tables: DrafterTables | None = None):
        set_vllm_environment(config)
        # Every vLLM call runs on this one thread. On a CPU, vLLM binds the OpenMP threads of the
        # thread that starts it to cores; Ray Data calls a stage from other threads, whose OpenMP
        # threads are not bound: measured here, 71 tok/s against 95 on the starting thread.
        self.thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vllm-engine")
        self.thread.submit(self.start, config, model_dir, tables).result()

    def start(self, config: Config, model_dir: str, tables: DrafterTables | None) -> None:
        from vllm import LLM  # after the environment is set

        decoder = config.decoder
        self.config = config
        self.tokenizer = load_tokenizer(model_dir, config.model)
        self.drafts = decoder.drafter != "none" and decoder.w > 0
        # Ours run as vLLM's proposer; vLLM's own methods (vllm_ngram, vllm_suffix) run as vLLM has them.
        self.ours = self.drafts and decoder.drafter not in VLLM_METHODS
        speculative = None
        if self.drafts:
            speculative = {"method": VLLM_METHODS.get(decoder.drafter, "custom_class"), "num_speculative_tokens": decoder.w}
            if self.ours:
                speculative["model"] = PROPOSER
            elif decoder.drafter == "vllm_ngram":
                speculative.update(prompt_lookup_min=decoder.ngram_min_q, prompt_lookup_max=decoder.ngram_max_q)
        self.llm = LLM(model=model_dir, tokenizer=model_dir, dtype=config.model.dtype, seed=0,
                       trust_remote_code=config.model.trust_remote_code,
                       max_model_len=config.engine.max_model_len or None,
                       max_num_seqs=decoder.max_batch_requests, enforce_eager=eager(config),
                       gpu_memory_utilization=config.engine.gpu_memory_utilization,
                       speculative_config=speculative,
                       per_request_spec_decode_metrics="detailed" if self.drafts else "none")
        self.max_model_len = self.llm.llm_engine.model_config.max_model_len
        self.max_w = decoder.w  # vLLM's num_speculative_tokens: fixed from here on
        if self.ours:
            self.attach(decoder, tables)

    def set_decoder(self, decoder: DecoderConfig, tables: DrafterTables | None = None) -> None:
        self.thread.submit(self.attach, decoder, tables).result()

    def attach(self, decoder: DecoderConfig, tables: DrafterTables | None = None) -> None:
        """Hands the proposer the drafter `decoder` describes. vLLM fixes the longest draft when it
        starts: another drafter can be swapped in with drafts of at most that many tokens."""
        assert self.ours and decoder.drafter not in VLLM_METHODS and 1 <= decoder.w <= self.max_w, (
            f"the engine was started for drafts of up to {self.max_w} tokens, not {decoder.w}")
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        drafter = make_drafter(decoder, tables or DrafterTables(), pad, None, len(self.tokenizer))
        self.llm.collective_rpc(attach_drafter, args=(drafter, decoder.w, decoder.ngram_max_q, decoder.auto_w))
        self.config = dataclasses.replace(self.config, decoder=decoder)

    def columns(self) -> dict:
        decoder = self.config.decoder
        return {"engine": self.name, "drafter": decoder.drafter if self.drafts else "none", "k": 1,
                "w": decoder.w if self.drafts else 0, "auto_k": False, "auto_w": decoder.auto_w and self.drafts,
                "verify": "batch", "lenience": 1.0}

    def generate(self, requests: Sequence[Request]) -> list[Result | Failed]:
        return self.thread.submit(self.generate_here, requests).result()

    def generate_here(self, requests: Sequence[Request]) -> list[Result | Failed]:
        from vllm import SamplingParams

        results: list[Result | Failed | None] = [None] * len(requests)
        runnable, prompts, params = [], [], []
        for index, request in enumerate(requests):
            try:
                max_tokens = budget(request, self.max_model_len)
            except RequestError as error:
                results[index] = Failed(request.request_id, str(error))
                continue
            sampling = request.sampling
            runnable.append(index)
            prompts.append({"prompt_token_ids": list(request.prompt_ids)})
            params.append(SamplingParams(max_tokens=max_tokens, temperature=sampling.temperature,
                                         top_k=sampling.top_k, top_p=sampling.top_p,
                                         seed=None if sampling.greedy else sampling.seed,
                                         stop=list(request.stop) or None, detokenize=bool(request.stop)))
        if runnable:
            started = time.perf_counter()
            outputs = self.llm.generate(prompts, params, use_tqdm=False)
            wall = time.perf_counter() - started
            tracked = {}
            if self.ours:
                generated = {o.request_id: list(o.outputs[0].token_ids) for o in outputs}
                tracked = self.llm.collective_rpc(take_tracked, args=(generated,))[0]
            for index, output in zip(runnable, outputs):
                results[index] = self.result(requests[index], output, tracked.get(output.request_id), wall)
        return results

    def result(self, request: Request, output, tracked: Tracked | None, wall: float) -> Result:
        completion = output.outputs[0]
        token_ids = list(completion.token_ids)
        if completion.finish_reason == "length":
            finish = "length"
        else:  # "stop": an EOS (stop_reason None, or a stop token id) or a stop string
            finish = "stop" if isinstance(completion.stop_reason, str) else "eos"
        text = cut_at_stop(self.tokenizer.decode(token_ids, skip_special_tokens=True), request.stop)
        decoder = self.config.decoder
        stats = request_stats(len(request.prompt_ids), token_ids, getattr(completion, "spec_decode_metrics", None),
                              tracked, decoder.w if self.drafts else 0, decoder.drafter)
        stats.finish_reason = finish
        metrics = output.metrics
        stats.total_seconds = (metrics.last_token_ts - metrics.scheduled_ts) if metrics is not None else wall
        return Result(request.request_id, token_ids, text, finish, stats)


def request_stats(prompt_length: int, token_ids: list[int], metrics, tracked: Tracked | None, w: int,
                  method: str = NO_DRAFT) -> RequestStats:
    """Our per-request columns from vLLM's metrics (metrics: RequestSpecDecodeMetrics or None)
    and what our proposer tracked (None for plain vLLM and vLLM's own `method`)."""
    histogram = [0] * (w + 1)
    drafted = checked = 0
    if metrics is not None:
        histogram = list(metrics.histogram) + [0] * (w + 1 - len(metrics.histogram))
        drafted = metrics.num_draft_tokens
        checked = sum(a + (1 if a < d else 0) for a, d in zip(metrics.per_step_accepted, metrics.per_step_drafted))
    accepted = sum(j * count for j, count in enumerate(histogram))
    # Every step emits its accepted drafts plus one token: without the proposer's count (plain
    # vLLM and its own methods), the steps follow from the emitted tokens. vLLM's metrics count a
    # final step's accepted drafts in full even where the request's end (max_tokens, EOS) cut them,
    # so for vLLM's own methods this undercounts steps by those tokens: their tokens per call read
    # high (HumanEval at B = 1, vllm_suffix: 2.70 reported where a replay of its drafts gives 2.51).
    steps = tracked.steps if tracked is not None else max(len(token_ids) - accepted, 1)
    histogram[0] += max(steps - sum(histogram), 0)  # steps that verified no draft accepted none
    stats = RequestStats(num_prompt_tokens=prompt_length, num_generated_tokens=len(token_ids),
                         num_target_calls=steps, num_verified_tokens=steps + drafted,
                         accepted_length_histogram=histogram, accepted_rank_histogram=[sum(histogram[1:])],
                         num_checked_draft_tokens=checked, sum_acceptance_probability=float(accepted))
    if tracked is not None:
        stats.draft_seconds = tracked.draft_seconds
        attribute_strategies(stats, tracked.proposals, token_ids, steps)
        return stats
    drafted_steps = len(metrics.per_step_drafted) if metrics is not None else 0
    stats.strategy_rows = {name: count for name, count in ((method, drafted_steps), (NO_DRAFT, steps - drafted_steps))
                           if count}
    if accepted:
        stats.strategy_wins, stats.strategy_accepted_tokens = {method: sum(histogram[1:])}, {method: accepted}
    return stats


def attribute_strategies(stats: RequestStats, proposals: list[Proposal], token_ids: list[int], steps: int) -> None:
    """Rows, wins and accepted tokens per strategy: each verified draft judged against the tokens
    the request emitted (a draft accepts exactly its common prefix with them). A draft proposed
    at the request's last step was never verified and is not counted."""
    verified = [p for p in proposals if p.position < len(token_ids)]
    for proposal in verified:
        actual = token_ids[proposal.position:proposal.position + len(proposal.tokens)]
        accepted = next((i for i, (a, b) in enumerate(zip(proposal.tokens, actual)) if a != b), len(actual))
        stats.strategy_rows[proposal.strategy] = stats.strategy_rows.get(proposal.strategy, 0) + 1
        if accepted:
            stats.strategy_wins[proposal.strategy] = stats.strategy_wins.get(proposal.strategy, 0) + 1
            stats.strategy_accepted_tokens[proposal.strategy] = (
                stats.strategy_accepted_tokens.get(proposal.strategy, 0) + accepted)
    if steps > len(verified):
        stats.strategy_rows[NO_DRAFT] = steps - len(verified)
