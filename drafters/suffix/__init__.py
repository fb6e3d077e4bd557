"""The suffix drafter (drafter.py), compiled by concern: the outputs' arena (arena.py), the store's
search (store_search.py), the acceptance model (acceptance.py), the state's layout (state.py) and
the step that runs them for a batch (step.py). Compiled functions call each other across these
modules at no cost (numba compiles a callee into its caller)."""

from drafters.suffix.drafter import STRATEGIES, BatchSuffixDrafter
from drafters.suffix.state import Settings

__all__ = ["STRATEGIES", "BatchSuffixDrafter", "Settings"]
