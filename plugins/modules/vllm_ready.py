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
        while loading), as soon as systemd marks it failed, or as soon as its main process
        has exited with nothing to restart it (the unit C(inactive), or a transient unit
        unloaded after it ended). The error quotes the journal's error line.
    type: int
    default: 2
  restarts_baseline:
    description:
      - NRestarts of I(unit) when the wait began (from an earlier slice's C(restarts_baseline));
        default is the count at the start of this call.
    type: int
  partial:
    description:
      - Wait one slice only. When I(timeout_s) passes while the server is still loading, return
        C(ready=false) with progress (C(elapsed_s), C(health_status), C(journal_last),
        C(restarts_baseline)) instead of failing. Used by the vllm_service role's action plugin,
        which calls the module in slices of I(progress_s) and prints progress between them.
    type: bool
    default: false
  progress_s:
    description:
      - Seconds per slice for the role's action plugin (it prints the elapsed time and the latest
        journal line after each). The module itself ignores it.
    type: int
    default: 15
extends_documentation_fragment:
  - vllm_ops.deploy.attributes
  - vllm_ops.deploy.attributes.PLATFORM
  - vllm_ops.deploy.attributes.ACTION
attributes:
  check_mode:
    support: partial
    details: Does not probe the endpoint in check mode (reports skipped).
  diff_mode:
    support: none
author:
  - vllm-deploy contributors (@vllm-ops)
"""

EXAMPLES = r"""
- name: Wait until the endpoint serves
  vllm_ops.deploy.vllm_ready:
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
ready_at:
  description: Controller time (seconds since the epoch) when the checks passed (set by the action plugin).
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
ready:
  description: Whether the endpoint passed all checks (false only with I(partial)).
  type: bool
  returned: always
journal_last:
  description: The latest journal line of I(unit) (with I(partial), while loading).
  type: str
  returned: when not ready
health_status:
  description: Last C(/health) answer; null while the connection is refused.
  type: int
  returned: always
restarts_baseline:
  description: NRestarts of I(unit) when the wait began (pass it to the next slice).
  type: int
  returned: when I(unit) is set
"""

import re
import subprocess

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_ops.deploy.plugins.module_utils.service.vllm_ready import (
    EndpointError, LoadTimeout, wait_ready)


def journal_tail(unit, lines):
    if not unit:
        return []
    try:
        out = subprocess.run(["journalctl", "--no-pager", "-o", "cat", "-n", str(lines),
                              "-u", unit], capture_output=True, text=True, timeout=20, check=False)
        return out.stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return []


_ERROR_MARKERS = ("Error", "Exception", "error:", "Traceback", "FAILED", "Failed", "failed",
                  "Killed", "killed", "status=")


# Lines that only point at another: a traceback's header, and the line vLLM's API server ends
# its traceback with after the engine process's own (``RuntimeError: Engine core
# initialization failed. See root cause above``).
_POINTERS = ("See root cause above", "Traceback (most recent call last)")


# An exception as Python prints it last in a traceback (``ValueError: Free memory ...``),
# after the process prefix vLLM puts on every line (``(EngineCore pid=42) ``).
_EXCEPTION = re.compile(r"^(\([^)]*\)\s*)?[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b:")


def error_line(lines):
    """The journal line that says best why a unit ended: the last exception as a traceback
    ends (``ValueError: ...``) that does not point at an earlier one, else the last line naming
    an error, else the last line."""
    lines = [ln.strip() for ln in (lines or []) if ln.strip()]

    def points(ln):
        return any(p in ln for p in _POINTERS)

    def names(ln, markers):
        return any(m in ln for m in markers)

    for wanted in (lambda ln: _EXCEPTION.match(ln) and not points(ln),
                   _EXCEPTION.match,
                   lambda ln: names(ln, _ERROR_MARKERS[:4]) and not points(ln),
                   lambda ln: names(ln, _ERROR_MARKERS[:4]),
                   lambda ln: names(ln, _ERROR_MARKERS[4:])):
        for ln in reversed(lines):
            if wanted(ln):
                return ln
    return lines[-1] if lines else ""


def unit_props(unit):
    """systemctl show's ActiveState, SubState, LoadState, NRestarts, ExecMainStatus and
    MainPID of a unit ({} when systemd cannot be asked)."""
    try:
        out = subprocess.run(["systemctl", "show", "-p", "ActiveState", "-p", "SubState",
                              "-p", "LoadState", "-p", "NRestarts", "-p", "ExecMainStatus",
                              "-p", "MainPID", unit],
                             capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return {}
    return dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)


def unit_state(unit):
    """(ActiveState, NRestarts) of a systemd unit, or (None, None) if unknown."""
    props = unit_props(unit)
    restarts = props.get("NRestarts", "")
    return props.get("ActiveState"), int(restarts) if restarts.isdigit() else None


def crash_watch(unit, max_restarts, first=None, props=unit_props, journal=None):
    """An on_wait callback that stops the wait as soon as the unit has clearly ended.

    Ended means: systemd marks it failed; it was restarted ``max_restarts`` times during the
    wait; or its main process exited and nothing will start it again -- the unit is
    ``inactive`` (a clean exit without Restart=, or a transient ``systemd-run --collect``
    unit, which is unloaded at once: LoadState ``not-found``). A unit between two restarts
    is ``activating`` (``auto-restart``) and the wait goes on. The error names the journal's
    error line."""
    journal = journal or (lambda u: journal_tail(u, 200))
    if first is None:
        p0 = props(unit)
        n0 = p0.get("NRestarts", "")
        first = int(n0) if n0.isdigit() else None

    def fail(why, elapsed):
        line = error_line(journal(unit))
        said = ("; journal: %s" % line) if line else ""
        raise EndpointError("%s %s after %.0f s%s" % (unit, why, elapsed, said))

    def check(elapsed, last_status):
        p = props(unit)
        if not p:
            return
        state, load = p.get("ActiveState"), p.get("LoadState")
        n = p.get("NRestarts", "")
        restarts = int(n) if n.isdigit() else None
        if state == "failed":
            fail("failed (its main process exited with status %s; systemd gave up restarting it)"
                 % p.get("ExecMainStatus", "?"), elapsed)
        if load == "not-found":
            fail("is gone: its main process exited and the transient unit was unloaded", elapsed)
        if state == "inactive":
            fail("is not running: its main process exited with status %s and nothing restarts it"
                 % p.get("ExecMainStatus", "?"), elapsed)
        if first is not None and restarts is not None and restarts - first >= max_restarts:
            fail("crashed and was restarted %d times while loading" % (restarts - first),
                 elapsed)
    return check


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            model=dict(type="str", required=True),
            api_key=dict(type="str", no_log=True),
            timeout_s=dict(type="int", default=1800),
            tokens=dict(type="int", default=8, no_log=False),  # a count, not a secret
            unit=dict(type="str"),
            journal_lines=dict(type="int", default=40),
            max_restarts=dict(type="int", default=2),
            restarts_baseline=dict(type="int"),
            partial=dict(type="bool", default=False),
            progress_s=dict(type="int", default=15),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if p["timeout_s"] <= 0 or p["tokens"] <= 0:
        module.fail_json(msg="timeout_s and tokens must be positive (got %s, %s)"
                         % (p["timeout_s"], p["tokens"]))
    if module.check_mode:
        module.exit_json(changed=False, skipped=True, ready=False,
                         msg="check mode: endpoint not probed")
    baseline = p["restarts_baseline"]
    if p["unit"] and baseline is None:
        baseline = unit_state(p["unit"])[1]
    extra = {"restarts_baseline": baseline} if p["unit"] else {}
    try:
        result = wait_ready(p["url"], p["model"], p["timeout_s"], tokens=p["tokens"],
                            api_key=p["api_key"],
                            on_wait=crash_watch(p["unit"], p["max_restarts"], baseline)
                            if p["unit"] else None)
    except LoadTimeout as e:
        if p["partial"]:
            last = journal_tail(p["unit"], 1)
            module.exit_json(changed=False, ready=False, msg=str(e),
                             elapsed_s=round(e.elapsed, 1), health_status=e.last,
                             journal_last=last[-1] if last else "", **extra)
        module.fail_json(msg=str(e), ready=False, health_status=e.last,
                         journal_tail=journal_tail(p["unit"], p["journal_lines"]), **extra)
    except (EndpointError, OSError, ValueError) as e:  # URLError, socket timeout, bad JSON
        module.fail_json(msg=str(e), ready=False,
                         journal_tail=journal_tail(p["unit"], p["journal_lines"]), **extra)
    module.exit_json(changed=False, ready=True, **dict(result, **extra))


if __name__ == "__main__":
    main()
