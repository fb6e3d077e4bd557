"""The suffix drafter's state, as its compiled step reads it: every array and setting a named field
of one `State` (STATE_FIELDS), so a compiled call unboxes one argument instead of one per array.

Layout of the arrays (drafter.py's BatchSuffixDrafter makes them):
- arena [C + 1] int32: generated tokens of requests, each request a segment reserved when it starts;
  -1 at position 0, after every segment's written tokens and in unwritten space (nothing crosses it);
- heads [NQ, H] int32, prev [NQ, C + 1] int32: per q in min_q..max_q an open-addressing hash table
  from a q-gram to the arena position just after its latest occurrence, and from each such position
  to the one before it (-1: none): the occurrences of a q-gram, newest first;
- slots [S, SLOT_FIELDS] int64: per request slot its segment (start, reserved, written), the tokens
  of its context taken so far, its prompt's length and the most tokens it may reach (set when the
  request starts), whether its segment is in use, and its last store match (its length and
  suffix-array range [lo, hi); lo -1: none known);
- docs [C + 1, 2] int64: the finished segments (start, tokens), oldest first; counters [COUNTERS];
- pending_* : per slot, the candidates awaiting judgement (position, length, tokens, features);
- weights, prior [F]; ring_x [R, F], ring_y [R]: the acceptance model and its judged tokens;
- calibration [2, CALIBRATION_DEPTHS, CALIBRATION_BINS]: the drafts' judged tokens by depth and by
  the probability they were given (drafters/budget.py), what the budget weighs them by;
- store, suffix_array, store_ranges, store_segments: earlier runs' outputs (store_search.py).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numba as nb
import numpy as np
from numba.core import types
from numba.experimental import structref

from drafters.suffix.acceptance import CANDIDATE_COLUMNS, SOURCES

# slots[s, :]
START, RESERVED, WRITTEN, SEEN, PROMPT, LIMIT, ACTIVE, STORE_MATCH, STORE_LO, STORE_HI = range(10)
SLOT_FIELDS = 10
# counters[:]
USED, DOCS, JUDGED, SINCE_FIT, CALLS = range(5)
COUNTERS = 5


@dataclass(frozen=True)
class Settings:
    """The drafter's settings, as the compiled step reads them (fields of the State)."""

    min_q: int  # shortest match drafted from (context and outputs)
    max_q: int  # longest q-gram the outputs index holds
    max_match: int = 24  # longest match looked for
    max_occurrences: int = 16  # occurrences of a match read per source
    refit_every: int = 1024  # judged tokens between two refits of the acceptance model
    newton_steps: int = 1  # Newton steps per refit
    segment_cap: int = 4096  # most arena tokens a request reserves (at most a quarter of the arena)
    store_min_match: int = 0  # shortest match drafted from the store (0: max_q)
    min_probability: float = 0.1  # a draft stops where the probability that all its tokens are accepted falls below
    prior_strength: float = 200.0  # the acceptance model's pull towards its prior weights


# The State's fields, in order, written here once: the arrays (the layout above), the settings, a
# step's outputs ([B', w] ...: the drafts in rows :B) and its working arrays (`scratch`).
ARRAYS = (
    "arena",
    "heads",
    "prev",
    "slots",
    "docs",
    "counters",
    "pending_count",
    "pending_position",
    "pending_length",
    "pending_tokens",
    "pending_features",
    "weights",
    "prior",
    "ring_x",
    "ring_y",
    "calibration",
    "store",
    "suffix_array",
    "store_ranges",
    "store_segments",
    "logs",
)
OUTPUTS_FIELDS = ("out_tokens", "out_lengths", "out_confidence", "out_strategy")
SCRATCH = (
    "rows",
    "row_lengths",
    "ends",
    "tally",
    "alive",
    "paths",
    "path_lengths",
    "members",
    "counts",
    "features",
    "confidence",
    "queued",
)
STATE_FIELDS = (
    ARRAYS + tuple(f.name for f in fields(Settings)) + OUTPUTS_FIELDS + tuple(f"scratch_{n}" for n in SCRATCH)
)


@structref.register
class StateType(types.StructRef):
    def preprocess_fields(self, fields):
        return tuple((name, types.unliteral(kind)) for name, kind in fields)


class State(structref.StructRefProxy):
    """The drafter's arrays and settings (STATE_FIELDS) as one object over the same buffers: a
    compiled call unboxes one argument instead of one per array (at B = 1 a step is mostly its
    call). Made in compiled code, cached (numba's own constructor is compiled in every process)."""

    def __new__(cls, **values):
        missing = set(STATE_FIELDS) - set(values)
        if missing or len(values) != len(STATE_FIELDS):
            raise TypeError(f"State: missing {sorted(missing)}, unknown {sorted(set(values) - set(STATE_FIELDS))}")
        return _new_state(*(values[name] for name in STATE_FIELDS))


structref.define_proxy(State, StateType, STATE_FIELDS)


@nb.njit(cache=True)
def _new_state(*values):
    return State(*values)


def settings_values(settings: Settings) -> dict:
    """The settings as State fields: integers as int64, probabilities as float64 (one compiled type)."""
    return {f.name: (float if f.type in (float, "float") else int)(getattr(settings, f.name)) for f in fields(Settings)}


def scratch(max_occurrences: int, w: int) -> dict[str, np.ndarray]:
    """A step's working arrays (the State's scratch_*), made once: each is written before it is read."""
    occurrences = max(max_occurrences, 1)
    sources = len(SOURCES)
    arrays = {
        "rows": np.zeros((occurrences, w), np.int64),
        "row_lengths": np.zeros(occurrences, np.int64),
        "ends": np.zeros(occurrences, np.int64),
        "tally": np.zeros(occurrences, np.int64),
        "alive": np.zeros(occurrences, np.int64),
        "paths": np.zeros((sources, w), np.int64),
        "path_lengths": np.zeros(sources, np.int64),
        "members": np.zeros(w, np.int64),
        "counts": np.zeros(w, np.int64),
        "features": np.zeros((sources, w, CANDIDATE_COLUMNS)),
        "confidence": np.zeros((sources, w)),
        "queued": np.zeros(sources, np.int64),
    }
    return {f"scratch_{name}": arrays[name] for name in SCRATCH}
