"""Our drafter as vLLM's V2 speculator: drafters.device.DeviceDrafter over the runner's token
history, each step in the runner's asynchronous path (no host synchronization in `propose`)."""

from __future__ import annotations

import numpy as np
import torch

from drafters.datastore import Datastore
from drafters.device.drafter import DeviceDrafter
from drafters.suffix.store_search import SEPARATOR
from pipeline.engines.vllm import compat
from pipeline.engines.vllm.v2 import predictions
from pipeline.engines.vllm.v2.options import parse_options

PROMPT_CONTEXT = 3  # a finished request's last prompt tokens kept before its output (the chat template's header)


def load_bigram(path: str) -> np.ndarray | None:
    """[vocab] int32: the model's most likely next token after each token (the table's first column)."""
    if not path:
        return None
    table = np.load(path, mmap_mode="r", allow_pickle=False)
    return np.array(table if table.ndim == 1 else table[:, 0], dtype=np.int32)  # a copy: the map is read-only


class NgrammysSpeculator(compat.speculator_base()):
    def __init__(self, vllm_config, device: torch.device, req_states):
        spec = vllm_config.speculative_config
        options = parse_options(spec.speculator_options)
        self.req_states = req_states
        self.store = Datastore.open(options.store) if options.store else None
        self.drafter = DeviceDrafter(
            vllm_config.scheduler_config.max_num_seqs,
            vllm_config.model_config.max_model_len,
            spec.num_speculative_tokens,
            options.settings,
            load_bigram(options.bigram_table),
            device,
        )
        # adaptive verification reads each batch row's confidences (conditional acceptance rates)
        self.draft_token_confidence_probs = self.drafter.confidence
        self._load_store()
        predictions.attach(req_states.all_token_ids, self.drafter)

    def _load_store(self) -> None:
        if self.store is not None:
            self.drafter.ingest_store(self.store.tokens, SEPARATOR)

    def init_cudagraph_manager(self, cudagraph_mode) -> None:
        del cudagraph_mode

    def capture(self) -> None:
        return None

    def add_request(self, req_index: int) -> None:
        self.drafter.start(req_index)

    def reset_state(self) -> None:
        self.drafter.reset()
        self._load_store()

    def on_requests_finished(self, finished_req_ids) -> None:
        slots, prompts = compat.finished_slots(self.req_states, finished_req_ids)
        if slots:
            tokens, total_len, _ = compat.token_history(self.req_states)
            starts = [max(prompt - PROMPT_CONTEXT, 0) for prompt in prompts]
            self.drafter.ingest_rows(tokens, total_len, slots, starts)

    @torch.inference_mode()
    def propose(
        self,
        input_batch,
        attn_metadata,
        slot_mappings,
        last_hidden_states,
        aux_hidden_states,
        num_sampled,
        num_rejected,
        last_sampled,
        next_prefill_tokens,
        temperature,
        seeds,
        dp_sync_state=None,
        dummy_run: bool = False,
        skip_attn_for_dummy_run: bool = False,
        mm_inputs=None,
        is_profile: bool = False,
        num_speculative_tokens: int | None = None,
    ) -> torch.Tensor:
        if dummy_run:
            return self.drafter.drafts[: input_batch.num_reqs]
        tokens, total_len, prompt_len = compat.token_history(self.req_states)
        draft = num_speculative_tokens != 0  # 0: the draft length by batch size turned drafting off this step
        return self.drafter.step(
            tokens, total_len, prompt_len, input_batch.idx_mapping, num_sampled, num_rejected, draft=draft
        )
