"""The feeding simulation: a design that drains each batch leaves most of a large engine idle;
the streaming design, with as many batches in flight as the config gives it, keeps it full."""

import numpy as np
import pytest

from lab.occupancy import simulate
from pipeline.config import load_config
from pipeline.engines.build import concurrent_batches


def skewed_lengths(count: int, seed: int = 0) -> np.ndarray:
    """Answer lengths like a corpus run's: many short, a long tail, capped at 256 tokens."""
    rng = np.random.default_rng(seed)
    return np.minimum(rng.lognormal(mean=4.5, sigma=0.8, size=count).astype(int) + 1, 256)


def test_every_slot_busy_when_every_request_lasts_as_long_and_batches_fill_the_slots():
    assert simulate(np.full(64, 10), slots=8, batch_size=8, batches_in_flight=1) == pytest.approx(1.0)
    assert simulate(np.full(64, 10), slots=8, batch_size=4, batches_in_flight=1) == pytest.approx(0.5)


@pytest.mark.parametrize("slots,batch_size", [(256, 64), (16, 16)])
def test_streaming_keeps_the_engine_full_where_draining_does_not(slots, batch_size):
    lengths = skewed_lengths(6000)
    config = load_config(
        "configs/default.yaml", ["engine.name=vllm", f"vllm.max_num_seqs={slots}", f"ray.batch_size={batch_size}"]
    )
    drain = simulate(lengths, slots, batch_size, 1)
    stream = simulate(lengths, slots, batch_size, concurrent_batches(config))
    assert stream >= 0.97
    assert drain < (0.3 if batch_size < slots else 0.85)
