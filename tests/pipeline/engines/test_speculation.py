"""The speculation mode an actor runs in (pipeline/engines/speculation.py): the modes each
setting allows, the rule, and the chooser fed made-up batches (no engine)."""

import pytest

from pipeline.config import ConfigError, load_config
from pipeline.engines import speculation
from pipeline.engines.build import checked_config
from pipeline.engines.speculation import NGRAM_GPU, PLAIN, Chooser


def vllm(*overrides):
    return load_config(overrides=["engine.name=vllm", *overrides])


def chooser(running=16, expected_rows=None, restart=5.0, modes=("batch_suffix", PLAIN), platform="cpu") -> Chooser:
    """A CPU actor's chooser, by default at 16 requests at once (the rule starts it drafting and
    leaves the answer open), windows of 10 busy seconds and 32 rows."""
    made = Chooser(modes=modes, platform=platform, running=running, window_setting=10.0, expected_rows=expected_rows)
    made.restart_seconds = restart
    return made


class Actor:
    """Feeds a chooser batches of 8 rows of 1 s each at each mode's tokens per second, making the
    switches it asks for (`predicted`: rows with a prediction per batch)."""

    def __init__(self, made: Chooser, rates: dict[str, float], predicted: int = 0):
        self.chooser, self.rates, self.predicted, self.busy, self.modes = made, rates, predicted, 0.0, []

    def run(self, batches: int) -> "Actor":
        for _ in range(batches):
            self.busy += 1.0
            self.modes.append(self.chooser.mode)
            target = self.chooser.observe(self.busy, int(self.rates[self.chooser.mode]), 8, self.predicted)
            if target is not None:
                self.chooser.switched(target, 0.0, self.chooser.restart_seconds)
        return self


def test_each_setting_names_its_modes_and_the_gpu_adds_vllms_async_ngram():
    assert speculation.modes(vllm()) == ("batch_suffix", PLAIN)
    assert speculation.modes(vllm("drafting.speculation=on")) == ("batch_suffix",)
    assert speculation.modes(vllm("drafting.speculation=off")) == (PLAIN,)
    assert speculation.modes(vllm("drafting.drafter=none")) == (PLAIN,)
    gpu = vllm("ray.num_gpus_per_actor=1")
    assert speculation.modes(gpu) == ("batch_suffix", PLAIN, "vllm_ngram_gpu")
    assert speculation.mode_config(gpu, "vllm_ngram_gpu").drafting.w == speculation.NGRAM_GPU_W
    assert checked_config(speculation.mode_config(gpu, "vllm_ngram_gpu")).drafting.drafter == "vllm_ngram_gpu"
    assert speculation.modes(load_config(overrides=["engine.name=transformers"])) == ("batch_suffix", PLAIN)


def test_yamls_bare_on_and_off_are_the_settings_and_anything_else_is_refused():
    assert load_config(overrides=["drafting.speculation=on"]).drafting.speculation == "on"  # YAML reads it as true
    assert load_config(overrides=["drafting.speculation=off"]).drafting.speculation == "off"
    with pytest.raises(ConfigError, match="drafting.speculation"):
        load_config(overrides=["drafting.speculation=sometimes"])


def test_vllms_gpu_ngram_is_refused_on_cpu_actors_when_the_job_starts():
    with pytest.raises(ConfigError, match="drafting.drafter: must be 'vllm_ngram_gpu' only on GPU actors"):
        checked_config(vllm("drafting.drafter=vllm_ngram_gpu"))


def test_the_rule_reads_the_platform_the_engines_concurrency_and_the_rows_predictions():
    rule = speculation.platform_rule
    assert rule("cpu", 1).mode == speculation.DRAFTING and not rule("cpu", 1).measure
    assert rule("cpu", 16).measure and rule("cpu", 16).mode == speculation.DRAFTING
    assert rule("cpu", 32).measure and rule("cpu", 32).mode == PLAIN and rule("cpu", 64).mode == PLAIN
    assert rule("gpu", 16).mode == NGRAM_GPU and rule("gpu", 16, predictions=True).mode == speculation.DRAFTING
    assert rule("gpu", 64).mode == NGRAM_GPU and not rule("gpu", 64).measure and rule("gpu", 64, True).measure
    assert rule("gpu", 256).mode == PLAIN
    # vLLM 0.34 (every method on the device): greedy rows draft up to 128 running (measured where chat
    # loses), plain past it; sampled rows plain until measured.
    assert rule("gpu_v2", 16).mode == speculation.DRAFTING and not rule("gpu_v2", 16).measure
    assert rule("gpu_v2", 64).measure and rule("gpu_v2", 64).mode == PLAIN
    assert rule("gpu_v2", 64, predictions=True).mode == speculation.DRAFTING and not rule("gpu_v2", 64, True).measure
    assert rule("gpu_v2", 256).mode == PLAIN
    assert rule("gpu_v2", 16, greedy=False).mode == PLAIN and rule("gpu_v2", 16, greedy=False).measure
    # On an engine without vLLM's ngram_gpu (the transformers engine on a GPU) the rule's ngram_gpu is plain.
    assert Chooser(modes=("batch_suffix", PLAIN), platform="gpu", running=64).mode == PLAIN
    # The engine's slots, bounded by the rows the actor holds at once and by the rows it will see.
    assert speculation.concurrency(vllm("vllm.max_num_seqs=16"), None) == 16
    assert speculation.concurrency(vllm("vllm.max_num_seqs=16"), 3) == 3
    assert speculation.concurrency(vllm("ray.num_gpus_per_actor=1"), None) == 256


def test_a_clear_rule_or_a_short_job_never_switches():
    assert (
        Actor(chooser(running=1, expected_rows=10**6), {"batch_suffix": 100, PLAIN: 300}).run(200).chooser.switches
        == []
    )
    # Open, but 40 batches of 8 rows: the round's restarts and windows are more than 3 % of the work.
    short = Actor(chooser(expected_rows=320), {"batch_suffix": 100, PLAIN: 300}).run(40)
    assert short.chooser.switches == [] and set(short.modes) == {"batch_suffix"}
    assert short.chooser.report()["decided_by"] == "rule"


def test_a_long_job_measures_each_mode_and_keeps_the_faster():
    actor = Actor(chooser(expected_rows=10**5), {"batch_suffix": 100, PLAIN: 300}).run(60)
    first = actor.chooser.switches[0]
    assert (first["from"], first["to"], first["why"]) == ("batch_suffix", PLAIN, "measure")
    assert len(actor.chooser.switches) == 1 and actor.modes[-1] == PLAIN
    assert actor.chooser.report()["decided_by"] == "measured"
    # The faster one measured second, kept; the incumbent measured faster: switched back to.
    back = Actor(chooser(expected_rows=10**5), {"batch_suffix": 300, PLAIN: 100}).run(60)
    assert [s["to"] for s in back.chooser.switches] == [PLAIN, "batch_suffix"]
    assert [s["why"] for s in back.chooser.switches] == ["measure", "faster"] and back.modes[-1] == "batch_suffix"


def test_a_mode_faster_by_less_than_the_margin_is_not_worth_a_restart():
    actor = Actor(chooser(expected_rows=10**5), {"batch_suffix": 100, PLAIN: 101}).run(30)
    assert [s["to"] for s in actor.chooser.switches] == [PLAIN]  # measured, then kept: it is in place
    back = Actor(chooser(expected_rows=10**5), {"batch_suffix": 101, PLAIN: 100}).run(30)
    assert [s["to"] for s in back.chooser.switches] == [PLAIN]  # measured; batch_suffix's 1 % pays no restart


def test_an_answer_that_stands_is_measured_again_half_as_often():
    actor = Actor(chooser(expected_rows=10**7, restart=1.0), {"batch_suffix": 100, PLAIN: 300}).run(3000)
    rounds = [s["at_busy_seconds"] for s in actor.chooser.switches if s["why"] == "measure"]
    gaps = [b - a for a, b in zip(rounds, rounds[1:])]
    assert len(rounds) >= 3 and all(later > 1.5 * earlier for earlier, later in zip(gaps, gaps[1:]))
    assert actor.modes[-1] == PLAIN


def test_rows_of_another_mix_are_measured_again_and_unlike_windows_decide_nothing():
    made = chooser(expected_rows=10**6)
    actor = Actor(made, {"batch_suffix": 100, PLAIN: 300}).run(40)
    settled = len(made.switches)
    actor.predicted = 8  # a burst of edited rows, each with a prediction
    actor.rates["batch_suffix"] = 900
    actor.run(40)
    assert made.switches[settled]["why"] == "measure" and actor.modes[-1] == "batch_suffix"


def test_where_the_rows_are_not_known_a_stream_measures_once_it_has_lasted():
    actor = Actor(chooser(expected_rows=None), {"batch_suffix": 100, PLAIN: 300}).run(600)
    first = actor.chooser.switches[0]["at_busy_seconds"]
    # The round costs 2 restarts and a quarter window (12.5 s): 3 % of the run so far at 417 s.
    assert first >= actor.chooser.round_cost() / speculation.MEASURE_BUDGET and actor.modes[-1] == PLAIN


def test_a_mode_whose_engine_cannot_start_is_dropped():
    made = chooser(expected_rows=10**5, modes=("batch_suffix", PLAIN, "vllm_ngram_gpu"))
    busy, target = 0.0, None
    while target is None:
        busy += 1.0
        target = made.observe(busy, 100, 8, 0)
    made.dropped(target)  # the stage could not build it: it builds the mode before it again
    made.switched("batch_suffix", 0.0, 1.0)
    actor = Actor(made, {"batch_suffix": 100, "vllm_ngram_gpu": 500})
    actor.busy = busy
    actor.run(100)
    assert made.modes == ("batch_suffix", "vllm_ngram_gpu") and actor.modes[-1] == "vllm_ngram_gpu"
    assert "none's engine could not start" in made.switches[0]["why"]


def test_rows_that_start_carrying_predictions_bring_their_own_rule():
    """A GPU actor at 64 sequences: ngram_gpu by a clear rule, never measured, until the rows carry
    predictions (a series' edited rows): their rule leaves it open, and the actor measures."""
    made = chooser(running=64, expected_rows=10**7, modes=("batch_suffix", PLAIN, NGRAM_GPU), platform="gpu")
    actor = Actor(made, {"batch_suffix": 100, PLAIN: 90, NGRAM_GPU: 120}).run(400)
    assert made.switches == [] and set(actor.modes) == {NGRAM_GPU} and not made.rule.measure
    actor.predicted, actor.rates["batch_suffix"] = 8, 300
    actor.run(200)
    assert made.rule.predictions and made.switches[0]["why"] == "measure" and actor.modes[-1] == "batch_suffix"
