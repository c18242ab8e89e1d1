"""Reports of vllm_sweep runs on the controller: CSV, tables and PNG plots; comparing runs.

Controller-side code of the collection: the action plugin vllm_ops.deploy.vllm_report (the
vllm_benchmark role's report, the compare playbook, ``make report`` / ``make compare``) and the
filter vllm_ops.deploy.vllm_sweep_compact call it.

A run directory (written by the vllm_benchmark role, one per host and sweep) holds:

* ``sweep.json``      the module's facts (levels, headline, stop_reason, parameters, client,
                      server) plus ``provenance``, ``measured_at`` and ``fingerprint``;
* ``requests.jsonl``  one JSON object per request (the module's request log);
* ``levels.csv``      one row per concurrency level (written by ``render``);
* ``throughput.png``  output (and total) tok/s vs concurrency;
* ``ttft.png``, ``tpot.png``  p50 (solid) and p99 (dashed) vs concurrency;
* ``summary.txt``     the per-level table and why the sweep stopped.

Operations (the action plugin's ``mode``): ``render`` a run directory, ``table`` of a run,
``compare`` two or more runs into an output directory.

A RUN is a run directory, a host's report directory (its newest run below it is taken) or an
inventory results file (host_vars/<host>/vllm_benchmark.yml, the compact summary). Plots use
matplotlib with the Agg backend (no display needed).
"""
from __future__ import annotations

import csv
import json
import os
import sys

SWEEP_FILE = "sweep.json"
REQUESTS_FILE = "requests.jsonl"
LEVELS_CSV = "levels.csv"
SUMMARY_FILE = "summary.txt"
PLOTS = {"throughput": "throughput.png", "ttft": "ttft.png", "tpot": "tpot.png"}
LATENCY_NAMES = {"ttft": ("ttft_ms", "TTFT (first token - request sent)"),
                 "tpot": ("tpot_ms", "TPOT ((E2E - TTFT) / (N - 1))")}

_STATS = ("mean", "p50", "p90", "p99", "max")
CSV_COLUMNS = (
    ["concurrency", "requests_ok", "requests_failed", "requests_measured", "window_s",
     "output_tok_s", "total_tok_s", "request_s", "achieved_concurrency"]
    + ["%s_%s_ms" % (lat, st) for lat in ("ttft", "tpot", "itl", "e2e") for st in _STATS]
    + ["goodput_request_s", "goodput_output_tok_s", "client_output_tokens",
       "server_output_tokens", "client_prompt_tokens", "server_prompt_tokens",
       "server_check_match", "client_cpu_ms_per_1k_output_tokens", "client_limited", "flags",
       "saturation_signal"]
    # the window's 95 % intervals, then the whole-run figures (vllm bench serve's definition)
    + ["output_tok_s_ci_low", "output_tok_s_ci_high", "ttft_p50_ci_low_ms", "ttft_p50_ci_high_ms",
       "whole_run_duration_s", "whole_run_completed", "whole_run_output_tok_s",
       "whole_run_ttft_mean_ms", "whole_run_ttft_median_ms", "whole_run_ttft_p99_ms",
       "whole_run_tpot_mean_ms", "whole_run_tpot_median_ms", "whole_run_itl_median_ms",
       "whole_run_e2el_median_ms"]
)


class ReportError(Exception):
    """A run that cannot be read or rendered (the message names the path)."""


_LATENCIES = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")


def compact_level(level):
    """The per-level figures worth keeping in host_vars (the full data goes to reports), with
    the level's flags (errors, length-miss, client-limited, slo-broken, server-count-diff)."""
    keys = ("concurrency", "requests_ok", "requests_failed", "output_tok_s", "total_tok_s",
            "request_s", "achieved_concurrency", "window_s")
    out = {k: level.get(k) for k in keys}
    for key in _LATENCIES:
        stats = level.get(key) or {}
        out[key] = {p: stats.get(p) for p in ("mean", "p50", "p90", "p99") if p in stats}
    flags = []
    if level.get("requests_failed"):
        flags.append("errors")
    if (level.get("output_length") or {}).get("marked"):
        flags.append("length-miss")
    if (level.get("client") or {}).get("client_limited"):
        flags.append("client-limited")
    if (level.get("slo") or {}).get("met") is False:
        flags.append("slo-broken")
    check = level.get("server_check") or {}
    if check.get("match") is False:
        flags.append("server-count-diff")
    out["flags"] = flags
    out["definition"] = level.get("definition", "steady_state")
    prec = level.get("precision") or {}
    if prec:
        out["precision"] = dict(
            (k, None if not v else dict((f, v.get(f)) for f in
                                        ("value", "ci_low", "ci_high", "half_width_pct",
                                         "confidence", "n", "df", "method")))
            for k, v in prec.items())
    run = level.get("whole_run")
    if run:
        out["whole_run"] = dict((k, run.get(k)) for k in (
            "definition", "duration_s", "completed", "failed", "output_tok_s", "total_tok_s",
            "request_s"))
        for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
            stats = run.get(key) or {}
            out["whole_run"][key] = dict((p, stats.get(p)) for p in
                                         ("mean", "median", "p99") if p in stats)
    if level.get("repeats"):
        out["repeats"] = level["repeats"]
        out["precision_repeats"] = level.get("precision_repeats")
    if level.get("goodput") is not None:
        out["goodput"] = level.get("goodput")
    if level.get("saturation_signal"):
        out["saturation_signal"] = level["saturation_signal"]
    return out


def level_flags(level):
    """Flags of one level (errors, length-miss, client-limited, slo-broken, ...)."""
    if "flags" in level and "output_length" not in level:  # already compact
        return list(level["flags"])
    return compact_level(level)["flags"]


# --- loading runs -------------------------------------------------------------------------

def resolve_run(path):
    """The run directory, results file, or the newest run below a directory: a host's report
    directory (<root>/<host>/<instance>/<UTC timestamp>/) or an instance's. Runs are ordered by
    their directory name, the UTC timestamp."""
    if os.path.isfile(path):
        return path
    if "#" in path and os.path.isfile(path.rsplit("#", 1)[0]):
        return path  # <upgrade history file>#<pin id>: one accepted pin's measurement
    if not os.path.isdir(path):
        raise ReportError("%s: no such run directory or results file" % path)
    if os.path.isfile(os.path.join(path, SWEEP_FILE)):
        return path
    runs = []
    for top, dirs, files in os.walk(path):
        if SWEEP_FILE in files:
            runs.append((os.path.basename(top), top))
            dirs[:] = []
        elif top.count(os.sep) - path.rstrip(os.sep).count(os.sep) >= 2:
            dirs[:] = []
    if not runs:
        raise ReportError("%s has no %s, nor run directories holding one" % (path, SWEEP_FILE))
    return max(runs)[1]


def upgrade_run(history, pin_id, src="history"):
    """One accepted pin of an upgrade history (host_vars/<host>/vllm_upgrades.yml, written by
    vllm_install's gate) as a run: the candidate's sweep the gate measured when it accepted it.
    ``pin_id`` is the venv name (vllm-...) or a unique prefix of it."""
    pins = [p for p in (history.get("pins") or []) if isinstance(p, dict)]
    ids = [str(p.get("pin_id")) for p in pins]
    hits = [p for p in pins if str(p.get("pin_id")) == pin_id] or \
        [p for p in pins if pin_id and str(p.get("pin_id")).startswith(pin_id)]
    if len(hits) != 1:
        raise ReportError("%s: name one accepted pin as %s#<pin id> (%s); pins: %s"
                          % (src, src, "no such pin %r" % pin_id if pin_id and not hits
                             else ("%r is ambiguous" % pin_id if pin_id else "none named"),
                             ", ".join(ids) or "none"))
    p = hits[0]
    return {"levels": p.get("levels") or [], "pin_id": p.get("pin_id"),
            "measured_at": p.get("accepted_at"),
            "provenance": {"pin": p.get("pin"), "mode": p.get("mode"),
                           "override": p.get("override")},
            "parameters": {}}


def load_run(path, label=None):
    """A run as {'path', 'label', 'levels', 'headline', 'stop_reason', 'provenance',
    'parameters', 'measured_at'}; from a run directory or an inventory results file."""
    path = resolve_run(path)
    if os.path.isdir(path):
        src = os.path.join(path, SWEEP_FILE)
        try:
            with open(src) as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            raise ReportError("%s: %s" % (src, e))
    else:
        src, _sep, pin_id = path.partition("#") if "#" in path else (path, "", "")
        try:
            import yaml  # PyYAML comes with ansible-core
            with open(src) as f:
                doc = yaml.safe_load(f) or {}
        except Exception as e:  # yaml errors have no common base outside yaml
            raise ReportError("%s: %s" % (src, e))
        if isinstance(doc, dict) and isinstance(doc.get("vllm_upgrades"), dict):
            data = upgrade_run(doc["vllm_upgrades"], pin_id, src)
            if label is None:
                label = "%s %s" % (data["pin_id"], data["measured_at"] or "")
        else:
            data = doc.get("vllm_benchmark_results", doc) if isinstance(doc, dict) else None
    if not isinstance(data, dict) or not isinstance(data.get("levels"), list):
        raise ReportError("%s does not hold a sweep result (no 'levels' list)" % src)
    for lv in data["levels"]:
        if not isinstance(lv, dict) or "concurrency" not in lv or "output_tok_s" not in lv:
            raise ReportError("%s: a level lacks concurrency/output_tok_s: %r" % (src, lv))
    prov = data.get("provenance") or {}
    if label is None:
        label = "%s@%s" % (prov.get("model") or "?", prov.get("host") or "?")
        if data.get("measured_at"):
            label += " " + str(data["measured_at"])
    return {
        "path": path,
        "label": label,
        "levels": sorted(data["levels"], key=lambda lv: lv["concurrency"]),
        "headline": data.get("headline") or {},
        "stop_reason": data.get("stop_reason"),
        "provenance": prov,
        "parameters": data.get("parameters") or {},
        "measured_at": data.get("measured_at"),
    }


def read_requests(path):
    """The request log (JSON lines) as a list of dicts; names the line of a bad record."""
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except ValueError as e:
                raise ReportError("%s line %d: %s" % (path, n, e))
    return rows


def check_requests(levels, requests):
    """Problems between the request log and the level summaries (empty list when they agree):
    every level's requests_total and client token totals must be found in the log."""
    problems = []
    by_level = {}
    for r in requests:
        by_level.setdefault(r.get("level"), []).append(r)
    for lv in levels:
        c = lv["concurrency"]
        rows = by_level.pop(c, [])
        if "requests_total" in lv and len(rows) != lv["requests_total"]:
            problems.append("concurrency %d: %d requests logged, summary says %d"
                            % (c, len(rows), lv["requests_total"]))
        chk = lv.get("server_check") or {}
        if chk.get("client_output_tokens") is not None:
            logged = sum(r.get("completion_tokens") or 0 for r in rows)
            if logged != chk["client_output_tokens"]:
                problems.append("concurrency %d: %d output tokens logged, summary says %d"
                                % (c, logged, chk["client_output_tokens"]))
    for c in sorted(by_level, key=str):
        problems.append("requests logged for concurrency %s, which has no summary" % (c,))
    return problems


# --- tables and CSV -----------------------------------------------------------------------

def level_row(level):
    """One CSV row (dict over CSV_COLUMNS) of a full or compact level summary."""
    row = dict((k, level.get(k)) for k in CSV_COLUMNS[:9])
    for lat in ("ttft", "tpot", "itl", "e2e"):
        stats = level.get(lat + "_ms") or {}
        for st in _STATS:
            row["%s_%s_ms" % (lat, st)] = stats.get(st)
    good = level.get("goodput") or {}
    row["goodput_request_s"] = good.get("request_s")
    row["goodput_output_tok_s"] = good.get("output_tok_s")
    chk = level.get("server_check") or {}
    for k in ("client_output_tokens", "server_output_tokens", "client_prompt_tokens",
              "server_prompt_tokens"):
        row[k] = chk.get(k)
    row["server_check_match"] = chk.get("match")
    client = level.get("client") or {}
    row["client_cpu_ms_per_1k_output_tokens"] = client.get("cpu_ms_per_1k_output_tokens")
    row["client_limited"] = client.get("client_limited")
    row["flags"] = ";".join(level_flags(level))
    row["saturation_signal"] = level.get("saturation_signal")
    prec = level.get("precision") or {}
    tok, ttft = prec.get("output_tok_s") or {}, prec.get("ttft_ms_p50") or {}
    row["output_tok_s_ci_low"], row["output_tok_s_ci_high"] = tok.get("ci_low"), tok.get("ci_high")
    row["ttft_p50_ci_low_ms"], row["ttft_p50_ci_high_ms"] = ttft.get("ci_low"), ttft.get("ci_high")
    run = level.get("whole_run") or {}
    row["whole_run_duration_s"] = run.get("duration_s")
    row["whole_run_completed"] = run.get("completed")
    row["whole_run_output_tok_s"] = run.get("output_tok_s")
    for lat, stats in (("ttft", ("mean", "median", "p99")), ("tpot", ("mean", "median")),
                       ("itl", ("median",)), ("e2el", ("median",))):
        for st in stats:
            row["whole_run_%s_%s_ms" % (lat, st)] = (run.get(lat + "_ms") or {}).get(st)
    return row


def write_csv(path, levels):
    """levels.csv: a header of CSV_COLUMNS and one row per level; empty cells for None."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS, lineterminator="\n")
        w.writeheader()
        for lv in levels:
            w.writerow(dict((k, "" if v is None else v) for k, v in level_row(lv).items()))
    return path


def _f(x, spec="%.1f"):
    return "-" if x is None else spec % x


def stop_lines(run):
    """Why the sweep ended, and which requested levels were not run."""
    asked = list((run.get("parameters") or {}).get("levels") or [])
    ran = [lv["concurrency"] for lv in run["levels"]]
    lines = ["stop: %s" % (run.get("stop_reason") or "unknown")]
    skipped = [c for c in asked if c not in ran]
    if skipped:
        lines.append("stopped early: levels %s were not run" % skipped)
    return lines


def run_table(run):
    """The per-level table of one run (list of lines)."""
    lines = ["%s (%s)" % (run["label"], run["path"]),
             "%5s %10s %6s %10s %9s %9s %9s %9s %5s | %10s %9s  %s"
             % ("conc", "out_tok/s", "+-95%", "tot_tok/s", "ttft_p50", "ttft_p99", "tpot_p50",
                "tpot_p99", "fail", "run_tok/s", "run_ttft", "flags")]
    for lv in run["levels"]:
        t, p = lv.get("ttft_ms") or {}, lv.get("tpot_ms") or {}
        prec = (lv.get("precision") or {}).get("output_tok_s") or {}
        whole = lv.get("whole_run") or {}
        lines.append("%5d %10.1f %6s %10s %9s %9s %9s %9s %5s | %10s %9s  %s" % (
            lv["concurrency"], lv["output_tok_s"], _f(prec.get("half_width_pct"), "%.1f%%"),
            _f(lv.get("total_tok_s")),
            _f(t.get("p50")), _f(t.get("p99")), _f(p.get("p50"), "%.2f"),
            _f(p.get("p99"), "%.2f"), lv.get("requests_failed", "-"),
            _f(whole.get("output_tok_s")), _f((whole.get("ttft_ms") or {}).get("median")),
            ",".join(level_flags(lv))))
    h = run["headline"]
    lines.append("single stream: %s tok/s; peak: %s tok/s at concurrency %s"
                 % (_f(h.get("single_stream_tok_s")), _f(h.get("peak_output_tok_s")),
                    h.get("peak_level", "-")))
    lines.extend(stop_lines(run))
    lines.append("(ms; TTFT = first token - request sent; TPOT = (E2E - TTFT)/(N - 1); "
                 "left of |: steady_state (each level's window; +-95% = the half-width of the "
                 "output tok/s interval); right of |: whole_run as vllm bench serve computes "
                 "it (all requests, first send to last completion; run_ttft = TTFT median)")
    return lines


def compare_rows(runs):
    """Per concurrency (union of all runs): each run's output tok/s, TTFT p50, TPOT p50 and
    its output tok/s relative to the first run (None where a run lacks the level)."""
    concs = sorted(set(lv["concurrency"] for r in runs for lv in r["levels"]))
    rows = []
    for c in concs:
        row = {"concurrency": c, "runs": []}
        base = None
        for i, r in enumerate(runs):
            lv = [x for x in r["levels"] if x["concurrency"] == c]
            lv = lv[0] if lv else None
            tok = lv["output_tok_s"] if lv else None
            if i == 0:
                base = tok
            row["runs"].append({
                "output_tok_s": tok,
                "ttft_p50_ms": ((lv or {}).get("ttft_ms") or {}).get("p50"),
                "tpot_p50_ms": ((lv or {}).get("tpot_ms") or {}).get("p50"),
                "flags": level_flags(lv) if lv else [],
                "vs_first": (round(tok / base, 4) if tok is not None and base else None),
            })
        rows.append(row)
    return rows


def compare_table(runs):
    """Text table comparing runs: headlines, then output tok/s / TTFT p50 / TPOT p50 per
    concurrency, with each run's throughput relative to run 1."""
    lines = ["Runs:"]
    for i, r in enumerate(runs, 1):
        h = r["headline"]
        p = r["parameters"]
        lines.append("  [%d] %s: in/out %s/%s tokens; single stream %s tok/s; peak %s tok/s "
                     "at concurrency %s; %s" % (
                         i, r["label"], p.get("input_len", "?"), p.get("output_len", "?"),
                         _f(h.get("single_stream_tok_s")), _f(h.get("peak_output_tok_s")),
                         h.get("peak_level", "-"), "; ".join(stop_lines(r))))
    head = "%5s" % "conc"
    for i in range(1, len(runs) + 1):
        head += " | %9s %8s %8s %6s" % ("[%d] tok/s" % i, "ttft_p50", "tpot_p50",
                                        "vs[1]" if i > 1 else "")
    lines.append(head)
    for row in compare_rows(runs):
        line = "%5d" % row["concurrency"]
        for i, cell in enumerate(row["runs"]):
            vs = "" if i == 0 else (_f(cell["vs_first"], "%.2fx"))
            mark = "*" if cell["flags"] else " "
            line += " | %9s%s%8s %8s %6s" % (_f(cell["output_tok_s"]), mark,
                                             _f(cell["ttft_p50_ms"]),
                                             _f(cell["tpot_p50_ms"], "%.2f"), vs)
        lines.append(line)
    lines.append("(* = level flagged: errors, length-miss, client-limited, slo-broken or "
                 "server-count-diff; ms)")
    return lines


def write_compare_csv(path, runs):
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["concurrency", "run", "label", "output_tok_s", "ttft_p50_ms",
                    "tpot_p50_ms", "output_tok_s_vs_first", "flags"])
        for row in compare_rows(runs):
            for i, cell in enumerate(row["runs"]):
                if cell["output_tok_s"] is None:
                    continue
                w.writerow([row["concurrency"], i + 1, runs[i]["label"], cell["output_tok_s"],
                            _blank(cell["ttft_p50_ms"]), _blank(cell["tpot_p50_ms"]),
                            _blank(cell["vs_first"]), ";".join(cell["flags"])])
    return path


def _blank(x):
    return "" if x is None else x


# --- plots --------------------------------------------------------------------------------

def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ReportError("plots need matplotlib in %s (requirements/tools.txt pins it)"
                          % sys.executable)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _concurrency_axis(ax, runs):
    concs = sorted(set(lv["concurrency"] for r in runs for lv in r["levels"]))
    ax.set_xscale("log", base=2)
    ax.set_xticks(concs)
    ax.set_xticklabels([str(c) for c in concs])
    ax.set_xlabel("concurrency (closed-loop workers)")
    ax.grid(True, which="major", alpha=0.3)


def _mark_flagged(ax, xs, ys, flagged, color):
    fx = [x for x, y, f in zip(xs, ys, flagged) if f and y is not None]
    fy = [y for x, y, f in zip(xs, ys, flagged) if f and y is not None]
    if fx:
        ax.scatter(fx, fy, marker="x", s=80, color=color, zorder=5)


def plot_throughput(runs, path, title=None):
    """Output tok/s vs concurrency for each run (total tok/s dashed when one run)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    try:
        for i, r in enumerate(runs):
            color = "C%d" % (i % 10)
            xs = [lv["concurrency"] for lv in r["levels"]]
            ys = [lv["output_tok_s"] for lv in r["levels"]]
            ax.plot(xs, ys, "o-", color=color, label="%s output" % r["label"] if len(runs) == 1
                    else r["label"])
            if len(runs) == 1 and all(lv.get("total_tok_s") is not None for lv in r["levels"]):
                ax.plot(xs, [lv["total_tok_s"] for lv in r["levels"]], "s--", color=color,
                        alpha=0.6, label="%s total (prompt + output)" % r["label"])
            _mark_flagged(ax, xs, ys, [bool(level_flags(lv)) for lv in r["levels"]], color)
        _concurrency_axis(ax, runs)
        ax.set_ylabel("tokens / s (steady-state window)")
        ax.set_ylim(bottom=0)
        ax.set_title(title or "Throughput vs concurrency (x = flagged level)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)
    return path


def plot_latency(runs, which, path, title=None):
    """p50 (solid) and p99 (dashed) of TTFT or TPOT vs concurrency for each run."""
    key, name = LATENCY_NAMES[which]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    try:
        plotted = False
        for i, r in enumerate(runs):
            color = "C%d" % (i % 10)
            xs = [lv["concurrency"] for lv in r["levels"]]
            for pct, style in (("p50", "o-"), ("p99", "^--")):
                ys = [(lv.get(key) or {}).get(pct) for lv in r["levels"]]
                pts = [(x, y) for x, y in zip(xs, ys) if y is not None]
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=color,
                            label="%s %s" % (r["label"], pct))
                    plotted = True
        if not plotted:
            ax.text(0.5, 0.5, "no measured requests", ha="center", transform=ax.transAxes)
        _concurrency_axis(ax, runs)
        ax.set_ylabel("%s, ms" % which.upper())
        ax.set_ylim(bottom=0)
        ax.set_title(title or "%s p50 (solid) / p99 (dashed) vs concurrency" % name)
        if plotted:
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)
    return path


def plot_all(runs, out_dir):
    """throughput.png, ttft.png and tpot.png in out_dir; returns their paths."""
    paths = [plot_throughput(runs, os.path.join(out_dir, PLOTS["throughput"]))]
    for which in ("ttft", "tpot"):
        paths.append(plot_latency(runs, which, os.path.join(out_dir, PLOTS[which])))
    return paths


# --- commands -----------------------------------------------------------------------------

def render_targets(run_dir):
    """The files render() writes into run_dir."""
    return [os.path.join(run_dir, name) for name in
            [LEVELS_CSV] + [PLOTS[k] for k in ("throughput", "ttft", "tpot")] + [SUMMARY_FILE]]


def compare_targets(out_dir):
    """The files compare() writes into out_dir."""
    return [os.path.join(out_dir, name) for name in
            ["compare.txt", "compare.csv"] + [PLOTS[k] for k in ("throughput", "ttft", "tpot")]]


def render(run_dir):
    """levels.csv, the plots and summary.txt for one run directory; returns the files
    written. Fails when the request log disagrees with the level summaries."""
    if not os.path.isfile(os.path.join(run_dir, SWEEP_FILE)):
        raise ReportError("%s has no %s" % (run_dir, SWEEP_FILE))
    run = load_run(run_dir)
    req_path = os.path.join(run_dir, REQUESTS_FILE)
    notes = []
    if os.path.isfile(req_path):
        problems = check_requests(run["levels"], read_requests(req_path))
        if problems:
            raise ReportError("%s disagrees with %s: %s"
                              % (req_path, SWEEP_FILE, "; ".join(problems)))
        notes.append("request log: %s (matches the level summaries)" % REQUESTS_FILE)
    else:
        notes.append("request log: none")
    files = [write_csv(os.path.join(run_dir, LEVELS_CSV), run["levels"])]
    files.extend(plot_all([run], run_dir))
    summary = os.path.join(run_dir, SUMMARY_FILE)
    with open(summary, "w") as f:
        f.write("\n".join(run_table(run) + notes) + "\n")
    files.append(summary)
    return files


def load_runs(paths, labels=None):
    """Two or more runs, labelled so that legends tell them apart."""
    if len(paths) < 2:
        raise ReportError("compare needs at least two runs, got %d" % len(paths))
    if labels and len(labels) != len(paths):
        raise ReportError("%d labels for %d runs" % (len(labels), len(paths)))
    runs = [load_run(p, label=(labels[i] if labels else None)) for i, p in enumerate(paths)]
    seen = {}
    for r in runs:  # labels must tell the runs apart in legends
        seen[r["label"]] = seen.get(r["label"], 0) + 1
    if any(n > 1 for n in seen.values()):
        for i, r in enumerate(runs, 1):
            r["label"] = "%s #%d" % (r["label"], i)
    return runs


def compare(paths, out_dir, labels=None):
    """Compare two or more runs: compare.txt, compare.csv and overlaid plots in out_dir."""
    runs = load_runs(paths, labels)
    if not os.path.isdir(out_dir):
        os.makedirs(out_dir)
    lines = compare_table(runs)
    files = [os.path.join(out_dir, "compare.txt")]
    with open(files[0], "w") as f:
        f.write("\n".join(lines) + "\n")
    files.append(write_compare_csv(os.path.join(out_dir, "compare.csv"), runs))
    files.extend(plot_all(runs, out_dir))
    return lines, files
