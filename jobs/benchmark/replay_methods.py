"""The drafting methods the replay (replay.py) drives, each as its engine calls it: ours
(drafters/suffix/, with the acceptance model's calibration by depth; `ours_prediction`: and each
row's prediction drafted from as vLLM's proposer does, drafters/prediction.py), vLLM's suffix method
(arctic-inference's cache), vLLM's n-gram lookup, plain decoding, and the copy ceiling (a bound:
the fewest steps of any drafter that copies from a row's prediction, prompt and output)."""

from __future__ import annotations

import functools
import gc
from typing import NamedTuple

import numpy as np

from drafters.budget import cost_table
from drafters.prediction import Hold, HoldRates, PredictionDrafter, step_drafts


class Method:
    """A drafting method as the replay drives it: `start` a request, `draft` for the running ones,
    `finish` one; `predict` and `judged` feed the calibration (ours only)."""

    # Whether vLLM would run a proposer for it between steps: the projection charges its time.
    proposes = True

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
    is also scored against what its tokens were predicted to do (`DepthCalibration`). With
    `predicted`, a row with a prediction drafts from it as the proposer does (`Predictions`)."""

    def __init__(self, args, store, answers, cost=None, predicted: bool = False):
        from pipeline.loading.drafters import DrafterTables, make_batch_drafter
        from pipeline.config import DraftingConfig

        # as a job builds it: the config's defaults, drafts of up to --max-draft tokens
        config = DraftingConfig(
            drafter="batch_suffix", w=args.max_draft, datastore="store" if store is not None else ""
        )
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
        self.predictions = Predictions(answers, args.prediction_w) if predicted else None

    def start(self, key: int, prompt: np.ndarray, limit: int) -> None:
        self.drafter.start(key, len(prompt), limit)
        if self.predictions is not None:
            self.predictions.start(key)

    def draft(
        self,
        batch: list[int],
        rows: np.ndarray,
        lengths: np.ndarray,
        prompts: np.ndarray,
        limits: np.ndarray,
        tokens: np.ndarray,
    ) -> list[np.ndarray]:
        step_cost = None if self.cost is None else self.cost(len(batch), lengths)
        table = None if step_cost is None else self.table(step_cost, len(batch))
        self.out = out = self.drafter.step(batch, tokens, rows, lengths, table)
        drafts = [out.tokens[i, : out.lengths[i]] for i in range(len(batch))]
        if self.predictions is not None:
            step_rows = StepRows(tokens, rows, lengths, prompts, limits)
            self.predictions.step(batch, step_rows, out.confidence, drafts, step_cost)
        return drafts

    def predict(self, batch: list[int]) -> None:
        """Keeps what the last step's drafts were predicted to do (outside the drafter's time); a
        draft the prediction's replaced is not the drafter's to score."""
        out = self.out
        calibrated = self.drafter.calibrated(out)
        replaced = self.predictions.pending if self.predictions is not None else {}
        for i, key in enumerate(batch):
            n = out.lengths[i]
            if key not in replaced:
                self.predicted[key] = (out.confidence[i, :n].copy(), calibrated[i, :n])

    def judged(self, key: int, accepted: int) -> None:
        if self.predictions is not None:
            self.predictions.judged(key, accepted)
        model, calibrated = self.predicted.pop(key, (None, None))
        if model is not None and len(model):
            self.calibration.add(model, calibrated, accepted)

    def finish(self, key: int, output: np.ndarray) -> None:
        self.drafter.finish(key, output.tolist())


class StepRows(NamedTuple):
    """A step's running rows as the replay holds them: row b is tokens[rows[b], :lengths[b]], its
    prompt the first prompts[b] tokens, and it may reach limits[b] tokens."""

    tokens: np.ndarray
    rows: np.ndarray
    lengths: np.ndarray
    prompts: np.ndarray
    limits: np.ndarray


class Predictions:
    """The rows' predictions as vLLM's proposer drafts from them (`NgrammysProposer.predict`,
    `judge`): each step after the drafter's, `step_drafts` over
    the running rows with a prediction (a draft of up to prediction_w tokens, and never past the
    row's limit), with the step's cost when the method has a budget; each draft it gave judged
    against what the row emitted from there (its output, the accepted tokens and one more)."""

    def __init__(self, answers, prediction_w: int):
        self.answers, self.w = answers, prediction_w
        self.holds = HoldRates()
        self.drafters: dict[int, tuple[PredictionDrafter, Hold]] = {}
        self.pending: dict[int, tuple[int, list[int]]] = {}  # key -> (the draft's position in the output, the draft)
        self.drafted, self.accepted = 0, 0  # prediction tokens drafted, and accepted

    def start(self, key: int) -> None:
        prediction = self.answers[key].prediction
        if prediction is not None and len(prediction):
            self.drafters[key] = (PredictionDrafter(prediction.tolist()), Hold())

    def step(
        self, batch: list[int], step_rows: StepRows, confidence: np.ndarray, drafts: list[np.ndarray], cost
    ) -> None:
        """Replaces, in `drafts`, the drafter's drafts that step_drafts prefers a prediction's to."""
        tokens, rows, lengths, prompts, limits = step_rows
        chosen = [i for i, key in enumerate(batch) if key in self.drafters]
        if not chosen:
            return
        predictions = [
            (
                *self.drafters[batch[i]],
                tokens[rows[i], prompts[i] : lengths[i]].tolist(),
                int(min(self.w, limits[i] - lengths[i] - 1)),
            )
            for i in chosen
        ]
        fed = len(batch) + sum(map(len, drafts))
        found = step_drafts(predictions, [confidence[i, : len(drafts[i])] for i in chosen], fed, self.holds, cost)
        for i, guess in zip(chosen, found):
            if guess is not None:
                drafts[i] = np.array(guess, np.int64)
                self.pending[batch[i]] = (int(lengths[i] - prompts[i]), guess)

    def judged(self, key: int, accepted: int) -> None:
        position, draft = self.pending.pop(key, (0, None))
        if draft is not None:
            emitted = self.answers[key].output[position : position + accepted + 1].tolist()
            self.holds.judge(self.drafters[key][1], draft, emitted)
            self.drafted, self.accepted = self.drafted + len(draft), self.accepted + accepted


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
        return [
            {
                "depth": j + 1,
                "drafts": int(drafts[j]),
                "predicted_model": round(float(model[j] / drafts[j]), 4),
                "predicted_calibrated": round(float(calibrated[j] / drafts[j]), 4),
                "observed": round(float(held[j] / drafts[j]), 4),
            }
            for j in range(len(drafts))
            if drafts[j]
        ]

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
        for key, row, n, limit in zip(batch, rows, lengths, limits):
            self.cache.add_active_response(key, tokens[row, self.seen[key] : n].tolist())
            self.seen[key] = n
            draft = self.cache.speculate(
                key,
                tokens[row, max(0, n - 24) : n],
                max_spec_tokens=min(self.max_draft, limit - n - 1),
                max_spec_factor=1.0,
                min_token_prob=0.1,
            )
            drafts.append(np.array(draft.token_ids, np.int64))
        return drafts

    def finish(self, key, output):
        self.cache.stop_request(key)
        self.seen.pop(key, None)


class VllmNgram(Method):
    """vLLM's `ngram` method: its numba batch lookup over the running requests' token rows."""

    def __init__(self, args, store, answers, cost=None):
        from vllm.v1.spec_decode.ngram_proposer import batch_propose_numba

        self.propose, self.args, self.w = batch_propose_numba, args, args.max_draft

    def draft(self, batch, rows, lengths, prompts, limits, tokens):
        args = self.args
        drafts = np.zeros((tokens.shape[0], self.w), np.int32)
        counts = np.zeros(tokens.shape[0], np.int32)
        numbers = np.zeros(tokens.shape[0], np.int32)
        numbers[rows] = lengths
        self.propose(
            list(rows), numbers, tokens, args.ngram_min, args.ngram_max, tokens.shape[1], self.w, drafts, counts
        )
        positions_left = limits - lengths - 1
        return [
            drafts[row, : max(min(counts[row], left), 0)].astype(np.int64) for row, left in zip(rows, positions_left)
        ]


class VllmNgramGpu(VllmNgram):
    """vLLM's `ngram_gpu` as drafting.speculation auto runs it: the same lookup (its Triton kernel
    finds the same n-grams on the GPU), drafts of at most NGRAM_GPU_W tokens."""

    def __init__(self, args, store, answers, cost=None):
        from pipeline.engines.speculation import NGRAM_GPU_W

        super().__init__(args, store, answers, cost)
        self.w = min(args.max_draft, NGRAM_GPU_W)


class Plain(Method):
    """No drafts: every request-step emits one token (the projection's reference)."""

    proposes = False  # plain vLLM runs no proposer: the replay's own bookkeeping is not its time

    def __init__(self, args, store, answers, cost=None):
        pass

    def draft(self, batch, rows, lengths, prompts, limits, tokens):
        return [np.zeros(0, np.int64)] * len(batch)


class CopyCeiling(Method):
    """Not a drafter: a bound. Each step it drafts the longest run of the row's recorded output,
    from where the row is, that occurs in the row's prediction, its prompt, its output so far
    (copies may overlap the text they copy, as a repeated line does) or its siblings' outputs so
    far (the other samples of its prompt), up to --prediction-w tokens.
    No drafter that copies text from those sources can take fewer steps; a run whose ceiling is
    below a goal cannot reach it by drafting from them."""

    def __init__(self, args, store, answers, cost=None):
        self.answers, self.w = answers, args.prediction_w
        by_prompt: dict[bytes, list[int]] = {}
        for key, answer in enumerate(answers):
            by_prompt.setdefault(answer.prompt.tobytes(), []).append(key)
        self.siblings = {key: [k for k in keys if k != key] for keys in by_prompt.values() for key in keys}
        self.emitted: dict[int, int] = {}  # how much of each started request's output is out

    def finish(self, key, output):
        self.emitted[key] = len(self.answers[key].output)

    def draft(self, batch, rows, lengths, prompts, limits, tokens):
        drafts = []
        self.emitted.update((key, int(n - prompt)) for key, n, prompt in zip(batch, lengths, prompts))
        for key, n, prompt, limit in zip(batch, lengths, prompts, limits):
            answer = self.answers[key]
            at, room = int(n - prompt), int(min(self.w, limit - n - 1))
            ahead = answer.output[at : at + room]
            sizes = [longest_run(answer.prompt, ahead), longest_run(answer.output, ahead, before=at)]
            sizes += [longest_run(self.answers[k].output[: self.emitted.get(k, 0)], ahead) for k in self.siblings[key]]
            if answer.prediction is not None:
                sizes.append(longest_run(answer.prediction, ahead))
            drafts.append(ahead[: max(sizes)].astype(np.int64))
        return drafts


def longest_run(source: np.ndarray, ahead: np.ndarray, before: int | None = None) -> int:
    """The longest prefix of `ahead` that occurs in `source` starting before position `before`
    (anywhere, by default; a run may go on past `before`)."""
    best = 0
    if not len(ahead):
        return 0
    for start in np.flatnonzero(source[:before] == ahead[0]).tolist():
        size = 1
        while size < len(ahead) and start + size < len(source) and source[start + size] == ahead[size]:
            size += 1
        best = max(best, size)
    return best


class OursPredicted(Ours):
    """ours, each row with a prediction drafting from it (replay --predictions)."""

    def __init__(self, args, store, answers, cost=None):
        super().__init__(args, store, answers, cost, predicted=True)


METHODS = {
    "ours": Ours,
    "ours_prediction": OursPredicted,
    "vllm_suffix": ArcticSuffix,
    "vllm_ngram": VllmNgram,
    "vllm_ngram_gpu": VllmNgramGpu,
    "plain": Plain,
    "copy_ceiling": CopyCeiling,
}


def store_documents(store) -> list[np.ndarray]:
    if store is None:
        return []
    from drafters.datastore import SEPARATOR

    tokens = np.asarray(store.tokens)
    cuts = np.flatnonzero(tokens == SEPARATOR)
    pieces = (piece[piece != SEPARATOR] for piece in np.split(tokens, cuts))
    return [piece.astype(np.int64) for piece in pieces if len(piece)]
