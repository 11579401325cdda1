"""`inferencepool model tiny`: the same bytes every time, a layout vLLM's Llama loader and the router's token
counter both read. (That vLLM itself serves it, chat template included, is tests/real/'s job.)"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from inferencepool.cli import main
from inferencepool.model.tiny import BOS, EOS, IM_END, IM_START, TinyShape, write_tiny_model
from inferencepool.router.prompt import Prompt
from inferencepool.router.tokens import HFTokenCounter, load_counter

FILES = [
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny")
    assert main(["model", "tiny", "--out", str(out)]) == 0
    return out


def _header(path: Path) -> dict[str, Any]:
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header: dict[str, Any] = json.loads(data[8 : 8 + length])
    body = len(data) - 8 - length
    assert max(t["data_offsets"][1] for n, t in header.items() if n != "__metadata__") == body
    return header


def test_two_runs_write_identical_files(model: Path, tmp_path: Path) -> None:
    again = write_tiny_model(tmp_path / "again")
    assert sorted(p.name for p in model.iterdir()) == FILES
    for name in FILES:
        assert (model / name).read_bytes() == (again / name).read_bytes(), name


def test_another_seed_changes_the_weights_only(model: Path, tmp_path: Path) -> None:
    other = write_tiny_model(tmp_path / "other", seed=1)
    assert (model / "model.safetensors").read_bytes() != (other / "model.safetensors").read_bytes()
    assert (model / "tokenizer.json").read_bytes() == (other / "tokenizer.json").read_bytes()


def test_config_has_what_vllm_builds_a_llama_from(model: Path) -> None:
    config = json.loads((model / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    for field in (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "vocab_size",
        "rms_norm_eps",
        "hidden_act",
        "rope_parameters",
        "tie_word_embeddings",
        "dtype",
    ):
        assert field in config, field
    # Prompts of several thousand tokens (the router's threshold and prefix blocks) fit.
    assert config["max_position_embeddings"] >= 8192
    generation = json.loads((model / "generation_config.json").read_text())
    assert generation["eos_token_id"] == config["eos_token_id"]


def test_weights_have_the_names_and_shapes_the_config_implies(model: Path) -> None:
    config = json.loads((model / "config.json").read_text())
    header = _header(model / "model.safetensors")
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    kv_heads = config["num_key_value_heads"]
    head_dim, inter, vocab = config["head_dim"], config["intermediate_size"], config["vocab_size"]
    expected = {"lm_head.weight": [vocab, hidden], "model.embed_tokens.weight": [vocab, hidden]}
    expected["model.norm.weight"] = [hidden]
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        expected |= {
            p + "input_layernorm.weight": [hidden],
            p + "post_attention_layernorm.weight": [hidden],
            p + "self_attn.q_proj.weight": [heads * head_dim, hidden],
            p + "self_attn.k_proj.weight": [kv_heads * head_dim, hidden],
            p + "self_attn.v_proj.weight": [kv_heads * head_dim, hidden],
            p + "self_attn.o_proj.weight": [hidden, heads * head_dim],
            p + "mlp.gate_proj.weight": [inter, hidden],
            p + "mlp.up_proj.weight": [inter, hidden],
            p + "mlp.down_proj.weight": [hidden, inter],
        }
    tensors = {name: t for name, t in header.items() if name != "__metadata__"}
    assert {name: t["shape"] for name, t in tensors.items()} == expected
    assert {t["dtype"] for t in tensors.values()} == {"BF16"}
    for t in tensors.values():
        size = 2
        for dim in t["shape"]:
            size *= dim
        assert t["data_offsets"][1] - t["data_offsets"][0] == size


def test_weights_are_seeded_normal_and_norms_one(model: Path) -> None:
    import numpy as np

    data = (model / "model.safetensors").read_bytes()
    header = _header(model / "model.safetensors")
    base = 8 + struct.unpack("<Q", data[:8])[0]

    def tensor(name: str) -> Any:
        start, end = header[name]["data_offsets"]
        bits = np.frombuffer(data[base + start : base + end], dtype="<u2").astype(np.uint32) << 16
        return bits.view(np.float32)

    q = tensor("model.layers.0.self_attn.q_proj.weight")
    assert abs(float(q.std()) - TinyShape().initializer_range) < 0.001 and abs(float(q.mean())) < 0.001
    assert set(tensor("model.norm.weight").tolist()) == {1.0}


def test_router_counts_with_its_tokenizer(model: Path) -> None:
    counter = load_counter(str(model))
    assert isinstance(counter, HFTokenCounter)
    tokenizer = counter.tokenizer
    assert tokenizer.get_vocab_size() == json.loads((model / "config.json").read_text())["vocab_size"]
    text = "The router counts a prompt's tokens as the engine does. " * 200
    ids = tokenizer.encode(text).ids
    assert ids[0] == tokenizer.token_to_id(BOS)  # completions start with BOS, as vLLM adds it
    assert counter.count(Prompt(texts=(text,), token_ids=(), message_count=0, stream=False)) == len(ids)
    # Long English prompts are thousands of tokens at a realistic ratio, so length thresholds are reachable.
    assert 2.5 < len(text) / len(ids) < 8
    for special in (BOS, EOS, IM_START, IM_END):
        assert tokenizer.encode(special, add_special_tokens=False).ids == [tokenizer.token_to_id(special)]
