"""Drafting from a prediction (drafters/prediction.py): the answer's tail found in the prediction,
through insertions and deletions, at the copy where the answer has reached."""
from drafters.prediction import PredictionDrafter


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
