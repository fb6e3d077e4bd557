"""Our speculator's `speculator_options` (vLLM's SpeculativeConfig hands them through): the device
drafter's settings by their names, and where its tables are. Checked where vLLM builds its config, so
that a bad option fails the engine's start, naming the option."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


# SamplingParams.extra_args[PREDICTION_KEY]: a request's prediction's token ids, OpenAI's name, as the
# vLLM 0.32 engine hands it to its proposer (request_params.py) and the 0.34 speculator reads it
PREDICTION_KEY = "prediction"
# SamplingParams.extra_args[KEYED_KEY]: a sampled request's {temperature, top_k, top_p, seed}, drawn by the
# keyed-draw processor while vLLM runs the request as greedy (keyed_draws.py; the vLLM 0.34 engine writes it)
KEYED_KEY = "ngrammys_keyed_sampling"


@dataclass(frozen=True)
class SpeculatorOptions:
    settings: object  # drafters.device.settings.DeviceSettings
    bigram_table: str = ""  # a .npy [vocab] or [vocab, K] int table of the model's next tokens ("": none)
    store: str = ""  # a datastore directory (jobs.build_datastore) loaded into the corpus at start ("": none)


def parse_options(options: dict | None) -> SpeculatorOptions:
    """The options, or ValueError naming the one that is wrong and the valid ones."""
    from drafters.device.settings import DeviceSettings  # (here: vLLM loads this package's plugin in every process)

    options = dict(options or {})
    own = {"bigram_table", "store"}
    fields = {field.name for field in dataclasses.fields(DeviceSettings)}
    unknown = sorted(set(options) - own - fields)
    if unknown:
        raise ValueError(
            f"speculator_options: unknown option(s) {unknown}; the ngrammys speculator takes {sorted(own | fields)}"
        )
    for name in own:
        if not isinstance(options.get(name, ""), str):
            raise ValueError(f"speculator_options.{name} must be a path (a string), got {options[name]!r}")
    try:
        settings = DeviceSettings(**{name: options[name] for name in fields & set(options)})
    except (TypeError, ValueError) as error:
        raise ValueError(f"speculator_options: {error}") from None
    return SpeculatorOptions(settings, options.get("bigram_table", ""), options.get("store", ""))
