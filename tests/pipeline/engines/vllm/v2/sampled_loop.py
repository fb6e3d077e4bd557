"""A sampled decode loop through vLLM 0.34's own Sampler, RejectionSampler, RequestState, post_update
and each method's `propose`, with a target that needs no model: each row's logits are a fixed random
table's row for the token it is fed (peaked, so texts repeat and drafts get accepted).

Plain decoding samples one row per request a step (vLLM's Sampler); a method verifies each request's
last draft (vLLM's RejectionSampler over the last token's row and one row per draft token) and then
drafts again (`propose`). Every request runs with our keyed-draw processor (v2/keyed_draws.py), as
the vLLM 0.34 engine runs a sampled row: greedy in vLLM, its settings in extra_args."""

from __future__ import annotations

import types

import numpy as np
import torch

from pipeline.engines.vllm.v2.options import KEYED_KEY
from pipeline.engines.vllm.v2.plugin import KEYED_DRAWS, PREDICTIONS


def table_logits(vocab: int, seed: int = 0) -> torch.Tensor:
    """[vocab, vocab] float32: the logits after each token, one next token far likelier than the rest,
    in a cycle of 5 tokens (so that a text often repeats itself, and drafts from it get accepted)."""
    table = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(seed)) * 2.0
    table[torch.arange(vocab), (torch.arange(vocab) + 1) % 5] += 9.0
    return table


def loop_config(method: str, k: int, batch: int, max_len: int, model_dir: str):
    """A VllmConfig for `method` ("plain", "ngrammys", "suffix", "ngram_gpu"): the keyed-draw processor
    among the model's, ours with its prediction processor."""
    from vllm.config import ModelConfig, ParallelConfig, SchedulerConfig, SpeculativeConfig, VllmConfig

    from pipeline.engines.vllm import register_speculator, speculator_arguments

    register_speculator()
    processors = [KEYED_DRAWS] + ([PREDICTIONS] if method == "ngrammys" else [])
    model = ModelConfig(
        model=model_dir, skip_tokenizer_init=True, max_model_len=max_len, dtype="float32", logits_processors=processors
    )
    scheduler = SchedulerConfig(
        max_num_seqs=batch, max_num_batched_tokens=max(2048, max_len), max_model_len=max_len, is_encoder_decoder=False
    )
    spec = {
        "ngrammys": speculator_arguments(k, {"max_depth": 8, "corpus_tokens": 4096})["speculative_config"],
        "suffix": {"method": "suffix"},
        "ngram_gpu": {"method": "ngram_gpu"},
        "plain": {"method": "ngram_gpu"},  # plain never proposes: a config vLLM's classes accept
    }[method]
    speculative = SpeculativeConfig(
        **dict(spec, num_speculative_tokens=k), target_model_config=model, target_parallel_config=ParallelConfig()
    )
    return VllmConfig(model_config=model, scheduler_config=scheduler, speculative_config=speculative)


class SampledLoop:
    def __init__(self, config, method: str, k: int, batch: int, table: torch.Tensor):
        from vllm.v1.worker.gpu.sample.logits_processor import build_custom_logits_processors
        from vllm.v1.worker.gpu.sample.sampler import Sampler
        from vllm.v1.worker.gpu.spec_decode import init_speculator
        from vllm.v1.worker.gpu.spec_decode.rejection_sampler import RejectionSampler
        from vllm.v1.worker.gpu.states import RequestState

        cpu = torch.device("cpu")
        self.method, self.k, self.table = method, k, table
        vocab, max_len = table.shape[0], config.model_config.max_model_len
        self.states = RequestState(batch, max_len, 4096, k, vocab, cpu, use_dense_all_token_ids=True)
        processors = build_custom_logits_processors(config, self.states, False, config.model_config.logits_processors)
        self.sampler = Sampler(
            config, batch, vocab, cpu, self.states, num_speculative_tokens=k, custom_logits_processors=processors
        )
        self.drafting = method != "plain"
        if self.drafting:
            self.speculator = init_speculator(config, cpu, self.states)
            self.rejection = RejectionSampler(self.sampler, config.speculative_config, cpu)
        self.running: dict[str, dict] = {}
        self.accepted = self.verified = 0

    def add(self, req_id: str, prompt: list[int], max_tokens: int, sampling: dict, keyed: bool = True) -> None:
        """A request sampled as the vLLM 0.34 engine runs it (keyed: greedy in vLLM, our processor
        draws), or as vLLM samples it (its own seeds and rejection sampling: the contrast)."""
        from vllm.sampling_params import SamplingParams

        self.states.add_request(req_id, len(prompt), prompt, 0, max_tokens)
        slot = self.states.req_id_to_index[req_id]
        if self.drafting:
            self.speculator.add_request(slot)
        if keyed:
            params = SamplingParams(temperature=0.0, extra_args={KEYED_KEY: sampling})
        else:
            params = SamplingParams(**sampling)
        self.sampler.add_request(slot, params)
        self.running[req_id] = dict(slot=slot, tokens=list(prompt), prompt=len(prompt), left=max_tokens, draft=[])

    def step(self) -> None:
        from vllm.v1.worker.gpu.input_batch import post_update

        self.states.apply_staged_writes()
        self.sampler.apply_staged_writes()
        ids = list(self.running)
        slots, local, positions, inputs, cu = [], [], [], [], [0]
        for req_id in ids:
            request = self.running[req_id]
            fed = [request["tokens"][-1], *request["draft"]]
            for j, token in enumerate(fed):
                slots.append(request["slot"])
                local.append(j)
                positions.append(len(request["tokens"]) - 1 + j)
                inputs.append(token)
            cu.append(len(slots))
        logits = self.table[torch.tensor(inputs)]
        idx = torch.tensor([self.running[i]["slot"] for i in ids], dtype=torch.int32)
        seq_lens = torch.tensor([len(self.running[i]["tokens"]) + len(self.running[i]["draft"]) for i in ids])
        batch = types.SimpleNamespace(
            num_reqs=len(ids),
            idx_mapping=idx,
            idx_mapping_np=idx.numpy(),
            expanded_idx_mapping=torch.tensor(slots, dtype=torch.int32),
            expanded_local_pos=torch.tensor(local, dtype=torch.int32),
            positions=torch.tensor(positions, dtype=torch.int64),
            input_ids=torch.tensor(inputs, dtype=torch.int32),
            logits_indices=torch.arange(len(slots), dtype=torch.int64),
            cu_num_logits=torch.tensor(cu, dtype=torch.int32),
            cu_num_logits_np=np.array(cu, dtype=np.int32),
            seq_lens=seq_lens.to(torch.int32),
            seq_lens_cpu_upper_bound=seq_lens.to(torch.int32),
        )
        out = self.rejection(logits, batch) if self.drafting else self.sampler(logits, batch)
        sampled = out.sampled_token_ids.to(torch.int64)
        num_sampled = out.num_sampled.to(torch.int32)
        num_rejected = out.num_rejected.to(torch.int32)
        width = self.k + 1 if self.drafting else 1
        sampled_wide = torch.zeros(len(ids), width, dtype=torch.int64)
        sampled_wide[:, : sampled.shape[1]] = sampled[:, :width]
        post_update(
            idx,
            self.states.num_computed_tokens.gpu,
            self.states.last_sampled_tokens,
            None,
            sampled_wide,
            num_sampled,
            num_rejected,
            None,
            self.states.all_token_ids.gpu,
            self.states.total_len.gpu,
        )
        for b, req_id in enumerate(ids):
            request = self.running[req_id]
            new = sampled_wide[b, : int(num_sampled[b])].tolist()
            self.verified += len(request["draft"])
            self.accepted += len(new) - 1
            request["tokens"] += new
            request["left"] -= len(new)
        self.finish_and_propose(ids, num_sampled, num_rejected)

    def finish_and_propose(self, ids, num_sampled, num_rejected) -> None:
        finished = {i for i in ids if self.running[i]["left"] <= 0}
        if finished and self.drafting:
            self.speculator.on_requests_finished(finished)
        for req_id in sorted(finished):
            self.states.remove_request(req_id)
            self.done[req_id] = self.running.pop(req_id)
        if not self.drafting:
            return
        keep = [b for b, req_id in enumerate(ids) if req_id not in finished]
        live = [ids[b] for b in keep]
        if not live:
            return
        idx = torch.tensor([self.running[i]["slot"] for i in live], dtype=torch.int32)
        drafts = self.speculator.propose(
            types.SimpleNamespace(num_reqs=len(live), idx_mapping=idx),
            None,
            None,
            None,
            None,
            num_sampled[keep].clone(),
            num_rejected[keep].clone(),
            self.states.last_sampled_tokens,
            None,
            None,
            None,
            num_speculative_tokens=self.k,
        )
        for b, req_id in enumerate(live):
            draft = [int(t) for t in drafts[b].tolist()]
            draft = draft[: draft.index(-1)] if -1 in draft else draft
            self.running[req_id]["draft"] = draft[: max(self.running[req_id]["left"] - 1, 0)]

    def run(self, requests: list[tuple[str, list[int], int, dict]], keyed: bool = True) -> dict[str, list[int]]:
        """Each request's generated tokens: (id, prompt, max_tokens, sampling settings)."""
        self.done: dict[str, dict] = {}
        pending = list(requests)
        capacity = self.states.max_num_reqs
        while pending or self.running:
            while pending and len(self.running) < capacity:
                self.add(*pending.pop(0), keyed=keyed)
            self.step()
        return {req_id: r["tokens"][r["prompt"] :] for req_id, r in self.done.items()}
