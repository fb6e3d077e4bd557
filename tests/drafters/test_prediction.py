"""Drafting from a prediction (drafters/prediction.py): the answer's tail found in the prediction,
through insertions and deletions, at the copy where the answer has reached."""
from drafters.prediction import PredictionDrafter


def test_an_answer_that_copies_its_prediction_is_drafted_ahead_from_its_start():
    predicted = list(range(100, 130))
    drafter = PredictionDrafter(predicted, min_match=2, max_match=4)
    assert drafter.draft([], 4) == [100, 101, 102, 103]
    assert drafter.draft([100], 3) == [101, 102, 103]
    assert drafter.draft(predicted[:10], 5) == predicted[10:15]
    assert drafter.draft(predicted, 5) == []  # nothing after the end
    assert drafter.draft([7], 3) == []  # a start the prediction does not have


def test_insertions_and_deletions_are_followed():
    predicted = list(range(100, 140))
    drafter = PredictionDrafter(predicted, min_match=2, max_match=6)
    inserted = predicted[:10] + [1, 2, 3]
    assert drafter.draft(inserted, 4) == []  # new text: nothing to follow yet
    assert drafter.draft(inserted + [110, 111], 3) == [112, 113, 114]  # rejoined the prediction
    deleted = predicted[:10] + predicted[20:23]  # ten tokens of the prediction dropped
    assert drafter.draft(deleted, 3) == [123, 124, 125]


def test_a_repeated_line_resumes_where_the_answer_is():
    line = [5, 6, 7, 8]
    predicted = line + [50] + line + [60] + line + [70]
    drafter = PredictionDrafter(predicted, min_match=2, max_match=4)
    assert drafter.draft(line, 1) == [50]
    assert drafter.draft(line + [50] + line, 1) == [60]
    assert drafter.draft(line + [50] + line + [60] + line, 1) == [70]
