#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: wait until a vLLM endpoint serves, and prove it with a completion."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_ready
short_description: Wait for a vLLM server to become ready and check it serves
description:
  - Polls C(GET /health) until it answers 200 (connection refused means the server is still
    loading), then checks that C(GET /v1/models) lists the served model name, then sends one
    completion with an exact output length and checks the server's usage count.
  - While waiting, and on failure, reports the latest lines of the systemd unit's journal.
  - Read-only; in check mode it does nothing and reports C(skipped).
options:
  url:
    description: Base URL of the server, e.g. C(http://127.0.0.1:8000).
    type: str
    required: true
  model:
    description: The served model name that must be listed.
    type: str
    required: true
  api_key:
    description: API key for the server, if it requires one. Never logged.
    type: str
    no_log: true
  timeout_s:
    description: Seconds to wait for C(/health) to answer 200.
    type: int
    default: 1800
  tokens:
    description: Output tokens requested from the check completion.
    type: int
    default: 8
  unit:
    description: systemd unit whose journal is quoted on failure.
    type: str
  journal_lines:
    description: How many journal lines to return on failure.
    type: int
    default: 40
  max_restarts:
    description:
      - Stop waiting once I(unit) was restarted this many times during the wait (it crashes
        while loading), or as soon as systemd marks it failed.
    type: int
    default: 2
author: vllm-deploy
"""

EXAMPLES = r"""
- name: Wait until the endpoint serves
  ansible.legacy.vllm_ready:
    url: http://127.0.0.1:8000
    model: tiny
    unit: vllm-main.service
    timeout_s: 1800
"""

RETURN = r"""
elapsed_s:
  description: Seconds from the first poll until the completion check passed.
  type: float
  returned: success
models:
  description: Names listed by /v1/models.
  type: list
  elements: str
  returned: success
completion_tokens:
  description: Tokens the check completion returned (equals I(tokens)).
  type: int
  returned: success
journal_tail:
  description: Latest journal lines of I(unit) (on failure).
  type: list
  elements: str
  returned: failure
"""

import subprocess

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.vllm_http import EndpointError, wait_ready


def journal_tail(unit, lines):
    if not unit:
        return []
    try:
        out = subprocess.run(["journalctl", "--no-pager", "-o", "cat", "-n", str(lines),
                              "-u", unit], capture_output=True, text=True, timeout=20)
        return out.stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return []


def unit_state(unit):
    """(ActiveState, NRestarts) of a systemd unit, or (None, None) if unknown."""
    try:
        out = subprocess.run(["systemctl", "show", "-p", "ActiveState", "-p", "NRestarts",
                              unit], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None, None
    props = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    restarts = props.get("NRestarts", "")
    return props.get("ActiveState"), int(restarts) if restarts.isdigit() else None


def crash_watch(unit, max_restarts):
    """An on_wait callback that stops the wait as soon as the unit has clearly failed."""
    _, first = unit_state(unit)

    def check(elapsed, last_status):
        state, restarts = unit_state(unit)
        if state == "failed":
            raise EndpointError("%s failed after %.0f s (systemd gave up restarting it)"
                                % (unit, elapsed))
        if first is not None and restarts is not None and restarts - first >= max_restarts:
            raise EndpointError("%s crashed and was restarted %d times while loading"
                                % (unit, restarts - first))
    return check


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            model=dict(type="str", required=True),
            api_key=dict(type="str", no_log=True),
            timeout_s=dict(type="int", default=1800),
            tokens=dict(type="int", default=8),
            unit=dict(type="str"),
            journal_lines=dict(type="int", default=40),
            max_restarts=dict(type="int", default=2),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if p["timeout_s"] <= 0 or p["tokens"] <= 0:
        module.fail_json(msg="timeout_s and tokens must be positive (got %s, %s)"
                         % (p["timeout_s"], p["tokens"]))
    if module.check_mode:
        module.exit_json(changed=False, skipped=True, msg="check mode: endpoint not probed")
    try:
        result = wait_ready(p["url"], p["model"], p["timeout_s"], tokens=p["tokens"],
                            api_key=p["api_key"],
                            on_wait=crash_watch(p["unit"], p["max_restarts"]) if p["unit"] else None)
    except (EndpointError, TimeoutError) as e:
        module.fail_json(msg=str(e), journal_tail=journal_tail(p["unit"], p["journal_lines"]))
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
