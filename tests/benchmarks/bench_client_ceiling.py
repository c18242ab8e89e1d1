"""The sweep client's ceiling: output tok/s it can drive per client core, and its scaling from
1 to N worker processes (vllm_sweep's ``processes``), against a local streaming stub server.

The stub is a load-generator benchmark target only (like wrk against a static page): it
answers /v1/models, /metrics and streaming /v1/completions in the byte format of vLLM's
OpenAI server (one SSE event per token, ``"usage":null`` in token chunks, a final usage
event, ``data: [DONE]``), as fast as it can, from several processes sharing the port
(SO_REUSEPORT). It is never a stand-in for vLLM in any other test.

Per run it reports output tok/s (the sweep's window), the client's CPU seconds (all its
processes), tok/s per client CPU-second (= per fully used client core), loop-lag p99 of the
worst process, client_limited, and whether the token totals equal the stub's counters (the
merge across processes is exact). Needs only the repository, Python >= 3.9 with aiohttp
(uvloop optional; used with Python >= 3.11 when importable):

    python3 tests/benchmarks/bench_client_ceiling.py                      # defaults
    python3 tests/benchmarks/bench_client_ceiling.py --processes 1,2,4,8 --concurrency 256 \\
        --server-processes 8 --duration-s 10

On a machine with few cores the stub and the client share them: read tok/s per client core,
not the absolute tok/s. On a 16-core machine use --server-processes 8 --processes 1,2,4,8.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "collections"))

MODEL = "stub"


# --- the stub server ------------------------------------------------------------------------
def _chunk(data):
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(obj):
    return _chunk(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


class StubProtocol(asyncio.Protocol):
    """HTTP/1.1 keep-alive, just enough for the sweep client: GET /v1/models, GET /metrics,
    POST /v1/completions (stream, max_tokens tokens, one write per token chunk)."""

    def __init__(self, counters, tokens_per_write, ttft_s=0.0, itl_s=0.0):
        self.counters = counters
        self.tokens_per_write = tokens_per_write
        self.ttft_s, self.itl_s = ttft_s, itl_s
        self.buf = b""
        self.transport = None
        self.busy = False

    def connection_made(self, transport):
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data):
        self.buf += data
        self._next()

    def _next(self):
        if self.busy:
            return
        head_end = self.buf.find(b"\r\n\r\n")
        if head_end < 0:
            return
        head = self.buf[:head_end].decode("latin-1")
        lines = head.split("\r\n")
        method, path = lines[0].split(" ")[:2]
        length = 0
        for line in lines[1:]:
            k, _sep, v = line.partition(":")
            if k.strip().lower() == "content-length":
                length = int(v.strip())
        if len(self.buf) < head_end + 4 + length:
            return
        body = self.buf[head_end + 4:head_end + 4 + length]
        self.buf = self.buf[head_end + 4 + length:]
        self.busy = True
        asyncio.ensure_future(self._answer(method, path, body))

    def _plain(self, status, ctype, payload):
        self.transport.write(b"HTTP/1.1 %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s"
                             % (status, ctype, len(payload), payload))

    async def _answer(self, method, path, body):
        try:
            if path == "/health":
                self._plain(b"200 OK", b"text/plain", b"")
            elif path == "/tokenize" and method == "POST":
                # word-level: every space-separated word one token, no special tokens
                n = len(str(json.loads(body).get("prompt") or "").split())
                self._plain(b"200 OK", b"application/json", json.dumps(
                    {"count": n, "max_model_len": 1 << 20, "tokens": list(range(n))}).encode())
            elif path == "/v1/models":
                self._plain(b"200 OK", b"application/json", json.dumps(
                    {"object": "list", "data": [{"id": MODEL, "object": "model",
                                                 "max_model_len": 1 << 20}]}).encode())
            elif path == "/metrics":
                with self.counters.get_lock():
                    gen, prompt, first_us, reqs = list(self.counters)
                self._plain(b"200 OK", b"text/plain", (
                    "# TYPE vllm:generation_tokens_total counter\n"
                    "vllm:generation_tokens_total{model_name=\"stub\"} %d\n"
                    "# TYPE vllm:prompt_tokens_total counter\n"
                    "vllm:prompt_tokens_total{model_name=\"stub\"} %d\n"
                    "# TYPE stub_first_token_seconds summary\n"
                    "stub_first_token_seconds_sum %.6f\n"
                    "stub_first_token_seconds_count %d\n"
                    % (gen, prompt, first_us / 1e6, reqs)).encode())
            elif path == "/v1/completions" and method == "POST":
                await self._stream(json.loads(body))
            else:
                self._plain(b"404 Not Found", b"text/plain", b"not found")
        finally:
            self.busy = False
            if self.buf:
                self._next()

    async def _stream(self, req):
        t_in = time.perf_counter()
        n = int(req.get("max_tokens") or 16)
        prompt = req.get("prompt")
        n_prompt = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
        w = self.transport.write
        w(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
          b"transfer-encoding: chunked\r\n\r\n")
        created = int(time.time())
        base = {"id": "cmpl-stub", "object": "text_completion", "created": created,
                "model": MODEL}
        token = _event(dict(base, choices=[{"index": 0, "text": " tok", "logprobs": None,
                                            "finish_reason": None, "stop_reason": None}],
                            usage=None))
        sent = 0
        first = None
        if self.ttft_s:
            await asyncio.sleep(max(0.0, self.ttft_s - (time.perf_counter() - t_in)))
        while sent < n:
            k = min(self.tokens_per_write, n - sent)
            w(token * k)
            if first is None:
                first = time.perf_counter() - t_in  # the stub's own TTFT (after the body)
            sent += k
            # let other streams write: one write per token chunk; paced when itl_s is set
            await asyncio.sleep(self.itl_s if sent < n else 0)
            if self.transport.is_closing():
                return
        w(_event(dict(base, choices=[], usage={"prompt_tokens": n_prompt, "total_tokens":
                                               n_prompt + n, "completion_tokens": n})))
        w(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        with self.counters.get_lock():
            self.counters[0] += n
            self.counters[1] += n_prompt
            self.counters[2] += int(round((first or 0.0) * 1e6))
            self.counters[3] += 1


def _serve(sock, counters, tokens_per_write, ready, ttft_s=0.0, itl_s=0.0):
    try:
        import uvloop
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    server = loop.run_until_complete(loop.create_server(
        lambda: StubProtocol(counters, tokens_per_write, ttft_s, itl_s), sock=sock))
    ready.set()
    try:
        loop.run_forever()
    finally:
        server.close()


def start_stub(processes, tokens_per_write=1, ttft_s=0.0, itl_s=0.0):
    """The stub on a free 127.0.0.1 port in ``processes`` processes; returns (url, procs).
    ``ttft_s``/``itl_s``: a paced stub (first token that long after the request body
    arrived, then one token every ``itl_s``): a known TTFT to calibrate clients against; its
    own measured first-token delay is ``stub_first_token_seconds`` on /metrics."""
    ctx = multiprocessing.get_context("fork")
    counters = ctx.Array("q", 4)
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    procs = []
    for _unused in range(processes):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(1024)
        ready = ctx.Event()
        p = ctx.Process(target=_serve, args=(sock, counters, tokens_per_write, ready, ttft_s, itl_s),
                        daemon=True)
        p.start()
        sock.close()
        ready.wait(30)
        procs.append(p)
    return "http://127.0.0.1:%d" % port, procs


# --- one client run --------------------------------------------------------------------------
def run_client(url, processes, concurrency, duration_s, output_len, input_len, gc_on=False,
               transport="native"):
    from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.vllm_sweep import run_sweep
    params = {"base_url": url, "model": MODEL, "levels": [concurrency], "input_len": input_len,
              "output_len": output_len, "duration_s": duration_s, "request_timeout_s": 120,
              "saturation_threshold": 0.1, "stop_on_saturation": False,
              "endpoint": "completions", "vocab_size": 1000, "processes": processes,
              "event_loop": "auto", "gc_during_level": gc_on, "stream_transport": transport}
    res = run_sweep(params)
    lv = res["levels"][0]
    chk = lv["server_check"]
    cl = lv["client"]
    tokens_total = chk.get("client_output_tokens")
    cpu = cl["cpu_s_level"]
    return {
        "processes": processes, "concurrency": concurrency, "transport": transport,
        "output_tok_s": lv["output_tok_s"],
        "whole_run_tok_s": lv["whole_run"]["output_tok_s"],
        "client_cpu_s": cpu, "level_s": lv["timing"]["level_s"],
        "tok_per_cpu_s": (tokens_total / cpu) if cpu else None,
        "lag_p99_ms": cl["loop_lag_ms"]["p99"], "client_limited": cl["client_limited"],
        "connections_opened": cl.get("connections_opened"),
        "tokens_match": chk.get("match"), "client_tokens": tokens_total,
        "server_tokens": chk.get("server_output_tokens"),
        "event_loop": res["client"]["event_loop"],
        "gc": cl.get("gc"),
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", default="1,2", help="client process counts to run")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--duration-s", type=float, default=5.0)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--input-len", type=int, default=16)
    ap.add_argument("--server-processes", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    ap.add_argument("--tokens-per-write", type=int, default=1,
                    help="token chunks per server write (1: one TCP write per token)")
    ap.add_argument("--gc-during-level", action="store_true",
                    help="leave Python's garbage collector on during the level (the client's "
                         "default switches it off); GC pauses are reported either way")
    ap.add_argument("--transports", default="native,aiohttp",
                    help="vllm_sweep stream_transport values to run, side by side: each process "
                         "count runs with each transport in turn, against the same stub")
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    counts = [int(x) for x in args.processes.split(",")]
    transports = [t for t in args.transports.split(",") if t]
    url, procs = start_stub(args.server_processes, args.tokens_per_write)
    rows = []
    try:
        for n in counts:
            for t in transports:
                rows.append(run_client(url, n, args.concurrency, args.duration_s,
                                       args.output_len, args.input_len, args.gc_during_level, t))
                r = rows[-1]
                print("processes %d, %s: %.0f tok/s (window), %.0f tok/s per client CPU-s, lag "
                      "p99 %.1f ms%s" % (n, t, r["output_tok_s"], r["tok_per_cpu_s"] or 0,
                                         r["lag_p99_ms"], " client-limited"
                                         if r["client_limited"] else ""), flush=True)
    finally:
        for p in procs:
            p.terminate()
            p.join(5)
    print("")
    print("stub: %d processes, one write per %d token(s); client: C=%d, output %d tokens, "
          "window %g s, %d cores here, loop %s" % (
              args.server_processes, args.tokens_per_write, args.concurrency, args.output_len,
              args.duration_s, os.cpu_count() or 0, rows[0]["event_loop"] if rows else "-"))
    print("%9s %9s %11s %11s %9s %13s %9s %8s %7s %12s %14s" % (
        "processes", "transport", "tok/s win", "tok/s run", "cpu_s", "tok/s/core", "lag p99", "limited",
        "conns", "tokens=srv", "gc n/max ms"))
    for r in rows:
        g = r.get("gc") or {}
        print("%9d %9s %11.0f %11.0f %9.2f %13.0f %9.1f %8s %7s %12s %14s" % (
            r["processes"], r["transport"], r["output_tok_s"], r["whole_run_tok_s"] or 0, r["client_cpu_s"],
            r["tok_per_cpu_s"] or 0, r["lag_p99_ms"], "yes" if r["client_limited"] else "no",
            r["connections_opened"], r["tokens_match"],
            "%s/%s" % (g.get("collections", "-"), g.get("pause_ms_max", "-"))))
    for t in transports:
        mine = [r for r in rows if r["transport"] == t]
        if mine and mine[0]["output_tok_s"]:
            print("scaling, %s (tok/s vs %d process): %s" % (t, mine[0]["processes"], ", ".join(
                "%dp %.2fx" % (r["processes"], r["output_tok_s"] / mine[0]["output_tok_s"])
                for r in mine)))
    if len(transports) > 1:
        base = transports[-1]
        for n in counts:
            ref = [r for r in rows if r["processes"] == n and r["transport"] == base]
            for t in transports[:-1]:
                got = [r for r in rows if r["processes"] == n and r["transport"] == t]
                if ref and got and ref[0]["tok_per_cpu_s"] and got[0]["tok_per_cpu_s"]:
                    print("%d process(es): %s / %s client CPU per token = %.3f" % (
                        n, t, base, ref[0]["tok_per_cpu_s"] / got[0]["tok_per_cpu_s"]))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=2)
    return 0 if rows and all(r["tokens_match"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
