# -*- coding: utf-8 -*-
"""Action plugin vllm_ops.deploy.vllm_report: sweep reports and comparisons on the controller
(see plugins/modules/vllm_report.py for the documentation, plugin_utils/benchmark/report.py for
the code)."""
from __future__ import annotations

import os

from ansible.plugins.action import ActionBase

from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.benchmark import report as sweep_report

_ARGS = {
    "mode": {"type": "str", "choices": ["render", "compare", "table"], "default": "render"},
    "run": {"type": "path"},
    "runs": {"type": "list", "elements": "path"},
    "labels": {"type": "list", "elements": "str"},
    "dest": {"type": "path"},
}


def _existing(paths):
    return sorted(p for p in paths if os.path.exists(p))


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        _spec, args = self.validate_argument_spec(
            argument_spec=_ARGS,
            required_if=[("mode", "render", ("run",)), ("mode", "table", ("run",)),
                         ("mode", "compare", ("runs", "dest"))])
        mode = args["mode"]
        check = self._task.check_mode
        try:
            if mode == "table":
                run = sweep_report.load_run(os.path.abspath(args["run"]))
                result.update(changed=False, run=run["path"], lines=sweep_report.run_table(run))
                return result
            if mode == "render":
                run_dir = sweep_report.resolve_run(os.path.abspath(args["run"]))
                if not os.path.isdir(run_dir):
                    raise sweep_report.ReportError("%s is a results file, not a run directory: "
                                                   "render needs the run's sweep.json" % run_dir)
                targets = sweep_report.render_targets(run_dir)
                before = _existing(targets)
                if check:
                    sweep_report.load_run(run_dir)  # readable, or the error now
                    files, lines = targets, []
                else:
                    files = sweep_report.render(run_dir)
                    with open(os.path.join(run_dir, sweep_report.SUMMARY_FILE)) as f:
                        lines = f.read().splitlines()
                result.update(run=run_dir)
            else:
                dest = os.path.abspath(args["dest"])
                runs = [os.path.abspath(p) for p in args["runs"]]
                targets = sweep_report.compare_targets(dest)
                before = _existing(targets)
                if check:
                    lines = sweep_report.compare_table(
                        sweep_report.load_runs(runs, args["labels"]))
                    files = targets
                else:
                    lines, files = sweep_report.compare(runs, dest, labels=args["labels"])
        except sweep_report.ReportError as exc:
            result.update(failed=True, msg=str(exc))
            return result
        result.update(changed=True, files=files, lines=lines)
        if self._task.diff:
            result["diff"] = {"before": {"files": before}, "after": {"files": files}}
        return result
