"""NCCL all-reduce smoke test: one process per GPU, hard timeout, JSON on stdout.

Run it with the vLLM venv's python, with the NCCL environment under test exported:

    NCCL_P2P_LEVEL=NVL python allreduce_smoke.py --timeout 120

It spawns one process per visible GPU (torch.multiprocessing, no torchrun), each joins a
torch.distributed process group over 127.0.0.1, all-reduces a float32 tensor filled with
rank + 1, checks the sum, then times --iters all-reduces. Rank 0's figures are printed as one
JSON object:

    {"passed": true, "timed_out": false, "world_size": 2, "busbw_gbps": ..., ...}

Bus bandwidth follows nccl-tests: busbw = algbw * 2 * (n - 1) / n, algbw = bytes / time.
If the ranks do not finish within --timeout seconds (an all-reduce hang is the usual P2P/ACS
symptom), the parent kills them and prints passed=false, timed_out=true.
The JSON object is always the last line of stdout (NCCL_DEBUG=INFO logs go to stdout too).
The timeout clock starts when the ranks are spawned (after the parent imported torch).
Exit status: 0 passed, 1 failed, 2 timed out (argument errors: 2, from argparse).

`--backend gloo --nprocs 2` runs the same code on CPU (no GPU needed), for testing the script.
"""
from __future__ import annotations

import argparse
import json
import os
import queue as queue_mod
import socket
import sys
import time
import traceback


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world_size, port, args, results):
    """One rank. Puts a dict on `results` (rank 0 with timings, others a short status)."""
    import torch
    import torch.distributed as dist

    out = {"rank": rank}
    try:
        if args.backend == "nccl":
            torch.cuda.set_device(rank)
            device = torch.device("cuda", rank)
        else:
            device = torch.device("cpu")
        init_kwargs = {
            "backend": args.backend,
            "init_method": "tcp://127.0.0.1:%d" % port,
            "rank": rank,
            "world_size": world_size,
            "timeout": __import__("datetime").timedelta(seconds=args.timeout),
        }
        if args.backend == "nccl":
            # Binds the communicator to this GPU up front (avoids a lazy guess by torch).
            init_kwargs["device_id"] = device
        dist.init_process_group(**init_kwargs)

        numel = max(1, (args.size_mb * 1024 * 1024) // 4)
        x = torch.full((numel,), float(rank + 1), dtype=torch.float32, device=device)

        def sync():
            if args.backend == "nccl":
                torch.cuda.synchronize(device)

        # Correctness: sum over ranks of (rank + 1) = n(n+1)/2 in every element.
        dist.all_reduce(x)
        sync()
        expected = world_size * (world_size + 1) / 2.0
        correct = bool(torch.all(x == expected).item())

        for _unused in range(args.warmup):
            dist.all_reduce(x)
        sync()
        dist.barrier()
        t0 = time.perf_counter()
        for _unused in range(args.iters):
            dist.all_reduce(x)
        sync()
        elapsed = time.perf_counter() - t0

        out.update({"ok": True, "correct": correct})
        if rank == 0:
            size_bytes = numel * 4
            per_iter = elapsed / args.iters
            algbw = size_bytes / per_iter / 1e9
            busbw = algbw * 2.0 * (world_size - 1) / world_size
            out.update({
                "size_bytes": size_bytes,
                "iters": args.iters,
                "avg_time_us": round(per_iter * 1e6, 2),
                "algbw_gbps": round(algbw, 2),
                "busbw_gbps": round(busbw, 2),
                "torch_version": torch.__version__,
            })
            if args.backend == "nccl":
                try:
                    v = torch.cuda.nccl.version()
                    out["nccl_version"] = ".".join(str(p) for p in v) if isinstance(v, tuple) else str(v)
                except Exception:  # pragma: no cover - informative only
                    out["nccl_version"] = None
                out["gpu_name"] = torch.cuda.get_device_name(device)
        dist.destroy_process_group()
    except Exception as exc:  # report, never hang the parent
        out.update({"ok": False, "error": "%s: %s" % (type(exc).__name__, exc),
                    "traceback": traceback.format_exc(limit=5)})
    results.put(out)


def _visible_gpus():
    try:
        import torch
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


def run(args):
    """Spawn the ranks, wait at most args.timeout seconds, return (report dict, exit status)."""
    import torch.multiprocessing as mp

    world_size = args.nprocs or (_visible_gpus() if args.backend == "nccl" else 2)
    report = {
        "passed": False,
        "timed_out": False,
        "backend": args.backend,
        "world_size": world_size,
        "timeout_s": args.timeout,
        "env": {k: v for k, v in sorted(os.environ.items())
                if k.startswith(("NCCL_", "CUDA_VISIBLE_DEVICES", "TORCH_NCCL_"))},
    }
    if world_size < 1:
        report["error"] = "no GPU visible to torch (torch.cuda.device_count() == 0)"
        return report, 1

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, world_size, port, args, results), daemon=True)
             for r in range(world_size)]
    start = time.monotonic()
    for p in procs:
        p.start()

    deadline = start + args.timeout
    got = {}
    while len(got) < world_size and time.monotonic() < deadline:
        try:
            item = results.get(timeout=min(1.0, max(0.05, deadline - time.monotonic())))
            got[item["rank"]] = item
        except queue_mod.Empty:
            if all(not p.is_alive() for p in procs) and results.empty():
                break
    report["wall_s"] = round(time.monotonic() - start, 2)

    for p in procs:
        p.join(timeout=max(0.0, min(5.0, deadline - time.monotonic())) or 0.1)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(5)

    if len(got) < world_size:
        missing = sorted(set(range(world_size)) - set(got))
        if time.monotonic() >= deadline:
            report["timed_out"] = True
            report["error"] = ("ranks %s did not finish within %ss (all-reduce hang: check "
                               "ACS/IOMMU, try the no-p2p environment)" % (missing, args.timeout))
            status = 2
        else:
            report["error"] = "ranks %s exited without a result (exit codes %s)" % (
                missing, [p.exitcode for p in procs])
            status = 1
        report["ranks"] = [got[r] for r in sorted(got)]
        return report, status

    errors = [g for g in got.values() if not g.get("ok")]
    if errors:
        report["error"] = "; ".join("rank %d: %s" % (g["rank"], g["error"]) for g in errors)
        report["ranks"] = [got[r] for r in sorted(got)]
        return report, 1

    rank0 = got[0]
    report.update({k: v for k, v in rank0.items() if k not in ("rank", "ok")})
    report["correct"] = all(g.get("correct") for g in got.values())
    report["passed"] = report["correct"]
    if not report["correct"]:
        report["error"] = "all-reduce result wrong: expected %s in every element" % (
            world_size * (world_size + 1) / 2.0)
    return report, 0 if report["passed"] else 1


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    ap.add_argument("--backend", default="nccl", choices=["nccl", "gloo"])
    ap.add_argument("--nprocs", type=int, default=0,
                    help="ranks to start (default: every visible GPU; 2 for gloo)")
    ap.add_argument("--size-mb", type=int, default=64, help="all-reduce message size in MiB")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=120.0,
                    help="hard limit in seconds for the whole run")
    args = ap.parse_args(argv)
    for name in ("size_mb", "iters", "timeout"):
        if getattr(args, name) <= 0:
            ap.error("--%s must be > 0 (got %s)" % (name.replace("_", "-"), getattr(args, name)))
    if args.warmup < 0 or args.nprocs < 0:
        ap.error("--warmup and --nprocs must be >= 0")
    return args


def main(argv=None):
    args = parse_args(argv)
    report, status = run(args)
    print(json.dumps(report, sort_keys=True))
    sys.stdout.flush()
    return status


if __name__ == "__main__":
    sys.exit(main())
