"""tests/benchmarks/bench_sweep_vs_vllm.py for tests/gpu/run.sh: env GPU_CHECK_VOCAB -> --vocab-size.

Kept for run.sh; the benchmark script takes --vocab-size itself now. vLLM 0.25.0 answers the
sweep's vocabulary probe (a prompt with token id 2**20) with an unhandled ValueError and a reset
connection instead of a 400, so our client is given the tokenizer's vocabulary size instead.

run.sh runs this under `timeout ${GPU_CHECK_BENCH_TIMEOUT:-560}`; unless --time-budget-s is
given, the budget is that timeout less 40 s, so that a long sweep stops starting new reps in
time and still prints what it measured (SIGTERM from `timeout` also does that).
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import bench_sweep_vs_vllm as bench  # noqa: E402


def forwarded(argv, env):
    argv = list(argv)

    def given(flag):
        return any(a == flag or a.startswith(flag + "=") for a in argv)
    if env.get("GPU_CHECK_VOCAB") and not given("--vocab-size"):
        argv += ["--vocab-size", str(int(env["GPU_CHECK_VOCAB"]))]
    if not given("--time-budget-s"):
        budget = max(10.0, float(env.get("GPU_CHECK_BENCH_TIMEOUT") or 560) - 40)
        argv += ["--time-budget-s", "%g" % budget]
    return argv


if __name__ == "__main__":
    sys.exit(bench.main(forwarded(sys.argv[1:], os.environ)))
