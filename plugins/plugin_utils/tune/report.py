"""Reports of a tuning run, on the controller: the ranked table as CSV and JSON, the Pareto plot
in InferenceX's form (throughput per GPU vs tokens per second per user = 1000 / TPOT), and the
compare view of the tuned flags against the default.

Throughput per GPU = total tok/s / GPUs of the candidate (InferenceX: total tok/s / (tp*pp));
interactivity = 1000 / TPOT p50 in ms. One point per candidate and concurrency level of its
longest measurement; points of levels meeting the SLO are filled, the others hollow; the Pareto
frontier of the SLO-meeting points is drawn as a step line.
"""
from __future__ import annotations

import csv
import json
import os

from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.benchmark.report import (
    ReportError, _pyplot)

CSV_FIELDS = ["rank", "id", "default", "gpus", "instances", "tensor_parallel", "expert_parallel",
              "data_parallel", "nccl_profile", "knobs", "goodput_tok_s", "goodput_tok_s_per_gpu",
              "goodput_level", "highest_level_meeting_slo", "rounds", "window_s", "noise",
              "token_match_rate", "logprob_gap_max", "disqualified", "not_measured"]


def table_rows(table):
    rows = []
    for r in table:
        lay, gate = r["layout"], r.get("correctness") or {}
        rows.append({
            "rank": r["rank"] if r["rank"] is not None else "",
            "id": r["id"], "default": r["default"], "gpus": r["gpus"],
            "instances": lay["instances"], "tensor_parallel": lay["tensor_parallel"],
            "expert_parallel": lay["expert_parallel"], "data_parallel": lay["data_parallel"],
            "nccl_profile": lay.get("nccl_profile") or "",
            "knobs": " ".join("%s=%s" % (k, v) for k, v in sorted(r["knobs"].items())
                              if v is not None),
            "goodput_tok_s": r["goodput_tok_s"], "goodput_tok_s_per_gpu": r["goodput_tok_s_per_gpu"],
            "goodput_level": r["goodput_level"] if r["goodput_level"] is not None else "",
            "highest_level_meeting_slo": r["highest_level_meeting_slo"]
            if r["highest_level_meeting_slo"] is not None else "",
            "rounds": r["rounds"], "window_s": r["window_s"],
            "noise": r["noise"] if r["noise"] is not None else "",
            "token_match_rate": gate.get("token_match_rate", ""),
            "logprob_gap_max": gate.get("logprob_gap_max", ""),
            "disqualified": r["disqualified"] or "", "not_measured": "",
        })
    return rows


def not_measured_rows(not_measured):
    """ranked.csv rows of the candidates the search did not serve (screened out, budget),
    with the reason; entries without a layout (older documents: ids only) are left out."""
    rows = []
    for n in not_measured or []:
        if not isinstance(n, dict) or not n.get("layout"):
            continue
        lay = n["layout"]
        row = dict((k, "") for k in CSV_FIELDS)
        row.update({
            "id": n["id"], "default": False,
            "gpus": lay["tensor_parallel"] * lay["data_parallel"] * lay["instances"],
            "instances": lay["instances"], "tensor_parallel": lay["tensor_parallel"],
            "expert_parallel": lay["expert_parallel"], "data_parallel": lay["data_parallel"],
            "nccl_profile": lay.get("nccl_profile") or "",
            "knobs": " ".join("%s=%s" % (k, v) for k, v in sorted((n.get("knobs") or {}).items())
                              if v is not None),
            "rounds": 0, "not_measured": n["reason"]})
        rows.append(row)
    return rows


def write_table(directory, doc):
    """ranked.csv and tune.json (the whole write-back document) in ``directory``."""
    os.makedirs(directory, exist_ok=True)
    csv_path = os.path.join(directory, "ranked.csv")
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        for row in table_rows(doc["ranked"]) + not_measured_rows(doc.get("not_measured")):
            w.writerow(row)
    json_path = os.path.join(directory, "tune.json")
    with open(json_path, "w") as f:
        json.dump(doc, f, indent=2, sort_keys=False, default=str)
    return csv_path, json_path


def pareto_points(points_by_candidate):
    """{candidate: [levels]} -> [(id, concurrency, tok_s_per_user, tok_s_per_gpu, met)]."""
    out = []
    for cid, (gpus, levels) in points_by_candidate.items():
        for lv in levels:
            tpot = (lv.get("tpot_ms") or {}).get("p50")
            if not tpot or tpot <= 0:
                continue
            out.append((cid, lv["concurrency"], round(1000.0 / tpot, 3),
                        round((lv.get("total_tok_s") or 0) / float(max(gpus, 1)), 3),
                        bool((lv.get("slo") or {}).get("met"))))
    return out


def frontier(points):
    """Pareto frontier (maximise both axes) of (x, y) points, sorted by x."""
    best, out = None, []
    for x, y in sorted(points, key=lambda p: (-p[0], -p[1])):
        if best is None or y > best:
            out.append((x, y))
            best = y
    return sorted(out)


def plot_pareto(points, path, title=None, slo=None):
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5.5))
    ids = sorted(set(p[0] for p in points))
    cmap = plt.get_cmap("tab20")
    for i, cid in enumerate(ids):
        mine = [p for p in points if p[0] == cid]
        color = cmap(i % 20)
        for met in (True, False):
            sel = [p for p in mine if p[4] == met]
            if sel:
                ax.scatter([p[2] for p in sel], [p[3] for p in sel], color=color,
                           facecolors=color if met else "none", label=cid if met or not
                           any(q[4] for q in mine) else None, s=36)
        for p in mine:
            ax.annotate(str(p[1]), (p[2], p[3]), fontsize=6, xytext=(2, 2),
                        textcoords="offset points")
    front = frontier([(p[2], p[3]) for p in points if p[4]])
    if front:
        ax.step([x for x, _y in front], [y for _x, y in front], where="post", color="black",
                linewidth=1, label="Pareto frontier (SLO met)")
    if slo and slo.get("tpot_ms"):
        ax.axvline(1000.0 / slo["tpot_ms"], color="red", linestyle="--", linewidth=1,
                   label="SLO: TPOT %.0f ms" % slo["tpot_ms"])
    ax.set_xlabel("interactivity: tok/s/user (1000 / TPOT p50 ms)")
    ax.set_ylabel("throughput per GPU: total tok/s / GPUs")
    ax.set_title(title or "tuning run: throughput per GPU vs interactivity")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=6, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def compare_view(doc):
    """Text: the default's and the winner's flags and headline numbers side by side."""
    rows = {r["id"]: r for r in doc["ranked"]}
    vs = doc.get("versus_default") or {}
    d, w = rows.get(vs.get("default")), rows.get(vs.get("winner"))
    if not d or not w:
        return "no default/winner pair to compare (%s)" % vs.get("verdict")
    lines = ["%-28s %-32s %-32s" % ("", "default", "tuned (winner)")]

    def line(name, a, b):
        lines.append("%-28s %-32s %-32s" % (name, a, b))
    line("candidate", d["id"], w["id"])
    line("flags", " ".join(d["args"]) or "(vLLM defaults)", " ".join(w["args"]) or "(vLLM defaults)")
    line("instances x GPUs", "%d x %d" % (d["layout"]["instances"], d["gpus"] // d["layout"]["instances"]),
         "%d x %d" % (w["layout"]["instances"], w["gpus"] // w["layout"]["instances"]))
    line("goodput tok/s (SLO)", d["goodput_tok_s"], w["goodput_tok_s"])
    line("at concurrency", d["goodput_level"], w["goodput_level"])
    line("highest C meeting SLO", d["highest_level_meeting_slo"], w["highest_level_meeting_slo"])
    line("noise (spread)", d["noise"], w["noise"])
    lines.append("ratio tuned/default: %s, verdict: %s" % (vs.get("ratio"), vs.get("verdict")))
    for name, other in sorted((doc.get("other_slos") or {}).items()):
        o_rows = dict((r["id"], r) for r in other["ranked"])
        o_vs = other.get("versus_default") or {}
        o_d, o_w = o_rows.get(o_vs.get("default")), o_rows.get(o_vs.get("winner"))
        if not o_d or not o_w:
            lines.append("under %s: no default/winner pair (%s)" % (name, o_vs.get("verdict")))
            continue
        lines.append("under %s: default %s tok/s at C=%s, winner %s %s tok/s at C=%s; ratio %s, "
                     "verdict: %s" % (name, o_d["goodput_tok_s"], o_d["goodput_level"], o_w["id"],
                                      o_w["goodput_tok_s"], o_w["goodput_level"],
                                      o_vs.get("ratio"), o_vs.get("verdict")))
    return "\n".join(lines)


def write_reports(directory, doc, points):
    """Everything a run leaves: ranked.csv, tune.json, pareto.png, compare.txt."""
    csv_path, json_path = write_table(directory, doc)
    out = {"csv": csv_path, "json": json_path}
    try:
        out["pareto"] = plot_pareto(points, os.path.join(directory, "pareto.png"),
                                    title="%s: %s" % (doc["host"], doc["slo"].get("class")),
                                    slo=doc["slo"])
    except ReportError as exc:
        out["pareto_error"] = str(exc)
    text = compare_view(doc)
    with open(os.path.join(directory, "compare.txt"), "w") as f:
        f.write(text + "\n")
    out["compare"] = os.path.join(directory, "compare.txt")
    return out
