"""The suffix drafter (`drafting.drafter: batch_suffix`): drafts from what has been written already,
in the spirit of SuffixDecoding (arXiv 2411.04975; no model calls, no training outside the job),
for every running request of an engine step in one compiled call (step.py), and for one request
at a time on the transformers engine (`propose`).

What it drafts from, per request, each source on its own:
- `context`: the request's own tokens: the longest earlier match of its suffix (suffix_min_match to
  suffix_max_match tokens), scanned afresh each step (no per-request index to keep);
- `outputs`: every other request's generated tokens, finished or still running (as SuffixDecoding
  learns from answers in flight), in a bounded arena indexed by q-gram (q = suffix_min_match to
  ngram_max_q, arena.py); past its capacity the oldest finished outputs are forgotten;
- `store`: earlier runs' outputs (drafting.datastore), by binary search in their suffix array
  (store_search.py); a match of at least `store_min_match` tokens (default ngram_max_q): in a store
  of millions of tokens a shorter one has thousands of occurrences and says little, and reading
  them costs the drafter more than all its other work (docs/measurements/batched-drafter-and-replay.md,
  "Replay (no model)").
A source's occurrences that match the longest are kept, as SuffixDecoding's tree keeps its deepest
node, and from their continuations the path that follows the most frequent next token (its
majority path). Sources are not pooled: the request's own long repeat is far more often right than
a store's many short matches, and which source to trust is what the acceptance model learns
(acceptance.py): each path is cut where the probability that all its tokens so far are accepted
falls below suffix_min_probability; the best candidate is the draft, its probabilities the draft's
confidence. Every candidate is judged later against what the request emits, and the model refits
as it goes.

A draft budget: given the engine step's cost as a function of the tokens it feeds (`step_cost`,
from drafters/budget.py), the batch's draft tokens are cut to those that raise the expected tokens
per second, least likely first; at large batch on a GPU most requests then draft nothing. The
probabilities it weighs are the model's as calibrated by its judged tokens (how often the tokens
of its drafts rated alike were accepted, per draft depth and bin of rating). With a budget, the
drafting itself is skipped while what its kept tokens were worth stays below the drafter's own
time (`DraftingPays`): the new tokens are still taken in, and one step in 16 drafts to see whether
that changed.

The engine hands over a step's requests as rows of a token array it already holds (vLLM's
`token_ids_cpu`); the drafter keeps, per request, a slot: how much of it has been taken in, its
arena segment and its candidates awaiting judgement. All of it is fixed-size numpy arrays: memory
is bounded and reported (`memory_bytes`); state.py says their layout.
"""

from __future__ import annotations

import dataclasses
import time
import weakref
from typing import TYPE_CHECKING

import numpy as np
import torch

from drafters.base import PADDING, BatchDrafts, DraftContext, Drafts, not_started, started_twice
from drafters.budget import DraftingPays, calibrated_gains, empty_calibration
from drafters.suffix.acceptance import CANDIDATE_COLUMNS, NUM_FEATURES, PRIOR, SOURCES, log_table
from drafters.suffix.state import (
    CALLS,
    COUNTERS,
    LIMIT,
    PROMPT,
    SLOT_FIELDS,
    USED,
    Settings,
    State,
    scratch,
    settings_values,
)
from drafters.suffix.step import step
from drafters.suffix.store_search import store_ranges, whole

if TYPE_CHECKING:
    from drafters.datastore import Datastore  # (it imports this package's search)

_NONE, _ZERO_OFFSETS, _NO_COST = np.zeros(0, np.int64), np.zeros(1, np.int64), np.zeros(0)
_INT64 = np.dtype(np.int64)  # numpy's dtypes of its own types are singletons: `is` is the cheap test
_INT32 = np.dtype(np.int32)


def _read_only(values) -> np.ndarray:
    view = np.asarray(values).view()
    view.flags.writeable = False
    return view


def _int64(values) -> np.ndarray:
    return values if type(values) is np.ndarray and values.dtype is _INT64 else np.asarray(values, dtype=np.int64)


STRATEGIES = tuple(f"suffix_{source}" for source in SOURCES)
PENDING = 16  # candidates awaiting judgement per request (more are not judged)
NO_LIMIT = 1 << 62  # the limit of a request whose length is not known (`propose`'s contexts)


class BatchSuffixDrafter:
    """A BatchDrafter (drafters/base.py), and a per-request Drafter for the transformers engine."""

    strategies = STRATEGIES  # by BatchDrafts.strategy

    def __init__(
        self,
        w: int,
        settings: Settings,
        *,
        capacity: int = 1 << 18,
        store: Datastore | None = None,
        prior: np.ndarray = PRIOR,
        ring: int = 4096,
        pad_token: int = 0,
    ):
        """Drafts of up to w tokens under `settings` (state.py), from an arena of `capacity` output
        tokens and `store` (earlier runs' outputs); the acceptance model starts at `prior` and learns
        from the last `ring` judged tokens."""
        min_q, max_q, max_match = settings.min_q, settings.max_q, settings.max_match
        assert 1 <= min_q <= max_q <= max_match, (
            f"need 1 <= min_q ({min_q}) <= max_q ({max_q}) <= max_match ({max_match})"
        )
        assert w >= 1 and capacity >= 16, f"need w >= 1 and capacity >= 16, got {w}, {capacity}"
        self.w = w
        self.pad_token = pad_token
        self.settings = dataclasses.replace(
            settings,
            segment_cap=min(settings.segment_cap, capacity // 4),
            store_min_match=settings.store_min_match or max_q,
        )
        max_occurrences = settings.max_occurrences
        self.logs = log_table(max_match + w + max_occurrences + 2)
        self._allocate(capacity, max_q - min_q + 1, ring)
        self.prior = np.asarray(prior, dtype=np.float64).copy()
        self.weights = self.prior.copy()
        self.calibration = empty_calibration()  # per depth and bin: drafts held to that token, tokens judged
        # read-only whatever their source (an actor maps them from the object store read-only): one
        # compiled step for both, not one per kind of array (a compile is tens of seconds where nothing is cached)
        self.store_tokens = _read_only(store.tokens if store is not None else np.zeros(0, np.uint32))
        self.suffix_array = _read_only(store.suffix_array if store is not None else np.zeros(0, np.int32))
        # the store's q-grams (q its shortest match) and their suffix-array ranges: where searches start
        self.store_segments = store.segments if store is not None else whole(self.suffix_array)
        self.store_ranges = store_ranges(
            self.store_tokens, self.suffix_array, self.settings.store_min_match, self.store_segments
        )
        self.slot_of: dict[object, int] = {}
        self.free: list[int] = []
        self.finished: list[tuple[int, list[int]]] = []
        self._scratch = scratch(max_occurrences, w)
        self._out = BatchDrafts.zeros(64, w)
        self._views: dict[int, tuple[BatchDrafts, np.ndarray]] = {}  # per batch size: the outputs, the slots
        self._allocate_slots(64)
        self._positions = np.arange(self.w)  # a draft's positions, against its length
        self.pays = DraftingPays()  # with a step budget: whether drafting at all pays for its time
        # (The transformers engine drafts one DraftContext at a time, `propose`: each is a request,
        # started when first seen, by its id, and finished when the context is collected.)
        self._compile()

    def _allocate(self, capacity: int, grams: int, ring: int) -> None:
        """The arena of outputs (`capacity` tokens), its index of `grams` q-gram lengths, its
        documents, counters, and the acceptance model's ring of the last `ring` judged tokens."""
        self.arena = np.full(capacity + 1, -1, dtype=np.int32)
        table = 1 << int(np.ceil(np.log2(2 * capacity)))
        self.heads = np.full((grams, table), -1, dtype=np.int32)
        self.prev = np.full((grams, capacity + 1), -1, dtype=np.int32)
        self.docs = np.zeros((capacity // 2 + 1, 2), dtype=np.int64)
        self.counters = np.zeros(COUNTERS, dtype=np.int64)
        self.counters[USED] = 1  # position 0 is a -1 sentinel
        self.ring_x = np.zeros((ring, NUM_FEATURES))
        self.ring_y = np.zeros(ring)

    def _compile(self) -> None:
        """Compiles the step for vLLM's rows of int32 tokens (or loads it from numba's cache) now, at
        the engine's start, not in its first batch (seconds when nothing is cached): a call for no
        request, which changes nothing but the count of calls."""
        step(self._state, (_NONE, _NONE, _ZERO_OFFSETS), _NONE, np.zeros((1, 1), np.int32), _NONE, _NONE, 0, _NO_COST)

    def __getstate__(self) -> dict:
        """Pickled (the vLLM engine sends the drafter to each tensor-parallel rank's worker): its
        arrays, not the compiled object over them nor the per-batch-size views of the output
        buffers (a view pickles as a copy): the receiving side makes both again."""
        state = dict(self.__dict__)
        state.pop("_state"), state.pop("_views")
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.store_tokens, self.suffix_array = (
            _read_only(self.store_tokens),
            _read_only(self.suffix_array),
        )  # (unpickled writable)
        self._views = {}
        self._gather()
        self._compile()

    def _allocate_slots(self, count: int) -> None:
        old = getattr(self, "slots", None)
        held = 0 if old is None else old.shape[0]
        slots = np.zeros((count, SLOT_FIELDS), dtype=np.int64)
        pending = {
            "pending_count": np.zeros(count, np.int64),
            "pending_position": np.zeros((count, PENDING), np.int64),
            "pending_length": np.zeros((count, PENDING), np.int64),
            "pending_tokens": np.zeros((count, PENDING, self.w), np.int64),
            # the features, then the probability given and whether it was the draft (GIVEN, CHOSEN)
            "pending_features": np.zeros((count, PENDING, self.w, CANDIDATE_COLUMNS)),
        }
        if old is not None:
            slots[:held] = old
            for name, new in pending.items():
                new[:held] = self.pending[name]
        self.slots = slots
        self.pending = pending
        self.free += list(range(count - 1, held - 1, -1))
        self._gather()

    def _gather(self) -> None:
        """Every compiled call takes the drafter's arrays as one object (State), made again
        when the slots or the output buffers grow."""
        self._state = State(
            arena=self.arena,
            heads=self.heads,
            prev=self.prev,
            slots=self.slots,
            docs=self.docs,
            counters=self.counters,
            **self.pending,
            weights=self.weights,
            prior=self.prior,
            ring_x=self.ring_x,
            ring_y=self.ring_y,
            calibration=self.calibration,
            store=self.store_tokens,
            suffix_array=self.suffix_array,
            store_ranges=self.store_ranges,
            store_segments=self.store_segments,
            logs=self.logs,
            **settings_values(self.settings),
            out_tokens=self._out.tokens,
            out_lengths=self._out.lengths,
            out_confidence=self._out.confidence,
            out_strategy=self._out.strategy,
            **self._scratch,
        )

    def start(self, key, prompt_length: int, limit: int) -> None:
        """A request begins (BatchDrafter.start): a slot for it; its arena segment is
        reserved at its first step, as long as it may generate (limit - prompt_length)."""
        if key in self.slot_of:
            raise started_twice(key)
        if not self.free:
            self._allocate_slots(2 * self.slots.shape[0])
        slot = self.slot_of[key] = self.free.pop()
        self.slots[slot, PROMPT], self.slots[slot, LIMIT] = prompt_length, limit

    def finish(self, key, generated=()) -> None:
        """A request ended: its slot is freed at the next step, its generated tokens (all of them: the
        drafter may not have seen the last step's) stay among the outputs."""
        slot = self.slot_of.pop(key, None)
        if slot is None:
            raise not_started([key])
        self.finished.append((slot, list(generated)))

    def step(
        self,
        keys,
        tokens: np.ndarray,
        rows: np.ndarray,
        lengths: np.ndarray,
        step_cost: np.ndarray | None = None,
        max_w: int | None = None,
    ) -> BatchDrafts:
        """Drafts for one engine step (BatchDrafter.step), of at most `max_w` tokens
        (default: the drafter's w). step_cost None: no budget, only the confidence cut."""
        batch = len(keys)
        out, request_slots = self._views.get(batch) or self._buffers(batch)
        known_slots = list(map(self.slot_of.get, keys))  # dict lookups in C: no Python loop per request
        if None in known_slots:
            raise not_started(key for key, slot in zip(keys, known_slots) if slot is None)
        request_slots[:] = known_slots
        if not (rows.dtype is _INT64 and lengths.dtype is _INT64):  # (the usual case: both int64 already)
            rows, lengths = _int64(rows), _int64(lengths)
        if tokens.dtype is not _INT32:  # vLLM's are int32; one compiled step takes them all as int32
            tokens = tokens.astype(np.int32)
        drafting = step_cost is None or self.pays.drafting()  # not drafting: only take in the new tokens
        started = time.perf_counter() if step_cost is not None else 0.0
        retired = self._take_finished() if self.finished else (_NONE, _NONE, _ZERO_OFFSETS)
        step(
            self._state,
            retired,
            request_slots,
            tokens,
            rows,
            lengths,
            (self.w if max_w is None else max_w) if drafting else 0,
            _NO_COST if step_cost is None else np.asarray(step_cost, dtype=np.float64),
        )
        if step_cost is not None and drafting:  # (the step compiled when the drafter was made: this is its time)
            expected = float(out.confidence[self._positions < out.lengths[:, None]].sum())
            self.pays.observe(
                expected, int(out.lengths.sum()), batch, np.asarray(step_cost), time.perf_counter() - started
            )
        return out

    def _buffers(self, batch: int) -> tuple[BatchDrafts, np.ndarray]:
        """The outputs of a step of `batch` requests (views of buffers that grow by doubling), and its slots."""
        if self._out.tokens.shape[0] < batch:
            size = max(batch, 2 * self._out.tokens.shape[0])
            self._out = BatchDrafts.zeros(size, self.w)
            self._views.clear()
            self._gather()
        out = BatchDrafts(
            *(
                array[:batch]
                for array in (self._out.tokens, self._out.lengths, self._out.confidence, self._out.strategy)
            )
        )
        self._views[batch] = out, np.zeros(batch, np.int64)
        return self._views[batch]

    def _take_finished(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(slots, their generated tokens joined, offsets) of the requests finished since the last step."""
        if not self.finished:
            return _NONE, _NONE, _ZERO_OFFSETS
        finished = np.array([slot for slot, _ in self.finished], dtype=np.int64)
        offsets = np.zeros(len(self.finished) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum([len(generated) for _, generated in self.finished])
        flat = np.array([t for _, generated in self.finished for t in generated], dtype=np.int64)
        self.free += [slot for slot, _ in self.finished]
        self.finished = []
        return finished, flat, offsets

    def calibrated(self, out: BatchDrafts) -> np.ndarray:
        """[B, w]: a step's draft tokens' probabilities as the budget weighs them (calibrated on the
        tokens judged so far, drafters/budget.py), for the tokens out.lengths keeps."""
        return calibrated_gains(out.confidence, out.lengths, self.calibration, np.zeros_like(out.confidence))

    @property
    def compiled_calls(self) -> int:
        """Calls into the compiled step so far (one per engine step)."""
        return int(self.counters[CALLS])

    def memory_bytes(self) -> int:
        """The drafter's own arrays (the store, shared read-only, left out)."""
        arrays = (
            self.arena,
            self.heads,
            self.prev,
            self.docs,
            self.slots,
            *self.pending.values(),
            self.ring_x,
            self.ring_y,
            self.store_ranges,
        )
        return sum(array.nbytes for array in arrays)

    # -- one request at a time (the Drafter protocol, for the transformers engine) -----------------

    def propose(self, context: DraftContext, k: int, w: int) -> Drafts:
        """One context's draft (its tokens when first seen taken as its prompt), in k rows of w
        tokens: the draft, then padding rows."""
        key = id(context)
        n = len(context)
        if key not in self.slot_of:  # its tokens when first seen are its prompt; its length unknown:
            self.start(key, n, NO_LIMIT)  # its segment as long as any, its drafts bounded by w alone
            weakref.finalize(context, self._forget, key)
        drafts = self.step(
            [key], np.asarray(context.tokens, dtype=np.int32)[None, :], np.zeros(1), np.array([n]), max_w=min(w, self.w)
        )
        length = int(drafts.lengths[0])
        rows = [drafts.tokens[0, :length].tolist() + [self.pad_token] * (w - length)] + [[self.pad_token] * w] * (k - 1)
        strategy = STRATEGIES[drafts.strategy[0]] if length else PADDING
        return Drafts(
            tokens=torch.tensor(rows, dtype=torch.long).reshape(k, w),
            strategies=(strategy,) + (PADDING,) * (k - 1),
            lengths=(length,) + (0,) * (k - 1),
            confidence=(tuple(drafts.confidence[0, :length].tolist()),) + ((),) * (k - 1),
        )

    def _forget(self, key: int) -> None:
        if key in self.slot_of:
            self.finish(key)
