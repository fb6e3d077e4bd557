import shutil

import numpy as np

import pytest
import torch

from pipeline.loading import model as model_loading
from pipeline.config import ModelConfig


def test_gguf_is_converted_once_and_then_read_from_the_cache(monkeypatch):
    first_dir, digest = model_loading.resolve_model_dir(ModelConfig())  # converts if not cached yet
    assert (first_dir / "model.safetensors").exists() and len(digest) == 64

    def no_conversion(*args, **kwargs):
        raise AssertionError("the cached conversion should have been used")

    monkeypatch.setattr(model_loading.AutoModelForCausalLM, "from_pretrained", no_conversion)
    assert model_loading.resolve_model_dir(ModelConfig()) == (first_dir, digest)


def test_embedded_default_generates(smollm2):
    tokenizer = smollm2.tokenizer
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2+2?"}], add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    with torch.no_grad():
        out = smollm2.model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)
    assert tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True).strip()


def test_unknown_model_says_what_is_accepted():
    with pytest.raises(FileNotFoundError, match="not a model directory, a .gguf file, a Hugging Face hub id"):
        model_loading.resolve_model_dir(ModelConfig(name="no/such/model"))


def test_a_hub_id_is_found_in_the_local_hugging_face_cache_offline(tiny_model_dir, tmp_path, monkeypatch):
    """A cache laid out as huggingface_hub lays it out (hub/models--ORG--NAME/snapshots/<hash>/ and
    refs/main), with HF_HUB_OFFLINE=1, as vLLM finds a hub id offline; one not cached is named."""
    snapshot = tmp_path / "hub" / "models--acme--tiny-llama" / "snapshots" / ("a" * 40)
    shutil.copytree(tiny_model_dir, snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("a" * 40)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    found, fingerprint = model_loading.resolve_model_dir(ModelConfig(name="acme/tiny-llama"))
    assert found == snapshot and fingerprint == model_loading.directory_fingerprint(tiny_model_dir)
    with pytest.raises(
        FileNotFoundError, match="'acme/other' is not in the Hugging Face cache .*huggingface-cli download"
    ):
        model_loading.resolve_model_dir(ModelConfig(name="acme/other"))


def test_missing_gguf_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.gguf does not exist"):
        model_loading.resolve_model_dir(ModelConfig(name=str(tmp_path / "missing.gguf")))


def test_a_conversion_that_another_process_published_first_is_used(monkeypatch, tmp_path):
    converted, digest = model_loading.resolve_model_dir(ModelConfig())
    # The second conversion reads the first one's output (seconds, not SmolLM2's conversion again):
    # what is tested is how it is published.
    for loader in (model_loading.AutoModelForCausalLM, model_loading.AutoTokenizer):
        monkeypatch.setattr(
            loader, "from_pretrained", lambda *args, read=loader.from_pretrained, **kwargs: read(converted)
        )
    replace = model_loading.os.replace

    def the_other_process_wins(staging, target):
        shutil.copytree(converted, target)  # a second job published the same conversion meanwhile
        replace(staging, target)

    monkeypatch.setattr(model_loading.os, "replace", the_other_process_wins)
    target, second_digest = model_loading.resolve_model_dir(ModelConfig(cache_dir=str(tmp_path)))
    assert second_digest == digest and (target / "config.json").exists()
    assert [path.name for path in (tmp_path / "models").iterdir()] == [target.name]  # no staging left


def test_within_a_conversion_a_gguf_file_is_parsed_once_and_gguf_is_restored_after(tmp_path):
    import gguf

    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_tensor("token_embd.weight", np.arange(8, dtype=np.float32).reshape(2, 4))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    reader_class, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with model_loading.gguf_parsed_once():
        first = gguf.GGUFReader(path)
        assert gguf.GGUFReader(str(path)) is first
        assert first.tensors[0].name == "token_embd.weight"
        arch = gguf.MODEL_ARCH.LLAMA
        assert gguf.get_tensor_name_map(arch, 2) is gguf.get_tensor_name_map(arch, 2)
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (reader_class, name_map)
    assert gguf.GGUFReader(path) is not first
