"""What the transformers engine refuses of the config when the job starts, each naming the field
(pipeline/engines/transformers/settings.py): its own section's settings against the drafter's."""

import pytest

from pipeline.config import ConfigError, load_config
from pipeline.engines.build import checked_config


def started(*overrides):
    return checked_config(load_config(overrides=["engine.name=transformers", *overrides]))


def test_lenience_is_an_explicit_option_of_the_draft_model_only():
    assert started("drafting.drafter=draft_model", "transformers.lenience=0.5").transformers.lenience == 0.5
    with pytest.raises(ConfigError, match="^transformers.lenience: must be 1 unless drafting.drafter is 'draft_model'"):
        started("drafting.drafter=context_ngram", "transformers.lenience=0.5")


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["transformers.k=2"], "^transformers.k: must be 1 with drafter 'draft_model'"),
        (
            ["transformers.max_batch_requests=2", "ray.batch_size=4"],
            "^transformers.max_batch_requests: must be 1 with drafter 'draft_model'",
        ),
        (["drafting.w=auto"], "^drafting.w: must be a number with drafter 'draft_model'"),
        (["transformers.verify=tree"], "^transformers.verify: must be 'batch' with drafter 'draft_model'"),
    ],
)
def test_a_draft_model_refuses_what_it_cannot_run_rather_than_running_it_otherwise(overrides, message):
    with pytest.raises(ConfigError, match=message):
        started("drafting.drafter=draft_model", *overrides)


def test_rows_are_bounded_by_the_tables_a_drafter_drafts_from():
    assert started("drafting.drafter=mixed", "transformers.k=32").transformers.k == 32
    with pytest.raises(
        ConfigError, match=r"^transformers.k: must be at most drafting.bigram.top_k \(32\) with drafter 'mixed'"
    ):
        started("drafting.drafter=mixed", "transformers.k=64")
    assert started("drafting.drafter=context_ngram", "transformers.k=64").transformers.k == 64  # no table


def test_k_auto_sets_the_maximum_and_the_flag():
    config = started("drafting.drafter=context_ngram", "transformers.k=auto", "drafting.w=auto")
    assert (config.transformers.k, config.drafting.w, config.transformers.auto_k, config.drafting.auto_w) == (
        8,
        8,
        True,
        True,
    )
