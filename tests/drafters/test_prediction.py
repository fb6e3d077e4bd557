"""Drafting from a prediction (drafters/prediction.py): the answer's tail found in the prediction,
through insertions and deletions, at the copy where the answer has reached; how often a request's
prediction holds, and the step budget's cut of its drafts."""

import numpy as np

from drafters.budget import LinearStepCost
from drafters.prediction import Hold, HoldRates, PredictionDrafter, cut_to_budget, step_drafts


def first(drafter, generated, w):
    return drafter.draft(generated, w)[0]


def test_an_answer_that_copies_its_prediction_is_drafted_ahead_from_its_start():
    predicted = list(range(100, 130))
    drafter = PredictionDrafter(predicted, min_match=2, max_match=4)
    assert first(drafter, [], 4) == [100, 101, 102, 103]
    assert first(drafter, [100], 3) == [101, 102, 103]
    assert first(drafter, predicted[:10], 5) == predicted[10:15]
    assert first(drafter, predicted, 5) == []  # nothing after the end
    assert first(drafter, [7], 3) == []  # a start the prediction does not have


def test_insertions_and_deletions_are_followed():
    predicted = list(range(100, 140))
    drafter = PredictionDrafter(predicted, min_match=2, max_match=6)
    inserted = predicted[:10] + [1, 2, 3]
    assert first(drafter, inserted, 4) == []  # new text: nothing to follow yet
    assert first(drafter, inserted + [110, 111], 3) == [112, 113, 114]  # rejoined the prediction
    deleted = predicted[:10] + predicted[20:23]  # ten tokens of the prediction dropped
    assert first(drafter, deleted, 3) == [123, 124, 125]


def test_a_repeated_line_resumes_where_the_answer_is():
    line = [5, 6, 7, 8]
    predicted = line + [50] + line + [60] + line + [70]
    drafter = PredictionDrafter(predicted, min_match=2, max_match=4)
    assert first(drafter, line, 1) == [50]
    assert first(drafter, line + [50] + line, 1) == [60]
    assert first(drafter, line + [50] + line + [60] + line, 1) == [70]


def test_a_draft_says_how_much_of_the_answer_matched():
    drafter = PredictionDrafter(list(range(100, 140)), min_match=2, max_match=6)
    assert drafter.draft(list(range(100, 110)), 2) == ([110, 111], 6)
    assert drafter.draft([1, 2, 3, 115, 116], 2) == ([117, 118], 2)
    assert drafter.draft([1, 2, 3], 2) == ([], 0)


def test_a_prediction_that_holds_earns_longer_drafts_than_one_that_leaves():
    rates = HoldRates()
    holding, leaving = Hold(), Hold()
    for _ in range(10):
        assert rates.judge(holding, [1, 2, 3, 4], [1, 2, 3, 4, 9]) == 4  # every token held, and the bonus
        assert rates.judge(leaving, [1, 2, 3, 4], [1, 7]) == 1  # the answer left at the second token
    assert (holding.judged, holding.diverged, holding.on_track) == ([0, 40], [0, 0], True)
    # [rejoining, on track]: its first draft was on track, every later one rejoining after it left
    assert (leaving.judged, leaving.diverged, leaving.on_track) == ([18, 2], [9, 1], False)
    assert rates.rate(holding) < rates.rate(leaving)
    confidence = rates.confidence(holding, 5)
    assert np.all(np.diff(confidence) < 0) and confidence[0] < 1
    cost = LinearStepCost(1.0, 0.05)
    kept = cut_to_budget([rates.confidence(holding, 64), rates.confidence(leaving, 64)], cost, fed_before=2)
    assert kept[0] > kept[1] >= 0
    assert kept[0] <= 64


def test_a_draft_cut_short_by_the_engine_is_judged_as_far_as_it_went():
    rates, hold = HoldRates(), Hold()
    assert rates.judge(hold, [1, 2, 3, 4], [1, 2, 3]) == 3  # two tokens verified, the third the model's own
    assert (hold.judged, hold.diverged) == ([0, 3], [0, 0])


def test_a_free_token_is_always_kept_and_a_costly_one_only_when_likely():
    rates, hold = HoldRates(), Hold()
    confidence = rates.confidence(hold, 200)
    assert cut_to_budget([confidence], LinearStepCost(1.0, 0.0), fed_before=1)[0] == 200  # a GPU-like step: all of it
    assert cut_to_budget([confidence], LinearStepCost(1.0, 1.0), fed_before=1)[0] < 10  # each token a whole step


def test_a_step_takes_a_predictions_draft_where_it_matches_and_is_expected_to_gain_more_than_the_drafters():
    predicted = list(range(100, 200))
    rates = HoldRates()
    rows = [
        (PredictionDrafter(predicted), Hold(), predicted[:10], 50),  # on the prediction
        (PredictionDrafter(predicted), Hold(), [1, 2, 3, 4, 5], 50),  # left it: nothing matches
        (PredictionDrafter(predicted), Hold(), predicted[:10], 3),
    ]  # on it, but room for 3 only
    own = [np.full(2, 0.9), np.zeros(0), np.full(5, 0.9)]
    found = step_drafts(rows, own=own, fed=10, holds=rates)
    assert found[0] == predicted[10:60]
    assert found[1] is None  # no evidence
    assert found[2] is None  # the drafter's 5 likely tokens gain more than the prediction's 3
    costly = step_drafts(rows[:1], own=[np.zeros(0)], fed=1, holds=rates, cost=LinearStepCost(1.0, 0.5))
    assert costly[0] is not None and 0 < len(costly[0]) < 50  # the budget cut it


def test_a_prediction_that_keeps_failing_yields_to_a_confident_draft_of_the_drafters():
    predicted = list(range(100, 200))
    rates, hold = HoldRates(), Hold()
    for _ in range(6):  # six drafts from it, each left after 2 tokens
        rates.judge(hold, predicted[10:40], predicted[10:12] + [7])
    row = [(PredictionDrafter(predicted), hold, predicted[:10], 50)]
    assert step_drafts(row, own=[np.full(8, 0.3)], fed=10, holds=rates)[0] == predicted[10:60]  # a weak guess loses
    assert step_drafts(row, own=[np.full(8, 0.95)], fed=10, holds=rates)[0] is None  # a confident one wins


def test_a_short_match_where_the_answer_is_expected_counts_as_full_evidence():
    predicted = list(range(100, 160))
    drafter = PredictionDrafter(predicted, min_match=2, max_match=8, near=4)
    assert drafter.draft(predicted[:20], 4) == (predicted[20:24], 8)
    edited = predicted[:20] + [7, 8]  # two tokens of the prediction (120, 121) replaced by two new ones
    assert drafter.draft(edited, 4) == ([], 0)
    rejoined = edited + [122, 123]  # back on the prediction: a 2-token match right where it is expected
    assert drafter.draft(rejoined, 4) == (predicted[24:28], 8)
    far = PredictionDrafter(predicted, min_match=2, max_match=8, near=4)
    far.draft(predicted[:20], 4)
    assert far.draft(predicted[:20] + [150, 151], 4) == (predicted[52:56], 2)  # a jump ahead: short evidence


class EveryRunIndex:
    """The reference: the prediction indexed by every run of min_match..max_match tokens, the longest
    run of the answer's tail looked up first (what PredictionDrafter finds from its min_match index)."""

    def __init__(self, tokens, min_match=2, max_match=8):
        self.tokens, self.min_match, self.max_match = list(tokens), min_match, max_match
        self.index = {}
        for size in range(min_match, max_match + 1):
            for end in range(size, len(self.tokens) + 1):
                self.index.setdefault(tuple(self.tokens[end - size : end]), []).append(end)
        self.reached, self.reached_at = 0, 0

    def draft(self, generated, w):
        if len(generated) < self.min_match:
            if list(generated) != self.tokens[: len(generated)]:
                return [], 0
            return self.tokens[len(generated) : len(generated) + w], self.max_match
        for size in range(min(self.max_match, len(generated)), self.min_match - 1, -1):
            ends = self.index.get(tuple(generated[len(generated) - size :]))
            if ends:
                end = PredictionDrafter.nearest(ends, self.reached + len(generated) - self.reached_at)
                self.reached, self.reached_at = end, len(generated)
                return self.tokens[end : end + w], size
        return [], 0


def test_the_min_match_index_drafts_as_an_index_of_every_run_length():
    rng = np.random.default_rng(3)
    for _ in range(40):
        predicted = rng.integers(0, 6, int(rng.integers(10, 80))).tolist()  # few distinct tokens: many repeats
        answer = list(predicted)
        for _ in range(3):  # edits: a token changed, a stretch deleted, one inserted
            at = int(rng.integers(0, len(answer)))
            answer[at : at + int(rng.integers(0, 4))] = rng.integers(0, 8, int(rng.integers(0, 3))).tolist()
        min_match, max_match = int(rng.integers(1, 3)), int(rng.integers(3, 9))
        # near=-1: the evidence as the match's length alone, as the reference has it
        drafter, reference = (
            PredictionDrafter(predicted, min_match, max_match, near=-1),
            EveryRunIndex(predicted, min_match, max_match),
        )
        for length in range(len(answer) + 1):
            assert drafter.draft(answer[:length], 5) == reference.draft(answer[:length], 5)


def test_a_draft_that_rejoins_is_judged_apart_from_one_that_continues():
    rates, hold = HoldRates(), Hold()
    for _ in range(20):  # continuing drafts hold; each rejoining one fails at once
        hold.on_track = True
        rates.judge(hold, [1, 2, 3, 4], [1, 2, 3, 4, 5])
        hold.on_track = False
        rates.judge(hold, [1, 2, 3, 4], [9])
    hold.on_track = True
    continuing = rates.confidence(hold, 32)
    hold.on_track = False
    rejoining = rates.confidence(hold, 32)
    assert continuing[7] > 0.5 > rejoining[1]
