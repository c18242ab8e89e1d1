#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Documentation of the action plugin vllm_ops.deploy.vllm_report (it runs on the controller)."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_report
short_description: Render a throughput sweep's report, or compare sweeps, on the controller
description:
  - Runs on the controller (an action plugin; nothing reaches the target host).
  - O(mode=render) writes C(levels.csv), C(throughput.png), C(ttft.png), C(tpot.png) and
    C(summary.txt) into a run directory written by the vllm_benchmark role (C(sweep.json) and,
    when there, C(requests.jsonl), which must agree with the level summaries).
  - O(mode=compare) writes C(compare.txt), C(compare.csv) and overlaid plots of two or more
    runs into O(dest). A run is a run directory, a directory above runs (its newest run is
    taken) or an inventory results file (C(host_vars/<host>/vllm_benchmark.yml)).
  - O(mode=table) returns the per-level table of one run and writes nothing.
  - Relative paths are taken from the current directory. Plots need matplotlib in the
    controller's Python (requirements/tools.txt pins it).
options:
  mode:
    description: What to do.
    type: str
    choices: [render, compare, table]
    default: render
  run:
    description: The run (O(mode=render) or O(mode=table)).
    type: path
  runs:
    description: Two or more runs (O(mode=compare)).
    type: list
    elements: path
  labels:
    description: A legend label per run of O(runs), in order (default model@host and time).
    type: list
    elements: str
  dest:
    description: Output directory of O(mode=compare) (created).
    type: path
extends_documentation_fragment:
  - vllm_ops.deploy.attributes
  - vllm_ops.deploy.attributes.CONTROLLER
attributes:
  check_mode:
    support: full
    details: Reads the runs and reports the files it would write; writes nothing.
  diff_mode:
    support: full
    details: The files written (before, the ones that were there).
author:
  - vllm-deploy contributors (@vllm-ops)
"""

EXAMPLES = r"""
- name: Render a sweep's report
  vllm_ops.deploy.vllm_report:
    run: reports/gpu-box-1/main/20260101T120000Z

- name: Compare two models on one host
  vllm_ops.deploy.vllm_report:
    mode: compare
    runs: [reports/gpu-box-1/kimi, reports/gpu-box-1/minimax]
    labels: [Kimi-K2.5, MiniMax-M2.5]
    dest: reports/compare/kimi-vs-minimax
"""

RETURN = r"""
files:
  description: Files written (would be written in check mode).
  type: list
  elements: str
  returned: mode is render or compare
lines:
  description: The table (compare and table modes) or summary (render mode), line by line.
  type: list
  elements: str
  returned: always
run:
  description: The run directory or results file that was read (render and table modes).
  type: str
  returned: mode is render or table
"""
