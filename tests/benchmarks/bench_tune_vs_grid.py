"""Benchmark of the tuner (prints ratios, not a timed test): on one CPU test host, over
the same knob values, the tuner's search (``--strategy``: ``screen`` by default -- one knob changed
from the default at a time, the winners' combination, then halving among the leaders --, or
``halving`` / ``auto``; early stop at saturation and at the first SLO break) against an
auto_tune-style full grid (every candidate, every level, the leaders' longest window, no early
stop). The default knobs are 3 binary ones: max-num-seqs {default, 2} x max-num-batched-tokens
{default, 512} x instances {1, 2} = 8 candidates (screening serves at most 5). Prints

* the winner's goodput under the SLO against vLLM's defaults for the model (the profile with no
  knob set, one instance) -- target >= 1.2x where a better configuration exists, else the
  evidence that the default is best;
* CPU-seconds to the decision (wall time of the host's serving and measuring, restarts
  included; on this CPU host the "GPU time" of the target) of the search and of the grid, and
  their ratio -- target <= 0.4x;
* whether both reach the same winner, or a tie within the measured noise.

Phases (each its own command, so each stays short under the shared machine's lock; the test
host vd-tbench-1, SSH 2295, vLLM 8292-8293, is kept between them):

    python tests/benchmarks/bench_tune_vs_grid.py up       # boot + deploy (cpu-tiny)
    python tests/benchmarks/bench_tune_vs_grid.py search   # the tuner
    python tests/benchmarks/bench_tune_vs_grid.py grid     # the full grid
    python tests/benchmarks/bench_tune_vs_grid.py compare  # ratios from the two runs
    python tests/benchmarks/bench_tune_vs_grid.py down
    python tests/benchmarks/bench_tune_vs_grid.py all      # everything in one go

e.g. the screening strategy against the grid, 2 s screening windows, 4 s for the leaders and
the grid: ``... all --strategy screen --window 2 --rounds 2``.

Results go to --out (default .cache/bench-tune): search.json, grid.json, compare.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "harness"))

HOST, SSH_PORT, VLLM_PORT = "vd-tbench-1", 2295, 8292
KNOBS = {"max-num-seqs": [None, 2], "max-num-batched-tokens": [None, 512]}
INSTANCES = [1, 2]
LEVELS = [1, 2, 4, 8]
GROUP_VARS = {
    "vllm_install_cpu_version": "0.32.0",
    "model_weights_source": "local",
    "model_weights_local_dir": os.path.join(ROOT, ".cache", "tiny-model"),
    "model_weights_name": "tiny-llama",
    "vllm_service_profile": "cpu-tiny",
    "vllm_service_host": "127.0.0.1",
    "vllm_service_port": VLLM_PORT,
    "vllm_service_ready_timeout_s": 600,
    "vllm_benchmark_enabled": False,
}


def _inv(out):
    return os.path.join(out, "inventory", "hosts.yml")


def up(a):
    import testhost as th
    model = os.path.join(ROOT, ".cache", "tiny-model")
    if not os.path.exists(os.path.join(model, "config.json")):
        subprocess.run([sys.executable, os.path.join(ROOT, "tests", "harness", "make_tiny_model.py"),
                        model], check=True)
    th.destroy("vd-tbench-")
    th.create(HOST, SSH_PORT)
    os.makedirs(os.path.dirname(_inv(a.out)), exist_ok=True)
    th.write_inventory([HOST], _inv(a.out), extra_vars=GROUP_VARS)
    import vllm_deploy
    t0 = time.time()
    vllm_deploy.deploy(_inv(a.out))
    print("deployed %s in %.0f s" % (HOST, time.time() - t0))


def down(_a):
    import testhost as th
    th.destroy("vd-tbench-")


def _tune(a, grid):
    import vllm_deploy
    doc = vllm_deploy.tune(
        _inv(a.out), HOST, profile="cpu-tiny", ttft_ms=a.ttft_ms, tpot_ms=a.tpot_ms,
        budget_candidates=64, knobs=json.loads(a.knobs) if a.knobs else KNOBS, instances=INSTANCES, levels=LEVELS,
        base_window_s=a.window, eta=2, max_rounds=a.rounds, input_len=a.input_len,
        output_len=a.output_len, port=VLLM_PORT, listen_host="127.0.0.1", grid=grid,
        strategy="grid" if grid else a.strategy,
        report_dir=os.path.join(a.out, "grid" if grid else "search"),
        log=lambda m: print(m, flush=True))
    path = os.path.join(a.out, "grid.json" if grid else "search.json")
    with open(path, "w") as f:
        json.dump(dict(doc), f, indent=2, default=str)
    print("winner %s (%s); %s" % ((doc["winner"] or {}).get("id"), doc["decision"]["verdict"],
                                  doc["versus_default"]))
    ev = doc["evidence"]
    print("strategy %s; %d candidates served, %d restarts; decision after %.0f s (measuring "
          "%.0f s); written %s" % (ev.get("strategy_reason"), ev.get("candidates_served") or 0,
                                   len(ev["runs"]), ev["decision_wall_s"], ev["measured_s"], path))
    for n in doc.get("not_measured") or []:
        print("  %s: %s" % (n["id"], n["reason"]) if isinstance(n, dict) else "  %s" % n)


def search(a):
    _tune(a, grid=False)


def grid(a):
    _tune(a, grid=True)


def compare(a):
    with open(os.path.join(a.out, "search.json")) as f:
        s = json.load(f)
    with open(os.path.join(a.out, "grid.json")) as f:
        g = json.load(f)
    sw, gw = s["winner"], g["winner"]
    grows = {r["id"]: r for r in g["ranked"]}
    # same winner, or the search's winner within the grid's noise of the grid's winner: the
    # tuner's own comparison (sweep_compare on the grid's request-log intervals, else a 10 %
    # spread) of the two as the grid measured them
    same = sw["id"] == gw["id"]
    tie, tie_why = False, None
    if not same and sw["id"] in grows:
        sys.path.insert(0, os.path.join(ROOT, "collections"))
        from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.tune import search as vt
        a, b = grows[gw["id"]], grows[sw["id"]]
        v = vt.decide(dict(a, _m=vt._interval_m(a)), dict(b, _m=vt._interval_m(b)))
        tie, tie_why = v["verdict"] == "tie", vt._reason(v)
    ds, dg = s["evidence"]["decision_wall_s"], g["evidence"]["decision_wall_s"]
    out = {
        "search_winner": sw["id"], "grid_winner": gw["id"], "same_winner": same,
        "tie_within_noise": tie, "tie_reason": tie_why,
        "strategy": s["evidence"].get("strategy"),
        "candidates_served_search": s["evidence"].get("candidates_served"),
        "candidates_served_grid": g["evidence"].get("candidates_served"),
        "not_measured_search": s.get("not_measured"),
        "winner_vs_default_search": s["versus_default"],
        "winner_vs_default_grid": g["versus_default"],
        "decision_s_search": s["evidence"]["decision_wall_s"],
        "decision_s_grid": g["evidence"]["decision_wall_s"],
        "time_ratio_search_over_grid": round(ds / dg, 3),
        "measuring_s_search": s["evidence"]["measured_s"],
        "measuring_s_grid": g["evidence"]["measured_s"],
        "candidates": len(g["ranked"]),
        "restarts_search": len(s["evidence"]["runs"]), "restarts_grid": len(g["evidence"]["runs"]),
    }
    with open(os.path.join(a.out, "compare.json"), "w") as f:
        json.dump(out, f, indent=2)
    print(json.dumps(out, indent=2))
    print("winner/default goodput (search): %s (target >= 1.2 where a better one exists)"
          % s["versus_default"].get("ratio"))
    print("CPU-seconds to the decision: search (%s) %.0f s, grid %.0f s; search/grid: %.3f "
          "(target <= 0.4)" % (out["strategy"], ds, dg, out["time_ratio_search_over_grid"]))
    print("same winner: %s; tie within noise: %s" % (same, tie))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    ap.add_argument("phase", choices=["up", "search", "grid", "compare", "down", "all"])
    ap.add_argument("--out", default=os.path.join(ROOT, ".cache", "bench-tune"))
    ap.add_argument("--ttft-ms", type=float, default=3000.0)
    ap.add_argument("--tpot-ms", type=float, default=60.0)
    ap.add_argument("--window", type=float, default=2.0, help="first round's window, s")
    ap.add_argument("--rounds", type=int, default=3,
                    help="search rounds; the grid's window is --window x 2^(rounds - 1)")
    ap.add_argument("--strategy", default="screen", choices=["screen", "halving", "auto"],
                    help="the search phase's strategy (the grid phase is always the grid)")
    ap.add_argument("--knobs", help='JSON {knob: [values]}, null = vLLM default (default: %s)'
                    % json.dumps(KNOBS))
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=32)
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    phases = {"up": [up], "search": [search], "grid": [grid], "compare": [compare],
              "down": [down], "all": [up, search, grid, compare, down]}[a.phase]
    for p in phases:
        t0 = time.time()
        p(a)
        print("phase %s: %.0f s" % (p.__name__, time.time() - t0), flush=True)


if __name__ == "__main__":
    main()
