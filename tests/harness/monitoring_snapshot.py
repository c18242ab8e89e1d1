"""Render the vllm-deploy dashboard's panels as one PNG from a real Prometheus (matplotlib):
a screenshot-free picture of what the Grafana dashboard shows.

    monitoring_snapshot.py --prometheus http://127.0.0.1:9390 \\
        --dashboard /etc/vllm-deploy/grafana/dashboards/vllm-deploy.json --out monitoring.png \\
        [--minutes 10] [--step 5] [--data monitoring.json]

Every panel that does not need a GPU is drawn from /api/v1/query_range over the last
--minutes, with Grafana's variables set to All and $__rate_interval to 4 steps (at least
1m). --data also saves the query results as JSON.
"""
import argparse
import json
import os
import re
import sys
import time
import urllib.parse
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The checkout is the collection vllm_ops.deploy through collections/ (README: Layout).
sys.path.insert(0, os.path.join(ROOT, "collections"))
from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.monitoring import plan as vm  # noqa: E402


def legend(fmt, labels):
    """Grafana's legendFormat: {{label}} replaced by the series' label value."""
    return re.sub(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}",
                  lambda m: str(labels.get(m.group(1), "")), fmt or "") or str(labels)


def panels(dashboard):
    """The panels to draw: [(title, unit, [(expr, legendFormat)])], GPU and router panels
    left out."""
    out = []
    for p in dashboard.get("panels") or []:
        meta = p.get("vllm_deploy") or {}
        if p.get("type") == "row" or meta.get("requires_gpu") or meta.get("requires") == "router":
            continue
        unit = ((p.get("fieldConfig") or {}).get("defaults") or {}).get("unit", "short")
        out.append((p["title"], unit, [(t["expr"], t.get("legendFormat", ""))
                                       for t in p.get("targets") or []]))
    return out


def scale(unit):
    """(factor, axis label) for a Grafana unit."""
    return {"s": (1000.0, "ms"), "percentunit": (100.0, "%"), "percent": (1.0, "%"),
            "reqps": (1.0, "req/s"), "celsius": (1.0, "C")}.get(unit, (1.0, ""))


def query_range(base, expr, start, end, step):
    data = urllib.parse.urlencode({"query": expr, "start": start, "end": end,
                                   "step": step}).encode()
    with urllib.request.urlopen(base.rstrip("/") + "/api/v1/query_range", data=data,
                                timeout=30) as r:
        doc = json.load(r)
    if doc.get("status") != "success":
        raise RuntimeError("%s: %s" % (expr, doc))
    return doc["data"]["result"]


def render(results, out, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 2
    rows = (len(results) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(14, 3.2 * rows), squeeze=False)
    t0 = min((float(v[0]) for r in results for _e, _l, series in r["targets"]
              for s in series for v in s["values"]), default=0.0)
    t1 = max((float(v[0]) for r in results for _e, _l, series in r["targets"]
              for s in series for v in s["values"]), default=60.0)
    for ax, panel in zip([a for row in axes for a in row], results):
        factor, label = scale(panel["unit"])
        ax.set_xlim(0, (t1 - t0) / 60.0)
        for expr, fmt, series in panel["targets"]:
            for s in series:
                xs = [(float(v[0]) - t0) / 60.0 for v in s["values"]]
                ys = [float(v[1]) * factor for v in s["values"]]
                style = "--" if expr.startswith("vllm_deploy:") else "-"
                ax.plot(xs, ys, style, linewidth=1.2, label=legend(fmt, s["metric"]))
        ax.set_title(panel["title"], fontsize=10)
        ax.set_xlabel("minutes", fontsize=8)
        ax.set_ylabel(label, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=6, loc="best")
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    for ax in [a for row in axes for a in row][len(results):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    fig.savefig(out, dpi=80)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prometheus", required=True)
    ap.add_argument("--dashboard", help="dashboard JSON (default: the role's, generated)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--step", type=float, default=5.0)
    ap.add_argument("--data", help="also save the query results here (JSON)")
    ap.add_argument("--title", default="vllm-deploy dashboard, from Prometheus data")
    args = ap.parse_args(argv)

    if args.dashboard:
        with open(args.dashboard) as f:
            dashboard = json.load(f)
    else:
        dashboard = vm.dashboard()
    end = time.time()
    start = end - args.minutes * 60.0
    rate = "%ds" % max(60, int(4 * args.step))
    results = []
    for title, unit, targets in panels(dashboard):
        done = []
        for expr, fmt in targets:
            done.append((expr, fmt, query_range(args.prometheus, vm.substitute(expr, rate),
                                                start, end, args.step)))
        results.append({"title": title, "unit": unit, "targets": done})
    if args.data:
        with open(args.data, "w") as f:
            json.dump(results, f, indent=1)
    render(results, args.out, args.title)
    print("%s: %d panels, %d series" % (args.out, len(results),
                                        sum(len(s) for r in results for _e, _l, s in r["targets"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
