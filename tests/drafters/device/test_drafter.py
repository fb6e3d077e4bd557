"""The device drafter's kernels (drafters/device/) against their plain reference
(tests/drafters/device/reference.py), step by step under Triton's CPU interpreter, in a decode loop
over answers that repeat themselves, each other and their predictions."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: its CPU interpreter

import numpy as np
import pytest
import torch

from drafters.device.drafter import DeviceDrafter
from drafters.device.settings import DeviceSettings
from tests.drafters.device import reference


def answers(count: int, rng) -> list[tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
    """(prompt, greedy output, prediction or None): outputs share phrases, half have a prediction
    (the output with an edit), as a series' changed rows do."""
    phrases = [rng.integers(0, 60, 7) for _ in range(4)]
    rows = []
    for i in range(count):
        prompt = rng.integers(0, 60, int(rng.integers(3, 9)))
        parts = [phrases[int(p)] if rng.random() < 0.7 else rng.integers(0, 60, 4) for p in rng.integers(0, 4, 6)]
        output = np.concatenate(parts)[: int(rng.integers(12, 40))]
        prediction = None
        if i % 2:
            cut = int(rng.integers(1, len(output)))
            prediction = np.concatenate([output[:cut], rng.integers(0, 60, 2), output[cut + 1 :]])
        rows.append((prompt, output, prediction))
    return rows


class Loop:
    """A greedy decode loop without a model: B slots, refilled from the answers as they end; each step
    verifies every slot's draft against its recorded output (k tokens verified, the accepted ones
    and one more emitted), as vLLM's runner does before `propose`."""

    def __init__(self, drafter: DeviceDrafter, rows, batch: int):
        self.drafter, self.rows, self.batch = drafter, list(rows), batch
        self.tokens = torch.zeros((drafter.max_slots, drafter.max_len), dtype=torch.int32)
        self.total = torch.zeros(drafter.max_slots, dtype=torch.int32)
        self.prompt = torch.zeros(drafter.max_slots, dtype=torch.int32)
        self.running: dict[int, tuple[np.ndarray, int]] = {}  # slot -> (output, emitted)
        self.sampled = np.zeros(drafter.max_slots, np.int32)
        self.rejected = np.zeros(drafter.max_slots, np.int32)
        self.accepted = self.steps = 0

    def admit(self) -> None:
        free = [s for s in range(self.drafter.max_slots) if s not in self.running]
        while self.rows and len(self.running) < self.batch:
            slot = free.pop(0)
            prompt, output, prediction = self.rows.pop(0)
            self.tokens[slot, : len(prompt)] = torch.from_numpy(prompt.astype(np.int32))
            self.tokens[slot, len(prompt)] = int(output[0])  # the prefill's token
            self.total[slot], self.prompt[slot] = len(prompt) + 1, len(prompt)
            self.running[slot] = (output, 1)
            self.sampled[slot], self.rejected[slot] = 0, 0
            self.drafter.start(slot)
            if prediction is not None:
                self.drafter.set_prediction(slot, prediction)

    def batch_tensors(self):
        slots = sorted(self.running)
        return (
            torch.tensor(slots, dtype=torch.int32),
            torch.from_numpy(self.sampled[slots].copy()),
            torch.from_numpy(self.rejected[slots].copy()),
        )

    def verify(self, slots, drafts: np.ndarray) -> None:
        finished = []
        for b, slot in enumerate(slots):
            output, emitted = self.running[slot]
            ahead = output[emitted:]
            accepted = 0
            while accepted < min(len(drafts[b]), len(ahead) - 1) and drafts[b][accepted] == ahead[accepted]:
                accepted += 1
            new = ahead[: accepted + 1]
            n = int(self.total[slot])
            self.tokens[slot, n : n + len(new)] = torch.from_numpy(new.astype(np.int32))
            self.total[slot] = n + len(new)
            self.sampled[slot], self.rejected[slot] = len(new), len(drafts[b]) - accepted
            self.accepted += accepted
            self.running[slot] = (output, emitted + len(new))
            if emitted + len(new) >= len(output):
                finished.append(slot)
        if finished:
            starts = [max(int(self.prompt[s]) - 3, 0) for s in finished]
            self.drafter.ingest_rows(self.tokens, self.total, finished, starts)
        for slot in finished:
            del self.running[slot]
        self.steps += 1


def run_against_reference(loop: Loop, k: int, settings: DeviceSettings) -> tuple[int, dict]:
    """Runs the loop to its end, each step's drafts from the kernels and from the reference (over
    the same state); returns the request-steps compared and the sources' counts."""
    compared, sources = 0, {}
    loop.admit()
    while loop.running:
        slots_t, sampled, rejected = loop.batch_tensors()
        state = reference.State.of(loop.drafter)
        drafts = loop.drafter.step(loop.tokens, loop.total, loop.prompt, slots_t, sampled, rejected).numpy().copy()
        batch = len(slots_t)
        want, confidence, chosen, lengths = reference.step(
            state,
            loop.tokens.numpy(),
            loop.total.numpy(),
            loop.prompt.numpy(),
            slots_t.numpy(),
            sampled.numpy(),
            rejected.numpy(),
            k,
            settings.max_depth,
            settings.min_confidence,
        )
        np.testing.assert_array_equal(drafts, want, err_msg=f"step {loop.steps}")
        np.testing.assert_allclose(loop.drafter.confidence[:batch].numpy(), confidence, rtol=1e-6)
        assert loop.drafter.source[:batch].tolist() == chosen
        assert loop.drafter.length[:batch].tolist() == lengths
        np.testing.assert_array_equal(loop.drafter.stats.numpy(), state.stats)
        np.testing.assert_array_equal(loop.drafter.reached.numpy(), state.reached)
        for name in chosen:
            sources[name] = sources.get(name, 0) + 1
        compared += batch
        loop.verify(slots_t.tolist(), drafts)
        loop.admit()
    return compared, sources


@pytest.mark.parametrize(
    "settings, bigram",
    [
        (DeviceSettings(max_depth=8, corpus_tokens=512, prediction_tokens=64), True),
        (DeviceSettings(max_depth=6, corpus_tokens=96, prediction_tokens=48, min_confidence=0.5), True),
        (DeviceSettings(max_depth=8, corpus_tokens=0, prediction_tokens=64), False),
    ],
    ids=["every-source", "small-ring-and-confidence-cut", "no-corpus-no-bigram"],
)
def test_the_kernels_draft_what_the_reference_drafts_step_by_step(settings, bigram):
    rng = np.random.default_rng(7)
    table = rng.integers(0, 60, 60).astype(np.int32) if bigram else None
    drafter = DeviceDrafter(4, 64, 5, settings, table, "cpu")
    loop = Loop(drafter, answers(10, rng), batch=4)
    compared, sources = run_against_reference(loop, 5, settings)
    assert compared >= 60
    # every source drafted somewhere (the corpus and the bigram table where they exist)
    expected = {0, 1} | ({2} if settings.corpus_tokens else set()) | ({3} if bigram else set())
    assert expected <= set(sources), sources
    assert loop.accepted > 0


def test_a_store_loaded_at_start_is_drafted_from():
    store = np.array([5, 6, 7, 8, 9, 10, 11, 2**32 - 1, 20, 21, 22, 23], np.uint32)
    drafter = DeviceDrafter(2, 32, 4, DeviceSettings(max_depth=8, corpus_tokens=1024), None, "cpu")
    drafter.ingest_store(store, separator=2**32 - 1)
    tokens = torch.zeros((2, 32), dtype=torch.int32)
    tokens[0, :5] = torch.tensor([1, 2, 5, 6, 7])
    total, prompt = torch.tensor([5, 0], dtype=torch.int32), torch.tensor([2, 0], dtype=torch.int32)
    drafter.start(0)
    one = torch.ones(1, dtype=torch.int32)
    drafts = drafter.step(tokens, total, prompt, torch.zeros(1, dtype=torch.int32), one, one * 0)
    assert drafts[0].tolist() == [8, 9, 10, 11] and drafter.sources(1) == ["corpus"]


def test_settings_out_of_range_name_the_field():
    with pytest.raises(ValueError, match="max_depth"):
        DeviceSettings(max_depth=0)
    with pytest.raises(ValueError, match="min_confidence"):
        DeviceSettings(min_confidence=2.0)


@pytest.mark.parametrize("steps_before", [0, 5000], ids=["first-step", "past-2048-steps"])
def test_an_answer_in_flight_is_drafted_from_by_the_others(steps_before):
    """Nothing has finished yet: request 1 drafts from what request 0 has emitted so far (also once
    the step count no longer fits the int32 a host int arrives as on a GPU)."""
    drafter = DeviceDrafter(2, 32, 3, DeviceSettings(max_depth=8, corpus_tokens=1024), None, "cpu")
    drafter.steps = steps_before
    tokens = torch.zeros((2, 32), dtype=torch.int32)
    tokens[0, :9] = torch.tensor([1, 2, 3, 5, 6, 7, 8, 9, 10])
    tokens[1, :6] = torch.tensor([4, 4, 4, 4, 5, 6])
    total, prompt = torch.tensor([9, 6], dtype=torch.int32), torch.tensor([3, 4], dtype=torch.int32)
    drafter.start(0)
    drafter.start(1)
    slots, one = torch.tensor([0, 1], dtype=torch.int32), torch.ones(2, dtype=torch.int32)
    drafts = drafter.step(tokens, total, prompt, slots, one, one * 0)
    assert drafts[1].tolist() == [7, 8, 9] and drafter.sources(2)[1] == "corpus"


def test_a_step_without_drafts_learns_and_indexes_but_drafts_nothing_new():
    drafter = DeviceDrafter(2, 32, 3, DeviceSettings(max_depth=8, corpus_tokens=1024), None, "cpu")
    tokens = torch.zeros((2, 32), dtype=torch.int32)
    tokens[0, :9] = torch.tensor([1, 2, 3, 5, 6, 7, 8, 9, 10])
    total, prompt = torch.tensor([9, 0], dtype=torch.int32), torch.tensor([3, 0], dtype=torch.int32)
    drafter.start(0)
    slot, one = torch.zeros(1, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    before = drafter.drafts.clone()
    drafter.step(tokens, total, prompt, slot, one, one * 0, draft=False)
    assert torch.equal(drafter.drafts, before) and int(drafter.indexed[0]) == 9


def test_a_store_longer_than_the_ring_keeps_its_newest_tokens():
    documents = [np.arange(100, 112), np.arange(200, 209), np.arange(300, 307)]
    separator = 2**32 - 1
    store = np.concatenate([np.append(d, separator) for d in documents])[:-1].astype(np.uint32)
    drafter = DeviceDrafter(1, 32, 2, DeviceSettings(max_depth=4, corpus_tokens=16), None, "cpu")
    drafter.ingest_store(store, separator)
    written = np.concatenate([np.append(d, -1) for d in documents])  # as the ring writes them
    head = int(drafter.head[0])
    assert head == len(written)
    ring = drafter.corpus.numpy()
    assert [int(ring[p % 16]) for p in range(head - 16, head)] == written[head - 16 :].tolist()
