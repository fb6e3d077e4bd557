"""The speculation mode an engine runs in, and how an actor chooses it (`drafting.speculation`).

A mode is the drafter an engine runs with: the configured one (`drafting.drafter`), `none` (plain
decoding: vLLM at its best for the platform, async scheduling on a GPU), or vLLM's own
`vllm_ngram_gpu` on GPU actors (it keeps async scheduling). The mode never changes a row: greedy rows
are plain's, token for token, and a sampled row is one text, keyed by its seed, with or without
drafts. Which mode runs is a question of speed alone, so an actor may change it whenever it likes,
at the cost of an engine restart.

`on` runs the configured drafter, `off` plain. `auto` starts in the mode RULES give for the
platform and the engine's concurrency, where the projection (docs/speculation.md) says who wins
clearly, and stays there. Where it leaves the answer open, the actor measures on its own rows:
a window of busy seconds in each mode, one after the other, then keeps the one that
generated the most tokens per second, and measures again from time to time (the interval doubling
while the answer stands), and at once when the share of rows with a prediction moves. An actor
measures only while its remaining work pays for it: the round's restarts, and the windows it may
spend in a slower mode, at most MEASURE_BUDGET of the work left. A job too short for that never
restarts an engine.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

from pipeline.config import Config

PLAIN = "none"  # the drafter of plain decoding
DRAFTING = "drafting"  # in RULES: the configured drafter
# auto measures only while a round costs at most this share of the actor's remaining work, and
# spaces its rounds so that they cost at most this share of the time between them.
MEASURE_BUDGET = 0.03
# What a round is taken to lose in a slower mode's window, as a share of that window.
SLOWER_SHARE = 0.25
# Two windows compare like work only if their shares of rows with a prediction differ by at most this.
MIX_TOLERANCE = 0.25
# A mode measured faster by less than this is not worth an engine restart.
MARGIN = 0.02
# A window is at least this many busy seconds, and at least WINDOW_RESTARTS engine starts' worth.
MIN_WINDOW_S = 30.0
WINDOW_RESTARTS = 3
# vLLM's ngram_gpu drafts this many tokens (its documentation's num_speculative_tokens).
NGRAM_GPU_W = 5
# vLLM 0.34's suffix drafts this many (its default num_speculative_tokens; the gpu_v2 rules' figures).
VLLM_SUFFIX_W = 8


@dataclass(frozen=True)
class Rule:
    """What auto does on a platform up to a concurrency, for rows with predictions or without: the
    mode to run, and whether the projection leaves it open enough to measure."""

    # "gpu": vLLM 0.32, plain and its ngram_gpu asynchronous, ours synchronous; "gpu_v2": vLLM 0.34, every
    # method on the device, asynchronous; "cpu": all synchronously
    platform: str
    most_running: float  # up to this many requests running at once
    predictions: bool | None  # for rows that carry a prediction (True), rows that do not (False), or both
    mode: str  # DRAFTING (the configured drafter), PLAIN or NGRAM_GPU
    measure: bool
    why: str  # the figures behind it (docs/speculation.md, docs/device-speculator.md have their commands)
    greedy: bool | None = None  # for a run whose rows are greedy (True), sampled (False), or both


NGRAM_GPU = "vllm_ngram_gpu"
INF = float("inf")
# From the projection of an 8B model on an H100 (its measured step, a GPU host's time; ours runs
# synchronously, plain and ngram_gpu asynchronously) and from this CPU's measurements: docs/speculation.md.
RULES = (
    Rule(
        "gpu",
        16,
        True,
        DRAFTING,
        True,
        "16 sequences, edited rows: ours 2.40x / 3.07x / 1.79x plain async "
        "(line, field, paragraph), ngram_gpu 2.04x / 2.14x / 2.06x: open",
    ),
    Rule(
        "gpu",
        16,
        False,
        NGRAM_GPU,
        True,
        "16 sequences: ngram_gpu 2.33x plain async on corpus work, 1.72x on chat; ours 2.25x, 1.57x: open",
    ),
    Rule(
        "gpu",
        128,
        True,
        NGRAM_GPU,
        True,
        "64 sequences, edited rows: ngram_gpu 1.22x / 1.23x / 1.20x plain async, ours 0.99x / 1.24x / 0.89x: open",
    ),
    Rule(
        "gpu",
        128,
        False,
        NGRAM_GPU,
        False,
        "64 sequences: ngram_gpu 1.81x plain async on corpus work, 1.35x on chat; ours 1.30x, 1.01x",
    ),
    Rule(
        "gpu",
        INF,
        None,
        PLAIN,
        True,
        "256 sequences: ngram_gpu 1.17x plain async on corpus work, ours 0.71x; a "
        "draft token costs 0.4-0.9 of a step there: open",
    ),
    # vLLM 0.34 on an H100, 8B model: the decode loop's accepted tokens on recorded greedy answers through
    # vLLM's own post_update, projected on the measured step, ours at H100_DRAFT_LENGTHS
    # (docs/device-speculator.md). Sampled rows repeat far less than greedy ones and were not measured
    # on 0.34: plain first, measured (a seed is one text in every mode there too: v2/keyed_draws.py).
    Rule(
        "gpu_v2",
        32,
        None,
        DRAFTING,
        False,
        "vLLM 0.34, 16 sequences, greedy: ours 2.27x plain on corpus work, 3.70x on edited rows with "
        "predictions, 1.23x on chat (vLLM's suffix 2.07x, 2.16x, 1.11x)",
        greedy=True,
    ),
    Rule(
        "gpu_v2",
        128,
        True,
        DRAFTING,
        False,
        "vLLM 0.34, 64 sequences, greedy edited rows with predictions: ours 1.79x plain at k=8 (vLLM's suffix 1.04x)",
        greedy=True,
    ),
    Rule(
        "gpu_v2",
        128,
        False,
        PLAIN,
        True,
        "vLLM 0.34, 64 sequences, greedy: ours 1.29x plain on corpus work at k=3, 0.80x on chat (its best "
        "k is 0): plain until measured, open",
        greedy=True,
    ),
    Rule(
        "gpu_v2",
        INF,
        None,
        PLAIN,
        False,
        "vLLM 0.34, 256 sequences: every method's best draft length is 0 (a verified slot costs nearly a "
        "generated token)",
        greedy=True,
    ),
    Rule(
        "gpu_v2",
        INF,
        None,
        PLAIN,
        True,
        "vLLM 0.34, sampled rows: drafts accepted far less often than on greedy ones, not measured there: "
        "plain until measured, open",
        greedy=False,
    ),
    Rule("cpu", 4, None, DRAFTING, False, "this CPU at one request: ours 1.4-2.1x plain (live), 1.8-2.5x (projected)"),
    Rule(
        "cpu",
        16,
        None,
        DRAFTING,
        True,
        "this CPU at 16 requests: ours 0.94-1.13x plain (live), 1.05-1.10x (projected): open",
    ),
    Rule(
        "cpu",
        32,
        None,
        PLAIN,
        True,
        "this CPU at 32 requests, ShareGPT sampled: ours 0.78x plain (live, 1,000 rows); on rows that repeat "
        "themselves ours may still win: open",
    ),
    Rule(
        "cpu",
        INF,
        None,
        PLAIN,
        True,
        "this CPU beyond 32 requests: not measured; each request's drafts cost a compute-bound step more: open",
    ),
)


def platform(config: Config) -> str:
    """Whose RULES apply to the config's actors (the engine's kind says: EngineKind.platform)."""
    from pipeline.engines.build import engine_kind

    return engine_kind(config.engine.name).platform(config)


def platform_rule(name: str, running: int, predictions: bool = False, greedy: bool = True) -> Rule:
    """The rule on platform `name` ("cpu", "gpu" or "gpu_v2") at `running` requests at once, for rows
    that carry a prediction or not, in a run whose rows are greedy or sampled."""
    return next(
        r
        for r in RULES
        if r.platform == name
        and running <= r.most_running
        and r.predictions in (None, predictions)
        and r.greedy in (None, greedy)
    )


def reads_sampling(name: str) -> bool:
    """Whether platform `name`'s rules tell greedy runs from sampled ones."""
    return any(r.greedy is not None for r in RULES if r.platform == name)


def modes(config: Config) -> tuple[str, ...]:
    """The modes an actor may run (drafting.speculation), the configured one first: `on` runs it,
    `off` plain, `auto` chooses among it, plain and the engine library's async drafters."""
    from pipeline.engines.build import engine_kind

    drafter = config.drafting.drafter if config.drafting.w > 0 else PLAIN
    if config.drafting.speculation == "off" or drafter == PLAIN:
        return (PLAIN,)
    if config.drafting.speculation == "on":
        return (drafter,)
    others = [d for d in engine_kind(config.engine.name).async_drafters(config) if d != drafter]
    return (drafter, PLAIN, *others)


def mode_config(config: Config, drafter: str) -> Config:
    """The config an engine runs `drafter` from (one of `modes(config)`)."""
    if drafter == config.drafting.drafter:
        return config
    w = {NGRAM_GPU: NGRAM_GPU_W, "vllm_suffix": VLLM_SUFFIX_W}.get(drafter, config.drafting.w)
    return dataclasses.replace(
        config, drafting=dataclasses.replace(config.drafting, drafter=drafter, w=w, auto_w=False)
    )


def concurrency(config: Config, expected_rows: int | None) -> int:
    """Requests an actor's engine runs at once: its slots, bounded by the rows it is given at once
    and, where known, by the rows it will see."""
    from pipeline.engines.build import concurrent_batches, engine_kind

    kind = engine_kind(config.engine.name)
    running = min(kind.slots(config), kind.batch_size(config) * concurrent_batches(config))
    return max(1, min(running, expected_rows)) if expected_rows is not None else running


@dataclass
class Window:
    """What one mode generated over a stretch of an actor's busy seconds."""

    mode: str
    start: float  # the actor's busy seconds when it opened
    seconds: float = 0.0
    tokens: int = 0
    rows: int = 0
    predicted_rows: int = 0  # rows with a prediction

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def prediction_share(self) -> float:
        return self.predicted_rows / self.rows if self.rows else 0.0

    def as_dict(self) -> dict:
        return {
            "mode": self.mode,
            "at_busy_seconds": round(self.start, 2),
            "seconds": round(self.seconds, 2),
            "tokens": self.tokens,
            "rows": self.rows,
            "tokens_per_second": round(self.rate, 2),
            "prediction_share": round(self.prediction_share, 3),
        }


@dataclass(kw_only=True)
class Chooser:
    """An actor's choice of mode (the module's docstring), fed each finished batch. Pure: the stage
    makes the switches it asks for and tells it how long they took."""

    modes: tuple[str, ...]  # the modes it chooses among (the configured drafter, PLAIN, NGRAM_GPU)
    platform: str = ""  # "gpu", "gpu_v2" or "cpu": whose RULES apply; "": none (drafting.speculation on or off)
    running: int = 1  # the engine's concurrency, which the rule reads
    window_setting: float = 0.0  # drafting.speculation_window_s (0: window_s)
    expected_rows: int | None = None  # this actor's share of the job's rows (None: not known)
    restart_seconds: float = 0.0  # an engine's start, as last measured
    mode: str = ""  # the mode the engine runs
    busy: float = 0.0  # the actor's busy seconds so far
    rows: int = 0
    window: Window | None = None
    history: list[Window] = field(default_factory=list)
    round: dict[str, Window] | None = None  # the windows of a measurement in progress
    to_measure: list[str] = field(default_factory=list)
    pending: str | None = None  # a switch asked for and not yet made
    incumbent: str = ""  # the mode chosen before the round in progress
    check_after: float = 0.0  # busy seconds in the chosen mode before it is measured again
    settled_at: float = 0.0  # busy seconds when the mode was last chosen
    settled_share: float = 0.0  # the share of rows with a prediction it was chosen on
    switches: list[dict] = field(default_factory=list)
    decided_by: str = "setting"
    predictions: bool = False  # whether the rows carry predictions, as the run knows at its start
    greedy: bool = True  # whether the rows are greedy (sampling.temperature 0), as the run knows at its start
    rule: Rule | None = None  # the rule for the rows seen last (None: no rule applies)

    def __post_init__(self):
        if self.platform and len(self.modes) > 1:
            self.rule = platform_rule(self.platform, self.running, self.predictions, self.greedy)
            self.decided_by = "rule"
        self.mode = self.mode or self.mode_of(self.rule)
        self.window = Window(self.mode, self.busy)

    @property
    def min_rows(self) -> int:
        """A window's least rows: the engine filled twice over."""
        return 2 * self.running

    def mode_of(self, rule: Rule | None) -> str:
        """The mode a rule names (the configured drafter with none; an async drafter this
        engine does not have stands down to plain)."""
        if rule is None or rule.mode == DRAFTING:
            return self.modes[0]
        return rule.mode if rule.mode in self.modes else PLAIN

    @property
    def window_s(self) -> float:
        """drafting.speculation_window_s, or for 0: MIN_WINDOW_S, or WINDOW_RESTARTS engine starts if longer."""
        return self.window_setting or max(MIN_WINDOW_S, WINDOW_RESTARTS * self.restart_seconds)

    @property
    def measures(self) -> bool:
        return self.rule is not None and self.rule.measure and len(self.modes) > 1

    def observe(self, busy: float, tokens: int, rows: int, predicted_rows: int, sampled_rows: int = 0) -> str | None:
        """A finished batch of the current engine (`busy`: the actor's busy seconds now); returns
        the drafter to switch to, if the actor should."""
        self.rows += rows
        window, self.busy = self.window, busy
        window.seconds, window.tokens = busy - window.start, window.tokens + tokens
        window.rows, window.predicted_rows = window.rows + rows, window.predicted_rows + predicted_rows
        if sampled_rows and self.greedy and self.pending is None and reads_sampling(self.platform):
            return self.sampled()
        if self.pending is not None or window.seconds < self.window_s or window.rows < self.min_rows:
            return None
        self.history.append(window)
        self.window = Window(self.mode, busy)
        return self.after(window)

    def after(self, window: Window) -> str | None:
        if self.round is not None:  # measuring: the next mode, or the one chosen
            self.round[window.mode] = window
            return self.switch(self.to_measure.pop(0), "measure") if self.to_measure else self.settle()
        if self.rule is not None:
            now = platform_rule(self.platform, self.running, window.prediction_share > 0.5, self.greedy)
            if now != self.rule:  # the rows' mix moved to another rule: run its mode, and measure if it says so
                self.rule = now
                self.check_after = 0.0
                self.decided_by = "rule"
                if not now.measure and self.mode_of(now) != self.mode and self.pays(self.restart_seconds):
                    return self.switch(self.mode_of(now), "rule")
        moved = abs(window.prediction_share - self.settled_share) > MIX_TOLERANCE
        due = self.busy - self.settled_at >= self.check_after or moved
        if not (self.measures and due and self.pays(self.round_cost())):
            return None
        self.round = {window.mode: window}
        self.incumbent = window.mode
        self.to_measure = [c for c in self.modes if c != window.mode]
        return self.switch(self.to_measure.pop(0), "measure")

    def sampled(self) -> str | None:
        """The rows turned out sampled (a row's own temperature, or ray.data.llm's default of 1.0): the
        run is sampled from here on, under its platform's rule for sampled rows (a round measured on
        greedy rows ends)."""
        self.greedy = False
        self.round = None
        self.to_measure = []
        if self.rule is None:
            return None
        self.rule = platform_rule(self.platform, self.running, self.predictions, False)
        self.decided_by = "rule"
        mode = self.mode_of(self.rule)
        return self.switch(mode, "sampled rows") if mode != self.mode else None

    def settle(self) -> str | None:
        """Chooses from the round's windows: the fastest, unless it beats the mode in place by less
        than MARGIN or the windows saw different mixes of rows (then it measures again soon)."""
        windows, self.round = self.round, None
        shares = [w.prediction_share for w in windows.values()]
        best = max(windows.values(), key=lambda w: w.rate)
        if max(shares) - min(shares) > MIX_TOLERANCE:
            chosen, interval = self.mode, self.window_s
        else:
            chosen = best.mode if best.rate > windows[self.mode].rate * (1 + MARGIN) else self.mode
            interval = self.round_cost() / MEASURE_BUDGET
            if chosen == self.incumbent and self.check_after:
                interval = 2 * self.check_after  # the answer stands: measure half as often
        self.check_after = interval
        self.settled_at = self.busy
        self.settled_share = best.prediction_share
        self.decided_by = "measured"
        return self.switch(chosen, "faster") if chosen != self.mode else None

    def round_cost(self) -> float:
        """A round's busy seconds lost: a restart per mode, and a slower mode's windows."""
        others = len(self.modes) - 1
        return len(self.modes) * self.restart_seconds + others * self.window_s * SLOWER_SHARE

    def pays(self, cost: float) -> bool:
        """Whether `cost` busy seconds are at most MEASURE_BUDGET of the actor's remaining work: its
        rows still to come at its seconds per row so far, or, where the rows are not known, as
        long again as it has run (a stream that has lasted this long is taken to last as long)."""
        if self.expected_rows is None:
            remaining = self.busy
        else:
            remaining = max(self.expected_rows - self.rows, 0) * self.busy / max(self.rows, 1)
        return cost <= MEASURE_BUDGET * remaining

    def switch(self, drafter: str, why: str) -> str:
        self.pending = drafter
        self.switches.append(
            {
                "at_busy_seconds": round(self.busy, 2),
                "at": round(time.time(), 2),
                "from": self.mode,
                "to": drafter,
                "why": why,
            }
        )
        return drafter

    def switched(self, drafter: str, drain_seconds: float, restart_seconds: float) -> None:
        """The engine now runs `drafter`: it waited `drain_seconds` for the batches in flight and
        took `restart_seconds` to start."""
        self.switches[-1].update(drain_seconds=round(drain_seconds, 2), restart_seconds=round(restart_seconds, 2))
        self.mode = drafter
        self.pending = None
        self.restart_seconds = restart_seconds
        self.window = Window(drafter, self.busy)

    def dropped(self, drafter: str) -> None:
        """`drafter`'s engine could not start: it is no longer one of the modes."""
        self.modes = tuple(c for c in self.modes if c != drafter)
        self.to_measure = [c for c in self.to_measure if c != drafter]
        self.switches[-1]["why"] += f"; {drafter}'s engine could not start"

    def report(self) -> dict:
        """What summary.json says of this actor: its mode now, why, its windows and its switches."""
        return {
            "mode": self.mode,
            "decided_by": self.decided_by,
            "modes": list(self.modes),
            "rule": self.rule.why if self.rule is not None else None,
            "window_seconds": round(self.window_s, 2),
            "restart_seconds": round(self.restart_seconds, 2),
            "busy_seconds": round(self.busy, 2),
            "rows": self.rows,
            "windows": [w.as_dict() for w in self.history[-32:]],
            "switches": self.switches[-32:],
        }


def chooser(config: Config, expected_rows: int | None, predictions: bool = False) -> Chooser:
    """An actor's chooser for `config` (expected_rows: the actor's share of the job's rows, if
    known; predictions: whether its rows carry them, as far as the run knows); its first engine's
    start is its `restart_seconds` once measured."""
    auto = config.drafting.speculation == "auto"
    return Chooser(
        modes=modes(config),
        platform=platform(config) if auto else "",
        running=concurrency(config, expected_rows),
        window_setting=config.drafting.speculation_window_s,
        expected_rows=expected_rows,
        predictions=predictions,
        greedy=config.sampling.temperature == 0,
    )
