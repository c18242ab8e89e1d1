"""Write a tiny random-weight Llama checkpoint that vLLM can serve (CPU build).

Used by the demo and the tests: a real Hugging Face model directory (config.json,
generation_config.json, model.safetensors, tokenizer.json, tokenizer_config.json), a few MB,
made locally without downloading anything. Needs only numpy, safetensors and tokenizers.

The weights are random (seeded, so the output is reproducible); the tokenizer is a byte-level
BPE trained on text generated here, so any prompt tokenizes; tokenizer_config.json carries a
plain chat template (role: content lines), so chat completions work. head_dim is 32: vLLM's CPU
attention supports 32, 64, 80, 96, 112, 128, ... (16 passes /health, then the engine dies
on the first request). Like `save_pretrained`, the weights file is left mode 0600: the
deploy must make it readable to the service user.

    python tests/harness/make_tiny_model.py OUTPUT_DIR [--vocab-size 2048] [--seed 0]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]

# A small word list to train the tokenizer on; sentences are sampled from it.
WORDS = (
    "the a an of to in for on with as at by from about into over after under between "
    "model token server request response stream latency throughput batch queue cache memory "
    "gpu cpu node host cluster network switch link bandwidth kernel driver version install "
    "deploy verify benchmark level concurrency window sample prompt output input length "
    "weights tensor parallel pipeline expert attention layer head vector matrix value key "
    "fast slow small large first last next ready healthy failed started stopped restart "
    "one two three four five six seven eight nine ten hundred thousand million "
    "is are was were be been has have had do does did can will would should may might"
).split()


# A plain chat template (role: content, one message a line), so /v1/chat/completions works:
# vLLM refuses chat requests for a tokenizer without one. Text only; the weights and the
# vocabulary do not depend on it.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ message['role'] }}: "
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% endif %}{% endfor %}{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def build_corpus(rng: random.Random, lines: int = 4000):
    for _unused in range(lines):
        n = rng.randint(4, 16)
        words = [rng.choice(WORDS) for _unused in range(n)]
        sentence = " ".join(words).capitalize() + rng.choice([".", ".", "?", "!"])
        if rng.random() < 0.2:
            sentence += " %d" % rng.randint(0, 100000)
        yield sentence


def train_tokenizer(vocab_size: int, rng: random.Random, extra_special=()):
    """A byte-level BPE tokenizer; extra_special adds special tokens (e.g. a reasoning or
    tool parser's markers) after <unk>, <s>, </s>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS + [t for t in extra_special if t not in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(build_corpus(rng)), trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    return tok


def llama_config(vocab_size: int, hidden: int, layers: int, heads: int, kv_heads: int,
                 intermediate: int, max_pos: int):
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": hidden // heads,
        "hidden_act": "silu",
        "max_position_embeddings": max_pos,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
        "dtype": "float32",
    }


def random_weights(cfg: dict, seed: int):
    import numpy as np

    rng = np.random.default_rng(seed)
    h = cfg["hidden_size"]
    inter = cfg["intermediate_size"]
    hd = cfg["head_dim"]
    q_out = cfg["num_attention_heads"] * hd
    kv_out = cfg["num_key_value_heads"] * hd
    vocab = cfg["vocab_size"]

    def mat(rows, cols):
        return (rng.standard_normal((rows, cols)) * 0.02).astype(np.float32)

    tensors = {
        "model.embed_tokens.weight": mat(vocab, h),
        "model.norm.weight": np.ones(h, dtype=np.float32),
        "lm_head.weight": mat(vocab, h),
    }
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        tensors.update({
            p + "self_attn.q_proj.weight": mat(q_out, h),
            p + "self_attn.k_proj.weight": mat(kv_out, h),
            p + "self_attn.v_proj.weight": mat(kv_out, h),
            p + "self_attn.o_proj.weight": mat(h, q_out),
            p + "mlp.gate_proj.weight": mat(inter, h),
            p + "mlp.up_proj.weight": mat(inter, h),
            p + "mlp.down_proj.weight": mat(h, inter),
            p + "input_layernorm.weight": np.ones(h, dtype=np.float32),
            p + "post_attention_layernorm.weight": np.ones(h, dtype=np.float32),
        })
    return tensors


def write_model(out: str, vocab_size: int = 2048, seed: int = 0, hidden: int = 128,
                layers: int = 2, heads: int = 4, kv_heads: int = 2, intermediate: int = 256,
                max_pos: int = 2048):
    from safetensors.numpy import save_file

    os.makedirs(out, exist_ok=True)
    rng = random.Random(seed)
    tok = train_tokenizer(vocab_size, rng)
    real_vocab = tok.get_vocab_size()
    tok.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<s>",
            "eos_token": "</s>",
            "unk_token": "<unk>",
            "model_max_length": max_pos,
            "clean_up_tokenization_spaces": False,
            "chat_template": CHAT_TEMPLATE,
        }, f, indent=2)
    with open(os.path.join(out, "special_tokens_map.json"), "w") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, f, indent=2)

    cfg = llama_config(real_vocab, hidden, layers, heads, kv_heads, intermediate, max_pos)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": 2, "do_sample": False}, f, indent=2)
    weights = os.path.join(out, "model.safetensors")
    save_file(random_weights(cfg, seed), weights, metadata={"format": "pt"})
    os.chmod(weights, 0o600)  # what transformers' save_pretrained leaves, whatever the umask
    return cfg


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("output_dir")
    ap.add_argument("--vocab-size", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    cfg = write_model(args.output_dir, vocab_size=args.vocab_size, seed=args.seed)
    size = sum(os.path.getsize(os.path.join(args.output_dir, n))
               for n in os.listdir(args.output_dir))
    print("tiny model written to %s: vocab %d, %d layers, %d bytes"
          % (args.output_dir, cfg["vocab_size"], cfg["num_hidden_layers"], size))
    return 0


if __name__ == "__main__":
    sys.exit(main())
