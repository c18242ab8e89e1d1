# -*- coding: utf-8 -*-
"""Action plugin for vllm_ops.deploy.vllm_ready: wait in slices and show progress.

A model load can take 30+ minutes; a single module call would sit silent all that time.
This plugin runs the module in slices of ``progress_s`` seconds (``partial=true``) and, after
each slice that ends still loading, prints one line on the controller: the unit, the elapsed
time, the last /health answer and the latest journal line of the unit. The last slice runs
without ``partial`` so a timeout fails with the journal's last lines; a crash (unit failed or
restarted ``max_restarts`` times) fails at once with them too. Nothing secret is printed: the
module's arguments are not shown and journal lines come from the server's own log.
"""
from __future__ import annotations

import time

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()

_MODULE = "vllm_ops.deploy.vllm_ready"


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = True

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        try:
            total = int(args.get("timeout_s", 1800))
            step = max(1, int(args.get("progress_s", 15)))
        except (TypeError, ValueError):
            result.update(failed=True, msg="timeout_s and progress_s must be integers")
            return result
        if self._task.check_mode or total <= step:
            start = time.monotonic()
            result.update(self._execute_module(module_name=_MODULE, module_args=args,
                                               task_vars=task_vars))
            if result.get("ready"):
                result.setdefault("elapsed_s", round(time.monotonic() - start, 1))
                result["ready_at"] = round(time.time(), 3)
            return result

        host = task_vars.get("inventory_hostname", "?")
        label = args.get("unit") or args.get("url")
        start = time.monotonic()
        baseline = args.get("restarts_baseline")
        while True:
            remaining = total - (time.monotonic() - start)
            final = remaining <= step
            margs = dict(args, timeout_s=max(1, int(remaining if final else step)),
                         partial=not final)
            if baseline is not None:
                margs["restarts_baseline"] = baseline
            res = self._execute_module(module_name=_MODULE, module_args=margs,
                                       task_vars=task_vars)
            if res.get("failed") or res.get("skipped") or res.get("ready") is not False:
                if res.get("failed"):
                    waited = time.monotonic() - start
                    res["elapsed_s"] = round(waited, 1)
                    res["msg"] = "%s (waited %.0f s of %d in all)" % (res.get("msg", ""),
                                                                      waited, total)
                if res.get("ready"):
                    res["elapsed_s"] = round(time.monotonic() - start, 1)
                    # controller clock (epoch s) when it answered: the transition's downtime
                    res["ready_at"] = round(time.time(), 3)
                result.update(res)
                return result
            baseline = res.get("restarts_baseline", baseline)
            health = res.get("health_status")
            line = (res.get("journal_last") or "").strip()
            if len(line) > 160:
                line = line[:157] + "..."
            display.display("[%s] %s: loading for %d s of %d (/health: %s); journal: %s"
                            % (host, label, time.monotonic() - start, total,
                               "connection refused" if health is None else health,
                               line or "(empty)"))
