# -*- coding: utf-8 -*-
"""The vllm_sweep module's logic: :func:`run_sweep` runs a whole sweep, in this process, over
forked worker processes (``processes``) or over agents on other hosts (``load_generators``);
:func:`run_agent` and :func:`stop_agents` are the module's agent modes.

The parts: settings.py (parameter checks, typed settings), preflight.py (what the sweep
learns about the server first), engine.py (the levels: closed-loop workers, the window rule,
the summary), level.py (window rule, client health), workers.py (the forked pool), agents.py
(the network boundary to load-generator agents), _stream.py (the native streaming transport),
metrics.py (the statistics of a level).
"""
from __future__ import annotations

import asyncio
import sys

from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.agents import (
    AgentAuthError, AgentPool, best_offset, connect_agent, run_agent, stop_agents)
from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.engine import (
    HAS_AIOHTTP, Sweep, loop_factory)
from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.level import (
    LevelState, Sampler, default_min_requests, repeats_summary)
from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.preflight import PROMPT_WORDS
from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.settings import (
    SECRET_PARAMS, RequestLogError, SweepError, SweepSettings, check_load_generators,
    check_params, failure_message)
from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.workers import (
    AgentIdle, Pool, map_record, record_tuple, split_workers)

__all__ = (
    "AgentAuthError", "AgentIdle", "AgentPool", "HAS_AIOHTTP", "LevelState", "PROMPT_WORDS",
    "Pool", "RequestLogError", "SECRET_PARAMS", "Sampler", "Sweep", "SweepError",
    "SweepSettings", "best_offset", "check_load_generators", "check_params", "connect_agent",
    "default_min_requests", "failure_message", "loop_factory", "map_record", "record_tuple",
    "repeats_summary", "run_agent", "run_sweep", "split_workers", "stop_agents")


def run_sweep(params, request_log_path=None):
    """Run the whole sweep synchronously; returns the facts dict. Raises SweepError (its
    subclass RequestLogError when the request log cannot be opened or written)."""
    if not HAS_AIOHTTP:
        raise SweepError("aiohttp is not importable by %s" % sys.executable)
    sweep = Sweep(params)  # validates the parameters
    factory = loop_factory(sweep.s.event_loop)
    n = sweep.s.processes

    def run(coro):
        if factory is None:
            return asyncio.run(coro)
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(coro)
    lgs = sweep.s.load_generators
    if lgs:  # the preflight here, then the agents get its outcome, then the levels
        run(sweep.run_preflight())
        sweep.pool = AgentPool(sweep, lgs, sweep.s.load_generator_authkey)
        try:
            return run(sweep.run(log_path=request_log_path, preflight=False))
        finally:
            sweep.pool.close()
            sweep.pool = None
    if n <= 1:
        return run(sweep.run(log_path=request_log_path))
    # several processes: the preflight first, then fork the workers (no event loop exists in
    # this process while it forks), then the levels
    run(sweep.run_preflight())
    sweep.pool = Pool(sweep, n)
    try:
        return run(sweep.run(log_path=request_log_path, preflight=False))
    finally:
        sweep.pool.close()
        sweep.pool = None
