"""molecule/default: run every dashboard query, every rule and every alert expression against
the real Prometheus (HTTP API) in one step; print a JSON summary, exit 1 naming each problem.

    check_queries.py --prometheus URL --dashboard FILE [--rate 2m]

Dashboard queries (Grafana's variables = All, $__rate_interval = --rate) must succeed and
return data with at least one finite value; the DCGM panels' queries must succeed and return
nothing (no GPU here). Both rule groups must be loaded with every rule healthy, and every
alert expression must evaluate.
"""
import argparse
import json
import os
import sys
import urllib.parse
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The checkout is the collection vllm_ops.deploy through collections/ (README: Layout).
sys.path.insert(0, os.path.join(ROOT, "collections"))
from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.monitoring import plan as vm  # noqa: E402

FINITE_EXCLUDED = ("NaN", "+Inf", "-Inf")


def api(base, path, query=None):
    data = urllib.parse.urlencode({"query": query}).encode() if query is not None else None
    with urllib.request.urlopen(base.rstrip("/") + path, data=data, timeout=30) as r:
        return json.load(r)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--prometheus", required=True)
    ap.add_argument("--dashboard", required=True)
    ap.add_argument("--rate", default="2m")
    args = ap.parse_args(argv)
    with open(args.dashboard) as f:
        queries = vm.dashboard_queries(json.load(f))

    problems, with_data, gpu_empty, router_empty = [], 0, [], []
    # router panels must have data where a router is scraped, none where none is
    routers = [t for t in api(args.prometheus, "/api/v1/targets?state=active")["data"]["activeTargets"]
               if t["labels"].get("job") == vm.ROUTER_JOB]
    for q in queries:
        expr = vm.substitute(q["expr"], args.rate)
        doc = api(args.prometheus, "/api/v1/query", expr)
        where = "%s %s: %s" % (q["panel"], q["ref"], expr)
        if doc.get("status") != "success":
            problems.append("%s -> %s" % (where, doc))
            continue
        values = [r["value"][1] for r in doc["data"]["result"]]
        if q["requires_gpu"]:
            if values:
                problems.append("%s returned data without a GPU: %s" % (where, values))
            else:
                gpu_empty.append(q["panel"])
        elif q.get("requires") == "router" and not routers:
            if values:
                problems.append("%s returned data without a router: %s" % (where, values))
            else:
                router_empty.append(q["panel"])
        elif not [v for v in values if v not in FINITE_EXCLUDED]:
            problems.append("%s returned no finite value: %s" % (where, doc["data"]["result"]))
        else:
            with_data += 1

    groups = [g for g in api(args.prometheus, "/api/v1/rules")["data"]["groups"]
              if g["name"].startswith("vllm-deploy-")]
    if sorted(g["name"] for g in groups) != ["vllm-deploy-alerts", "vllm-deploy-benchmark"]:
        problems.append("rule groups loaded: %s" % [g["name"] for g in groups])
    rules = [r for g in groups for r in g["rules"]]
    problems += ["rule %s: %s %s" % (r["name"], r["health"], r.get("lastError", ""))
                 for r in rules if r["health"] != "ok"]
    alerts = [r for r in rules if r["type"] == "alerting"]
    true_now = []
    for r in alerts:
        doc = api(args.prometheus, "/api/v1/query", r["query"])
        if doc.get("status") != "success":
            problems.append("alert %s: %s -> %s" % (r["name"], r["query"], doc))
        elif doc["data"]["result"]:
            true_now.append(r["name"])

    targets = [{"job": t["labels"].get("job"), "instance": t["labels"].get("instance"),
                "health": t["health"], "last_error": t.get("lastError", ""),
                "last_scrape_duration_s": t.get("lastScrapeDuration"),
                "last_scrape": t.get("lastScrape")}
               for t in api(args.prometheus, "/api/v1/targets?state=active")["data"]["activeTargets"]]
    history = {}
    for name, expr in (("failed_scrapes_5m", "count_over_time((up == 0)[5m:5s])"),
                       ("max_scrape_duration_s_5m", "max_over_time(scrape_duration_seconds[5m])")):
        for r in api(args.prometheus, "/api/v1/query", expr)["data"]["result"]:
            history.setdefault(r["metric"].get("job", "?"), {})[name] = r["value"][1]
    summary = {"targets": targets, "history": history, "dashboard_queries": len(queries), "with_data": with_data,
               "gpu_panels_empty": sorted(set(gpu_empty)),
               "router_panels_empty": sorted(set(router_empty)), "rules": len(rules),
               "alert_expressions": len(alerts), "alert_conditions_true": true_now,
               "problems": problems}
    print(json.dumps(summary, indent=1))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
