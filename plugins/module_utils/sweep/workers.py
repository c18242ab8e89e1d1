# -*- coding: utf-8 -*-
"""The forked worker pool (``processes`` > 1): processes forked before any event loop runs,
each with its own loop and HTTP session; the parent applies the window rule to their merged
completions. The same messages drive the agents of load_generators (see agents.py).
"""
from __future__ import annotations

import asyncio
import multiprocessing
import os
import random
import time

try:
    import aiohttp
except ImportError:  # run_sweep and run_agent report this with the interpreter's path
    aiohttp = None

from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.level import (
    LevelState, Sampler, gc_quiet, gc_restore)
from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.metrics import Record
from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.settings import SweepError

# A worker process or agent sends a heartbeat when it has had nothing to send for this long;
# the parent fails the level when one is silent for SILENCE_LIMIT_S (a load-generator host
# that stopped answering without closing its connection: a partition, a stopped process).
HEARTBEAT_S = 1.0
SILENCE_LIMIT_S = 30.0
READ_BUFSIZE = 4 * 1024 * 1024
RECORD_TIME_FIELDS = (2, 3)  # start, end in record_tuple; 4 is chunk_times


class AgentIdle(SweepError):
    """An agent waited agent_timeout_s for the sweep (to connect, or for its next message)."""


def split_workers(conc, processes):
    """C workers over ``processes`` processes, as evenly as possible (the first get one more)."""
    n = max(1, min(processes, conc))
    base, extra = divmod(conc, n)
    return [base + (1 if i < extra else 0) for i in range(n)] + [0] * (processes - n)


def map_record(tup, offset):
    """A record tuple from an agent with its times (start, end, chunk times) moved onto this
    clock (agent time - offset). TTFT, ITL, TPOT and E2E are differences of the agent's own
    times and come out the same; the offset only decides which window a request falls in."""
    out = list(tup)
    for k in RECORD_TIME_FIELDS:
        if out[k] is not None:
            out[k] = out[k] - offset
    out[4] = [t - offset for t in (out[4] or [])]
    return tuple(out)


class WorkersMixin(object):
    """The parent's side of a level over worker processes or agents, and a worker's side of
    it (a mixin of :class:`engine.Sweep`)."""

    children_cpu = 0.0  # CPU seconds of the worker processes or agents, summed per level

    async def _run_level_pool(self, conc):
        cfg = self.level_settings(conc)
        pool = self.pool
        shares = split_workers(conc, len(pool.conns))
        clocks = pool.sync_clocks()  # agents: their clock offsets, just before the level
        offsets = [c["offset_s"] for c in clocks] if clocks else [0.0] * len(pool.conns)
        before = await self.scrape()
        cpu_start = time.process_time()
        level_start = time.perf_counter()
        state = LevelState(conc, cfg, level_start)
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        ends = {}
        stop_sent = {"on": False}
        seen = [level_start] * len(pool.conns)  # the last message from each, our clock

        def watchdog():
            if done.done():
                return
            now = time.perf_counter()
            for i, t in enumerate(seen):
                if i not in ends and now - t > SILENCE_LIMIT_S:
                    done.set_exception(SweepError(
                        "%s sent nothing for %.0f s during concurrency %d (it sends a heartbeat "
                        "every %g s): its host stopped answering or its process stopped"
                        % (pool.names[i], now - t, conc, HEARTBEAT_S)))
                    return
            timers.append(loop.call_later(1.0, watchdog))
        timers = [loop.call_later(1.0, watchdog)]

        def readable(i, conn):
            seen[i] = time.perf_counter()
            try:
                msg = conn.recv()
            except (EOFError, OSError) as e:
                if not done.done():
                    done.set_exception(SweepError(
                        "%s ended during concurrency %d: %s" % (
                            pool.names[i], conc, pool.died_hint(i, e))))
                loop.remove_reader(conn.fileno())
                return
            if msg[0] == "recs":
                off = offsets[i]
                for tup in msg[1]:
                    state.feed(Record(*(map_record(tup, off) if off else tup)))
                if state.stop and not stop_sent["on"]:
                    stop_sent["on"] = True
                    for c in pool.conns:
                        try:
                            c.send(("stop",))
                        except (OSError, EOFError):
                            pass  # that one's reader reports it
            elif msg[0] == "end":
                ends[i] = msg[1]
                if len(ends) == len(pool.conns) and not done.done():
                    done.set_result(True)
            elif msg[0] == "error" and not done.done():
                done.set_exception(SweepError("%s: %s" % (pool.names[i], msg[1])))

        gc_parent = gc_quiet(self.s)
        first = 0
        try:
            for i, conn in enumerate(pool.conns):
                try:
                    conn.send(("level", conc, shares[i], first,
                               "%d/%d/%d" % (self.seed, conc, i)))
                except (OSError, EOFError) as e:
                    raise SweepError("%s ended before concurrency %d: %s"
                                     % (pool.names[i], conc, pool.died_hint(i, e)))
                first += shares[i]
                loop.add_reader(conn.fileno(), readable, i, conn)
                os.set_blocking(conn.fileno(), True)  # uvloop made it non-blocking: whole messages
            await done
        finally:
            for t in timers:
                t.cancel()
            for conn in pool.conns:
                try:
                    loop.remove_reader(conn.fileno())
                except (OSError, ValueError):
                    pass
            gc_restore(gc_parent)
        level_end = time.perf_counter()
        after = await self.scrape()
        w0, w1 = state.window(level_start)
        procs, limited = [], []
        cpu_level = time.process_time() - cpu_start
        cpu_window = 0.0
        for i in range(len(pool.conns)):
            e = ends[i]
            samples = e["samples"]
            if offsets[i]:
                samples = [(t - offsets[i], lag, cpu) for t, lag, cpu in samples]
            h = Sampler.from_samples(samples).health(w0, w1, i, shares[i])
            if clocks:
                h["host"] = pool.names[i]
                h["clock"] = clocks[i]
            cpu_level += e["cpu_s_level"]
            self.children_cpu += e["cpu_s_level"]
            cpu_window += h["cpu_s_window"]
            procs.append(h)
            limited.extend("%s: %s" % (pool.names[i], r) for r in h["client_limited_reasons"])
        client = {
            "processes": len(pool.conns),
            "cpu_s_level": round(cpu_level, 4),
            "cpu_s_window": round(cpu_window, 4),
            "cpu_util_window": max(h["cpu_util_window"] for h in procs),
            "loop_lag_ms": dict((k, max(h["loop_lag_ms"][k] for h in procs))
                                for k in ("p50", "p99", "max")),
            "client_limited": bool(limited),
            "client_limited_reasons": limited,
            "connections_opened": sum(ends[i]["connections_opened"] for i in ends),
            "per_process": procs,
            "gc": ends[0].get("gc"),
        }
        if clocks:
            client["load_generators"] = len(pool.conns)
            client["clock_offset_error_ms_max"] = max(c["error_bound_ms"] for c in clocks)
        return self._finish_level(conc, cfg, state, client, before, after, level_start,
                                  level_end, w0, w1)

    # --- a worker process (processes > 1) ------------------------------------------------
    async def child_serve(self, conn, idle_s=None):
        """Serve the parent's messages until "quit" (or, for an agent, a closed connection:
        returns "quit" or "disconnect"; raises AgentIdle after ``idle_s`` without a message)."""
        loop = asyncio.get_running_loop()
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, force_close=False)
        async with aiohttp.ClientSession(connector=connector, read_bufsize=READ_BUFSIZE,
                                         trace_configs=[self._trace()]) as s:
            self.session = s
            self._open_native()
            try:
                while True:
                    try:
                        msg = await asyncio.wait_for(_recv(loop, conn, eof=("eof",)), idle_s)
                    except asyncio.TimeoutError:
                        raise AgentIdle("no message from the sweep for %s s (agent_timeout_s)"
                                        % idle_s)
                    if msg[0] in ("quit", "eof"):
                        return "quit" if msg[0] == "quit" else "disconnect"
                    if msg[0] == "ping":
                        conn.send(("pong", time.perf_counter()))
                    elif msg[0] == "level":
                        self.agent_levels = getattr(self, "agent_levels", 0) + 1
                        await self._child_level(loop, conn, *msg[1:])
            finally:
                self._close_native()

    async def _child_level(self, loop, conn, conc, workers, first, seed):
        s = self.s
        rng = random.Random(seed)
        state = {"stop": False}
        pending = []
        gc_info = gc_quiet(s)
        opened0 = self.connections["opened"]
        cpu0 = time.process_time()

        def on_msg():
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                msg = ("stop",)
            if msg[0] in ("stop", "quit"):  # quit: the parent gave up on the level
                state["stop"] = True

        loop.add_reader(conn.fileno(), on_msg)
        os.set_blocking(conn.fileno(), True)  # sends and receives move whole messages

        async def worker(wid):
            while not state["stop"]:
                rec = Record(level=conc, worker=wid, expected_tokens=s.output_len,
                             chunk_tokens=[])
                await self.request(rec, self._body(rng))
                pending.append(record_tuple(rec))

        flushing = {"on": True}

        async def flusher():
            last = time.perf_counter()
            while flushing["on"]:
                await asyncio.sleep(Pool.FLUSH_S)
                if pending:
                    batch = list(pending)
                    del pending[:]
                    conn.send(("recs", batch))
                    last = time.perf_counter()
                elif time.perf_counter() - last >= HEARTBEAT_S:
                    conn.send(("hb",))  # alive, nothing finished (long requests)
                    last = time.perf_counter()

        sampler = Sampler()
        tick = asyncio.ensure_future(sampler.run())
        flush = asyncio.ensure_future(flusher())
        try:
            await asyncio.gather(*[worker(first + j) for j in range(workers)])
        finally:
            sampler.on = False
            flushing["on"] = False
            await tick
            await flush
            loop.remove_reader(conn.fileno())
            gc_info = gc_restore(gc_info)
        if pending:
            conn.send(("recs", list(pending)))
        conn.send(("end", {"samples": sampler.samples, "cpu_s_level": time.process_time() - cpu0,
                           "connections_opened": self.connections["opened"] - opened0,
                           "gc": gc_info}))


def record_tuple(r):
    return (r.level, r.worker, r.start, r.end, r.chunk_times, r.chunk_tokens,
            r.completion_tokens, r.prompt_tokens, r.expected_tokens, r.error)


def send_quit(conns):
    """Tell every worker process or agent to quit; one that is gone already is skipped."""
    for c in conns:
        try:
            c.send(("quit",))
        except (OSError, EOFError):
            pass


class Pool(object):
    """Load-generator worker processes, forked before any event loop runs (``processes``).

    Each child runs its own event loop and aiohttp session. Per level the parent sends
    ("level", C, workers, first worker id, rng seed); the child runs that many closed-loop
    workers, sends its completed requests in batches every FLUSH_S (("recs", [...])), stops
    sending new requests on ("stop",), and when its last request ended sends ("end", {...})
    with its CPU and loop-lag samples. The parent applies the window rule to the merged
    completions, so token counts and windows are those of one client with C workers.
    """

    FLUSH_S = 0.02

    def sync_clocks(self):
        """Forked workers share this process's clock: nothing to estimate."""
        return None

    def died_hint(self, i, exc):
        return type(exc).__name__

    def __init__(self, sweep, n):
        ctx = multiprocessing.get_context("fork")
        self.conns, self.procs = [], []
        for i in range(n):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=_child_main, args=(sweep, theirs, i), daemon=True)
            proc.start()
            theirs.close()
            self.conns.append(mine)
            self.procs.append(proc)
        self.names = ["load-generator process %d" % i for i in range(n)]

    def close(self):
        send_quit(self.conns)
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
        for c in self.conns:
            c.close()


def _child_main(sweep, conn, index):
    sweep.pool = None
    sweep.child_index = index
    from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.engine import loop_factory
    factory = loop_factory(sweep.s.event_loop)
    coro = sweep.child_serve(conn)
    try:
        if factory is None:
            asyncio.run(coro)
        else:
            with asyncio.Runner(loop_factory=factory) as runner:
                runner.run(coro)
    except Exception as e:  # noqa: BLE001 - the parent reports it
        try:
            conn.send(("error", "%s: %s" % (type(e).__name__, e)))
        except (OSError, EOFError):
            pass


async def _recv(loop, conn, eof=("quit",)):
    """The next message on a multiprocessing connection, without blocking the loop (``eof``
    when the other end closed it)."""
    fut = loop.create_future()

    def ready():
        if not fut.done():
            try:
                fut.set_result(conn.recv())
            except (EOFError, OSError):
                fut.set_result(eof)
    loop.add_reader(conn.fileno(), ready)
    os.set_blocking(conn.fileno(), True)  # uvloop sets O_NONBLOCK; messages are read whole
    try:
        return await fut
    finally:
        loop.remove_reader(conn.fileno())
