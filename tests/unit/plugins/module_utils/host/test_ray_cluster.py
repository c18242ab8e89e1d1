"""Unit tests for plugins/module_utils/host/ray_cluster.py (Ray node table vs. inventory)."""
import json

import pytest

from ansible_collections.vllm_ops.deploy.plugins.module_utils.host.ray_cluster import (
    NODE_TABLE_SCRIPT, RayStatusError, alive_nodes, check_cluster, parse_node_table,
    validate_expected)


def node(ip, cpus=1.0, gpus=None, alive=True, node_id=None):
    """A node entry with the keys NODE_TABLE_SCRIPT keeps from Ray's GCS node table."""
    res = {"node:%s" % ip: 1.0, "memory": 1e9, "object_store_memory": 1e8}
    if cpus is not None:
        res["CPU"] = cpus
    if gpus is not None:
        res["GPU"] = gpus
    return {"NodeID": node_id or ("id-" + ip), "Alive": alive, "NodeManagerAddress": ip,
            "NodeManagerHostname": "h-" + ip, "Resources": res}


EXPECTED = [{"host": "a", "ip": "10.0.0.1", "cpus": 1, "gpus": 8},
            {"host": "b", "ip": "10.0.0.2", "cpus": 1, "gpus": 8}]


def test_script_keeps_the_keys_the_checks_read():
    for key in ("NodeID", "Alive", "NodeManagerAddress", "Resources"):
        assert '"%s"' % key in NODE_TABLE_SCRIPT
    compile(NODE_TABLE_SCRIPT, "<node-table>", "exec")


def test_parse_rejects_non_json_and_non_lists():
    with pytest.raises(RayStatusError, match="not JSON"):
        parse_node_table("Traceback (most recent call last)")
    with pytest.raises(RayStatusError, match="list of objects"):
        parse_node_table('{"NodeID": "x"}')
    assert parse_node_table(json.dumps([node("10.0.0.1")]))[0]["NodeManagerAddress"] == "10.0.0.1"


def test_all_present_with_gpus():
    r = check_cluster([node("10.0.0.1", 96, 8), node("10.0.0.2", 96, 8)], EXPECTED)
    assert r["ok"] and r["missing"] == [] and r["extra"] == []
    assert r["nodes"]["10.0.0.2"]["gpus"] == 8.0
    assert r["message"].startswith("all 2 Ray nodes present")


def test_missing_node_is_named_with_its_address():
    r = check_cluster([node("10.0.0.1", 96, 8)], EXPECTED)
    assert not r["ok"]
    assert r["missing"] == [{"host": "b", "ip": "10.0.0.2", "reason": "not in the cluster"}]
    assert "1 of 2 Ray nodes missing: b (10.0.0.2) not in the cluster" == r["message"]


def test_node_without_enough_gpus_is_missing_with_numbers():
    r = check_cluster([node("10.0.0.1", 96, 8), node("10.0.0.2", 96, 4)], EXPECTED)
    assert [m["host"] for m in r["missing"]] == ["b"]
    assert r["missing"][0]["reason"] == "has 96 CPU / 4 GPU, expected at least 1 CPU / 8 GPU"


def test_cpu_profile_node_without_gpu_key_counts_as_zero_gpus():
    exp = [{"host": "a", "ip": "10.0.0.1", "cpus": 1, "gpus": 0}]
    assert check_cluster([node("10.0.0.1", 1.0)], exp)["ok"]
    r = check_cluster([node("10.0.0.1", cpus=None)], exp)
    assert r["missing"][0]["reason"].startswith("has 0 CPU / 0 GPU")


def test_dead_entries_do_not_count_and_restarted_node_does():
    nodes = [node("10.0.0.2", 96, 8, alive=False, node_id="old"),
             node("10.0.0.1", 96, 8)]
    assert [m["ip"] for m in check_cluster(nodes, EXPECTED)["missing"]] == ["10.0.0.2"]
    nodes.append(node("10.0.0.2", 96, 8, node_id="new"))
    r = check_cluster(nodes, EXPECTED)
    assert r["ok"] and r["nodes"]["10.0.0.2"]["node_id"] == "new"


def test_unexpected_nodes_are_reported_as_extra():
    r = check_cluster([node("10.0.0.1", 96, 8), node("10.0.0.2", 96, 8),
                       node("10.0.0.7", 8, 0)], EXPECTED)
    assert r["ok"] and r["extra"] == ["10.0.0.7"]


def test_alive_nodes_skips_entries_without_address():
    bad = node("10.0.0.1")
    bad["NodeManagerAddress"] = ""
    assert alive_nodes([bad]) == {}


@pytest.mark.parametrize("expected,match", [
    ([], "non-empty list"),
    (["10.0.0.1"], r"expected\[0\] must be a mapping"),
    ([{"host": "a", "ip": ""}], r"expected\[0\].ip"),
    ([{"host": "a", "ip": "10.0.0.1", "gpus": -1}], r"gpus must be a number >= 0"),
    ([{"host": "a", "ip": "10.0.0.1", "cpus": True}], r"cpus must be a number"),
    ([{"host": "a", "ip": "10.0.0.1"}, {"host": "b", "ip": "10.0.0.1"}], "twice"),
])
def test_validate_expected_refuses_bad_input(expected, match):
    with pytest.raises(RayStatusError, match=match):
        validate_expected(expected)
