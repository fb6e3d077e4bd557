"""The drafting methods the replay (replay.py) drives, each as its engine calls it: ours
(drafters/suffix/, with the acceptance model's calibration by depth), vLLM's suffix method
(arctic-inference's cache), vLLM's n-gram lookup, and plain decoding."""
from __future__ import annotations

import functools
import gc

import numpy as np

from drafters.budget import cost_table


class Method:
    """A drafting method as the replay drives it: `start` a request, `draft` for the running ones,
    `finish` one; `predict` and `judged` feed the calibration (ours only)."""

    def start(self, key: int, prompt: np.ndarray, limit: int) -> None:
        pass

    def predict(self, batch: list[int]) -> None:
        pass

    def judged(self, key: int, accepted: int) -> None:
        pass

    def finish(self, key: int, output: np.ndarray) -> None:
        pass


class Ours(Method):
    """drafters/suffix/: one call per step for every running request. Each verified draft
    is also scored against what its tokens were predicted to do (`DepthCalibration`)."""

    def __init__(self, args, store, answers, cost=None):
        from pipeline.config.drafter_registry import DrafterTables, make_batch_drafter
        from pipeline.config import DecoderConfig

        # as a job builds it: the config's defaults, drafts of up to --max-draft tokens
        config = DecoderConfig(drafter="batch_suffix", w=args.max_draft, datastore="store" if store is not None else "")
        warm = make_batch_drafter(config, DrafterTables(datastore=store), 0)  # its compiled code loaded here, not timed
        del warm
        gc.collect()
        self.drafter = make_batch_drafter(config, DrafterTables(datastore=store), 0)
        self.cost = cost
        # The step's cost table, once per step cost (the engine's own comes from its fitted line, a
        # few microseconds; the replay's measured table is a harness's, not to be timed as drafting).
        self.table = functools.lru_cache(maxsize=512)(lambda step, batch: cost_table(step, batch, self.drafter.w))
        self.calibration = DepthCalibration(args.max_draft)
        self.predicted: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.out = None

    def start(self, key: int, prompt: np.ndarray, limit: int) -> None:
        self.drafter.start(key, len(prompt), limit)

    def draft(self, batch: list[int], rows: np.ndarray, lengths: np.ndarray, prompts: np.ndarray,
              limits: np.ndarray, tokens: np.ndarray) -> list[np.ndarray]:
        table = None if self.cost is None else self.table(self.cost(len(batch), lengths), len(batch))
        self.out = out = self.drafter.step(batch, tokens, rows, lengths, table)
        return [out.tokens[i, :out.lengths[i]] for i in range(len(batch))]

    def predict(self, batch: list[int]) -> None:
        """Keeps what the last step's drafts were predicted to do (outside the drafter's time)."""
        out = self.out
        calibrated = self.drafter.calibrated(out)
        for i, key in enumerate(batch):
            n = out.lengths[i]
            self.predicted[key] = (out.confidence[i, :n].copy(), calibrated[i, :n])

    def judged(self, key: int, accepted: int) -> None:
        model, calibrated = self.predicted.pop(key, (None, None))
        if model is not None and len(model):
            self.calibration.add(model, calibrated, accepted)

    def finish(self, key: int, output: np.ndarray) -> None:
        self.drafter.finish(key, output.tolist())


class DepthCalibration:
    """Per draft depth j: the verified drafts that reached it, the sum of their predicted
    probabilities that their first j + 1 tokens are accepted (the drafter's model's, and as the
    budget calibrates them), and how many were."""

    def __init__(self, max_draft: int):
        self.sums = np.zeros((4, max_draft))  # drafts, model, calibrated, held

    def add(self, model: np.ndarray, calibrated: np.ndarray, accepted: int) -> None:
        n = len(model)
        self.sums[0, :n] += 1
        self.sums[1, :n] += model
        self.sums[2, :n] += calibrated
        self.sums[3, :n] += np.arange(n) < accepted

    def rows(self) -> list[dict]:
        drafts, model, calibrated, held = self.sums
        return [{"depth": j + 1, "drafts": int(drafts[j]), "predicted_model": round(float(model[j] / drafts[j]), 4),
                 "predicted_calibrated": round(float(calibrated[j] / drafts[j]), 4), "observed": round(float(held[j] / drafts[j]), 4)}
                for j in range(len(drafts)) if drafts[j]]

    def error(self) -> float:
        """The calibrated prediction's mean absolute error over depths, weighted by drafts."""
        drafts, _, calibrated, held = self.sums
        return float(np.abs(calibrated - held).sum() / max(drafts.sum(), 1))


class ArcticSuffix(Method):
    """vLLM's `suffix` method: arctic-inference's cache, called as vLLM's SuffixDecodingProposer does."""

    def __init__(self, args, store, answers, cost=None):
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        documents = store_documents(store)
        self.cache = SuffixDecodingCache(max_tree_depth=24, max_cached_requests=len(documents) + len(answers) + 1)
        for number, document in enumerate(documents):  # earlier runs' outputs: finished responses in its tree
            self.cache.start_request(f"store-{number}", np.zeros(0, np.int32))
            self.cache.add_active_response(f"store-{number}", document.tolist())
            self.cache.stop_request(f"store-{number}")
        self.max_draft, self.seen = args.max_draft, {}

    def start(self, key, prompt, limit):
        self.cache.start_request(key, np.asarray(prompt, np.int32))
        self.seen[key] = len(prompt)

    def draft(self, batch, rows, lengths, prompts, limits, tokens):
        drafts = []
        for key, row, n, prompt, limit in zip(batch, rows, lengths, prompts, limits):
            self.cache.add_active_response(key, tokens[row, self.seen[key]:n].tolist())
            self.seen[key] = n
            draft = self.cache.speculate(key, tokens[row, max(0, n - 24):n], max_spec_tokens=min(self.max_draft, limit - n - 1),
                                         max_spec_factor=1.0, min_token_prob=0.1)
            drafts.append(np.array(draft.token_ids, np.int64))
        return drafts

    def finish(self, key, output):
        self.cache.stop_request(key)
        self.seen.pop(key, None)


class VllmNgram(Method):
    """vLLM's `ngram` method: its numba batch lookup over the running requests' token rows."""

    def __init__(self, args, store, answers, cost=None):
        from vllm.v1.spec_decode.ngram_proposer import batch_propose_numba

        self.propose, self.args = batch_propose_numba, args

    def draft(self, batch, rows, lengths, prompts, limits, tokens):
        args = self.args
        drafts = np.zeros((tokens.shape[0], args.max_draft), np.int32)
        counts = np.zeros(tokens.shape[0], np.int32)
        numbers = np.zeros(tokens.shape[0], np.int32)
        numbers[rows] = lengths
        self.propose(list(rows), numbers, tokens, args.ngram_min, args.ngram_max, tokens.shape[1], args.max_draft, drafts, counts)
        room = limits - lengths - 1
        return [drafts[row, :max(min(counts[row], limit), 0)].astype(np.int64) for row, limit in zip(rows, room)]


class Plain(Method):
    """No drafts: every request-step emits one token (the projection's reference)."""

    def __init__(self, args, store, answers, cost=None):
        pass

    def draft(self, batch, rows, lengths, prompts, limits, tokens):
        return [np.zeros(0, np.int64)] * len(batch)


METHODS = {"ours": Ours, "vllm_suffix": ArcticSuffix, "vllm_ngram": VllmNgram, "plain": Plain}


def store_documents(store) -> list[np.ndarray]:
    if store is None:
        return []
    from drafters.datastore import SEPARATOR

    tokens = np.asarray(store.tokens)
    cuts = np.flatnonzero(tokens == SEPARATOR)
    pieces = (piece[piece != SEPARATOR] for piece in np.split(tokens, cuts))
    return [piece.astype(np.int64) for piece in pieces if len(piece)]
