#!/usr/bin/env python3
"""scripts/bench_sweep_vs_vllm.py with a fixed vocab_size for our client (env GPU_CHECK_VOCAB).

vLLM 0.25.0 answers the sweep's vocabulary probe (a prompt with token id 2**20) with an
unhandled ValueError ("Token id 1048576 is out of vocabulary") and a reset connection instead
of a 400, so the probe cannot learn the vocabulary there; giving vocab_size skips it.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import bench_sweep_vs_vllm as bench  # noqa: E402

bench.OUR_RUNNER = bench.OUR_RUNNER.replace(
    "json.loads(sys.argv[2])",
    "dict(json.loads(sys.argv[2]), vocab_size=%d)" % int(os.environ["GPU_CHECK_VOCAB"]))
sys.exit(bench.main())
