"""Pure functions over ansible-runner events (no Ansible, no I/O): unit-tested on their own.

Which events carry facts (ansible-runner 2.4, ``awx_display`` callback):
- ``runner_on_ok``: ``event_data.res`` is the task's result. ``set_fact`` results and modules
  that return facts (``gpu_facts``, ``vllm_sweep``, ...) carry ``res.ansible_facts``; a loop's
  final ``runner_on_ok`` carries each item's result in ``res.results[*]`` (the per-item
  ``runner_item_on_ok`` events repeat them, so they are not read twice). ``setup`` /
  ``gather_facts`` results are skipped (the collected OS facts are not of interest here).
- ``no_log`` results arrive as ``{"censored": ...}``: they carry no facts, by design.
- ``runner_on_failed`` / ``runner_on_unreachable``: ``res.msg`` says why; ``event_data`` names
  the host, the task, its role and action. ``ignore_errors`` failures are not failures.
- ``playbook_on_stats``: per-host counters (``ok``, ``changed``, ``failures``, ``dark``,
  ``skipped``, ``rescued``, ``ignored``), each a ``{host: n}`` mapping.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from .results import HostFailure, HostStats

FACT_GATHERING = {"setup", "gather_facts", "ansible.builtin.setup", "ansible.builtin.gather_facts",
                  "ansible.legacy.setup", "ansible.legacy.gather_facts"}
MAX_MESSAGE = 2000


def facts_from_result(res: Any) -> Dict[str, Any]:
    """Facts a task result sets, in the order Ansible applies them (items, then the task)."""
    out: Dict[str, Any] = {}
    if not isinstance(res, dict) or "censored" in res:
        return out
    for item in res.get("results") or []:
        if isinstance(item, dict) and "censored" not in item and not item.get("skipped"):
            facts = item.get("ansible_facts")
            if isinstance(facts, dict):
                out.update(facts)
    facts = res.get("ansible_facts")
    if isinstance(facts, dict):
        out.update(facts)
    return out


def failure_message(res: Any) -> str:
    """The most useful line(s) of a failed result: msg, else a failed item's msg, else stderr."""
    if not isinstance(res, dict):
        return "failed"
    if "censored" in res:
        return "the result is hidden (no_log: true)"
    msg = res.get("msg") or ""
    items = [i for i in (res.get("results") or []) if isinstance(i, dict) and i.get("failed")]
    if items and (not msg or "one or more items failed" in str(msg).lower()):
        msg = failure_message(items[0])
    if not msg:
        msg = res.get("stderr") or res.get("module_stderr") or res.get("stdout") or "failed"
    if isinstance(msg, list):
        msg = "; ".join(str(m) for m in msg)
    msg = str(msg).strip()
    return msg if len(msg) <= MAX_MESSAGE else msg[:MAX_MESSAGE] + " [...]"


def parse_stats(event_data: Dict[str, Any]) -> Dict[str, HostStats]:
    """Per-host counters from a ``playbook_on_stats`` event's ``event_data``."""
    keys = {"ok": "ok", "changed": "changed", "failures": "failed", "dark": "unreachable",
            "skipped": "skipped", "rescued": "rescued", "ignored": "ignored"}
    hosts = set()
    for src in list(keys) + ["processed"]:
        value = event_data.get(src) or {}
        if isinstance(value, dict):
            hosts.update(value)
    out = {}
    for host in sorted(hosts):
        kw = {}
        for src, dst in keys.items():
            value = event_data.get(src) or {}
            kw[dst] = int(value.get(host, 0)) if isinstance(value, dict) else 0
        out[host] = HostStats(**kw)
    return out


class EventCollector:
    """Feed it runner events in order; it keeps per-host facts, failures, tasks and stats."""

    def __init__(self) -> None:
        self.facts: Dict[str, Dict[str, Any]] = {}
        self.results: Dict[str, Dict[str, Any]] = {}   # host -> action -> last ok result
        self.failures: List[HostFailure] = []
        self.stats: Optional[Dict[str, HostStats]] = None
        self.tasks: List[str] = []
        self.count = 0

    def add(self, event: Dict[str, Any]) -> None:
        self.count += 1
        kind = event.get("event")
        data = event.get("event_data") or {}
        host = data.get("host")
        action = data.get("resolved_action") or data.get("task_action") or ""
        if kind == "playbook_on_task_start":
            self.tasks.append(data.get("task") or data.get("name") or "")
        elif kind == "runner_on_ok" and host:
            if action in FACT_GATHERING:
                return
            res = data.get("res") or {}
            self.facts.setdefault(host, {}).update(facts_from_result(res))
            if isinstance(res, dict) and "censored" not in res:
                self.results.setdefault(host, {})[action.split(".")[-1]] = res
        elif kind == "runner_on_failed" and host:
            if data.get("ignore_errors"):
                return
            self.failures.append(self._failure(data, unreachable=False))
        elif kind == "runner_on_unreachable" and host:
            self.failures.append(self._failure(data, unreachable=True))
        elif kind == "playbook_on_stats":
            self.stats = parse_stats(data)

    @staticmethod
    def _failure(data: Dict[str, Any], unreachable: bool) -> HostFailure:
        return HostFailure(host=data["host"], task=data.get("task") or None,
                           message=failure_message(data.get("res")), unreachable=unreachable,
                           role=data.get("role") or None,
                           action=data.get("resolved_action") or data.get("task_action") or None,
                           play=data.get("play") or None)

    def hosts(self) -> List[str]:
        names = set(self.facts) | {f.host for f in self.failures}
        if self.stats:
            names |= set(self.stats)
        return sorted(names)

    def failures_for(self, host: str) -> List[HostFailure]:
        found = [f for f in self.failures if f.host == host]
        stats = (self.stats or {}).get(host)
        if not found and stats and (stats.failed or stats.unreachable):
            found = [HostFailure(host=host, task=None, unreachable=bool(stats.unreachable),
                                 message="counted as failed in the recap without a failure "
                                         "event (another host failed with any_errors_fatal?)")]
        return found
