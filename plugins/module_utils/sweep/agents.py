# -*- coding: utf-8 -*-
"""Load-generator agents on other hosts (``load_generators``; the module's mode agent): the
sweep's network boundary. An agent listens with multiprocessing's authenticated connections
(HMAC challenge with ``load_generator_authkey``); it serves the first sweep that authenticates
and nothing else, and the key never leaves the hosts (not in results, logs or argv). The sweep
drives agents with the worker pool's messages, plus clock offsets before every level.
"""
from __future__ import annotations

import asyncio
import multiprocessing
import socket
import sys
import time

from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.settings import SweepError
from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.workers import (
    AgentIdle, send_quit)

AGENT_CONNECT_S = 60.0  # how long the sweep keeps trying to reach an agent that is starting
CLOCK_PINGS = 8


def best_offset(pings):
    """The clock offset of an agent from ping round trips ``(t_send, t_agent, t_recv)``
    (t_send/t_recv on this clock, t_agent on the agent's): offset = t_agent - (t_send +
    t_recv) / 2 of the round trip with the smallest RTT. The agent read its clock between
    send and receive, so the true offset lies within +-RTT/2 of the estimate (error_bound)."""
    if not pings:
        raise ValueError("no ping round trips")
    t_send, t_agent, t_recv = min(pings, key=lambda x: x[2] - x[0])
    rtt = t_recv - t_send
    return {"offset_s": t_agent - (t_send + t_recv) / 2.0, "rtt_ms": round(rtt * 1000.0, 3),
            "error_bound_ms": round(rtt * 500.0, 3), "pings": len(pings)}


def agent_name(i, lg):
    return "load generator %s:%d (load_generators[%d])" % (lg["host"], lg["port"], i)


class AgentAuthError(SweepError):
    """The agent refused the key (it was started with another load_generator_authkey)."""


def connect_agent(i, lg, authkey, timeout_s=AGENT_CONNECT_S):
    """A multiprocessing connection to the agent ``lg``; retried while it is still starting
    (connection refused) for up to ``timeout_s``. Raises SweepError naming it."""
    from multiprocessing.connection import Client
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return Client((lg["host"], lg["port"]), authkey=authkey)
        except multiprocessing.AuthenticationError:
            raise AgentAuthError("%s refused the sweep: authentication failed (the agent was "
                                 "started with another load_generator_authkey)" % agent_name(i, lg))
        except socket.gaierror as e:
            raise SweepError("cannot resolve the host of %s: %s (give its address)"
                             % (agent_name(i, lg), e))
        except (OSError, EOFError) as e:
            if time.monotonic() >= deadline:
                raise SweepError("cannot reach %s within %d s: %s: %s (is the agent running "
                                 "there, mode=agent, and the port open from here?)"
                                 % (agent_name(i, lg), timeout_s, type(e).__name__, e))
            time.sleep(0.25)


class AgentPool(object):
    """The agents of load_generators, connected and set up: used like Pool's forked workers
    (the same messages), plus "ping" (clock offsets before every level) and "setup"."""

    def __init__(self, sweep, lgs, authkey, connect_s=AGENT_CONNECT_S):
        self.lgs = list(lgs)
        self.names = [agent_name(i, lg) for i, lg in enumerate(self.lgs)]
        self.conns = []
        key = authkey.encode() if isinstance(authkey, str) else authkey
        setup = sweep.agent_setup()
        try:
            for i, lg in enumerate(self.lgs):
                conn = connect_agent(i, lg, key, connect_s)
                self.conns.append(conn)
                conn.send(("setup", setup))
                reply = self._reply(i, 30.0)
                if reply[0] != "ready":
                    raise SweepError("%s: %s" % (self.names[i], reply[1] if len(reply) > 1
                                                 else reply))
        except BaseException:
            self.close()
            raise

    def _reply(self, i, timeout):
        conn = self.conns[i]
        try:
            if not conn.poll(timeout):
                raise SweepError("%s did not answer within %d s" % (self.names[i], timeout))
            return conn.recv()
        except (OSError, EOFError) as e:
            raise SweepError("%s closed the connection: %s"
                             % (self.names[i], type(e).__name__))

    def died_hint(self, i, exc):
        return "the connection closed (%s): the agent or its host died, or it was stopped" % (
            type(exc).__name__)

    def sync_clocks(self, pings=CLOCK_PINGS):
        """Each agent's clock offset (see best_offset), estimated now."""
        out = []
        for i, conn in enumerate(self.conns):
            rounds = []
            for _unused in range(pings):
                t_send = time.perf_counter()
                try:
                    conn.send(("ping",))
                except (OSError, EOFError) as e:
                    raise SweepError("%s: %s" % (self.names[i], self.died_hint(i, e)))
                reply = self._reply(i, 30.0)
                t_recv = time.perf_counter()
                if reply[0] != "pong":
                    raise SweepError("%s answered a ping with %r" % (self.names[i], reply[0]))
                rounds.append((t_send, reply[1], t_recv))
            out.append(best_offset(rounds))
        return out

    def close(self):
        send_quit(self.conns)
        for c in self.conns:
            c.close()
        self.conns = []


def run_agent(listen_host, listen_port, authkey, timeout_s, event_loop="auto"):
    """Serve one sweep as a load generator: listen (authenticated with ``authkey``), take the
    first connection that authenticates, run its levels; return when it sends "quit" or
    closes the connection, or after ``timeout_s`` without a connection or a message (between
    levels). Returns what happened (never the key)."""
    import threading
    from multiprocessing.connection import Listener
    from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.engine import (
        HAS_AIOHTTP, Sweep, loop_factory)
    if not HAS_AIOHTTP:
        raise SweepError("aiohttp is not importable by %s" % sys.executable)
    key = authkey.encode() if isinstance(authkey, str) else authkey
    try:
        listener = Listener((listen_host, listen_port), authkey=key)
    except OSError as e:
        raise SweepError("agent cannot listen on %s:%d (listen_host, listen_port): %s"
                         % (listen_host, listen_port, e))
    info = {"listen": "%s:%d" % (listen_host, listen_port), "auth_failures": 0,
            "levels": 0, "ended": None}
    got = {}

    def accept():
        while "conn" not in got:
            try:
                got["conn"] = listener.accept()
            except multiprocessing.AuthenticationError:
                info["auth_failures"] += 1
            except (OSError, EOFError):
                if got.get("closing"):
                    return
                info["auth_failures"] += 1  # dropped during the handshake
    t0 = time.monotonic()
    th = threading.Thread(target=accept, daemon=True)
    th.start()
    th.join(timeout_s)
    got["closing"] = True
    listener.close()
    if "conn" not in got:
        info["ended"] = "timeout"
        raise AgentIdle("no sweep connected within %s s (agent_timeout_s); %d connection(s) "
                        "failed to authenticate" % (timeout_s, info["auth_failures"]))
    conn = got["conn"]
    try:
        if not conn.poll(timeout_s):
            raise AgentIdle("the sweep connected but sent nothing within %s s "
                            "(agent_timeout_s)" % timeout_s)
        msg = conn.recv()
        if msg[0] == "quit":
            info["ended"] = "quit (stopped before any level)"
            return info
        if msg[0] != "setup":
            raise SweepError("agent: expected setup from the sweep, got %r" % (msg[0],))
        try:
            sweep = Sweep.for_agent(msg[1])
        except SweepError as e:
            conn.send(("error", str(e)))
            raise
        conn.send(("ready",))
        factory = loop_factory(event_loop or "auto")
        coro = sweep.child_serve(conn, idle_s=timeout_s)
        try:
            if factory is None:
                ended = asyncio.run(coro)
            else:
                with asyncio.Runner(loop_factory=factory) as runner:
                    ended = runner.run(coro)
        except (OSError, EOFError) as e:  # the sweep went away mid-level
            ended = "disconnect (%s)" % type(e).__name__
        except SweepError:
            raise
        except Exception as e:  # noqa: BLE001 - tell the sweep, then fail
            try:
                conn.send(("error", "%s: %s" % (type(e).__name__, e)))
            except (OSError, EOFError):
                pass
            raise
        info["ended"] = ended
        info["levels"] = getattr(sweep, "agent_levels", 0)
        info["event_loop"] = "uvloop" if factory is not None else "asyncio"
        info["cpu_s"] = round(time.process_time(), 4)
        info["served_s"] = round(time.monotonic() - t0, 3)
        return info
    finally:
        conn.close()


def stop_agents(lgs, authkey, wait_s=10.0):
    """Send "quit" to every agent that still waits for a sweep (after a failed sweep): returns
    per agent "stopped", or why not ("authentication failed"; "not listening: ..." when it is
    gone, or serving a sweep, which ends it by closing). An agent that refuses the connection
    may still be starting: connect_agent retries for up to ``wait_s`` in all."""
    key = authkey.encode() if isinstance(authkey, str) else authkey
    deadline = time.monotonic() + wait_s
    out = []
    for i, lg in enumerate(lgs):
        name = "%s:%d" % (lg["host"], lg["port"])
        try:
            c = connect_agent(i, lg, key, max(0.0, deadline - time.monotonic()))
        except AgentAuthError:
            out.append({"agent": name, "result": "authentication failed"})
            continue
        except SweepError as e:
            out.append({"agent": name, "result": "not listening: %s" % e})
            continue
        try:
            c.send(("quit",))
            out.append({"agent": name, "result": "stopped"})
        except (OSError, EOFError) as e:
            out.append({"agent": name, "result": "gone (%s)" % type(e).__name__})
        finally:
            c.close()
    return out
