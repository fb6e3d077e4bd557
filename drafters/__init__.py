"""Engine-neutral drafting: each drafter proposes drafts for a context, from the request itself, other
requests' outputs, a store of earlier runs' outputs or tables of the model; drafters/primitives/ is
the lowest layer. Nothing here imports pipeline/.

The compiled drafters (numba, `cache=True`) keep their machine code beside their sources, built
once per clone. numba checks a cached function against its own source file only, but a compiled
function holds the functions it calls from other modules (drafters/suffix/step.py calls into four),
so here a cached function of this package is stale when any source file of the package changes.
"""

from __future__ import annotations

from pathlib import Path

from numba.core.caching import CacheImpl, InTreeCacheLocator

PACKAGE = Path(__file__).resolve().parent


class PackageCacheLocator(InTreeCacheLocator):
    """numba's in-tree cache, for the functions defined in this package, stamped with every one of
    the package's source files (numba's own stamp is the function's file alone)."""

    @classmethod
    def from_function(cls, py_func, py_file):
        if PACKAGE not in Path(py_file).resolve().parents:
            return None
        return super().from_function(py_func, py_file)

    def get_source_stamp(self):
        return tuple(
            (str(path.relative_to(PACKAGE)), path.stat().st_mtime_ns, path.stat().st_size)
            for path in sorted(PACKAGE.rglob("*.py"))
        )


if PackageCacheLocator not in CacheImpl._locator_classes:
    CacheImpl._locator_classes.insert(0, PackageCacheLocator)
