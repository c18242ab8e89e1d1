"""Helpers for tests/gpu/run.sh (the real-GPU check). Standard library only, except
``make-model`` (tokenizers, via tests/harness/make_tiny_model.py) and ``capacity`` (none).

    check.py join-wheels WHEELHOUSE                 join cut wheels, check every sha256
    check.py facts-compare FACTS_JSON CAPTURE_DIR   gpu_facts (ansible json callback) vs nvidia-smi
    check.py make-model DIR [--hidden 2048 ...]     dummy-weight Llama config + a real tokenizer
    check.py make-arch FIXTURE DIR [--layers N]     a target architecture's config (fewer layers)
                                                    + a real tokenizer with its parser tokens
    check.py capacity MODEL_DIR SERVER_LOG --gpu-memory-mib N [...]
                                                    planner prediction vs vLLM's log lines

Every subcommand prints a short human summary and, with --json-out, writes its numbers.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GIB = 1024 ** 3


def _dump(obj, path):
    if path:
        with open(path, "w") as f:
            json.dump(obj, f, indent=2, sort_keys=True)


# ------------------------------------------------------------------------------------ wheels
def join_wheels(args):
    wh = args.wheelhouse
    with open(os.path.join(wh, "manifest.json")) as f:
        manifest = json.load(f)
    bad = []
    for name, info in sorted(manifest["wheels"].items()):
        path = os.path.join(wh, name)
        if info["pieces"]:
            missing = [p for p in info["pieces"] if not os.path.exists(os.path.join(wh, p))]
            if missing and not os.path.exists(path):
                bad.append("%s: pieces missing: %s" % (name, ", ".join(missing)))
                continue
            if not missing:
                with open(path + ".tmp", "wb") as out:
                    for piece in info["pieces"]:
                        with open(os.path.join(wh, piece), "rb") as fi:
                            while True:
                                block = fi.read(1 << 24)
                                if not block:
                                    break
                                out.write(block)
                os.replace(path + ".tmp", path)
                for piece in info["pieces"]:
                    os.remove(os.path.join(wh, piece))
        if not os.path.exists(path):
            bad.append("%s: missing" % name)
            continue
        h = hashlib.sha256()
        with open(path, "rb") as fi:
            for block in iter(lambda: fi.read(1 << 20), b""):
                h.update(block)
        if h.hexdigest() != info["sha256"]:
            bad.append("%s: sha256 %s, manifest %s" % (name, h.hexdigest(), info["sha256"]))
    print("wheels: %d in manifest, %d bad" % (len(manifest["wheels"]), len(bad)))
    for line in bad:
        print("  " + line)
    return 1 if bad else 0


# ------------------------------------------------------------------------------------- facts
def _adhoc_result(path):
    """The module result written by `ansible ... -m X --tree DIR` (DIR/<host>)."""
    with open(path) as f:
        doc = json.load(f)
    if "plays" in doc:  # the same from the ansible.posix.json callback
        doc = next(iter(doc["plays"][0]["tasks"][0]["hosts"].values()))
    return doc


def _smi_query(path):
    rows = []
    with open(path) as f:
        for line in f:
            if line.strip():
                rows.append([c.strip() for c in line.split(",")])
    return rows


def facts_compare(args):
    res = _adhoc_result(args.facts_json)
    if res.get("failed"):
        print("gpu_facts FAILED: %s" % res.get("msg"))
        _dump({"ok": False, "module": res}, args.json_out)
        return 1
    facts = res["ansible_facts"]["gpu_facts"]
    cap = args.capture_dir
    rows = _smi_query(os.path.join(cap, "nvidia-smi-query-gpu.txt"))
    with open(os.path.join(cap, "nvidia-smi.txt")) as f:
        plain = f.read()
    m = re.search(r"CUDA Version:\s*([0-9.]+)", plain)
    smi_cuda = m.group(1) if m else None
    m = re.search(r"Driver Version:\s*([0-9.]+)", plain)
    smi_driver = m.group(1) if m else None
    checks = []

    def check(what, ours, theirs):
        checks.append({"what": what, "gpu_facts": ours, "nvidia_smi": theirs,
                       "match": ours == theirs})

    check("GPU present", facts["present"], True)
    check("GPU count", facts["count"], len(rows))
    check("driver version", facts["driver_version"], smi_driver)
    check("CUDA version", facts["cuda_version"], smi_cuda)
    for g, row in zip(facts["gpus"], rows):
        i = g["index"]
        check("GPU %d name" % i, g["name"], row[1])
        check("GPU %d uuid" % i, g["uuid"], row[2])
        check("GPU %d memory.total MiB" % i, g["memory_total_mib"], int(row[3]))
        check("GPU %d compute_cap" % i, g["compute_cap"], row[5])
        check("GPU %d driver (query)" % i, g["driver_version"], row[6])
        check("GPU %d pci.bus_id" % i, g["pci_bus_id"], row[10])
    expected_class = "single-gpu" if len(rows) == 1 else None
    with open(os.path.join(cap, "nvidia-smi-topo-m.txt")) as f:
        topo = f.read()
    if len(rows) > 1 and re.search(r"\bNV[0-9]+\b", topo):
        expected_class = "nvlink"
    topo_class = facts["topology"]["class"]
    if expected_class:
        check("topology class (from topo -m)", topo_class, expected_class)
    ok = all(c["match"] for c in checks)
    for c in checks:
        print("%-32s %-40s %-40s %s" % (c["what"], c["gpu_facts"], c["nvidia_smi"],
                                        "ok" if c["match"] else "MISMATCH"))
    print("topology class: %s (%s); kernel module: %s; derived NCCL env: %s"
          % (topo_class, facts["topology"].get("reason"), facts.get("kernel_module"),
             json.dumps(facts.get("nccl", {}).get("env"))))
    print("ALL MATCH" if ok else "MISMATCHES FOUND")
    _dump({"ok": ok, "checks": checks, "topology_class": topo_class,
           "nccl": facts.get("nccl"), "preflight_errors": facts.get("preflight_errors")},
          args.json_out)
    return 0 if ok else 1


# ------------------------------------------------------------------------------------- model
def llama_params(cfg):
    h, L, v = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    hd = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q = h * cfg["num_attention_heads"] * hd
    kv = 2 * h * cfg["num_key_value_heads"] * hd
    o = cfg["num_attention_heads"] * hd * h
    mlp = 3 * h * cfg["intermediate_size"]
    per_layer = q + kv + o + mlp + 2 * h
    emb = v * h * (1 if cfg.get("tie_word_embeddings") else 2)
    return L * per_layer + emb + h


def make_model(args):
    sys.path.insert(0, os.path.join(ROOT, "tests", "harness"))
    import random

    import make_tiny_model as mtm
    os.makedirs(args.dir, exist_ok=True)
    tok = mtm.train_tokenizer(args.tokenizer_vocab, random.Random(0))
    tok.save(os.path.join(args.dir, "tokenizer.json"))
    with open(os.path.join(args.dir, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
                   "eos_token": "</s>", "unk_token": "<unk>",
                   "model_max_length": args.max_pos, "clean_up_tokenization_spaces": False},
                  f, indent=2)
    cfg = mtm.llama_config(args.vocab, args.hidden, args.layers, args.heads, args.kv_heads,
                           args.intermediate, args.max_pos)
    cfg["torch_dtype"] = "bfloat16"
    cfg["dtype"] = "bfloat16"
    cfg["tie_word_embeddings"] = False
    with open(os.path.join(args.dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    with open(os.path.join(args.dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": 2, "do_sample": False}, f, indent=2)
    n = llama_params(cfg)
    print("model config in %s: %.3fB parameters, %.2f GiB in bf16; tokenizer vocab %d"
          % (args.dir, n / 1e9, 2 * n / GIB, tok.get_vocab_size()))
    return 0


# A chat template for the fixtures' tokenizers: enough for /v1/chat/completions (and the
# profile's reasoning parser) to run; the published models' templates are not needed for that.
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant: {% endif %}")


def make_arch(args):
    """A model directory for a target architecture: the fixture's config.json values (public
    numbers of the real model) with fewer layers, and a small real tokenizer that holds the
    profile's parser tokens. Served with --load-format dummy (no weight files)."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "harness"))
    sys.path.insert(0, os.path.join(ROOT, "plugins", "module_utils", "service"))
    import random

    import vllm_capacity_plan as cp
    import make_tiny_model as mtm
    with open(args.fixture) as f:
        cfg = json.load(f)
    meta = cfg.pop("_fixture")
    layers = args.layers or meta["num_hidden_layers"]
    cfg["num_hidden_layers"] = layers
    for key in meta.get("per_layer_lists", []):
        cfg[key] = cfg[key][:layers]
    os.makedirs(args.dir, exist_ok=True)
    tok = mtm.train_tokenizer(args.tokenizer_vocab, random.Random(0), meta.get("special_tokens", []))
    tok.save(os.path.join(args.dir, "tokenizer.json"))
    with open(os.path.join(args.dir, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
                   "eos_token": "</s>", "unk_token": "<unk>",
                   "additional_special_tokens": meta.get("special_tokens", []),
                   "model_max_length": cfg.get("max_position_embeddings", 4096),
                   "clean_up_tokenization_spaces": False, "chat_template": CHAT_TEMPLATE},
                  f, indent=2)
    cfg["bos_token_id"], cfg["eos_token_id"] = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    with open(os.path.join(args.dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    with open(os.path.join(args.dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"],
                   "do_sample": False}, f, indent=2)
    full = dict(cfg, num_hidden_layers=meta["full_num_hidden_layers"])
    for key in meta.get("per_layer_lists", []):
        full[key] = [cfg[key][0]] * meta["full_num_hidden_layers"]
    print("%s: %s, %d of %d layers: %.2f GiB of weights (planner, from config.json; the full "
          "model %.1f GB); tokenizer vocab %d with %s"
          % (args.dir, cfg["architectures"][0], layers, meta["full_num_hidden_layers"],
             cp.estimate_weights_bytes(cfg) / GIB, cp.estimate_weights_bytes(full) / 1e9,
             tok.get_vocab_size(), ", ".join(meta.get("special_tokens", []))))
    return 0


# ---------------------------------------------------------------------------------- capacity
LOG_PATTERNS = {
    "model_loading_gib": r"Model loading took ([0-9.]+) ?GiB",
    "available_kv_gib": r"Available KV cache memory: ([0-9.]+) ?GiB",
    "kv_cache_tokens": r"GPU KV cache size: ([0-9,]+) tokens",
    "max_concurrency": r"Maximum concurrency for ([0-9,]+) tokens per request: ([0-9.]+)x",
    "graph_capture_gib": r"Graph capturing finished in [0-9.]+ secs?, took ([0-9.]+) GiB",
}


def parse_log(text):
    found = {}
    for key, pat in LOG_PATTERNS.items():
        hits = re.findall(pat, text)
        if not hits:
            continue
        last = hits[-1]
        if key == "max_concurrency":
            found["max_concurrency_len"] = int(last[0].replace(",", ""))
            found[key] = float(last[1])
        elif key == "kv_cache_tokens":
            found[key] = [int(h.replace(",", "")) for h in hits]  # one line per TP rank group
        else:
            found[key] = float(last)
    return found


def capacity(args):
    sys.path.insert(0, os.path.join(ROOT, "plugins", "module_utils", "service"))
    import vllm_capacity_plan as cp
    with open(os.path.join(args.model_dir, "config.json")) as f:
        cfg = json.load(f)
    weights = cp.estimate_weights_bytes(cfg)  # dummy weights: nothing on disk to measure
    with open(args.server_log, errors="replace") as f:
        log = parse_log(f.read())
    mem = args.gpu_memory_mib * 1024 * 1024
    plan = cp.plan(cfg, weights, mem, args.tensor_parallel, tensor_parallel=args.tensor_parallel,
                   gpu_memory_utilization=args.util, max_model_len=args.max_model_len)
    pd = plan.as_dict()
    out = {"plan": pd, "log": log, "weights_bytes": weights}
    lines = []
    w_pred = pd["weights_per_gpu_bytes"] / GIB
    lines.append("weights per GPU: planner %.3f GiB, vLLM 'Model loading took' %s GiB"
                 % (w_pred, log.get("model_loading_gib")))
    if log.get("model_loading_gib"):
        out["weights_error_pct"] = 100.0 * (w_pred - log["model_loading_gib"]) / log["model_loading_gib"]
        lines.append("  error %+.2f%%" % out["weights_error_pct"])
    kv_tokens = log.get("kv_cache_tokens")
    lines.append("KV cache tokens: planner %d (reserve %.2f GiB, util %.2f), vLLM %s"
                 % (pd["kv_capacity_tokens"], pd["reserve_per_gpu_bytes"] / GIB, args.util,
                    kv_tokens))
    if kv_tokens:
        real = kv_tokens[0]
        out["kv_error_pct"] = 100.0 * (pd["kv_capacity_tokens"] - real) / real
        lines.append("  error %+.2f%%" % out["kv_error_pct"])
        # the reserve that would have made the planner exact (what vLLM kept for activations,
        # non-torch memory and, in this version, whatever else it subtracts)
        per_tok = pd["kv_bytes_per_token_per_gpu"]
        implied = args.util * mem - pd["weights_per_gpu_bytes"] - real * per_tok
        out["implied_reserve_gib"] = implied / GIB
        lines.append("  reserve that would match vLLM: %.2f GiB (KV bytes/token/GPU %d)"
                     % (implied / GIB, per_tok))
        if log.get("available_kv_gib"):
            out["kv_bytes_from_log_vs_tokens"] = log["available_kv_gib"] * GIB / (real * per_tok)
    print("\n".join(lines))
    out["summary"] = lines
    _dump(out, args.json_out)
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("join-wheels")
    p.add_argument("wheelhouse")
    p.set_defaults(func=join_wheels)
    p = sub.add_parser("facts-compare")
    p.add_argument("facts_json")
    p.add_argument("capture_dir")
    p.add_argument("--json-out")
    p.set_defaults(func=facts_compare)
    p = sub.add_parser("make-model")
    p.add_argument("dir")
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--intermediate", type=int, default=5632)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--tokenizer-vocab", type=int, default=2048)
    p.add_argument("--max-pos", type=int, default=4096)
    p.set_defaults(func=make_model)
    p = sub.add_parser("make-arch")
    p.add_argument("fixture", help="tests/gpu/models/<name>.json")
    p.add_argument("dir")
    p.add_argument("--layers", type=int, default=0, help="0 = the fixture's reduced depth")
    p.add_argument("--tokenizer-vocab", type=int, default=2048)
    p.set_defaults(func=make_arch)
    p = sub.add_parser("capacity")
    p.add_argument("model_dir")
    p.add_argument("server_log")
    p.add_argument("--gpu-memory-mib", type=int, required=True)
    p.add_argument("--tensor-parallel", type=int, default=1)
    p.add_argument("--util", type=float, default=0.9)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--json-out")
    p.set_defaults(func=capacity)
    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
