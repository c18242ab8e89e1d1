"""vllm-deploy: deploy | sweep | status | verify | report | tune, with a progress display (rich) or --json.

Exit codes: 0 everything ok; 1 a host failed or was unreachable; 2 usage error (bad
arguments, missing inventory, unknown tag or profile, Ansible not installed).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from typing import Any, Dict, List, Optional

from . import api
from .tune import tune as tune_run
from .errors import AnsibleNotAvailable, PlaybookFailed, UsageError, VllmDeployError

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def exit_code(result) -> int:
    """0 when the run succeeded on every host, else 1."""
    return EXIT_OK if result.ok else EXIT_FAILED


def parse_extravars(items: Optional[List[str]]) -> Dict[str, Any]:
    """-e KEY=VALUE (VALUE parsed as YAML: numbers, lists, booleans), -e '{json}', -e @file."""
    import yaml
    out: Dict[str, Any] = {}
    for item in items or []:
        if item.startswith("@"):
            path = item[1:]
            if not os.path.isfile(path):
                raise UsageError("extra vars file not found: %s" % path)
            with open(path) as f:
                data = yaml.safe_load(f) or {}
        elif item.lstrip().startswith("{"):
            try:
                data = json.loads(item)
            except ValueError as exc:
                raise UsageError("bad JSON in -e %s: %s" % (item, exc)) from None
        elif "=" in item:
            key, value = item.split("=", 1)
            if not key:
                raise UsageError("bad -e %r: expected KEY=VALUE" % item)
            data = {key: yaml.safe_load(value) if value else ""}
        else:
            raise UsageError("bad -e %r: expected KEY=VALUE, JSON or @file" % item)
        if not isinstance(data, dict):
            raise UsageError("extra vars %r are not a mapping" % item)
        out.update(data)
    return out


def _split(value: Optional[str]) -> Optional[List[str]]:
    if value is None:
        return None
    return [x.strip() for x in value.split(",") if x.strip()]


class _Args(argparse.ArgumentParser):
    def error(self, message):  # usage errors exit 2 (argparse's default too), said plainly
        self.print_usage(sys.stderr)
        print("vllm-deploy: error: %s" % message, file=sys.stderr)
        sys.exit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    ap = _Args(prog="vllm-deploy", description=__doc__.split("\n\n", maxsplit=1)[0])
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=_Args)

    def common(p, run=True):
        p.add_argument("-i", "--inventory", action="append", required=True,
                       help="inventory file or directory (repeatable)")
        p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
        if run:
            p.add_argument("-l", "--limit", help="host pattern (ansible --limit)")
            p.add_argument("-e", "--extra-vars", action="append", metavar="KEY=VALUE|JSON|@FILE",
                           help="extra variables (repeatable)")
            p.add_argument("--timeout", type=int, help="seconds before the run is stopped")
            p.add_argument("-q", "--quiet", action="store_true", help="no progress display")

    d = sub.add_parser("deploy", help="converge hosts to a verified, benchmarked endpoint")
    common(d)
    d.add_argument("-t", "--tags", help="comma-separated tags (roles: host_prep, vllm_install, ...)")
    d.add_argument("--profile", help="vllm_service_profile for every host")
    s = sub.add_parser("sweep", help="measure the endpoints again and save the results")
    common(s)
    s.add_argument("--levels", help="concurrency levels, e.g. 1,2,4,8")
    s.add_argument("--duration", type=int, help="seconds per level")
    st = sub.add_parser("status", help="service state, health, served model, versions")
    common(st)
    v = sub.add_parser("verify", help="hash every weight file; repair what fails")
    common(v)
    r = sub.add_parser("report", help="table of the sweep results saved in the inventory")
    common(r, run=False)
    t = sub.add_parser("tune", help="search the fastest correct layout of one host under an SLO")
    t.add_argument("-i", "--inventory", action="append", required=True,
                   help="inventory file or directory (repeatable)")
    t.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    t.add_argument("-e", "--extra-vars", action="append", metavar="KEY=VALUE|JSON|@FILE",
                   help="extra variables (repeatable)")
    t.add_argument("--host", required=True, help="the inventory host to tune")
    t.add_argument("--profile", required=True, help="model profile (profiles/<name>.yml)")
    t.add_argument("--slo", dest="slo_class",
                   help="mlperf-interactive | mlperf-server[:<mlperf model>] | custom")
    t.add_argument("--also-slo", action="append", metavar="CLASS",
                   help="another SLO class the same measurements are ranked under (repeatable); "
                        "the search follows --slo")
    t.add_argument("--ttft-ms", type=float, help="TTFT p99 SLO, ms (custom or override)")
    t.add_argument("--tpot-ms", type=float, help="TPOT p99 SLO, ms (custom or override)")
    t.add_argument("--slo-scale", type=float, default=1.0,
                   help="multiply the SLO class's limits (e.g. 100 on a CPU host)")
    t.add_argument("--params-b", type=float, help="model size in billions (picks the MLPerf class)")
    t.add_argument("--minutes", type=float, help="budget: wall minutes")
    t.add_argument("--candidates", type=int, help="budget: number of candidates")
    t.add_argument("--knob", action="append", metavar="NAME=V1,V2,default",
                   help="an engine knob and its allowed values ('default' = vLLM's); repeatable")
    t.add_argument("--instances", help="instances per host to try, e.g. 1,2")
    t.add_argument("--tp", help="tensor-parallel sizes to try, e.g. 4,8")
    t.add_argument("--gpus", type=int, default=0, help="GPUs of the host (0 = CPU host)")
    t.add_argument("--gpu-memory-mib", type=int, help="memory of one GPU (nvidia-smi), MiB")
    t.add_argument("--model-config", help="the model's config.json on the controller (planner)")
    t.add_argument("--levels", default="1,2,4,8", help="concurrency levels per instance")
    t.add_argument("--window", type=float, default=3.0, help="first round's window, seconds")
    t.add_argument("--rounds", type=int, default=3,
                   help="rounds of the search, each with twice the window of the one before")
    t.add_argument("--min-lifetimes", type=float, default=5.0,
                   help="keep each level's window open until it is this many request lifetimes "
                        "long (median E2E), so its interval has that many batches; 0 = the window only")
    t.add_argument("--input-len", type=int, default=32, help="prompt length of the sweep, tokens")
    t.add_argument("--output-len", type=int, default=32, help="output length of the sweep, tokens")
    t.add_argument("--port", type=int, default=8000, help="port of the first instance")
    t.add_argument("--reference", help="candidate id whose outputs are the reference")
    t.add_argument("--min-match", type=float, default=0.9, help="token match rate to pass")
    t.add_argument("--apply", action="store_true", help="serve the winner and write it back")
    t.add_argument("--no-restore", dest="restore", action="store_false",
                   help="leave the last candidate serving instead of serving the inventory's "
                        "configuration again (for a run followed at once by another)")
    t.add_argument("--grid", action="store_true", help="measure the full grid (baseline)")
    t.add_argument("--strategy", default="auto", choices=["auto", "screen", "halving", "grid"],
                   help="screen: one knob at a time from the default, then the winners' "
                        "combination, then halving among the leaders; halving: every candidate "
                        "first; grid: every candidate, every level; auto (default): screen when "
                        "it serves clearly fewer candidates")
    t.add_argument("--plan-only", action="store_true",
                   help="list the candidates and the planner's refusals; serve nothing")
    t.add_argument("--weights-bytes", type=int, help="weights' size (default: from config.json)")
    t.add_argument("--ep", help="expert parallel to try, e.g. false,true")
    t.add_argument("--profile-overrides", type=json.loads, default=None,
                   help="JSON: the host's vllm_service_profile_overrides, kept in every candidate")
    t.add_argument("--extra-args", dest="tune_extra_args",
                   help="the host's vllm_service_extra_args, e.g. '--load-format dummy'")
    t.add_argument("--resume", metavar="JOURNAL", action="append",
                   help="an earlier run's measurements.jsonl (or its report directory; "
                        "repeatable): what it measured is not served again; the default is "
                        "measured again as the anchor")
    t.add_argument("--reference-every", type=int, default=0, metavar="N",
                   help="grid: measure vLLM's defaults again after every N candidates served "
                        "(default 0: first and last only); their spread is every candidate's "
                        "least noise")
    return ap


def _knobs(items: Optional[List[str]]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for item in items or []:
        name, sep, values = item.partition("=")
        if not sep or not values:
            raise UsageError("--knob %r: expected NAME=V1,V2" % item)
        vals: List[Any] = []
        for v in values.split(","):
            v = v.strip()
            vals.append(None if v == "default" else int(v) if v.isdigit() else v)
        out[name.strip()] = vals
    return out


def render_tune(console, doc) -> None:
    slo = doc["slo"]
    console.print("SLO %s: TTFT %s ms, TPOT %s ms" % (slo["class"], slo.get("ttft_ms"),
                                                      slo.get("tpot_ms")))
    for r in doc["refused"]:
        console.print("refused %s: %s" % (_escape(r["id"]), _escape("; ".join(r["reasons"]))))
    for r in doc["ranked"]:
        console.print("%-4s %-48s goodput %8.1f tok/s at C=%-4s noise %-6s %s" % (
            r["rank"] or "-", _escape(r["id"]), r["goodput_tok_s"], r["goodput_level"],
            r["noise"], _escape(r["disqualified"] or "")))
    for n in doc.get("not_measured") or []:
        if isinstance(n, dict):
            console.print("-    %-48s %s" % (_escape(n["id"]), _escape(n["reason"])))
    drift = (doc.get("evidence") or {}).get("drift")
    if drift and drift.get("ratio") is not None:
        between = [r["goodput_tok_s"] for r in (drift.get("references") or [])[:-1]]
        console.print("drift: vLLM's defaults measured %.1f tok/s first%s and %.1f last (x%.3f): "
                      "a difference within %.1f %% is a tie" % (
                          drift["first"]["goodput_tok_s"],
                          ", %s between" % ", ".join("%.1f" % g for g in between)
                          if between else "", drift["last"]["goodput_tok_s"],
                          drift["ratio"], 100 * (drift.get("spread") or 0.0)))
    console.print("winner: %s (%s); vs default: %s" % (
        _escape((doc["winner"] or {}).get("id", "none")), _escape(str(doc["decision"]["verdict"])),
        _escape(str(doc["versus_default"].get("verdict")))))
    for name, other in sorted((doc.get("other_slos") or {}).items()):
        o_slo = other["slo"]
        console.print("under %s (TTFT %s ms, TPOT %s ms), the same measurements:" % (
            _escape(name), o_slo.get("ttft_ms"), o_slo.get("tpot_ms")))
        for r in other["ranked"]:
            console.print("%-4s %-48s goodput %8.1f tok/s at C=%-4s %s" % (
                r["rank"] or "-", _escape(r["id"]), r["goodput_tok_s"], r["goodput_level"],
                _escape(r["disqualified"] or "")))
        vs = other.get("versus_default") or {}
        win = next((r["id"] for r in other["ranked"] if r["rank"] == 1), "none")
        console.print("winner: %s; vs default: %s%s" % (
            _escape(win), _escape(str(vs.get("verdict"))),
            "; not judged: %s" % _escape(", ".join(other["not_judged"]))
            if other.get("not_judged") else ""))


class Progress:
    """Live display of the current play/task and per-host outcomes (stderr)."""

    def __init__(self, console, enabled: bool):
        self.console = console
        self.enabled = enabled
        self.status = None
        self.counts: Dict[str, Dict[str, int]] = {}

    def __enter__(self):
        if self.enabled:
            self.status = self.console.status("starting ansible-playbook")
            self.status.__enter__()
        return self

    def __exit__(self, *exc):
        if self.status is not None:
            self.status.__exit__(*exc)

    def __call__(self, event: Dict[str, Any]) -> None:
        if not self.enabled:
            return
        kind = event.get("event")
        data = event.get("event_data") or {}
        host = data.get("host")
        if kind == "playbook_on_play_start":
            self.console.print("[bold]PLAY[/bold] %s" % (data.get("play") or data.get("name")))
        elif kind == "playbook_on_task_start":
            self.status.update("[cyan]%s[/cyan]" % (data.get("task") or data.get("name")))
        elif kind in ("runner_on_ok", "runner_on_failed", "runner_on_unreachable") and host:
            c = self.counts.setdefault(host, {"ok": 0, "changed": 0})
            c["ok"] += 1
            res = data.get("res") or {}
            if kind == "runner_on_failed" and not data.get("ignore_errors"):
                self.console.print("  [red]failed[/red]  %s: %s" % (host, data.get("task")))
            elif kind == "runner_on_unreachable":
                self.console.print("  [red]unreachable[/red] %s: %s" % (host, data.get("task")))
            elif isinstance(res, dict) and res.get("changed"):
                c["changed"] += 1
                self.console.print("  [yellow]changed[/yellow] %s: %s" % (host, data.get("task")))


def _print_failures(console, failures) -> None:
    for f in failures:
        console.print("[red]FAILED[/red] " + _escape(f.describe()))


def _escape(text: str) -> str:
    from rich.markup import escape
    return escape(text)


def render_run(console, result) -> None:
    from rich.table import Table
    t = Table(title="%s: %s (rc %s, %.0f s)"
              % (result.playbook, result.status, result.rc, result.duration_s))
    for col in ("host", "ok", "changed", "failed", "unreachable", "skipped", "endpoint",
                "vLLM", "torch", "sweep peak tok/s"):
        t.add_column(col)
    for host, r in sorted(result.hosts.items()):
        s = r.stats
        t.add_row(host, str(s.ok), str(s.changed), str(s.failed), str(s.unreachable),
                  str(s.skipped), ", ".join(e.url for e in r.endpoints) or "-",
                  (r.versions.vllm if r.versions else None) or "-",
                  (r.versions.torch if r.versions else None) or "-",
                  "%.1f" % r.sweep.peak_output_tok_s if r.sweep and r.sweep.peak_output_tok_s
                  is not None else "-")
    console.print(t)
    _print_failures(console, result.failures)


def render_status(console, result) -> None:
    from rich.table import Table
    t = Table(title="status (%.0f s)" % result.duration_s)
    for col in ("host", "unit", "state", "health", "served model", "listed", "vLLM", "torch"):
        t.add_column(col)
    for host, st in sorted(result.status_by_host.items()):
        v = st.versions
        if not st.instances:
            t.add_row(host, "-", "unreachable" if not st.reachable else "-", "-", "-", "-",
                      "-", "-")
        for inst in st.instances:
            t.add_row(host, inst.unit, "%s/%s" % (inst.active_state, inst.sub_state),
                      str(inst.health_status) if inst.health_status is not None else "down",
                      inst.served_model, "yes" if inst.serving else "no",
                      (v.vllm if v else None) or "-", (v.torch if v else None) or "-")
    console.print(t)
    _print_failures(console, result.failures)


def render_verify(console, result) -> None:
    from rich.table import Table
    t = Table(title="verify weights: %s (%.0f s)" % (result.status, result.duration_s))
    for col in ("host", "files hashed", "GB hashed", "MB/s", "damaged", "repaired",
                "bytes fetched", "ok"):
        t.add_column(col)
    for host, w in sorted(result.weights_by_host.items()):
        if not w.checked:
            t.add_row(host, "-", "-", "-", "-", "-", "-", "not checked")
            continue
        t.add_row(host, str(w.files_hashed), "%.2f" % (w.bytes_hashed / 1e9),
                  "%.1f" % w.hash_mb_per_s if w.hash_mb_per_s is not None else "-",
                  ", ".join(sorted(w.damaged)) or "-", ", ".join(w.repaired) or "-",
                  str(w.bytes_fetched), "yes" if w.ok else "no")
    console.print(t)
    _print_failures(console, result.failures)


def render_sweeps(console, sweeps) -> None:
    from rich.table import Table
    if not sweeps:
        console.print("no saved sweep results in the inventory's host_vars")
        return
    rows = []
    for host, top in sorted(sweeps.items()):
        for name, s in sorted((top.instances or {"": top}).items()):
            rows.append(("%s/%s" % (host, name) if name and len(top.instances) > 1 else host, s))
    for where, s in rows:
        title = "%s: %s%s, vLLM %s, %s" % (
            where, s.model, " (profile %s)" % s.profile if s.profile else "", s.vllm_version,
            s.measured_at)
        t = Table(title=title,
                  caption="single stream %s tok/s; peak %s tok/s at concurrency %s; %s" % (
                      s.single_stream_tok_s, s.peak_output_tok_s, s.peak_level,
                      s.stop_reason or ""))
        for col in ("conc", "out tok/s", "total tok/s", "TTFT p50", "TTFT p99", "TPOT p50",
                    "TPOT p99", "failed", "flags"):
            t.add_column(col, justify="right" if col != "flags" else "left")

        def f(x, fmt="%.1f"):
            return fmt % x if x is not None else "-"
        for lv in s.levels:
            t.add_row(str(lv.concurrency), f(lv.output_tok_s), f(lv.total_tok_s),
                      f(lv.ttft_p50_ms), f(lv.ttft_p99_ms), f(lv.tpot_p50_ms, "%.2f"),
                      f(lv.tpot_p99_ms, "%.2f"), str(lv.requests_failed or 0),
                      ",".join(lv.flags))
        console.print(t)


def render_upgrades(console, upgrades) -> None:
    """The trend across the pins each host accepted (the upgrade gate's history)."""
    from rich.table import Table
    for host, doc in sorted(upgrades.items()):
        rows = api.upgrade_trend(doc["pins"])
        levels = sorted(set(c for r in rows for c in r["output_tok_s"]))
        t = Table(title="%s: accepted vLLM pins (upgrade gate), oldest first" % host,
                  caption="out tok/s per concurrency (change vs the pin before); "
                          "overlay two: make compare RUNS=\"%s#<pin> %s#<pin>\""
                          % (doc["file"], doc["file"]))
        for col in ["pin", "vllm", "accepted", "mode"] + ["c=%d" % c for c in levels] + \
                ["token match", "override"]:
            t.add_column(col, justify="left" if col in ("pin", "vllm", "accepted", "mode")
                         else "right")
        for r in rows:
            cells = []
            for c in levels:
                v = r["output_tok_s"].get(c)
                d = r["change_pct"].get(c)
                cells.append("-" if v is None else ("%.1f" % v) + (" (%+.1f%%)" % d
                                                                   if d is not None else ""))
            mode = r["mode"] or "-"
            if r["downtime_s"] is not None:
                mode += " (down %ss)" % r["downtime_s"]
            t.add_row(str(r["pin_id"]), str(r["vllm"] or "-"), str(r["accepted_at"] or "-"),
                      mode, *cells,
                      "-" if r["token_match_rate"] is None else "%.3f" % r["token_match_rate"],
                      "YES" if r["override"] else "no")
        console.print(t)


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    from rich.console import Console
    err = Console(stderr=True)
    out = Console()
    try:
        if args.cmd == "report":
            sweeps = api.saved_sweeps(args.inventory)
            if args.json:
                print(json.dumps({h: s.to_dict() for h, s in sweeps.items()}, indent=2))
            else:
                render_sweeps(out, sweeps)
                render_upgrades(out, api.saved_upgrades(args.inventory))
            return EXIT_OK
        extravars = parse_extravars(args.extra_vars)
        if args.cmd == "tune":
            doc = tune_run(
                args.inventory, args.host, profile=args.profile, slo_class=args.slo_class,
                ttft_ms=args.ttft_ms, tpot_ms=args.tpot_ms, slo_scale=args.slo_scale,
                params_b=args.params_b, budget_minutes=args.minutes,
                budget_candidates=args.candidates, knobs=_knobs(args.knob),
                instances=[int(x) for x in _split(args.instances) or []] or None,
                tensor_parallel=[int(x) for x in _split(args.tp) or []] or None,
                gpu_count=args.gpus, gpu_memory_mib=args.gpu_memory_mib,
                model_config=args.model_config,
                levels=[int(x) for x in _split(args.levels) or []], base_window_s=args.window,
                max_rounds=args.rounds, input_len=args.input_len, output_len=args.output_len,
                min_lifetimes=args.min_lifetimes,
                port=args.port, reference=args.reference, min_match=args.min_match,
                apply=args.apply, restore=args.restore, grid=args.grid, strategy=args.strategy,
                plan_only=args.plan_only,
                weights_bytes=args.weights_bytes, profile_overrides=args.profile_overrides,
                extra_args=shlex.split(args.tune_extra_args) if args.tune_extra_args else None,
                expert_parallel=[x.lower() == "true" for x in _split(args.ep) or []] or None,
                extravars=extravars, resume=args.resume,
                reference_every=args.reference_every, also_slos=args.also_slo,
                log=None if args.json or args.plan_only else (lambda m: err.print(_escape(m))))
            if args.json:
                print(json.dumps(dict(doc), indent=2, default=str))
            elif args.plan_only:
                out.print("strategy: %s" % _escape(doc["strategy_reason"]))
                for c in doc["candidates"]:
                    out.print("candidate %s%s" % (_escape(c["id"]), " (default)" if c["default"] else ""))
                for r in doc["refused"]:
                    out.print("refused %s: %s" % (_escape(r["id"]), _escape("; ".join(r["reasons"]))))
                return EXIT_OK
            else:
                render_tune(out, doc)
                out.print("written: %s; reports: %s" % (doc.path, doc.reports.get("csv")))
            return EXIT_OK if doc.winner else EXIT_FAILED
        show = not args.quiet and not args.json and err.is_terminal
        progress_lines = not args.quiet and not args.json
        with Progress(err, enabled=show) as progress:
            kw = dict(limit=args.limit, on_event=progress if progress_lines and show else None,
                      check=False, timeout=args.timeout)
            if args.cmd == "deploy":
                if args.profile:
                    extravars["vllm_service_profile"] = args.profile
                result = api.deploy(args.inventory, extravars=extravars,
                                    tags=_split(args.tags), **kw)
            elif args.cmd == "sweep":
                result = api.sweep(args.inventory, levels=_split(args.levels),
                                   duration_s=args.duration, extravars=extravars, **kw)
            elif args.cmd == "verify":
                result = api.verify(args.inventory, extravars=extravars, **kw)
            else:
                result = api.status(args.inventory, extravars=extravars, **kw)
    except (UsageError, AnsibleNotAvailable) as exc:
        err.print("vllm-deploy: error: " + _escape(str(exc)))
        return EXIT_USAGE
    except PlaybookFailed as exc:  # not raised with check=False; kept for safety
        result = exc.result
    except VllmDeployError as exc:
        err.print("vllm-deploy: error: " + _escape(str(exc)))
        return EXIT_FAILED
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, default=str))
    elif args.cmd == "status":
        render_status(out, result)
    elif args.cmd == "verify":
        render_verify(out, result)
    else:
        render_run(out, result)
        if args.cmd == "sweep":
            render_sweeps(out, result.results)
    return exit_code(result)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
