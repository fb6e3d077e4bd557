"""The device drafter: our drafting sources on the accelerator, for every running request in one
step of Triton kernels (kernels.py), with no host synchronization. vLLM >= 0.34 runs it as a
speculator (pipeline/engines/vllm/v2/); it takes tensors, not an engine.

What it drafts from, per request (kernels.py says how each is found and chosen):
- `prediction`: the text the request's answer is expected to resemble (OpenAI's `prediction`, a
  series row's last output), set for its slot when it starts;
- `context`: the request's own tokens (the longest earlier match of its suffix);
- `corpus`: earlier requests' outputs and a store of earlier runs' outputs loaded at start, in a
  bounded ring on the device (`corpus_tokens`);
- `bigram`: the model's own bigram table (N-Grammys), chained from the last token: a draft where
  nothing matches, and the fill of the slots past a shorter draft.

The state is fixed-size tensors on the drafter's device, per slot (`max_slots`: the engine's
request slots) and shared; slots are recycled: `start(slot)` forgets the slot's last occupant.
"""

from __future__ import annotations

import numpy as np
import torch
import triton

from drafters.device.index import _index_kernel, _ingest_kernel
from drafters.device.kernels import _finalize_kernel, _observe_kernel, _scan_kernel
from drafters.device.settings import (
    BIGRAM,
    CONTEXT,
    CORPUS,
    NUM_LEN_BUCKETS,
    POS_BITS,
    PREDICTION,
    SOURCES,
    DeviceSettings,
)

INGEST_BLOCK = 1024
STAMP_LIMIT = (1 << 23) - 1  # a running entry packs (stamp, slot, position) into 63 bits: 23, 20, 20


def prior_counts(k: int) -> np.ndarray:
    """[4 * NUM_LEN_BUCKETS, k, 2] int64: the (accepted, observed) counts the rates start from, worth
    ten observations each: a prediction holds (0.8), a match's next token holds the likelier the
    longer the match (L / (L + 2)), the bigram table's guess seldom (0.3)."""
    prior = np.zeros((4, NUM_LEN_BUCKETS, k, 2), np.int64)
    prior[..., 1] = 10
    lengths = np.array([1, 2, 3, 4, 5, 6, 8, 15, 24])
    for source in (CONTEXT, CORPUS):
        prior[source, :, :, 0] = np.round(10 * lengths / (lengths + 2))[:, None]
    prior[PREDICTION, :, :, 0] = 8
    prior[BIGRAM, :, :, 0] = 3
    return prior.reshape(4 * NUM_LEN_BUCKETS, k, 2)


def _po2(value: int) -> int:
    return max(1, triton.next_power_of_2(max(value, 1)))


class DeviceDrafter:
    """Drafts of k tokens for a batch of slots, on `device`. In: each step's token history and the
    target's verdict on the last drafts (`step`); finished requests' outputs (`ingest`); a slot's
    prediction (`set_prediction`). Out: drafts [B, k] int64 and their per-position confidences."""

    def __init__(
        self,
        max_slots: int,
        max_len: int,
        k: int,
        settings: DeviceSettings,
        bigram: np.ndarray | None,  # [vocab] int32: the model's most likely next token after each
        device: torch.device | str,
    ):
        if max_len >= 1 << POS_BITS:
            raise ValueError(f"max_model_len {max_len} is too long for the device drafter (< {1 << POS_BITS})")
        self.k = k
        self.settings = settings
        self.device = torch.device(device)
        self.max_slots = max_slots
        self.max_len = max_len
        self.block = 256 if max_len >= 1024 else max(16, _po2(min(max_len, 128)))
        self.context_blocks = triton.cdiv(max_len, self.block)
        self.prediction_blocks = max(1, triton.cdiv(settings.prediction_tokens, self.block))
        zeros = lambda *shape, dtype=torch.int32: torch.zeros(shape, dtype=dtype, device=self.device)  # noqa: E731
        self.context_scratch = zeros(max_slots, self.context_blocks, dtype=torch.int64)
        self.prediction_scratch = zeros(max_slots, self.prediction_blocks, dtype=torch.int64)
        self.predictions = zeros(max_slots, max(settings.prediction_tokens, 1))
        self.prediction_len = zeros(max_slots)
        self.reached = zeros(max_slots, 2, dtype=torch.int64)
        self.capacity = max(settings.corpus_tokens, 1)
        self.num_buckets = _po2(max(16, 2 * settings.corpus_tokens))  # at most half full: few keys collide
        self.corpus = torch.full((self.capacity,), -1, dtype=torch.int32, device=self.device)
        self.table = torch.full((2, self.num_buckets), -1, dtype=torch.int64, device=self.device)
        self.head = zeros(1, dtype=torch.int64)
        # running requests' tokens, indexed as they are emitted (answers in flight are drafted from)
        self.running_buckets = min(_po2(max(16, 2 * max_slots * max_len)), 1 << 22)
        self.running = torch.full((2, self.running_buckets), -1, dtype=torch.int64, device=self.device)
        self.indexed = zeros(max_slots, dtype=torch.int64)
        self.steps = 0  # host-side step count: a running entry's stamp (the newest wins)
        self.has_bigram = bigram is not None
        table = np.zeros(1, np.int32) if bigram is None else np.ascontiguousarray(bigram, dtype=np.int32)
        self.bigram = torch.from_numpy(table).to(self.device)
        self.prior = torch.from_numpy(prior_counts(k)).to(self.device)
        self.stats = self.prior.clone()
        self.drafts = zeros(max_slots, k, dtype=torch.int64)
        self.confidence = zeros(max_slots, k, dtype=torch.float32)
        self.source = zeros(max_slots)
        self.length = zeros(max_slots)
        self.last_code = torch.full((max_slots, k), -1, dtype=torch.int32, device=self.device)
        self.last_valid = zeros(max_slots)
        self.staged: dict[int, np.ndarray] = {}  # predictions set since the last flush, by slot
        # each slot's prediction length, known on the host when set: the prediction scan's grid
        # covers the longest held (none: no scan), with no read from the device
        self.prediction_lengths = np.zeros(max_slots, np.int64)

    # --- Slots ---------------------------------------------------------------------------------

    def start(self, slot: int) -> None:
        """A new request in `slot`: no prediction, no draft pending judgement (staged: applied at the
        next step, as vLLM stages a slot's writes)."""
        self.staged[slot] = np.zeros(0, np.int32)
        self.prediction_lengths[slot] = 0

    def set_prediction(self, slot: int, token_ids) -> None:
        """The slot's request drafts from these tokens (at most prediction_tokens: their start)."""
        tokens = np.asarray(token_ids, dtype=np.int64)[: self.settings.prediction_tokens]
        self.staged[slot] = tokens.astype(np.int32)
        self.prediction_lengths[slot] = len(tokens)

    def flush(self) -> None:
        """The staged slots' predictions onto the device (asynchronous copies from pinned memory)."""
        if not self.staged:
            return
        slots = sorted(self.staged)
        width = max(1, max(len(self.staged[s]) for s in slots))
        block = np.zeros((len(slots), width), np.int32)
        lengths = np.zeros(len(slots), np.int32)
        for i, s in enumerate(slots):
            block[i, : len(self.staged[s])], lengths[i] = self.staged[s], len(self.staged[s])
        index = self._to_device(np.array(slots, np.int64))
        self.predictions[index, :width] = self._to_device(block)
        self.prediction_len[index] = self._to_device(lengths)
        self.reached[index] = 0
        self.last_valid[index] = 0
        self.indexed[index] = 0
        self.staged.clear()

    def _to_device(self, array: np.ndarray) -> torch.Tensor:
        host = torch.from_numpy(array)
        if self.device.type == "cuda":
            return host.pin_memory().to(self.device, non_blocking=True)
        return host.to(self.device)

    def reset(self) -> None:
        """Forget what was learned across requests (after an engine's warm-up)."""
        self.corpus.fill_(-1)
        self.table.fill_(-1)
        self.head.zero_()
        self.running.fill_(-1)
        self.steps = 0
        self.stats.copy_(self.prior)
        self.last_valid.zero_()

    # --- The corpus ----------------------------------------------------------------------------

    def ingest(self, source: torch.Tensor, rows: list[int], starts: list[int], ends: torch.Tensor, longest: int):
        """Documents source[rows[i], starts[i]:ends[i]] (`ends` on the device: a request's length is
        known there, not on the host; none longer than `longest`) into the ring, the newest
        capacity - 1 tokens of each at most."""
        if self.settings.corpus_tokens == 0 or not rows:
            return
        rows_t = self._to_device(np.array(rows, np.int64))
        starts_t = self._to_device(np.array(starts, np.int64))
        ends = ends.to(torch.int64)
        starts_t = torch.maximum(starts_t, ends - (self.capacity - 1))
        sizes = (ends - starts_t).clamp_min(0)
        offsets = torch.cumsum(sizes + 1, 0) - (sizes + 1)
        documents = torch.stack([rows_t, starts_t, starts_t + sizes, offsets], dim=1).contiguous()
        total = (sizes + 1).sum()  # on the device: the lengths are known there
        grid = (len(rows), max(1, triton.cdiv(min(longest, self.capacity), INGEST_BLOCK)))
        _ingest_kernel[grid](
            source,
            source.stride(0),
            documents,
            self.corpus,
            self.capacity,
            self.head,
            total.view(1),
            self.table,
            NUM_BUCKETS=self.num_buckets,
            BLOCK=INGEST_BLOCK,
        )
        self.head += total

    def ingest_rows(self, tokens: torch.Tensor, total_len: torch.Tensor, slots: list[int], starts: list[int]):
        """Finished requests' outputs: tokens[slot, start:total_len[slot]] for each slot (their
        lengths read on the device)."""
        index = self._to_device(np.array(slots, np.int64))
        self.ingest(tokens, slots, starts, total_len.index_select(0, index), self.max_len)

    def ingest_store(self, tokens: np.ndarray, separator: int) -> None:
        """A store's documents (one array, `separator` between them), newest last."""
        tokens = np.asarray(tokens)
        cuts = np.flatnonzero(tokens == separator)
        starts = np.concatenate([[0], cuts + 1])
        ends = np.concatenate([cuts, [len(tokens)]])
        keep = ends > starts
        flat = np.where(tokens == separator, -1, tokens).astype(np.int32)[None, :]
        self.ingest(
            self._to_device(flat),
            [0] * int(keep.sum()),
            starts[keep].tolist(),
            self._to_device(ends[keep].astype(np.int64)),
            int((ends - starts)[keep].max(initial=0)),
        )

    # --- A step --------------------------------------------------------------------------------

    def step(
        self,
        tokens: torch.Tensor,  # [max_slots, stride] int32: each slot's tokens
        total_len: torch.Tensor,  # [max_slots] int32
        prompt_len: torch.Tensor,  # [max_slots] int32
        idx_mapping: torch.Tensor,  # [B] int32: batch row -> slot
        num_sampled: torch.Tensor,  # [B] int32: tokens the last step emitted (0: a prefill chunk)
        num_rejected: torch.Tensor,  # [B] int32: draft tokens the last step rejected
        draft: bool = True,
    ) -> torch.Tensor:
        """[B, k] int64: each request's draft (its confidences in self.confidence[:B]). With `draft`
        False (a step that verifies none) it only learns from the last verdicts and indexes the new
        tokens; the drafts it returns are the last ones."""
        self.flush()
        batch, k = idx_mapping.shape[0], self.k
        k_po2 = _po2(k)
        if batch == 0:
            return self.drafts[:0]
        _observe_kernel[(batch,)](
            idx_mapping, num_sampled, num_rejected, self.stats, self.last_code, self.last_valid, K=k, K_PO2=k_po2
        )
        if self.settings.corpus_tokens:
            if self.steps >= STAMP_LIMIT:  # the stamp's 23 bits (every ~8M steps): start the index anew
                self.running.fill_(-1)
                self.steps = 0
            self.steps += 1
            _index_kernel[(batch,)](
                tokens,
                tokens.stride(0),
                idx_mapping,
                total_len,
                prompt_len,
                self.indexed,
                self.running,
                self.steps,
                NUM_BUCKETS=self.running_buckets,
                BLOCK=max(16, _po2(2 * (k + 1))),
            )
        if not draft:
            return self.drafts[:batch]
        self._scan(tokens, total_len, prompt_len, idx_mapping)
        self._finalize(tokens, total_len, prompt_len, idx_mapping, num_sampled)
        return self.drafts[:batch]

    def _scan(self, tokens, total_len, prompt_len, idx_mapping) -> None:
        """Each request's best match in its own tokens and in its prediction, per block of positions."""
        batch, depth = idx_mapping.shape[0], self.settings.max_depth
        _scan_kernel[(batch, self.context_blocks)](
            tokens,
            tokens.stride(0),
            tokens,
            tokens.stride(0),
            total_len,
            idx_mapping,
            total_len,
            prompt_len,
            self.reached,
            self.context_scratch,
            self.context_blocks,
            IS_PREDICTION=False,
            MAX_DEPTH=depth,
            BLOCK=self.block,
        )
        prediction_blocks = triton.cdiv(int(self.prediction_lengths.max()), self.block)
        if prediction_blocks:
            _scan_kernel[(batch, prediction_blocks)](
                tokens,
                tokens.stride(0),
                self.predictions,
                self.predictions.stride(0),
                self.prediction_len,
                idx_mapping,
                total_len,
                prompt_len,
                self.reached,
                self.prediction_scratch,
                prediction_blocks,
                IS_PREDICTION=True,
                MAX_DEPTH=depth,
                BLOCK=self.block,
            )

    def _finalize(self, tokens, total_len, prompt_len, idx_mapping, num_sampled) -> None:
        """Each request's draft from its sources, its confidences and what the next observe judges."""
        batch, depth, k = idx_mapping.shape[0], self.settings.max_depth, self.k
        prediction_blocks = triton.cdiv(int(self.prediction_lengths.max()), self.block)
        _finalize_kernel[(batch,)](
            tokens,
            tokens.stride(0),
            idx_mapping,
            total_len,
            prompt_len,
            num_sampled,
            self.context_scratch,
            self.context_blocks,
            self.predictions,
            self.predictions.stride(0),
            self.prediction_len,
            self.prediction_scratch,
            prediction_blocks,
            self.reached,
            self.corpus,
            self.capacity,
            self.head,
            self.table,
            self.running,
            self.bigram,
            self.bigram.shape[0],
            self.stats,
            self.drafts,
            self.confidence,
            self.last_code,
            self.last_valid,
            self.source,
            self.length,
            float(self.settings.min_confidence),
            HAS_CORPUS=self.settings.corpus_tokens > 0,
            HAS_BIGRAM=self.has_bigram,
            NUM_BUCKETS=self.num_buckets,
            RUNNING_BUCKETS=self.running_buckets,
            LEN_BUCKETS=NUM_LEN_BUCKETS,
            MAX_DEPTH=depth,
            K=k,
            K_PO2=_po2(k),
            CONTEXT_NB_PO2=_po2(self.context_blocks),
            PREDICTION_NB_PO2=_po2(self.prediction_blocks),
        )

    def sources(self, batch: int) -> list[str]:
        """The source of each of the last step's drafts (a host read: tests and statistics only)."""
        return [SOURCES[s] if s >= 0 else "" for s in self.source[:batch].tolist()]
