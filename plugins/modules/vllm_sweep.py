#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: closed-loop throughput sweep of an OpenAI-compatible vLLM endpoint."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_sweep
short_description: Measure a vLLM endpoint with a closed-loop concurrency sweep
description:
  - For each concurrency level C, runs C workers that each send their next streaming request
    when their last one ends (closed loop). Each level has a warm-up (the first
    I(warmup_requests) completions), then a steady-state window that lasts I(duration_s) and at
    least I(min_requests) requests (whichever ends later), then a drain (in-flight requests
    finish; nothing new is sent). Ramp-up and drain are excluded from rates and latencies.
  - Prompts are random token-id lists of exactly I(input_len) tokens sent to
    C(/v1/completions) (I(prompt_format=token_ids)), or text the server tokenizes into exactly
    I(input_len) tokens (I(prompt_format=text)), drawn afresh per level and per run so prefix
    caching cannot flatter a level. Output length is forced with C(max_tokens = min_tokens = output_len) and
    C(ignore_eos); every request's C(usage.completion_tokens) is checked. Token counts come from
    the server's usage (C(stream_options.include_usage)), never from chunks or re-tokenizing.
  - "Window: opens at the completion of the last warm-up request (w0), closes at the
    completion of the request that satisfied both the duration and the request count (w1)."
  - "Rates: output tok/s = sum of usage.completion_tokens of successful requests that ended
    in (w0, w1], divided by (w1 - w0); total tok/s adds their prompt tokens; requests/s
    counts them. Achieved concurrency = time-average of requests in flight over the window."
  - "Latencies use successful requests that started and ended inside the window.
    TTFT = first token chunk - request sent. E2E = stream end - request sent.
    TPOT = (E2E - TTFT) / (N - 1), N = usage.completion_tokens (vLLM's name; guidellm and
    aiperf call this ITL). ITL = gaps between consecutive token chunks (vLLM's name); tokens
    per chunk come from the server's running usage count. Each latency: mean, p50, p90, p99,
    max; percentiles by linear interpolation between closest ranks (numpy's default)."
  - "Goodput (when SLOs are given): requests counted in the rates that meet every given SLO,
    per second. A level meets the SLOs when the p99 of each latency with an SLO is within it
    and no request failed."
  - "Output-length check: a level where more than 1% of successful requests did not return
    exactly I(output_len) tokens is marked (C(output_length.marked))."
  - "Prompt-length check: C(input_length) counts the successful requests whose
    C(usage.prompt_tokens) is not I(input_len) (C(mismatched), marked when there is one) and
    the level's prompt-token total (C(prompt_tokens_total)), with either prompt format."
  - "Server cross-check: the deltas of C(vllm:generation_tokens_total) and
    C(vllm:prompt_tokens_total) (summed over label sets) from I(metrics_url) across the whole
    level (warm-up to drain) against the client's usage totals over the same requests."
  - "Saturation: after each level the sweep stops (with I(stop_on_saturation)) and says why
    when a request failed, an SLO broke, or output tok/s rose by less than
    I(saturation_threshold) per doubling of concurrency (threshold * log2(C/C_prev) for other
    steps) while TTFT p50 grew. Knee: the error-free level of maximum output tok/s, and the
    highest level meeting the SLOs."
  - "Client health: CPU time (time.process_time) and event-loop lag (a 10 ms ticker) per level
    and per client process; a level is marked C(client_limited) when in any process the
    loop-lag p99 exceeds 10 ms or the process used more than 80% of a core over the window.
    Python's garbage collector is switched off (after a collection, with what exists frozen)
    during each level unless I(gc_during_level); C(client.gc) reports collections and pauses."
  - "Two definitions, every level: the figures above are C(definition: steady_state) (the
    window). C(whole_run) holds the same level computed the way C(vllm bench serve) computes
    its results: all requests of the level (warm-up, window, drain), duration from the first
    send to the last completion, output tok/s = usage tokens of the successful requests /
    duration, TTFT/TPOT/ITL/E2EL (latency to the last token chunk) with mean, median, std and
    p50/p90/p99 (numpy's definitions)."
  - "Precision: C(precision.output_tok_s) is a 95% batch-means interval of the window's output
    tok/s (10 equal sub-windows, fewer where a sub-window would be shorter than one request
    lifetime, the median end-to-end latency: requests of one length in a closed loop run in
    phase, so a shorter sub-window sees all prefill or all decode; null when the window is
    shorter than 1.5 lifetimes; each request's tokens spread over the span of its token
    chunks),
    C(precision.ttft_ms_p50) the 95% distribution-free interval of the TTFT median (order statistics). With
    I(precision_pct) a level runs past I(duration_s) until both intervals are within
    +-precision_pct of their values, or until I(max_duration_s); with I(min_lifetimes) until the
    window is that many request lifetimes long (C(timing.stopped_by) says which)."
  - "Worker processes: with I(processes) > 1 the C workers of a level are spread over that
    many forked processes (each with its own event loop and connections), started together;
    they stream their completed requests to the parent, which applies the window rule to the
    merged completions (the window is decided within 20 ms of each completion), so token
    counts, windows and the server cross-check are those of one client."
  - Before any level it checks C(GET /v1/models) (unreachable server or a model name not served
    fails here, listing the served names) and, with I(endpoint=completions), learns the
    vocabulary size from C(/v1/completions) unless I(vocab_size) is given (see I(vocab_size)).
  - "Several load-generator hosts: with I(load_generators) the workers of a level are spread
    over agents on other hosts (each started with I(mode=agent), one client process each),
    instead of this process. The module connects to every agent (the TCP connection of
    Python's C(multiprocessing.connection), authenticated by HMAC with
    I(load_generator_authkey)), hands it the preflight's outcome (parameters with I(api_key),
    seed, vocabulary or prompt words), and before each level estimates each agent's clock
    offset from 8 ping round trips (offset = agent time - midpoint of the round trip with the
    smallest RTT; the true offset is within +-RTT/2 of it, reported as
    C(clock.error_bound_ms)). The agents stream their completed requests here, their times
    mapped onto this host's clock, and the window rule is applied to the merged completions
    as with I(processes); TTFT, TPOT, ITL and E2E are differences of one agent's own times,
    so the offset only decides which window a request falls in. Every agent must reach
    I(base_url)."
  - "With I(mode=agent) the module is such an agent: it listens on I(listen_host):I(listen_port),
    serves the first sweep that authenticates, and returns once the sweep sends quit or closes
    the connection, or after I(agent_timeout_s) without a sweep connecting or without a
    message between levels (run it with C(async) so it waits in the background). With
    I(mode=stop_agents) it sends quit to the agents of I(load_generators) that still wait for
    a sweep (cleanup after a failure)."
  - Needs C(aiohttp) importable by the Python that runs the module; vLLM depends on it, so
    setting C(ansible_python_interpreter) to the vLLM virtualenv's python works.
  - It only measures, so it always reports C(changed=false); the caller persists the facts.
    In check mode it sends nothing (a sweep loads the server for minutes) and returns
    C(skipped=true) with no facts.
options:
  mode:
    description:
      - C(sweep) runs the sweep (from this process, its I(processes), or the agents of
        I(load_generators)).
      - C(agent) serves one sweep as a load generator (see I(listen_port)).
      - C(stop_agents) tells the agents of I(load_generators) that still wait to quit.
    type: str
    choices: [sweep, agent, stop_agents]
    default: sweep
  base_url:
    description:
      - Base URL of the server, e.g. C(http://127.0.0.1:8000); a trailing C(/v1) (or C(/v1/))
        is accepted and dropped, so C(http://127.0.0.1:8000/v1) means the same server.
      - Required with I(mode=sweep).
    type: str
  model:
    description: Served model name (as listed by C(/v1/models)). Required with I(mode=sweep).
    type: str
  load_generators:
    description:
      - Agents (I(mode=agent), already started) that send the requests of every level, its
        workers split over them as evenly as possible. At most as many as the largest level.
        Not with I(processes) > 1 (each agent is one client process; start several agents
        on a host with spare cores).
      - An agent that sends nothing for 30 s during a level (it sends a heartbeat every second
        while its requests run) fails the level, naming it; so does one that closes its
        connection.
    type: list
    elements: dict
    suboptions:
      host:
        description: Address or name of the agent's host, as this host reaches it.
        type: str
        required: true
      port:
        description: The agent's I(listen_port).
        type: int
        required: true
  load_generator_authkey:
    description:
      - The secret the agents were started with (I(mode=agent)); random per run. Never logged
        or returned. Required with I(load_generators) and I(mode=agent).
    type: str
  listen_host:
    description: Address the agent listens on (I(mode=agent)).
    type: str
    default: 0.0.0.0
  listen_port:
    description: TCP port the agent listens on (I(mode=agent)).
    type: int
  agent_timeout_s:
    description:
      - I(mode=agent) returns (failed) when no sweep connected within this many seconds, or
        when a connected sweep sent nothing for this long between levels.
    type: float
    default: 600
  api_key:
    description: Bearer token for the server, if it needs one. Never logged or returned.
    type: str
  levels:
    description: Concurrency levels, run in this order. Each must be a positive integer.
    type: list
    elements: int
    default: [1, 2, 4, 8, 16, 32, 64, 128]
  input_len:
    description: Prompt length in tokens (exact with I(endpoint=completions)).
    type: int
    default: 128
  output_len:
    description: Output tokens per request (exact, C(max_tokens = min_tokens), C(ignore_eos)).
    type: int
    default: 128
  duration_s:
    description: Minimum length of each level's measurement window, seconds.
    type: float
    default: 20
  min_requests:
    description: Minimum requests started and ended inside each window. Default C(max(2*C, 8)).
    type: int
  warmup_requests:
    description: Completions before each window opens. Default C(C) (every worker done once).
    type: int
  endpoint:
    description:
      - C(completions) sends token-id prompts to C(/v1/completions).
      - C(chat) sends random words to C(/v1/chat/completions); the prompt token count then
        depends on the chat template and is reported, not forced.
    type: str
    choices: [completions, chat]
    default: completions
  prompt_format:
    description:
      - How a C(/v1/completions) prompt is sent (I(endpoint=completions) only).
      - C(token_ids) (the default) sends a list of I(input_len) random token ids; the server
        does not tokenize anything.
      - C(text) sends text, as C(vllm bench serve)'s random dataset does, so every request's
        time to first token includes the server's tokenization (and its queueing under load).
        The preflight asks the server's C(/tokenize) which of a built-in list of common words
        are one token after a space, and how many special tokens (BOS) a prompt gets; each
        prompt is that many random such words (seeded, fresh per level and per run) that
        tokenize to exactly I(input_len) tokens, special tokens counted. The preflight
        tokenizes 8 random prompts and fails, naming I(prompt_format), when one is not exactly
        I(input_len) tokens or when the server has no C(/tokenize) (then use C(token_ids)).
        The vocabulary probe is not needed then (see I(vocab_size)).
    type: str
    choices: [token_ids, text]
    default: token_ids
  request_timeout_s:
    description: Per-request timeout, seconds; a timed-out request counts as failed.
    type: float
    default: 600
  slo_ttft_ms:
    description: TTFT SLO (ms), checked against each level's p99 and per request for goodput.
    type: float
  slo_tpot_ms:
    description: TPOT SLO (ms), as above.
    type: float
  slo_e2e_ms:
    description: End-to-end latency SLO (ms), as above.
    type: float
  also_slos:
    description:
      - Other SLOs to judge the same requests by, each named, as a mapping of its name to
        some of C(ttft_ms), C(tpot_ms) and C(e2e_ms) (milliseconds).
      - Each level gets C(by_slo.<name>) with that SLO's goodput and verdict, computed from
        the same requests as C(goodput) and C(slo). They do not stop the sweep; the
        C(slo_*) options alone do.
    type: dict
  saturation_threshold:
    description: Minimum relative gain of output tok/s per doubling of concurrency.
    type: float
    default: 0.1
  stop_on_saturation:
    description: Stop after the first level with a saturation, error or SLO signal.
    type: bool
    default: true
  request_log_path:
    description: Where to write per-request records (JSON lines) on the host running the
      module. Times are seconds from the start of the sweep. Opened once the preflight passed;
      only a failure to open or write it is reported as C(request_log_path ...).
    type: path
  metrics_url:
    description: Prometheus endpoint for the server cross-check. Default I(base_url)C(/metrics).
    type: str
  chunk_usage:
    description:
      - Ask the server for running usage in every streamed chunk
        (C(stream_options.continuous_usage_stats)), which gives the tokens of each chunk
        (C(chunk_tokens) in the request log, for multi-token chunks under speculative decoding).
      - Off by default, like C(vllm bench serve) and real clients. With it the server builds one
        usage object per token, and where its API server is the bottleneck (a small model, a
        fast GPU) that extra work lowers the throughput being measured. Output token counts and
        TPOT come from the final usage either way.
    type: bool
    default: false
  event_loop:
    description:
      - The client's event loop. C(auto) takes uvloop when the interpreter can import it (the
        vLLM venv can, vLLM depends on it) and is Python 3.11 or newer, else asyncio's own.
      - The results name the loop used (C(client.event_loop)).
    type: str
    choices: [auto, asyncio, uvloop]
    default: auto
  stream_transport:
    description:
      - How the streaming requests travel. C(native) (the default) is the sweep's own HTTP/1.1
        keep-alive client on C(asyncio.Protocol), one connection per worker. Each arriving
        token chunk is parsed where the event loop hands over its bytes, with no task
        wake-up per chunk, which costs less client CPU per token than C(aiohttp)
        (tests/benchmarks/bench_client_ceiling.py measures the two side by side). C(http) and
        C(https) base URLs (the system's trust store, C(SSL_CERT_FILE) honoured), no proxies.
      - C(aiohttp) sends them through the aiohttp session the preflight uses (proxies and
        other aiohttp behaviour); both apply the same SSE rules, and the results name the
        transport used (C(client.stream_transport)).
    type: str
    choices: [native, aiohttp]
    default: native
  vocab_size:
    description:
      - Token ids for prompts are drawn from C([0, vocab_size)).
      - When omitted (and I(endpoint=completions)), the preflight learns it from the server with
        a binary search of about 22 one-token prompts to C(/v1/completions), ids 0 to 2**21,
        each on a fresh connection. HTTP 200 means the id is in range, HTTP 400 mentioning the
        vocabulary means out of range.
      - Some servers drop the connection (vLLM 0.25 resets it on an out-of-vocabulary id) or
        answer HTTP 5xx instead; such a probe counts as out of range only when the server still
        accepts token id 0 right after it (one more request). When it does not, the sweep
        fails before any level, saying the server stopped answering during the vocabulary
        probe; it also fails there when token id 0 is refused or a probe gets no answer within
        60 s. Give I(vocab_size) (the model's C(vocab_size) from its C(config.json)) to skip
        the probe.
    type: int
  processes:
    description:
      - Client processes that share each level's workers (forked from the module's process,
        which then only coordinates). One process drives about the tok/s that
        tests/benchmarks/bench_client_ceiling.py measures per core; use more on a load
        generator with spare cores when a level comes out C(client_limited).
    type: int
    default: 1
  precision_pct:
    description:
      - Run each level until the 95% intervals of its output tok/s and TTFT p50 are within
        +-I(precision_pct) percent of their values (checked at most every second and every
        10% of the window so far), after I(duration_s) and I(min_requests) are met, or until
        I(max_duration_s).
    type: float
  repeats:
    description:
      - Run each level this many times back to back. The level's summary is its first run's,
        plus C(repeats) (output tok/s, TTFT p50 and the whole-run figures of every run) and
        C(precision_repeats) (their 95% t-intervals across runs, which also cover drift
        between runs). The request log marks each request's run (C(repeat)).
    type: int
    default: 1
  min_lifetimes:
    description:
      - Keep each level's window open until it is this many request lifetimes long (the
        median end-to-end latency of the requests completed in it so far), after
        I(duration_s) and I(min_requests) are met, or until I(max_duration_s). At high
        concurrency a request can outlive a short window; the output tok/s interval has one
        batch per lifetime up to 10 and needs at least 1.5 lifetimes
        (C(precision.output_tok_s) is null below that).
    type: float
  max_duration_s:
    description:
      - Cap on a level's window with I(precision_pct) or I(min_lifetimes), seconds. Default
        10 x I(duration_s).
    type: float
  gc_during_level:
    description:
      - Leave Python's garbage collector on during levels (the default switches it off for
        each level, since a full collection blocks the event loop while the level's records
        grow). For measuring the client itself.
    type: bool
    default: false
extends_documentation_fragment:
  - vllm_ops.deploy.attributes
  - vllm_ops.deploy.attributes.PLATFORM
  - vllm_ops.deploy.attributes.FACTS
attributes:
  check_mode:
    support: partial
    details: Sends no load in check mode (reports skipped), since a sweep loads the server for minutes.
  diff_mode:
    support: none
author:
  - vllm-deploy contributors (@vllm-ops)
"""

EXAMPLES = r"""
- name: Sweep the local endpoint
  vllm_ops.deploy.vllm_sweep:
    base_url: http://127.0.0.1:8000
    model: tiny
    levels: [1, 2, 4, 8]
    input_len: 64
    output_len: 64
    duration_s: 10
    request_log_path: /var/tmp/vllm-sweep.jsonl
  vars:
    ansible_python_interpreter: /opt/vllm/venv/bin/python

- name: Start a load-generator agent on each load-generator host
  vllm_ops.deploy.vllm_sweep:
    mode: agent
    listen_port: 18500
    load_generator_authkey: "{{ sweep_authkey }}"
    agent_timeout_s: 600
  delegate_to: "{{ item }}"
  loop: [loadgen-1, loadgen-2]
  async: 7200
  poll: 0
  register: agents

- name: Sweep from both load generators
  vllm_ops.deploy.vllm_sweep:
    base_url: http://10.0.0.5:8000
    model: tiny
    levels: [64, 128, 256]
    load_generators:
      - {host: loadgen-1, port: 18500}
      - {host: loadgen-2, port: 18500}
    load_generator_authkey: "{{ sweep_authkey }}"

- name: Sweep against SLOs, key from the environment
  vllm_ops.deploy.vllm_sweep:
    base_url: "https://llm.example.com"
    model: Kimi-K2.5
    api_key: "{{ lookup('ansible.builtin.env', 'VLLM_API_KEY') }}"
    slo_ttft_ms: 2000
    slo_tpot_ms: 50
"""

RETURN = r"""
ansible_facts:
  description: Facts set by the module.
  returned: success, not in check mode
  type: dict
  contains:
    vllm_sweep:
      description: The sweep result.
      type: dict
      contains:
        levels:
          description: >-
            One summary per level run: concurrency, requests_total/ok/failed,
            failed_in_window, requests_in_window, requests_measured, window_s,
            output_tokens_in_window, output_tok_s, total_tok_s, request_s,
            achieved_concurrency, ttft_ms/tpot_ms/itl_ms/e2e_ms (count, mean, p50, p90, p99,
            max), tokens_per_chunk (mean, max), output_length (expected, checked, mismatched,
            fraction, marked), input_length (expected, prompt_format, checked, mismatched,
            fraction, marked, prompt_tokens_total, lengths_seen), errors (message -> count), goodput (request_s, output_tok_s,
            fraction; null without SLOs), slo (met, breaks), by_slo (with also_slos: per
            name, its goodput and slo as above), client (cpu_s_level,
            cpu_s_window, cpu_util_window, cpu_ms_per_1k_output_tokens, loop_lag_ms,
            client_limited, client_limited_reasons, connections_opened, per_process
            with processes > 1 or load_generators: one entry per client process with its
            own cpu, loop lag and verdict; with load_generators also its host and its
            clock (offset_s, rtt_ms, error_bound_ms, pings); load_generators and
            clock_offset_error_ms_max with load_generators; CPU and connections are
            summed over the processes, client_limited is true when any is, each reason
            naming its process or agent), timing (warmup_s, drain_s, level_s,
            warmup_requests, min_requests), aborted, server_check (client_/server_ output and
            prompt tokens, output_diff, prompt_diff, match), saturation_signal.
          type: list
          elements: dict
        headline:
          description: >-
            single_stream_tok_s (output tok/s at concurrency 1), peak_output_tok_s,
            peak_level, knee (max_throughput_level, max_output_tok_s,
            highest_level_meeting_slo), client_limited_levels, output_length_marked_levels,
            input_length_marked_levels, levels_with_errors.
          type: dict
        stop_reason:
          description: Why the sweep ended.
          type: str
        parameters:
          description: The parameters used (api_key left out), with the run's random seed.
          type: dict
        client:
          description:
            - Python, aiohttp version, event loop, stream transport, the /metrics parser
              (C(prometheus_client) where the interpreter has it, else C(builtin)), total
              client CPU seconds (the agents' included), processes (the agents with
              I(load_generators)), load_generators (host:port of each agent), the limits used.
          type: dict
        server:
          description: >-
            served_models, max_model_len, vocab_size, prompt_format, prompt_text (with
            prompt_format text: special_tokens, words, first_words, leading_space,
            checked_prompts), metrics_available.
          type: dict
table:
  description: The per-level results as text lines.
  returned: success, not in check mode
  type: list
  elements: str
skipped:
  description: True in check mode (nothing was sent).
  returned: check mode
  type: bool
agent:
  description: >-
    I(mode=agent): listen (host:port), levels served, ended (C(quit), C(disconnect) or
    C(quit (stopped before any level))), auth_failures (connections refused for a wrong key),
    event_loop, cpu_s, served_s.
  returned: success, mode agent
  type: dict
agents:
  description: "I(mode=stop_agents) - per agent (host:port) what happened: C(stopped), C(authentication failed), or C(not listening: ...) with the reason."
  returned: mode stop_agents
  type: list
  elements: dict
"""

import sys
import traceback

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.vllm_sweep import (
    HAS_AIOHTTP, SweepError, check_params, failure_message, run_agent, run_sweep, stop_agents)
from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.metrics import format_table


def base_url(url):
    """The server's base URL without a trailing / or /v1 (requests add /v1/...)."""
    url = url.strip().rstrip("/")
    if url.endswith("/v1"):
        url = url[:-len("/v1")]
    return url


def agent_modes(module, mode):
    """mode agent (serve one sweep) and mode stop_agents; both exit the module."""
    p = module.params
    if module.check_mode:
        module.exit_json(changed=False, skipped=True, msg="check mode: no agent started")
    if mode == "stop_agents":
        module.exit_json(changed=False, agents=stop_agents(p["load_generators"],
                                                           p["load_generator_authkey"]))
    if not HAS_AIOHTTP:
        module.fail_json(msg="vllm_sweep mode=agent needs aiohttp, which %s cannot import; run "
                             "the agent with a Python that has it (ansible_python_interpreter)"
                             % sys.executable)
    if p["agent_timeout_s"] <= 0:
        module.fail_json(msg="agent_timeout_s must be > 0, got %r" % p["agent_timeout_s"])
    try:
        info = run_agent(p["listen_host"], p["listen_port"], p["load_generator_authkey"],
                         p["agent_timeout_s"], p.get("event_loop") or "auto")
    except SweepError as e:
        module.fail_json(msg="agent on %s:%d: %s" % (p["listen_host"], p["listen_port"], e))
    except Exception as e:  # noqa: BLE001 - say what failed, not a bare traceback
        module.fail_json(msg="agent on %s:%d: %s" % (p["listen_host"], p["listen_port"],
                                                     failure_message(e)),
                         exception=traceback.format_exc())
    module.exit_json(changed=False, agent=info)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            mode=dict(type="str", default="sweep", choices=["sweep", "agent", "stop_agents"]),
            base_url=dict(type="str"),
            model=dict(type="str"),
            load_generators=dict(type="list", elements="dict", options=dict(
                host=dict(type="str", required=True), port=dict(type="int", required=True))),
            load_generator_authkey=dict(type="str", no_log=True),
            listen_host=dict(type="str", default="0.0.0.0"),
            listen_port=dict(type="int"),
            agent_timeout_s=dict(type="float", default=600),
            api_key=dict(type="str", no_log=True),
            levels=dict(type="list", elements="int", default=[1, 2, 4, 8, 16, 32, 64, 128]),
            input_len=dict(type="int", default=128),
            output_len=dict(type="int", default=128),
            duration_s=dict(type="float", default=20),
            min_requests=dict(type="int"),
            warmup_requests=dict(type="int"),
            endpoint=dict(type="str", default="completions", choices=["completions", "chat"]),
            prompt_format=dict(type="str", default="token_ids", choices=["token_ids", "text"]),
            request_timeout_s=dict(type="float", default=600),
            slo_ttft_ms=dict(type="float"),
            slo_tpot_ms=dict(type="float"),
            slo_e2e_ms=dict(type="float"),
            also_slos=dict(type="dict"),
            saturation_threshold=dict(type="float", default=0.1),
            stop_on_saturation=dict(type="bool", default=True),
            request_log_path=dict(type="path"),
            metrics_url=dict(type="str"),
            vocab_size=dict(type="int"),
            chunk_usage=dict(type="bool", default=False),
            event_loop=dict(type="str", default="auto", choices=["auto", "asyncio", "uvloop"]),
            stream_transport=dict(type="str", default="native", choices=["native", "aiohttp"]),
            processes=dict(type="int", default=1),
            repeats=dict(type="int", default=1),
            precision_pct=dict(type="float"),
            min_lifetimes=dict(type="float"),
            max_duration_s=dict(type="float"),
            gc_during_level=dict(type="bool", default=False),
        ),
        required_if=[("mode", "sweep", ["base_url", "model"]),
                     ("mode", "agent", ["listen_port", "load_generator_authkey"]),
                     ("mode", "stop_agents", ["load_generators", "load_generator_authkey"])],
        supports_check_mode=True,
    )
    mode = module.params["mode"]
    if mode != "sweep":
        agent_modes(module, mode)
    params = dict(module.params)
    for key in ("mode", "listen_host", "listen_port", "agent_timeout_s"):
        params.pop(key)
    if not params.get("load_generators"):
        params.pop("load_generators")
        params.pop("load_generator_authkey")
    params["base_url"] = base_url(params["base_url"])
    log_path = params.pop("request_log_path")
    try:
        check_params(params)
    except SweepError as e:
        module.fail_json(msg=str(e))
    if module.check_mode:
        module.exit_json(changed=False, skipped=True,
                         msg="check mode: no load sent (a sweep loads the server for minutes)")
    if not HAS_AIOHTTP:
        module.fail_json(msg="vllm_sweep needs aiohttp, which %s cannot import; run the module "
                             "with a Python that has it (e.g. set ansible_python_interpreter "
                             "to the vLLM virtualenv's python)" % sys.executable)
    try:
        result = run_sweep(params, request_log_path=log_path)
    except SweepError as e:  # RequestLogError (a SweepError) names request_log_path itself
        module.fail_json(msg=failure_message(e))
    except Exception as e:  # noqa: BLE001 - say what failed, not a bare traceback
        module.fail_json(msg=failure_message(e), exception=traceback.format_exc())
    module.exit_json(changed=False, ansible_facts={"vllm_sweep": result},
                     table=format_table(result["levels"]))


if __name__ == "__main__":
    main()
