"""The suffix drafter (drafters/suffix/): its sources and rules on small literal cases, its compiled
step against the plain references of tests/drafters/reference.py on random and real token streams,
decoding with it, and its budget."""

from collections import Counter, defaultdict

import numpy as np
import pytest

from drafters.base import common_prefix
from drafters.budget import (
    DraftingPays,
    LinearStepCost,
    calibrated_gains,
    cost_table,
    empty_calibration,
)
from drafters.datastore import Datastore, build_datastore
from drafters.suffix import BatchSuffixDrafter, Settings, state
from drafters.suffix.acceptance import FEATURES, PRIOR, fit
from drafters.suffix.step import _budget
from tests.drafters.reference import (
    AcceptanceModel,
    continuations,
    find_longest_suffix_match,
    majority_path,
    token_features,
)
from jobs.benchmark.step_costs import GPUS, MODELS, MeasuredStepCost, RooflineStepCost

W, MAX_Q, MIN_Q, MAX_MATCH, OCCURRENCES, MIN_PROBABILITY = 6, 3, 1, 12, 8, 0.05


class Reference:
    """The drafter's rules, one request at a time, in plain Python (no learning: weights fixed)."""

    def __init__(self, store: Datastore | None):
        self.store = store
        self.model = AcceptanceModel(PRIOR)
        self.generated: dict[object, list[int]] = {}  # every request's generated tokens, in flight or finished
        self.grams: dict[tuple, list[tuple[object, int]]] = defaultdict(list)  # q-gram -> (request, end), oldest first

    def take(self, key, tokens: list[int], prompt: int) -> None:
        output = self.generated.setdefault(key, [])
        for token in tokens[prompt + len(output) :]:
            output.append(token)
            for q in range(MIN_Q, min(MAX_Q, len(output)) + 1):
                self.grams[tuple(output[-q:])].append((key, len(output)))

    def context_rows(self, tokens, w):
        n, best, rows = len(tokens), 0, []
        for end in range(n - 1, 0, -1):
            length = 0
            while length < MAX_MATCH and length < end and tokens[end - 1 - length] == tokens[n - 1 - length]:
                length += 1
            if length < MIN_Q or length < best:
                continue
            if length > best:
                best, rows = length, []
            if len(rows) < OCCURRENCES:
                row = []
                for j in range(w):
                    row.append(tokens[end + j] if end + j < n else row[j - (n - end)])
                rows.append(tuple(row))
        return best, rows

    def output_rows(self, key, tokens, w):
        n = len(tokens)
        for q in range(min(MAX_Q, n), MIN_Q - 1, -1):
            ends = [(k, e) for k, e in reversed(self.grams.get(tuple(tokens[-q:]), [])) if k != key][:OCCURRENCES]
            if not ends:
                continue
            best, kept = q, []
            for other, end in ends:
                output, length = self.generated[other], q
                while (
                    length < MAX_MATCH
                    and length < n
                    and end - length - 1 >= 0
                    and output[end - length - 1] == tokens[n - length - 1]
                ):
                    length += 1
                if length > best:
                    best, kept = length, []
                if length == best:
                    kept.append((other, end))
            rows = [tuple(self.generated[other][end : end + w]) for other, end in kept]
            rows = [row for row in rows if row]
            if rows:
                return best, rows
        return 0, []

    def store_rows(self, tokens, w):
        if self.store is None:
            return 0, []
        match, lo, hi = find_longest_suffix_match(
            np.asarray(self.store.tokens),
            np.asarray(self.store.suffix_array),
            tokens,
            MAX_MATCH,
            MAX_Q,
            self.store.segments,
        )  # the store's shortest match: max_q
        if not match:
            return 0, []
        return match, continuations(
            np.asarray(self.store.tokens), np.asarray(self.store.suffix_array), lo, hi, match, w, OCCURRENCES
        )

    def draft(self, key, tokens: list[int], prompt: int, limit: int) -> tuple[list[int], str | None]:
        self.take(key, tokens, prompt)
        w = min(W, limit - len(tokens) - 1)
        if w <= 0:
            return [], None
        found = []
        for source, (match, rows) in zip(
            ("context", "outputs", "store"),
            (self.context_rows(tokens, w), self.output_rows(key, tokens, w), self.store_rows(tokens, w)),
        ):
            path, shares, counts = majority_path(Counter(rows), w)
            if path:
                found.append((source, path, token_features([(source, match, shares, counts)])))
        for source, path, features in found:
            for other_source, other, _ in found:
                if other_source != source:
                    features[: common_prefix(path, other), FEATURES.index("agreed")] = 1.0
        best, best_score = None, 0.0
        for source, path, features in found:
            confidence = self.model.cumulative(features)
            kept = int(np.sum(confidence >= MIN_PROBABILITY))
            if kept and (best is None or confidence.sum() > best_score):
                best, best_score = (path[:kept], source), confidence.sum()
        return best if best is not None else ([], None)


def stepped(drafter, keys, tokens, rows, lengths, prompts, limits, **kwargs):
    """drafter.step, each request started first where it is new (with its prompt's length and limit)."""
    for key, prompt, limit in zip(keys, np.broadcast_to(prompts, len(keys)), np.broadcast_to(limits, len(keys))):
        if key not in drafter.slot_of:
            drafter.start(key, int(prompt), int(limit))
    return drafter.step(keys, tokens, rows, lengths, **kwargs)


def compiled(store=None):
    settings = Settings(MIN_Q, MAX_Q, MAX_MATCH, OCCURRENCES, refit_every=1 << 40, min_probability=MIN_PROBABILITY)
    return BatchSuffixDrafter(W, settings, capacity=1 << 14, store=store)


def run_both(streams, prompts, store=None, batch=3, drafter=None):
    """Replays streams (prompt + output each) `batch` at a time, each step emitting 1-3 tokens per
    request; returns every step's drafts from both."""
    drafter, reference = drafter or compiled(store), Reference(store)
    tokens = np.zeros((len(streams), max(map(len, streams))), np.int64)
    for i, stream in enumerate(streams):
        tokens[i, : len(stream)] = stream
    rng = np.random.default_rng(1)
    seen, drafted_any = [], 0
    for start in range(0, len(streams), batch):
        group = list(range(start, min(start + batch, len(streams))))
        lengths = {i: prompts[i] + 1 for i in group}
        while group:
            rows = np.array(group)
            n = np.array([lengths[i] for i in group])
            limits = np.array([len(streams[i]) + 4 for i in group])
            out = stepped(drafter, group, tokens, rows, n, np.array([prompts[i] for i in group]), limits)
            for b, i in enumerate(group):
                ours = out.tokens[b, : out.lengths[b]].tolist()
                theirs, source = reference.draft(i, list(streams[i][: lengths[i]]), prompts[i], int(limits[b]))
                seen.append((ours, theirs))
                assert ours == theirs, f"request {i} at {lengths[i]} tokens: compiled {ours}, reference {theirs}"
                assert (source is None) == (out.strategy[b] < 0)
                drafted_any += bool(ours)
            for i in list(group):
                lengths[i] += int(rng.integers(1, 4))
                if lengths[i] >= len(streams[i]):
                    drafter.finish(i, list(streams[i][prompts[i] :]))
                    reference.take(i, list(streams[i]), prompts[i])
                    group.remove(i)
    return seen, drafted_any


SURE = np.array([10.0] + [0.0] * (len(FEATURES) - 1))  # sigmoid(10) for every token: a path runs as far as its evidence


def drafted(drafter, tokens: list[int], key="r", prompt: int = 1) -> tuple[list[int], str | None]:
    """One step of one request (started with a `prompt`-token prompt): its draft and source."""
    if key not in drafter.slot_of:
        drafter.start(key, prompt, 1 << 20)
    out = drafter.step([key], np.array([tokens], np.int64), np.zeros(1, np.int64), np.array([len(tokens)]))
    source = drafter.strategies[out.strategy[0]] if out.lengths[0] else None
    return out.tokens[0, : out.lengths[0]].tolist(), source


def finished_output(drafter, key, generated: list[int]) -> None:
    """A request that ran a step (its one-token prompt) and ended with `generated`: one of the outputs."""
    drafted(drafter, [9], key)
    drafter.finish(key, generated)


def test_each_source_is_named_on_the_draft_it_makes(tmp_path):
    drafter = BatchSuffixDrafter(3, Settings(2, 3), prior=SURE, capacity=1 << 10)
    assert drafted(drafter, [5, 6, 7, 1, 5, 6]) == ([7, 1, 5], "suffix_context")
    finished_output(drafter, "done", [40, 41, 42, 43, 44])
    assert drafted(drafter, [9, 40, 41], "new") == ([42, 43, 44], "suffix_outputs")
    store = build_datastore([[70, 71, 72, 73, 74]] * 3, tmp_path / "store", {})
    with_store = BatchSuffixDrafter(2, Settings(2, 3, store_min_match=2), prior=SURE, capacity=1 << 10, store=store)
    assert drafted(with_store, [9, 71, 72]) == ([73, 74], "suffix_store")


def test_the_majority_path_follows_the_most_frequent_continuation_with_its_shares():
    rows = Counter([(3, 4, 5)] * 3 + [(9, 9, 9), (3, 7)])
    path, shares, counts = majority_path(rows, 3)
    # 3 of 5 continuations start with 3 (one unseen counted: 4 / 6); of those 4, three go on with 4; then all.
    assert path == [3, 4, 5] and shares == pytest.approx([4 / 6, 3 / 4, 1.0]) and counts == [4, 3, 3]
    assert majority_path(Counter([(8, 1), (6, 1)]), 2)[0] == [6, 1]  # a tie: the smaller token id
    assert majority_path(Counter(), 3) == ([], [], [])


def test_a_draft_is_cut_where_the_model_gives_it_too_little_chance():
    context = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3]  # one earlier occurrence of (1, 2, 3)
    drafter = BatchSuffixDrafter(6, Settings(1, 2, min_probability=0.3), capacity=1 << 10)
    draft, _ = drafted(drafter, context)
    assert 1 <= len(draft) < 6 and draft == [4, 5, 6, 7, 8, 9][: len(draft)]  # one occurrence does not vouch for 6
    assert drafted(BatchSuffixDrafter(6, Settings(1, 2, min_probability=0.99), capacity=1 << 10), context) == ([], None)


def test_the_occurrences_that_repeat_the_most_context_decide_not_the_most_frequent():
    # (1, 2) was followed by 4 twice and by 3 once, but only the 3 came after the same 5 as now.
    context = [5, 1, 2, 3, 6, 1, 2, 4, 6, 1, 2, 4, 5, 1, 2]
    assert drafted(BatchSuffixDrafter(2, Settings(2, 2), prior=SURE, capacity=1 << 10), context)[0] == [3, 6]
    assert drafted(BatchSuffixDrafter(1, Settings(2, 2, max_match=2), prior=SURE, capacity=1 << 10), context)[0] == [4]


def test_the_source_the_model_trusts_drafts():
    # The context repeats (1, 2) -> 3 once, after a long match; the outputs saw (1, 2) -> 7 five times.
    context = [5, 8, 4, 1, 2, 3, 6, 5, 8, 4, 1, 2]

    def trained(prior):
        drafter = BatchSuffixDrafter(2, Settings(2, 2, refit_every=1 << 40), prior=prior, capacity=1 << 10)
        for i in range(5):
            finished_output(drafter, f"old{i}", [9, 9, 1, 2, 7, 8])
        return drafter

    assert drafted(trained(PRIOR), context) == ([3, 6], "suffix_context")  # the prior trusts a long own repeat more
    outputs_trusted = PRIOR.copy()
    outputs_trusted[FEATURES.index("from_outputs")] = 5.0
    assert drafted(trained(outputs_trusted), context) == ([7, 8], "suffix_outputs")


@pytest.mark.parametrize("batched", [False, True])
def test_decoding_with_the_suffix_drafter_is_plain_greedy_and_learns_from_finished_outputs(tiny_model, batched):
    from pipeline.engines.base import Request
    from pipeline.engines.transformers.batched_decoder import BatchedDecoder
    from pipeline.engines.transformers.speculative_decoder import SpeculativeDecoder

    prompts = [[1, 5, 9, 2, 5, 9], [1, 40, 41, 42], [1, 5, 9, 2, 5, 9], [1, 40, 41, 42]]
    plain = SpeculativeDecoder(tiny_model, None, None, 1, 0)
    reference = [plain.generate(prompt, 24).token_ids for prompt in prompts]
    decoder = SpeculativeDecoder(tiny_model, None, BatchSuffixDrafter(6, Settings(2, 3), capacity=1 << 12), 1, 6)
    if batched:
        requests = [Request(f"r{i}", prompt, 24) for i, prompt in enumerate(prompts)]
        results = {request.request_id: result for request, result in BatchedDecoder(decoder, 2).generate_many(requests)}
        results = [results[f"r{i}"] for i in range(len(prompts))]
    else:
        results = [decoder.generate(prompt, 24) for prompt in prompts]
    assert [result.token_ids for result in results] == reference
    # The repeated prompts' answers were drafted from the first answers, other requests' outputs.
    later = [result.stats.strategy_accepted_tokens.get("suffix_outputs", 0) for result in results[2:]]
    assert sum(later) > 0, [result.stats.strategy_accepted_tokens for result in results]


def test_random_streams_draft_as_the_reference():
    rng = np.random.default_rng(0)
    # Few symbols: matches of every length, repeats across requests
    streams = [rng.integers(0, 6, int(rng.integers(30, 90))).tolist() for _ in range(9)]
    prompts = [int(rng.integers(3, 20)) for _ in streams]
    seen, drafted = run_both(streams, prompts)
    assert drafted > len(seen) // 2


def test_the_compiled_refit_is_the_acceptance_models_fit_on_the_same_judged_drafts():
    """The drafter's own judging fills its ring of judged tokens; its compiled Newton steps
    (drafters/suffix/acceptance.py: fit, solve) from the prior over that ring give the weights the
    Python reference's AcceptanceModel.fit gives (tests/drafters/reference.py)."""
    rng = np.random.default_rng(0)
    streams = [rng.integers(0, 6, int(rng.integers(30, 90))).tolist() for _ in range(9)]
    prompts = [int(rng.integers(3, 20)) for _ in streams]
    drafter = compiled()
    run_both(streams, prompts, drafter=drafter)
    held = min(int(drafter.counters[state.JUDGED]), len(drafter.ring_y))
    x, y = drafter.ring_x[:held], drafter.ring_y[:held]
    assert held > 100 and 0 < y.mean() < 1
    for steps in (1, 3):
        weights = PRIOR.astype(np.float64)  # a copy
        fit(weights, PRIOR.astype(np.float64), drafter.ring_x, drafter.ring_y, held, 200.0, steps)
        model = AcceptanceModel(PRIOR, prior_strength=200.0, capacity=held, refit_every=1 << 40, newton_steps=steps)
        model.observe(x, y)
        model.fit()
        np.testing.assert_allclose(weights, model.weights, rtol=1e-9, atol=1e-9)
        assert np.abs(weights - PRIOR).max() > 1e-3  # the judged tokens moved them


def test_real_streams_with_a_store_draft_as_the_reference(tmp_path):
    text = open(__file__).read() + open(__import__("drafters.suffix").suffix.__file__).read()
    words = text.split()
    vocab = {w: i for i, w in enumerate(dict.fromkeys(words))}
    ids = [vocab[w] for w in words]
    streams = [ids[i : i + 120] for i in range(0, 1800, 200)]
    prompts = [40] * len(streams)
    build_datastore([ids[2000:2600], ids[2600:3400]], tmp_path / "store", {})
    store = Datastore.open(tmp_path / "store")
    seen, drafted = run_both(streams, prompts, store, batch=4)
    assert drafted > 0


def test_random_streams_with_a_store_of_few_symbols_draft_as_the_reference(tmp_path):
    """Store matches of every length, in suffix-array ranges of one to hundreds of suffixes, and
    matches that go on from step to step (searched in the last match's range) or break."""
    rng = np.random.default_rng(3)
    streams = [rng.integers(0, 5, int(rng.integers(40, 100))).tolist() for _ in range(8)]
    prompts = [int(rng.integers(3, 20)) for _ in streams]
    build_datastore(
        [rng.integers(0, 5, 700).tolist(), streams[0] * 3, rng.integers(0, 3, 300).tolist()], tmp_path / "store", {}
    )
    seen, drafted = run_both(streams, prompts, Datastore.open(tmp_path / "store"))
    assert drafted > len(seen) // 2


def test_a_pickled_drafter_goes_on_drafting_as_the_original(tmp_path):
    """The vLLM engine pickles the drafter to each tensor-parallel rank: the copy's compiled state
    is made again over its own arrays, and its drafts are the original's, step for step."""
    import pickle

    rng = np.random.default_rng(4)
    streams = [rng.integers(0, 6, 80) for _ in range(3)]
    tokens = np.array(streams, np.int64)
    build_datastore([rng.integers(0, 6, 400).tolist()], tmp_path / "store", {})
    original = compiled(Datastore.open(tmp_path / "store"))
    rows, prompts, limits = np.arange(3), np.full(3, 10), np.full(3, 90)
    for n in range(11, 30, 2):
        stepped(original, [0, 1, 2], tokens, rows, np.full(3, n), prompts, limits)
    copy = pickle.loads(pickle.dumps(original))
    for n in range(31, 70, 3):
        ours, theirs = (stepped(d, [0, 1, 2], tokens, rows, np.full(3, n), prompts, limits) for d in (original, copy))
        assert ours.lengths.tolist() == theirs.lengths.tolist() and np.array_equal(ours.tokens, theirs.tokens)
        assert not np.shares_memory(ours.tokens, theirs.tokens)
    assert ours.lengths.sum() > 0
    assert copy.compiled_calls == original.compiled_calls + 1  # (the copy loaded its compiled step when unpickled)


def test_every_kind_of_array_runs_one_compiled_step(tmp_path):
    """vLLM's int32 token rows and the transformers engine's int64, a store built in this process
    (writable arrays) and one an actor maps from the object store (read-only), and a drafter
    unpickled (its arrays writable again): one compiled step for all of them, not one per kind of
    array (each compile is tens of seconds where nothing is cached)."""
    import pickle

    from drafters.suffix.step import step

    build_datastore([list(range(40)) * 3], tmp_path / "store", {})
    on_disk = Datastore.open(tmp_path / "store")
    writable = Datastore(np.array(on_disk.tokens), np.array(on_disk.suffix_array), on_disk.meta)
    drafters = [compiled(), compiled(on_disk), compiled(writable), pickle.loads(pickle.dumps(compiled(on_disk)))]
    before = len(step.signatures)
    rows, prompts, limits = np.arange(1), np.full(1, 3), np.full(1, 60)
    for drafter in drafters:
        for dtype in (np.int32, np.int64):
            tokens = np.array([list(range(40))], dtype)
            stepped(drafter, [0], tokens, rows, np.full(1, 20), prompts, limits)
    assert len(step.signatures) == max(before, 1), step.signatures


def test_answers_in_flight_are_drafted_from():
    """A request drafts another's answer while that one is still being generated."""
    drafter = compiled()
    answer = list(range(100, 140))
    tokens = np.array([[1, 2, 3] + answer, [7, 8, 9] + answer])
    # request 0 has generated 30 tokens of the answer; request 1 has just begun it
    stepped(drafter, [0], tokens, np.array([0]), np.array([33]), np.array([3]), np.array([60]))
    out = stepped(drafter, [1], tokens, np.array([1]), np.array([6]), np.array([3]), np.array([60]))
    length = int(out.lengths[0])
    assert length >= 1 and out.tokens[0, :length].tolist() == answer[3 : 3 + length]
    assert drafter.strategies[out.strategy[0]] == "suffix_outputs"


def test_one_compiled_call_drafts_for_256_requests():
    drafter = compiled()
    rng = np.random.default_rng(3)
    tokens = rng.integers(0, 50, (256, 200))
    calls = drafter.compiled_calls
    out = stepped(
        drafter, list(range(256)), tokens, np.arange(256), np.full(256, 150), np.full(256, 100), np.full(256, 199)
    )
    assert drafter.compiled_calls == calls + 1 and out.lengths.shape == (256,)


def test_memory_is_bounded_past_the_capacity():
    drafter = BatchSuffixDrafter(W, Settings(MIN_Q, MAX_Q), capacity=4096)
    size = drafter.memory_bytes()
    rng = np.random.default_rng(4)
    for key in range(200):  # 200 x 100 generated tokens: five times the arena
        stream = rng.integers(0, 30, 130)
        stepped(drafter, [key], stream[None, :], np.zeros(1), np.array([130]), np.array([30]), np.array([140]))
        drafter.finish(key, stream[30:].tolist())
    assert drafter.memory_bytes() == size
    out = stepped(drafter, ["new"], stream[None, :], np.zeros(1), np.array([60]), np.array([30]), np.array([140]))
    assert out.lengths[0] > 0  # still drafts after the old outputs were dropped


# -- the budget -------------------------------------------------------------------------------


def budgeted(cost, batch=64):
    """A batch's drafts from one step, cut by `cost`; returns (tokens kept, tokens before the cut)."""
    rng = np.random.default_rng(5)
    base = rng.integers(0, 8, 60)
    tokens = np.tile(base, (batch, 3))  # every request repeats itself: long, likely drafts
    drafter = compiled()
    args = (list(range(batch)), tokens, np.arange(batch), np.full(batch, 150), np.full(batch, 60), np.full(batch, 179))
    uncut = int(stepped(drafter, *args).lengths.sum())
    drafter = compiled()
    kept = int(stepped(drafter, *args, step_cost=cost_table(cost, batch, W)).lengths.sum())
    return kept, uncut


def test_the_budget_cuts_drafts_when_tokens_are_dear_and_keeps_them_when_cheap():
    kept_cheap, uncut = budgeted(LinearStepCost(a=1.0, b=1e-4))
    kept_dear, _ = budgeted(LinearStepCost(a=1.0, b=0.5))
    assert uncut > 64 and kept_cheap == uncut
    assert kept_dear < uncut // 4


def test_on_a_gpu_roofline_drafts_are_kept_while_the_step_is_memory_bound():
    small, uncut = budgeted(RooflineStepCost(GPUS["a100"], MODELS["8b"], 4, 500.0), batch=4)
    large, large_uncut = budgeted(RooflineStepCost(GPUS["a100"], MODELS["8b"], 256, 500.0), batch=256)
    assert small == uncut  # 4 requests x 7 tokens: far from compute-bound, every draft token is free
    assert large < large_uncut  # 256 requests: the step is compute-bound, only likely tokens pay


def test_drafting_is_skipped_while_it_does_not_pay_for_its_time_and_probed_now_and_then():
    pays = DraftingPays(probe=4)
    table = np.full(100, 1.0)  # a plain step of 1 s for 4 requests; extra tokens free
    pays.observe(expected_accepted=0.0, fed_drafts=0, batch=4, step_cost=table, drafter_seconds=0.01)
    assert [pays.drafting() for _ in range(8)] == [False, False, False, True] * 2
    pays.observe(expected_accepted=4.0, fed_drafts=8, batch=4, step_cost=table, drafter_seconds=0.01)  # 1 s gained
    assert pays.drafting()


def test_a_drafter_that_skips_still_takes_in_the_batch_and_drafts_again_when_probing():
    batch, steps = 8, 40
    rng = np.random.default_rng(6)
    base = rng.integers(0, 8, 60)
    tokens = np.tile(base, (batch, 3))  # every request repeats itself: long, likely drafts
    free = np.full(batch * (W + 1) + 1, 1e-12)  # a step of nothing: no draft is worth the drafter's time
    drafter = compiled()
    drafted = []
    for step in range(steps):
        n = 100 + step
        out = stepped(
            drafter,
            list(range(batch)),
            tokens,
            np.arange(batch),
            np.full(batch, n),
            np.full(batch, 60),
            np.full(batch, 179),
            step_cost=free,
        )
        drafted.append(int(out.lengths.sum()))
    # The first step drafts (nothing is known yet) and is judged by its time, which is not a compile's:
    # the drafter compiled its step when it was made.
    assert drafted[:2] == [48, 0] and drafted[-1] == 0
    assert 0 < sum(d > 0 for d in drafted[1:]) <= steps // drafter.pays.probe + 1  # probes only
    assert drafter.slots[drafter.slot_of[0], state.SEEN] == 100 + steps - 1  # every token taken in


def test_a_measured_step_cost_interpolates_its_table_and_extends_it():
    report = {
        "rows": [
            {"batch": b, "fed_per_request": f, "seconds": s}
            for b, f, s in [(16, 1, 6.0), (16, 2, 6.0), (16, 5, 7.0), (256, 1, 11.0), (256, 2, 25.0), (256, 3, 32.0)]
        ]
    }
    small, large = MeasuredStepCost.from_report(report, 16), MeasuredStepCost.from_report(report, 200)
    assert small.seconds(np.array([16, 32, 56, 80])).tolist() == [6.0, 6.0, 6.5, 7.0]
    assert large.seconds(np.array([200, 300, 800])).tolist() == pytest.approx(
        [11.0, 18.0, 39.0]
    )  # 4 per request: 32 + 7
    kept_small, uncut = budgeted(MeasuredStepCost.from_report(report, 4), batch=4)
    kept_large, uncut_large = budgeted(MeasuredStepCost.from_report(report, 256), batch=256)
    assert kept_small == uncut and kept_large < uncut_large // 4  # a second token per request doubles a 256 step


@pytest.mark.parametrize("batch", [1, 16])
def test_budget_keeps_the_most_likely_tokens_as_prefixes(batch):
    drafter = compiled()
    rng = np.random.default_rng(6)
    tokens = np.tile(rng.integers(0, 5, 40), (batch, 4))
    args = (list(range(batch)), tokens, np.arange(batch), np.full(batch, 120), np.full(batch, 40), np.full(batch, 159))
    full = stepped(drafter, *args)
    full_tokens, full_lengths = full.tokens.copy(), full.lengths.copy()
    cut = stepped(compiled(), *args, step_cost=cost_table(LinearStepCost(1.0, 0.05), batch, W))
    for b in range(batch):
        assert cut.lengths[b] <= full_lengths[b]
        assert cut.tokens[b, : cut.lengths[b]].tolist() == full_tokens[b, : cut.lengths[b]].tolist()


def test_the_budget_trusts_the_model_only_as_far_as_its_judged_tokens_bear_it_out():
    batch, w = 8, 4
    confidence = np.tile([0.9, 0.88, 0.86, 0.84], (batch, 1))
    cost = cost_table(LinearStepCost(a=1.0, b=0.05), batch, w)  # a token pays above ~0.4 here
    fresh = empty_calibration()
    lengths = np.full(batch, w)
    assert _budget(lengths, confidence, cost, fresh) == batch * w  # no evidence: the model's word
    overconfident = fresh.copy()
    overconfident[:, :, 16:19] = np.array([[5.0] * 3, [100.0] * 3])[:, None, :]  # rated 0.8-0.95, held 5 in 100
    lengths = np.full(batch, w)
    assert _budget(lengths, confidence, cost, overconfident) == 0


def test_the_calibration_is_kept_by_depth():
    """A model whose first tokens are held more often than it says and whose deeper tokens less
    often: each depth is corrected by its own judged tokens, not by the average of both."""
    batch, w = 8, 4
    confidence = np.tile([0.55, 0.55, 0.55, 0.55], (batch, 1))  # one probability bin at every depth
    calibration = empty_calibration()
    bin_ = int(0.55 * calibration.shape[2])
    calibration[:, 0, bin_] = [950.0, 1000.0]  # first tokens: held 95 %
    calibration[:, 1:, bin_] = np.array([[100.0], [1000.0]])  # deeper: 10 %
    gains = calibrated_gains(confidence, np.full(batch, w), calibration, np.zeros_like(confidence))
    assert gains[0, 0] == pytest.approx((950 + 20 * 0.55) / 1020)
    assert gains[0, 1] == pytest.approx((100 + 20 * 0.55) / 1020)
    cost = cost_table(LinearStepCost(a=1.0, b=0.05), batch, w)  # a token pays above ~0.4 here
    lengths = np.full(batch, w)
    assert _budget(lengths, confidence, cost, calibration) == batch  # the first token of each, no more
    assert lengths.tolist() == [1] * batch


def test_judged_drafts_fill_the_calibration():
    drafter = compiled()
    rng = np.random.default_rng(7)
    for step in range(40):  # contexts that repeat, continued by tokens that do not: drafts fail
        tokens = np.concatenate([np.tile([1, 2, 3, 4], 10), rng.integers(5, 60, step + 1)])[None, :]
        stepped(drafter, ["r"], tokens, np.zeros(1), np.array([tokens.shape[1]]), np.array([40]), np.array([200]))
    hits, judged = drafter.calibration
    assert judged.sum() > 0 and hits.sum() < judged.sum()


def test_the_calibration_learns_from_the_drafts_not_every_candidate():
    """Two sources draft every step (the request's own context and an earlier answer of the same
    pattern); only the candidate written as the draft is scored into the calibration, so its
    first-token count is the drafts judged, not twice that."""
    drafter = compiled()
    pattern = np.tile([1, 2, 3, 4, 5, 6, 7], 12)
    stepped(
        drafter, ["earlier"], pattern[None, :], np.zeros(1), np.array([len(pattern)]), np.array([7]), np.array([200])
    )
    drafter.finish("earlier", pattern[7:].tolist())
    drafts = 0
    for n in range(14, 70):  # one emitted token per step, the pattern continued: every draft holds
        out = stepped(drafter, ["now"], pattern[None, :], np.zeros(1), np.array([n]), np.array([14]), np.array([200]))
        drafts += int(out.lengths[0] > 0)
    first_tokens_judged = drafter.calibration[1, 0].sum()
    assert 0.8 * drafts <= first_tokens_judged <= drafts


def test_misuse_of_the_lifecycle_raises():
    from drafters.base import LifecycleError

    drafter = compiled()
    tokens = np.zeros((1, 20), np.int64)
    with pytest.raises(LifecycleError, match=r"requests \['a'\] were not started"):
        drafter.step(["a"], tokens, np.zeros(1), np.array([5]))
    drafter.start("a", 3, 20)
    with pytest.raises(LifecycleError, match="started already"):
        drafter.start("a", 3, 20)
    drafter.step(["a"], tokens, np.zeros(1), np.array([5]))
    drafter.finish("a")
    with pytest.raises(LifecycleError, match="were not started"):
        drafter.finish("a")
    drafter.start("a", 3, 20)  # a request that comes back starts again
    assert drafter.step(["a"], tokens, np.zeros(1), np.array([6])).lengths.shape == (1,)


def test_a_store_of_segments_drafts_as_the_reference(tmp_path):
    """A series' store joins segments (each closed by a SEPARATOR, its suffix array sorted on its own):
    every segment is searched, the longest match wins, the newest segment's on a tie."""
    rng = np.random.default_rng(5)
    streams = [rng.integers(0, 5, int(rng.integers(40, 100))).tolist() for _ in range(8)]
    prompts = [int(rng.integers(3, 20)) for _ in streams]
    parts = [[rng.integers(0, 5, 400).tolist()], [streams[0] * 2, rng.integers(0, 3, 200).tolist()], [streams[3]]]
    segments = [build_datastore(docs, tmp_path / f"s{i}", {}, closed=i < 2) for i, docs in enumerate(parts)]
    store = Datastore.join(segments, {})
    assert store.segments.tolist() == [
        [0, 401],
        [401, 401 + len(streams[0]) * 2 + 202],
        [store.segments[2][0], len(store.tokens)],
    ]
    seen, drafted = run_both(streams, prompts, store)
    assert drafted > len(seen) // 2
