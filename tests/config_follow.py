"""Following the job's config as a reader would: the functions of this project that the driver
calls with a whole Config among their arguments, each counted once, in the order first called."""

from __future__ import annotations

import collections
import sys
import threading
from pathlib import Path

from pipeline.config import Config

REPO = Path(__file__).resolve().parents[1]
OURS = tuple(str(REPO / folder) + "/" for folder in ("pipeline", "drafters", "jobs"))


class ConfigFollower:
    """A profiler hook, on every thread of this process while in its `with` block."""

    def __init__(self):
        self.stops: list[tuple[str, str]] = []  # (module's path in the repository, function)

    def __enter__(self) -> ConfigFollower:
        sys.setprofile(self.profile)
        threading.setprofile(self.profile)
        return self

    def __exit__(self, *exc) -> None:
        sys.setprofile(None)
        threading.setprofile(None)

    def profile(self, frame, event, arg) -> None:
        code = frame.f_code
        if event != "call" or not code.co_filename.startswith(OURS):
            return
        arguments = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        if any(isinstance(frame.f_locals.get(name), Config) for name in arguments):
            stop = (str(Path(code.co_filename).relative_to(REPO)), code.co_qualname)
            if stop not in self.stops:
                self.stops.append(stop)

    def per_module(self) -> collections.Counter:
        return collections.Counter(module for module, _ in self.stops)
