"""What every engine shares: the run's engine columns over its engines' step accounting."""

import pytest

from pipeline.engines.base import EngineSteps, Request, engine_summary


def test_occupancy_averages_the_steps_while_input_remained_and_is_none_when_every_step_drained():
    drained = EngineSteps(slots=4, drain_steps=10, drain_running=30, drain_seconds=1.5)
    assert engine_summary([drained]) == {
        "engine_occupancy": None,
        "engine_steps": 10,
        "engine_idle_seconds": 0.0,
        "engine_drain_seconds": 1.5,
        "engine_step_cost": None,
    }
    fed = EngineSteps(slots=4, steps=10, running=30, idle_seconds=0.5, drain_steps=2, drain_running=2)
    summary = engine_summary([fed, drained])
    assert summary["engine_occupancy"] == 30 / 40  # the drains' steps left out
    assert (summary["engine_steps"], summary["engine_idle_seconds"]) == (22, 0.5)
    assert engine_summary([]) == dict.fromkeys(
        ["engine_occupancy", "engine_steps", "engine_idle_seconds", "engine_drain_seconds", "engine_step_cost"]
    )


def test_the_step_cost_is_the_engines_measured_fits_averaged_and_none_where_none_measured():
    measured = [EngineSteps(step_cost=(0.10, 0.002)), EngineSteps(step_cost=(0.20, 0.004)), EngineSteps()]
    assert engine_summary(measured)["engine_step_cost"] == {
        "seconds": 0.15,
        "seconds_per_fed_token": 0.003,
        "fed_token_share": 0.02,
    }


def test_a_requests_settings_after_its_length_go_by_name():
    """Past request_id, prompt_ids and max_new_tokens a Request takes its settings by name: a call
    by position cannot put a stop where a sampling goes."""
    request = Request("r", [1, 2], 4, stop=("\n",), prediction=(3,))
    assert (request.stop, request.prediction) == (("\n",), (3,))
    with pytest.raises(TypeError, match="positional"):
        Request("r", [1, 2], 4, ("\n",))
