"""Lay out the test repository the scenario's hub serves: the tiny model, an FP8-style
hf_quant_config.json (its KV-cache entry is what the scenario's override removes), a README
(skipped by ignore_patterns) and three 2 MB dummy shards in a subfolder (stored as LFS
objects by hubserver.py). Content is random but fixed per seed, so re-runs serve the same
commit content. OUT_DIR-dummy gets the tiny model without its weights file (config and
tokenizer only, what --load-format dummy needs).

    make_repo.py TINY_MODEL_DIR OUT_DIR
"""
import json
import os
import random
import shutil
import sys

SHARD_BYTES = 2 * 1000 * 1000


def main(src, out):
    if os.path.exists(out):
        shutil.rmtree(out)
    shutil.copytree(src, out)
    with open(os.path.join(out, "hf_quant_config.json"), "w") as f:
        json.dump({"producer": {"name": "modelopt"},
                   "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}, f,
                  indent=2)
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write("# tiny-llama for the weights scenario\n")
    os.makedirs(os.path.join(out, "extra"))
    rng = random.Random(20260)
    for i in range(1, 4):
        with open(os.path.join(out, "extra", "shard-%05d.bin" % i), "wb") as f:
            f.write(rng.randbytes(SHARD_BYTES - i))
    # OUT_DIR-dummy: what a --load-format dummy server needs (config and tokenizer, no weights)
    dummy = out + "-dummy"
    if os.path.exists(dummy):
        shutil.rmtree(dummy)
    shutil.copytree(src, dummy, ignore=shutil.ignore_patterns("*.safetensors"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
