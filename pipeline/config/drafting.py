"""The `drafting` section: which drafter proposes drafts, how long, whether an actor drafts at all
(the speculation mode), and one subsection per drafter's own knobs. Drafting changes how fast a
row is generated, never its text (greedy rows are plain's; a sampled row is one text per seed)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pipeline.config.drafter_kinds import DRAFTER_KINDS
from pipeline.config.typed import ConfigError
from pipeline.config.typed import require as _require

# The largest k and w a `k: auto` / `w: auto` may choose (an engine may raise w's: the vLLM
# engine's drafts cost only their tokens, pipeline/engines/vllm/settings.py).
AUTO_MAX = {"k": 8, "w": 8}
# drafter draft_model's w when none is set: its draft length γ (a call of the draft model per token).
DRAFT_MODEL_W = 5


@dataclass(frozen=True)
class NgramConfig:
    # The longest context suffix the n-gram drafters match; they fall back to shorter ones down to
    # min_q. A 1-token match is right too rarely to pay for its verification on a CPU.
    max_q: int = 3
    min_q: int = 2


@dataclass(frozen=True)
class BigramConfig:
    # How many next tokens per vocabulary entry the model's bigram table keeps (an upper bound on
    # transformers.k).
    top_k: int = 32
    # What the model sees before token x when the table p(.|x) is computed. "assistant_header": the
    # chat template's assistant turn start (chat models); "bos": the BOS token; "none": x alone
    # (degenerate for most models: docs/measurements/defaults.md, "Figures behind the defaults").
    prefix: Literal["assistant_header", "bos", "none"] = "assistant_header"
    # Tokens in the table's build batch; bounds the memory of the one-off build.
    batch_size: int = 512

    def __post_init__(self):
        _require(self.top_k >= 1, "drafting.bigram.top_k", "an integer >= 1")
        _require(self.batch_size >= 1, "drafting.bigram.batch_size", "an integer >= 1")


@dataclass(frozen=True)
class RetrievalConfig:
    # REST: the longest context suffix from max_match tokens down to min_match that occurs in the
    # datastore; up to max_occurrences of its continuations; the max_nodes most frequent prefixes of
    # them (the paper's 64).
    max_match: int = 16
    min_match: int = 2
    max_occurrences: int = 5000
    max_nodes: int = 64

    def __post_init__(self):
        _require(
            1 <= self.min_match <= self.max_match,
            "drafting.retrieval.min_match",
            f"an integer from 1 to drafting.retrieval.max_match ({self.max_match})",
        )
        _require(self.max_occurrences >= 1, "drafting.retrieval.max_occurrences", "an integer >= 1")
        _require(self.max_nodes >= 1, "drafting.retrieval.max_nodes", "an integer >= 1")


@dataclass(frozen=True)
class SuffixConfig:
    # drafter "batch_suffix": outputs an actor keeps to draft from (tokens; past it the oldest
    # finished ones are dropped), and the least probability, by the acceptance model, that every
    # token of a draft so far is accepted: a draft stops where that falls below (under `w: auto` the
    # step budget may stop it sooner). 0.1 is batch_suffix's measured best against vLLM's suffix
    # decoding (more tokens per step for few more draft tokens: the replay,
    # docs/measurements/batched-drafter-and-replay.md).
    max_tokens: int = 262144
    min_probability: float = 0.1
    # Occurrences are found by the context's last drafting.ngram.max_q tokens, down to min_match
    # when no longer suffix occurs (1: a one-token match is judged by the acceptance model like any
    # other), then extended backwards up to max_match tokens; only those that repeat the most of the
    # context are drafted from.
    min_match: int = 1
    max_match: int = 24

    def __post_init__(self):
        _require(self.max_tokens >= 1, "drafting.suffix.max_tokens", "an integer >= 1")
        _require(0 < self.min_probability <= 1, "drafting.suffix.min_probability", "a number in (0, 1]")


@dataclass(frozen=True)
class DraftingConfig:
    """What every engine reads of drafting. The transformers engine's own settings (k, tree
    verification, draft models) are its section (TransformersConfig)."""

    # Which drafter proposes drafts; "none" is plain decoding. The names are
    # pipeline/config/drafter_kinds.py's (vllm_ngram, vllm_suffix: vLLM's own methods).
    drafter: str = "batch_suffix"
    # Tokens per draft row: a number (0: no drafts, plain decoding) or "auto": each step keeps only
    # the draft tokens that pay for what they cost the step, up to AUTO_MAX["w"], or the vLLM
    # engine's longer limit (pipeline/engines/vllm/settings.py); the step's cost is measured as the
    # engine runs. Unset: "auto", or DRAFT_MODEL_W with drafter draft_model (whose drafts cost a
    # call per token: it drafts a fixed length). Resolved at load: `w` is then the longest draft,
    # and `auto_w` (not a setting) says whether each step chooses up to it.
    w: int | Literal["auto"] | None = None
    auto_w: bool = field(default=False, metadata={"set_by": "drafting.w: auto"})
    # Whether an actor drafts: "on" runs the drafter, "off" plain decoding (vLLM at its best for the
    # platform: async scheduling on a GPU), "auto" the faster of them (and of vLLM's own
    # vllm_ngram_gpu on GPU actors), by the platform's rule where it is clear or the actor's work is
    # too short to measure, else measured on the actor's own rows and checked again as it goes
    # (pipeline/engines/speculation.py). The mode never changes a row. (YAML reads a bare on and
    # off as true and false: taken as "on" and "off".)
    speculation: Literal["auto", "on", "off"] | bool = "auto"
    # auto: the busy seconds of one measurement window; 0 sizes it from the engine's measured start
    # (pipeline/engines/speculation.py, Chooser.window_s).
    speculation_window_s: float = 0.0
    # A token datastore directory (python -m jobs.build_datastore) for drafter "rest"; with drafter
    # "mixed" it adds retrieved rows after the context n-gram's. Every actor maps the same files.
    datastore: str = ""
    # vLLM: the longest draft a row's `prediction` may give (a series' changed row drafts from its
    # last output): where a prediction holds, a step verifies up to this many of its tokens, the
    # step budget (w: auto) cutting them to what pays for itself at the measured step cost. vLLM
    # fixes its longest draft (num_speculative_tokens) at start: the larger of this and w where our
    # drafter runs. 0: predictions draft at most w tokens, as the drafter. 128 on every device:
    # through the job on a CPU, where a verified token costs 0.06-0.09 of a step, 128 beat 16 on the
    # line and field edits and tied on the paragraph edit, and on an H100 step by the replay
    # (docs/measurements/series-and-predictions.md, "Predicted outputs through the job").
    prediction_w: int = 128
    ngram: NgramConfig = field(default_factory=NgramConfig)
    bigram: BigramConfig = field(default_factory=BigramConfig)
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    suffix: SuffixConfig = field(default_factory=SuffixConfig)

    def __post_init__(self):
        if self.w is None:
            object.__setattr__(self, "w", DRAFT_MODEL_W if self.drafter == "draft_model" else "auto")
        object.__setattr__(self, "w", resolve_auto(self, "w", "drafting"))
        if isinstance(self.speculation, bool):
            object.__setattr__(self, "speculation", "on" if self.speculation else "off")
        if self.drafter not in DRAFTER_KINDS:
            hint = " ('suffix' is now 'batch_suffix': the same sources and acceptance model)" * (
                self.drafter == "suffix"
            )
            raise ConfigError(
                f"drafting.drafter: {self.drafter!r} is not allowed{hint}; choose one of "
                f"{', '.join(map(repr, DRAFTER_KINDS))}"
            )
        self.check_values()

    def check_values(self) -> None:
        _require(self.w >= 0, "drafting.w", "an integer >= 0 or 'auto'")
        _require(self.speculation_window_s >= 0, "drafting.speculation_window_s", "a number of seconds >= 0 (0: auto)")
        _require(
            isinstance(self.prediction_w, int) and self.prediction_w >= 0,
            "drafting.prediction_w",
            "an integer >= 0 (0: predictions draft at most drafting.w)",
        )
        ngram, suffix = self.ngram, self.suffix
        _require(ngram.max_q >= 1, "drafting.ngram.max_q", "an integer >= 1")
        _require(
            1 <= ngram.min_q <= ngram.max_q,
            "drafting.ngram.min_q",
            f"an integer from 1 to drafting.ngram.max_q ({ngram.max_q})",
        )
        _require(
            1 <= suffix.min_match <= ngram.max_q,
            "drafting.suffix.min_match",
            f"an integer from 1 to drafting.ngram.max_q ({ngram.max_q})",
        )
        _require(
            suffix.max_match >= ngram.max_q,
            "drafting.suffix.max_match",
            f"an integer >= drafting.ngram.max_q ({ngram.max_q})",
        )
        if self.drafter == "rest":
            _require(
                bool(self.datastore),
                "drafting.datastore",
                "a datastore directory with drafter 'rest' (build one with python -m jobs.build_datastore)",
            )


def resolve_auto(section, name: str, where: str) -> int:
    """`name`'s value with `auto` resolved to AUTO_MAX[name] (and auto_<name> set)."""
    value = getattr(section, name)
    if value == "auto":
        object.__setattr__(section, f"auto_{name}", True)
        return AUTO_MAX[name]
    if isinstance(value, str):
        raise ConfigError(f"{where}.{name}: must be an integer or 'auto', got {value!r}")
    return value
