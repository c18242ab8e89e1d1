"""Ray cluster membership: read the GCS node table and compare it with the inventory.

Pure Python (no Ray import here): ``NODE_TABLE_SCRIPT`` runs in the vLLM venv's interpreter
(where Ray lives) and prints the node table as JSON; everything else works on that JSON and is
unit-tested without Ray.
"""
from __future__ import annotations

import json

# Runs in the venv that has Ray. Reads the GCS node table the way `ray status` does, without
# ray.init(): no driver, no job, nothing written into the session directory.
NODE_TABLE_SCRIPT = r'''
import json, sys
from ray._private.state import GlobalState
from ray._raylet import GcsClientOptions
state = GlobalState()
state._initialize_global_state(GcsClientOptions.create(
    sys.argv[1], None, allow_cluster_id_nil=True, fetch_cluster_id_if_nil=False))
keep = ("NodeID", "Alive", "NodeManagerAddress", "NodeManagerHostname", "Resources")
print(json.dumps([{k: n.get(k) for k in keep} for n in state.node_table()]))
'''


class RayStatusError(Exception):
    """Input that cannot be checked (bad expected list, unparseable node table)."""


def parse_node_table(text):
    """The JSON printed by NODE_TABLE_SCRIPT -> list of node dicts."""
    try:
        nodes = json.loads(text)
    except ValueError as e:
        raise RayStatusError("node table is not JSON: %s (got %r)" % (e, text[:200]))
    if not isinstance(nodes, list) or not all(isinstance(n, dict) for n in nodes):
        raise RayStatusError("node table must be a JSON list of objects, got %r" % (text[:200],))
    return nodes


def alive_nodes(nodes):
    """{ip: {'node_id', 'hostname', 'cpus', 'gpus'}} of the nodes that are alive.

    A node that restarted shows up twice (the dead entry stays in the table); only alive
    entries count. Two alive nodes on one IP keep the one with more resources listed first.
    """
    out = {}
    for node in nodes:
        if not node.get("Alive"):
            continue
        ip = node.get("NodeManagerAddress")
        if not ip:
            continue
        res = node.get("Resources") or {}
        entry = {
            "node_id": node.get("NodeID"),
            "hostname": node.get("NodeManagerHostname"),
            "cpus": float(res.get("CPU", 0) or 0),
            "gpus": float(res.get("GPU", 0) or 0),
        }
        if ip not in out:
            out[ip] = entry
    return out


def validate_expected(expected):
    """expected: list of {'host': str, 'ip': str, 'cpus': int >= 0, 'gpus': int >= 0}."""
    if not isinstance(expected, list) or not expected:
        raise RayStatusError("expected must be a non-empty list of nodes")
    seen = set()
    for i, item in enumerate(expected):
        if not isinstance(item, dict):
            raise RayStatusError("expected[%d] must be a mapping, got %r" % (i, item))
        for key in ("host", "ip"):
            if not isinstance(item.get(key), str) or not item[key]:
                raise RayStatusError("expected[%d].%s must be a non-empty string" % (i, key))
        for key in ("cpus", "gpus"):
            value = item.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise RayStatusError("expected[%d].%s must be a number >= 0, got %r"
                                     % (i, key, value))
        if item["ip"] in seen:
            raise RayStatusError("expected lists %s twice" % item["ip"])
        seen.add(item["ip"])
    return expected


def _fmt(n):
    return ("%d" % n) if float(n).is_integer() else ("%g" % n)


def check_cluster(nodes, expected):
    """Compare the node table with the expected nodes.

    Returns {'ok', 'missing': [{'host', 'ip', 'reason'}], 'extra': [ip...], 'nodes': {...},
    'message'}: a node is missing when no alive node has its IP, or it announces fewer CPUs
    or GPUs than expected.
    """
    validate_expected(expected)
    alive = alive_nodes(nodes)
    missing = []
    for item in expected:
        node = alive.get(item["ip"])
        want_cpus, want_gpus = item.get("cpus", 0), item.get("gpus", 0)
        if node is None:
            reason = "not in the cluster"
        elif node["cpus"] < want_cpus or node["gpus"] < want_gpus:
            reason = "has %s CPU / %s GPU, expected at least %s CPU / %s GPU" % (
                _fmt(node["cpus"]), _fmt(node["gpus"]), _fmt(want_cpus), _fmt(want_gpus))
        else:
            continue
        missing.append({"host": item["host"], "ip": item["ip"], "reason": reason})
    wanted = set(i["ip"] for i in expected)
    extra = sorted(ip for ip in alive if ip not in wanted)
    if missing:
        message = "%d of %d Ray nodes missing: %s" % (
            len(missing), len(expected),
            "; ".join("%s (%s) %s" % (m["host"], m["ip"], m["reason"]) for m in missing))
    else:
        message = "all %d Ray nodes present: %s" % (len(expected), ", ".join(
            "%s (%s, %s CPU, %s GPU)" % (i["host"], i["ip"], _fmt(alive[i["ip"]]["cpus"]),
                                         _fmt(alive[i["ip"]]["gpus"])) for i in expected))
    return {"ok": not missing, "missing": missing, "extra": extra, "nodes": alive,
            "message": message}
