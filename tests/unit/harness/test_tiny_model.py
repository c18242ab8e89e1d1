"""The tiny model generator makes a checkpoint vLLM's CPU build can serve."""
import json
import os
import stat
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "tests", "harness"))

make_tiny_model = pytest.importorskip("make_tiny_model")
pytest.importorskip("tokenizers")
pytest.importorskip("safetensors")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    subprocess.run([sys.executable, os.path.join(ROOT, "tests", "harness", "make_tiny_model.py"),
                    str(out), "--seed", "7"], check=True, capture_output=True)
    return out


def test_config_has_a_cpu_supported_head_dim(model_dir):
    cfg = json.loads((model_dir / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["hidden_size"] // cfg["num_attention_heads"] == cfg["head_dim"]
    # vLLM CPU attention supports 32, 64, 80, ...; 16 dies on the first request.
    assert cfg["head_dim"] in (32, 64, 80, 96, 112, 128)
    assert cfg["num_attention_heads"] % cfg["num_key_value_heads"] == 0


def test_weights_match_the_config(model_dir):
    from safetensors.numpy import load_file

    cfg = json.loads((model_dir / "config.json").read_text())
    tensors = load_file(str(model_dir / "model.safetensors"))
    assert tensors["model.embed_tokens.weight"].shape == (cfg["vocab_size"], cfg["hidden_size"])
    kv = cfg["num_key_value_heads"] * cfg["head_dim"]
    assert tensors["model.layers.0.self_attn.k_proj.weight"].shape == (kv, cfg["hidden_size"])
    layers = {k.split(".")[2] for k in tensors if k.startswith("model.layers.")}
    assert len(layers) == cfg["num_hidden_layers"]


def test_tokenizer_round_trips_any_text(model_dir):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    text = "Throughput at concurrency 128: 1,239 tok/s — ünïcode too"
    ids = tok.encode(text).ids
    assert ids[0] == tok.token_to_id("<s>")
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok.get_vocab_size() == json.loads((model_dir / "config.json").read_text())["vocab_size"]


def test_weights_are_private_like_save_pretrained(model_dir):
    # The deploy must make them readable for the service user; the generator does not.
    mode = stat.S_IMODE(os.stat(model_dir / "model.safetensors").st_mode)
    assert mode & 0o044 == 0


def test_same_seed_same_weights(model_dir, tmp_path):
    subprocess.run([sys.executable, os.path.join(ROOT, "tests", "harness", "make_tiny_model.py"),
                    str(tmp_path), "--seed", "7"], check=True, capture_output=True)
    assert (tmp_path / "model.safetensors").read_bytes() == \
        (model_dir / "model.safetensors").read_bytes()


def test_chat_template_renders_messages_for_chat_completions(model_dir):
    import jinja2

    tok_cfg = json.loads((model_dir / "tokenizer_config.json").read_text())
    template = jinja2.Environment().from_string(tok_cfg["chat_template"])
    text = template.render(
        bos_token=tok_cfg["bos_token"], add_generation_prompt=True,
        messages=[{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": [{"type": "text", "text": "Hello"}]}])
    assert text == "<s>system: Be brief.\nuser: Hello\nassistant: "


def test_same_seed_gives_the_same_checkpoint(model_dir, tmp_path):
    # Every test serves this model: a run with the same seed writes the same bytes.
    import hashlib

    subprocess.run([sys.executable, os.path.join(ROOT, "tests", "harness", "make_tiny_model.py"),
                    str(tmp_path), "--seed", "7"], check=True, capture_output=True)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        a = hashlib.sha256((model_dir / name).read_bytes()).hexdigest()
        b = hashlib.sha256((tmp_path / name).read_bytes()).hexdigest()
        assert a == b, name
