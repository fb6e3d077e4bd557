"""The vLLM engine: vLLM's `LLM` runs the model; our drafter, if any, is its proposer.

The engine runs inside the process that builds it (VLLM_ENABLE_V1_MULTIPROCESSING=0): on a CPU
that is faster than vLLM's separate engine and worker processes and starts in seconds
(docs/measurements/defaults.md, "Figures behind the defaults"), and it lets the proposer take the
drafter tables by reference (one read-only copy in Ray's object store per node). One engine per Ray actor, kept full
across the actor's batches
(feeder.py). With tensor parallelism (vllm.tensor_parallel_size) the
ranks are worker processes of the actor, each with its own copy of the drafter.

Statistics: vLLM's per-request speculative metrics (`per_request_spec_decode_metrics`) give the
accepted-length histogram of the steps that verified a draft; the proposer gives the steps the
request took and which strategy proposed each draft; judging each draft against the tokens the
request emitted gives the strategies' accepted tokens. Greedy acceptance probabilities are 0 or
1; when sampling, vLLM does not expose them, so the realised acceptances stand in (α stays an
unbiased estimate).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from drafters.base import NO_DRAFT
from pipeline.loading.drafters import DrafterTables, make_batch_drafter
from pipeline.config import CPU_MAX_NUM_SEQS, Config, ConfigError, DraftingConfig
from pipeline.config.drafter_kinds import VLLM_METHODS
from pipeline.engines.base import (
    EngineFailed,
    EngineHung,
    EngineSteps,
    Failed,
    Request,
    RequestError,
    Result,
    budget,
    cut_at_stop,
)
from pipeline.engines.vllm.compat import (
    check_worker,
    install,
    install_keyed_draws,
    llvmlite_set_aside,
    prepare_environment,
    uninstall_keyed_draws,
)
from pipeline.engines.vllm.feeder import EngineFeeder
from pipeline.engines.vllm.versions import check_vllm_version, runs_speculator
from pipeline.engines.vllm.methods import (
    longest_draft,
    vllm_arguments,
    write_bigram_table,
)
from pipeline.engines.vllm.request_params import vllm_params, vllm_sampling
from pipeline.engines.vllm.proposer import (
    PREDICTION,
    Proposal,
    Tracked,
    attach_drafter,
    measured_step_cost,
    take_tracked,
)
from pipeline.loading.model import dtype_name, load_tokenizer
from pipeline.engines.stats import RequestStats

logger = logging.getLogger(__name__)


def set_vllm_environment(config: Config) -> None:
    """vLLM reads these from the environment when the engine starts: set before that."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine runs in this process
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    # vLLM's n-gram method runs numba's parallel loops; numba's default (OpenMP) threads spin after
    # each loop and slow the torch work of the whole process (docs/measurements/defaults.md, "Figures behind
    # the defaults"). Its own work queue blocks.
    os.environ.setdefault("NUMBA_THREADING_LAYER", "workqueue")
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(config.vllm.cpu_kv_cache_gib)
    # On a CPU, vLLM binds its threads to cores and keeps one core for a scheduler process that
    # does not exist in-process: bind to this process's cores (model.num_threads of them, if set),
    # an equal share to each tensor-parallel rank ("0,1|2,3").
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cpu_binding(config)
    os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
    compile_nothing_when_eager(config)
    prepare_environment()  # the V1 model runner, and the environment read anew (compat.py)


def compile_nothing_when_eager(config: Config) -> None:
    """An eager engine's process runs every torch.compile'd function eagerly; a compiled one's as compiled.

    vLLM 0.32 compiles two sampler helpers (log-probability ranks, a random sample) whatever
    enforce_eager says: on a CPU each costs an inductor C++ build of ~10 s on its first use in a
    process (docs/measurements/vllm-engine.md). The stance is the process's, as the environment is.
    """
    import torch

    torch.compiler.set_stance("force_eager" if eager(config) else "default")


def cpu_binding(config: Config) -> str:
    cores = sorted(os.sched_getaffinity(0))
    if config.model.num_threads:
        cores = cores[: config.model.num_threads]
    ranks = config.vllm.tensor_parallel_size
    if len(cores) < ranks:
        raise ConfigError(
            f"vllm.tensor_parallel_size: {ranks} ranks on a CPU need as many cores; this actor has "
            f"{len(cores)} (give it more CPUs, ray.num_cpus_per_actor or the placement group's bundles)"
        )
    share = len(cores) // ranks
    return "|".join(",".join(map(str, cores[rank * share : (rank + 1) * share])) for rank in range(ranks))


def max_num_seqs(config: Config) -> int | None:
    """vllm.max_num_seqs, or for 0: vLLM's own default on a GPU (None), CPU_MAX_NUM_SEQS on a CPU."""
    import torch

    if config.vllm.max_num_seqs:
        return config.vllm.max_num_seqs
    return None if torch.cuda.is_available() else CPU_MAX_NUM_SEQS


def eager(config: Config) -> bool:
    """Whether vLLM runs eagerly (vllm.execution; auto: eager on a CPU, compiled on a GPU)."""
    if config.vllm.execution == "auto":
        import torch

        return not torch.cuda.is_available()
    return config.vllm.execution == "eager"


class VllmEngine:
    name = "vllm"

    def __init__(self, config: Config, model_dir: str, tables: DrafterTables | None = None):
        check_vllm_version()  # a vLLM this package does not support fails here, naming the supported ones
        set_vllm_environment(config)
        self.config = config
        decoder = config.drafting
        self.drafts = decoder.drafter != "none" and decoder.w > 0
        # Ours run as vLLM's proposer (0.32) or speculator (0.34); vLLM's own methods as vLLM has them.
        self.ours = self.drafts and decoder.drafter not in VLLM_METHODS
        # On 0.34 ours drafts on the device inside vLLM's model runner: nothing of it runs here.
        self.hosted = self.ours and not runs_speculator()
        self.num_speculative_tokens = longest_draft(config, self.ours)  # vLLM's, fixed from the start
        # The model's bigram table, where the device speculator reads it as vLLM starts (removed at close).
        self.table_dir = Path(tempfile.mkdtemp(prefix="ngrammys-tables-")) if self.ours and not self.hosted else None
        if self.table_dir is not None:
            write_bigram_table(tables, self.table_dir)
        self.tokenizer = load_tokenizer(model_dir, config.model)
        self.sampling = vllm_sampling()
        self.adapters: dict = {}  # LoRA adapter -> its LoRARequest (vLLM's ids count from 1)
        self.adapters_lock = threading.Lock()
        # One thread runs every vLLM call and keeps the engine fed (feeder.py).
        try:
            self.feeder = EngineFeeder(
                lambda: self.start(model_dir), self.finished if self.hosted else None, config.engine.hang_timeout_s
            )
        except BaseException:
            self.remove_tables()  # an engine that never started is never closed
            raise
        self.max_model_len = self.feeder.llm.llm_engine.model_config.max_model_len
        # Whether vLLM's sampling, on every worker, is now exact with drafts (cpu_sampling.py: vLLM
        # 0.32's CPU rejection sampler). If not, no request drafts in a step that runs a sampled one.
        self.exact_sampling = not self.drafts or runs_speculator() or all(self.collective_rpc(check_worker))
        if not runs_speculator():
            # Sampled rows drawn with noise keyed by (seed, position), drafted or not (seeded_sampling.py;
            # on vLLM 0.34 the keyed-draw processor draws them: v2/keyed_draws.py, named by methods.vllm_arguments).
            self.keyed_draws(True)
        if not self.exact_sampling:
            logger.warning(
                "vLLM's rejection sampler on this platform does not spread the sampling settings over "
                "draft positions exactly (pipeline/engines/vllm/cpu_sampling.py): no request drafts "
                "in a step that runs a sampled one%s",
                "" if self.ours else f"; with {decoder.drafter} they fail",
            )
        if self.hosted:
            self.set_decoder(decoder, tables)

    def start(self, model_dir: str):
        from vllm import LLM  # after the environment is set

        arguments = vllm_arguments(self.config, self.num_speculative_tokens, self.drafts, self.ours, self.table_dir)
        if not runs_speculator():
            install()  # vLLM 0.32's CPU sampling corrected for the workers this starts (cpu_sampling.py)
        with llvmlite_set_aside():
            return self._llm(LLM, model_dir, arguments)

    def _llm(self, LLM, model_dir: str, arguments: dict):
        config = self.config
        return LLM(
            model=model_dir,
            tokenizer=model_dir,
            dtype=dtype_name(config.model),
            seed=0,
            trust_remote_code=config.model.trust_remote_code,
            max_model_len=config.vllm.max_model_len or None,
            max_num_seqs=max_num_seqs(config),
            max_num_batched_tokens=config.vllm.max_num_batched_tokens or None,
            enforce_eager=eager(config),
            gpu_memory_utilization=config.vllm.gpu_memory_utilization,
            speculative_config=arguments.get("speculative_config"),
            tensor_parallel_size=config.vllm.tensor_parallel_size,
            # Ranks beyond one are worker processes of this actor, on its node.
            distributed_executor_backend="mp" if config.vllm.tensor_parallel_size > 1 else None,
            per_request_spec_decode_metrics="detailed" if self.drafts else "none",
            disable_log_stats=not config.vllm.request_metrics,
            **{name: value for name, value in arguments.items() if name != "speculative_config"},
            **config.vllm.engine_args,
        )

    def set_decoder(self, decoder: DraftingConfig, tables: DrafterTables | None = None) -> None:
        """Hands the proposer the drafter `drafting` describes. vLLM fixes the longest draft when it
        starts: another drafter can be swapped in with drafts of at most that many tokens."""
        assert self.hosted and decoder.drafter not in VLLM_METHODS and 1 <= decoder.w <= self.num_speculative_tokens, (
            f"the engine was started for drafts of up to {self.num_speculative_tokens} tokens, not {decoder.w}"
        )
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        drafter = make_batch_drafter(
            decoder,
            tables or DrafterTables(),
            pad,
            len(self.tokenizer),
            self.feeder.llm.llm_engine.model_config.get_vocab_size(),
        )
        longest = min(max(decoder.w, self.config.drafting.prediction_w), self.num_speculative_tokens)
        self.collective_rpc(attach_drafter, (drafter, decoder.w, decoder.auto_w, self.exact_sampling, longest))
        self.config = dataclasses.replace(self.config, drafting=decoder)

    def keyed_draws(self, on: bool) -> None:
        """Sampled rows drawn with keyed noise (on, the engine's way), or with vLLM's own draws and
        rejection sampler (off: the benchmark's comparison, lab/sampling.py). vLLM 0.32 only:
        they live in model runner V1's sampler."""
        if runs_speculator():
            raise RuntimeError("the keyed draws run on vLLM 0.32's model runner V1 only, not on vLLM 0.34")
        self.collective_rpc(install_keyed_draws if on else uninstall_keyed_draws)

    def collective_rpc(self, function, args: tuple = ()) -> list:
        """vLLM's LLM.collective_rpc, run on the engine thread between two steps."""
        llm = self.feeder.llm
        return self.feeder.call(lambda: llm.collective_rpc(function, args=args))

    def finished(self, outputs: list) -> dict[str, Tracked]:
        """On the engine thread, as requests end: what the proposer tracked of them (and the
        drafter learns their outputs)."""
        generated = {o.request_id: list(o.outputs[0].token_ids) for o in outputs}
        return self.feeder.llm.collective_rpc(take_tracked, args=(generated,))[0]

    def columns(self) -> dict:
        decoder = self.config.drafting
        return {
            "engine": self.name,
            "drafter": decoder.drafter if self.drafts else "none",
            "k": 1,
            "w": decoder.w if self.drafts else 0,
            "auto_k": False,
            "auto_w": decoder.auto_w and self.drafts,
            "verify": "batch",
            "lenience": 1.0,
        }

    def steps(self) -> EngineSteps:
        if self.feeder is None:
            return EngineSteps()
        return dataclasses.replace(self.feeder.steps(), step_cost=self.measured_step_cost())

    def measured_step_cost(self) -> tuple[float, float] | None:
        """What our proposer's budget has measured a step to cost (a, b); None without our proposer
        or with an engine that has failed (its steps are reported without it)."""
        if not self.hosted:
            return None
        try:
            return self.collective_rpc(measured_step_cost)[0]
        except Exception:  # noqa: BLE001 - a failed engine's steps are still reported
            return None

    def close(self) -> None:
        """Stops the engine thread, which shuts the engine down (its worker processes with it), and
        lets the engine go (a hung one's thread is left to its step)."""
        self.feeder.close()
        if not isinstance(self.feeder.failure, EngineHung):
            self.feeder.thread.join()
        self.remove_tables()
        # vLLM's LLM (weights, KV cache) is the feeder's: dropped with it, even where something keeps
        # this object (a library that keeps an import error's traceback keeps the frame that built it).
        self.feeder = None

    def remove_tables(self) -> None:
        if self.table_dir is not None:
            shutil.rmtree(self.table_dir, ignore_errors=True)

    def generate(self, requests: Sequence[Request], run=None) -> list[Result | Failed]:
        """Any thread may call it, several at once: their requests run together in the one engine.
        `run(prompts, params) -> (vLLM's outputs, tracked by request id)` runs them instead of the
        engine's feeder (the feeding benchmark's vLLM LLM.generate over a whole corpus)."""
        if self.feeder is None:
            raise EngineFailed("the vLLM engine was closed after a failure")
        run = run or self.feeder.generate
        results: list[Result | Failed | None] = [None] * len(requests)
        runnable, prompts, params = [], [], []
        for index, request in enumerate(requests):
            try:
                self.check_sampling(request)
                params.append(vllm_params(request, budget(request, self.max_model_len)))
            except RequestError as error:
                results[index] = Failed(request.request_id, str(error))
                continue
            runnable.append(index)
            prompts.append({"prompt_token_ids": list(request.prompt_ids)})
            if request.adapter is not None:
                prompts[-1]["lora_request"] = self.adapter(request.adapter)
        started = time.perf_counter()
        outputs, tracked = run(prompts, params)
        wall = time.perf_counter() - started
        for index, output, settings in zip(runnable, outputs, params):
            if isinstance(output, Exception):  # vLLM refused the request: it fails alone
                results[index] = Failed(
                    requests[index].request_id, f"request {requests[index].request_id!r}: vLLM refused it: {output}"
                )
            else:
                results[index] = self.result(requests[index], output, tracked.get(output.request_id), wall, settings)
        return results

    def adapter(self, path: str):
        """vLLM's LoRARequest for an adapter's directory, the same one each time it is named."""
        from vllm.lora.request import LoRARequest

        with self.adapters_lock:
            if path not in self.adapters:
                self.adapters[path] = LoRARequest(lora_name=path, lora_int_id=len(self.adapters) + 1, lora_path=path)
            return self.adapters[path]

    def check_sampling(self, request: Request) -> None:
        """A sampled request with vLLM's own drafting where its rejection sampler is not exact fails."""
        if not (self.exact_sampling or self.ours or request.sampling.greedy):
            raise RequestError(
                f"request {request.request_id!r}: sampling (temperature "
                f"{request.sampling.temperature}) with {self.config.drafting.drafter} is not exact on "
                f"this platform's vLLM (docs/vllm-cpu-sampling.md); use one of our drafters (sampled rows "
                f"then run without drafts), drafting.drafter=none, or greedy decoding"
            )

    def result(self, request: Request, output, tracked: Tracked | None, wall: float, params) -> Result:
        """vLLM's output for `request`, run with `params` (vLLM's SamplingParams), as our Result."""
        completion = output.outputs[0]
        token_ids = list(completion.token_ids)
        if completion.finish_reason == "length":
            finish = "length"
        else:  # "stop": an EOS (stop_reason None, or a stop token id) or a stop string
            finish = "stop" if isinstance(completion.stop_reason, str) else "eos"
        settings = request.engine_sampling or {}
        text = cut_at_stop(
            self.tokenizer.decode(token_ids, skip_special_tokens=settings.get("skip_special_tokens", True)),
            request.stop,
            settings.get("include_stop_str_in_output", False),
        )
        decoder = self.config.drafting
        stats = request_stats(
            len(request.prompt_ids),
            token_ids,
            getattr(completion, "spec_decode_metrics", None),
            tracked,
            decoder.w if self.drafts else 0,
            decoder.drafter,
        )
        stats.finish_reason = finish
        metrics = output.metrics
        stats.time_taken_llm = (metrics.last_token_ts - metrics.scheduled_ts) if metrics is not None else wall
        record = dataclasses.asdict(metrics) if dataclasses.is_dataclass(metrics) else None
        return Result(
            request.request_id,
            token_ids,
            text,
            finish,
            stats,
            record,
            logprob_rows(completion.logprobs),
            logprob_rows(output.prompt_logprobs),
            repr(params),
        )


def logprob_rows(positions) -> list | None:
    """vLLM's log probabilities (per position, None or {token id: Logprob}) as ray.data.llm's rows
    hold them: {token id: {"logprob", "rank", "decoded_token"}} per position."""
    if positions is None:
        return None
    return [
        None
        if position is None
        else {
            int(token): {"logprob": float(p.logprob), "rank": p.rank, "decoded_token": p.decoded_token}
            for token, p in position.items()
        }
        for position in positions
    ]


def request_stats(
    prompt_length: int, token_ids: list[int], metrics, tracked: Tracked | None, w: int, method: str = NO_DRAFT
) -> RequestStats:
    """Our per-request columns from vLLM's metrics (metrics: RequestSpecDecodeMetrics or None)
    and what our proposer tracked (None for plain vLLM and vLLM's own `method`)."""
    histogram = [0] * (w + 1)
    drafted = checked = 0
    if metrics is not None:
        histogram = list(metrics.histogram) + [0] * (w + 1 - len(metrics.histogram))
        while len(histogram) > w + 1 and not histogram[-1]:  # sized for vLLM's longest draft (a prediction's)
            histogram.pop()
        drafted = metrics.num_draft_tokens
        checked = sum(a + (1 if a < d else 0) for a, d in zip(metrics.per_step_accepted, metrics.per_step_drafted))
    accepted = sum(j * count for j, count in enumerate(histogram))
    # Every step emits its accepted drafts plus one token: without the proposer's count (plain
    # vLLM and its own methods), the steps follow from the emitted tokens. vLLM's metrics count a
    # final step's accepted drafts in full even where the request's end (max_tokens, EOS) cut them,
    # so for vLLM's own methods this undercounts steps by those tokens: their tokens per call read
    # high (docs/measurements/vllm-engine.md, "Against vLLM's own speculation").
    steps = tracked.steps if tracked is not None else max(len(token_ids) - accepted, 1)
    histogram[0] += max(steps - sum(histogram), 0)  # steps that verified no draft accepted none
    stats = RequestStats(
        num_input_tokens=prompt_length,
        num_generated_tokens=len(token_ids),
        num_target_calls=steps,
        num_verified_tokens=steps + drafted,
        accepted_length_histogram=histogram,
        accepted_rank_histogram=[sum(histogram[1:])],
        num_checked_draft_tokens=checked,
        sum_acceptance_probability=float(accepted),
    )
    if tracked is not None:
        stats.draft_seconds = tracked.draft_seconds
        stats.num_drafter_failed_steps = tracked.failed_steps
        attribute_strategies(stats, tracked.proposals, token_ids, steps)
        return stats
    drafted_steps = len(metrics.per_step_drafted) if metrics is not None else 0
    stats.strategy_rows = {
        name: count for name, count in ((method, drafted_steps), (NO_DRAFT, steps - drafted_steps)) if count
    }
    if accepted:
        stats.strategy_wins, stats.strategy_accepted_tokens = {method: sum(histogram[1:])}, {method: accepted}
    return stats


def attribute_strategies(stats: RequestStats, proposals: list[Proposal], token_ids: list[int], steps: int) -> None:
    """Rows, wins and accepted tokens per strategy: each verified draft judged against the tokens
    the request emitted (a draft accepts exactly its common prefix with them). A draft proposed
    at the request's last step was never verified and is not counted."""
    verified = [p for p in proposals if p.position < len(token_ids)]
    for proposal in verified:
        actual = token_ids[proposal.position : proposal.position + len(proposal.tokens)]
        accepted = next((i for i, (a, b) in enumerate(zip(proposal.tokens, actual)) if a != b), len(actual))
        stats.strategy_rows[proposal.strategy] = stats.strategy_rows.get(proposal.strategy, 0) + 1
        if proposal.strategy == PREDICTION:
            stats.accepted_prediction_tokens += accepted
            stats.rejected_prediction_tokens += len(proposal.tokens) - accepted
        if accepted:
            stats.strategy_wins[proposal.strategy] = stats.strategy_wins.get(proposal.strategy, 0) + 1
            stats.strategy_accepted_tokens[proposal.strategy] = (
                stats.strategy_accepted_tokens.get(proposal.strategy, 0) + accepted
            )
    if steps > len(verified):
        stats.strategy_rows[NO_DRAFT] = steps - len(verified)
