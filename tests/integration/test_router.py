"""The host's front door (roles/vllm_router) on a real test host: two vLLM CPU instances of
the tiny model behind vLLM's own router (vllm-router from PyPI), one converge of the real
deploy playbook, then several stories on the same host:

- both instances serve through the router's one port, the API key enforced and passed on;
- kill -9 of the router: systemd brings it back and the instances are not restarted;
- bad router settings are refused in the validation play, before any change on the host;
- under steady load through the router, a serving flag of both instances changes and both
  swap to model B (one change), then a new vLLM pin is switched to: each change rolls one
  instance at a time behind the router and not one request fails.

vd-rt-1 (SSH 26401; vLLM 26410 and 26411; router 26420, its metrics 26421). Run it under
the heavy lock (flock /tmp/vd-heavy.lock)."""
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "harness"))
BIN = os.path.dirname(sys.executable)

pytestmark = pytest.mark.slow

HOST, SSH_PORT = "vd-rt-1", 26401
ONE, TWO, ROUTER, METRICS = 26410, 26411, 26420, 26421
KEY = "canary-router-key-5d1f8e2a9c"
GROUP_VARS = {
    "vllm_install_cpu_version": "0.32.0",
    "model_weights_source": "local",
    "model_weights_local_dir": os.path.join(ROOT, ".cache", "tiny-model"),
    "model_weights_name": "tiny-llama",
    "vllm_service_profile": "cpu-tiny",
    "vllm_service_host": "127.0.0.1",
    # the cpu-tiny profile runs each instance unpinned with one OpenMP thread, so an instance
    # restarting beside one that serves the load is not starved of CPU
    "vllm_service_instances": [{"name": "one", "port": ONE}, {"name": "two", "port": TWO}],
    "vllm_service_ready_timeout_s": 600,
    "vllm_service_restart_sec": 2,
    "vllm_service_api_key": KEY,
    "vllm_router_enabled": True,
    "vllm_router_host": "127.0.0.1",
    "vllm_router_port": ROUTER,
    # cache_aware (the default) sent every one of a dozen sequential requests to the same
    # instance here (it balances load only past 64 requests of imbalance): round robin shows
    # both instances serving through the one port
    "vllm_router_policy": "round_robin",
    "vllm_router_metrics_host": "127.0.0.1",
    "vllm_router_metrics_port": METRICS,
    # one short sweep level: the write-back records the router as the host's endpoint
    "vllm_benchmark_levels": [1],
    "vllm_benchmark_input_len": 16,
    "vllm_benchmark_output_len": 16,
    "vllm_benchmark_duration_s": 3,
    "vllm_benchmark_report": False,
}


def playbook(inventory, *args, timeout=1500):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"),
               ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    p = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", inventory,
                        "vllm_ops.deploy.deploy"] + list(args), cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=timeout, check=False)
    return p.returncode, p.stdout + p.stderr


def ssh(command):
    import testhost as th
    st = th._state(HOST)
    p = subprocess.run(th.ssh_base(st["port"]) + [command], capture_output=True, text=True,
                       timeout=60, check=False)
    return p.returncode, p.stdout


def http(method, url, body=None, key=KEY, timeout=60):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def complete(port, prompt, key=KEY):
    return http("POST", "http://127.0.0.1:%d/v1/completions" % port,
                {"model": "tiny-llama", "prompt": prompt, "max_tokens": 4, "ignore_eos": True},
                key=key)


def unit_show(unit, *props):
    rc, out = ssh("systemctl show %s %s" % (unit, " ".join("-p " + p for p in props)))
    assert rc == 0, out
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def router_metrics():
    status, text = http("GET", "http://127.0.0.1:%d/metrics" % METRICS, key=None)
    assert status == 200
    return text


def processed_per_worker(text=None):
    """{worker URL: requests the router processed for it} from its metrics."""
    served = {}
    for line in (text if text is not None else router_metrics()).splitlines():
        if line.startswith("vllm_router_processed_requests_total{"):
            worker = line.split('worker="', 1)[1].split('"', 1)[0]
            served[worker] = served.get(worker, 0.0) + float(line.rsplit(" ", 1)[1])
    return served


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.fail("test hosts need root (systemd-nspawn)")
    import testhost as th
    if not os.path.exists(os.path.join(ROOT, ".cache", "tiny-model", "config.json")):
        subprocess.run([sys.executable, os.path.join(ROOT, "tests", "harness", "make_tiny_model.py"),
                        os.path.join(ROOT, ".cache", "tiny-model")], check=True)
    th.destroy("vd-rt-")
    th.create(HOST, SSH_PORT)
    path = str(tmp_path_factory.mktemp("inv") / "hosts.yml")
    th.write_inventory([HOST], path, extra_vars=GROUP_VARS)
    try:
        t0 = time.time()
        rc, out = playbook(path)
        print("converge: rc=%d in %.0f s" % (rc, time.time() - t0))
        assert rc == 0, out[-6000:]
        # declared: the extra vars of the changes rolled since (rolled_change)
        yield {"inventory": path, "converge": out, "declared": {}}
    finally:
        th.destroy("vd-rt-")


def test_two_instances_serve_through_one_port(host):
    status, body = http("GET", "http://127.0.0.1:%d/list_workers" % ROUTER, key=None)
    assert status == 200
    assert sorted(json.loads(body)["urls"]) == ["http://127.0.0.1:%d" % ONE,
                                                "http://127.0.0.1:%d" % TWO]
    before = router_metrics()
    for i in range(12):
        status, body = complete(ROUTER, "request %d: %s" % (i, "lorem ipsum " * (i + 1)))
        assert status == 200, body
        assert json.loads(body)["usage"]["completion_tokens"] == 4
    text = router_metrics()
    served = processed_per_worker(text)
    print("router metrics before:", [l for l in before.splitlines() if "processed_requests" in l])
    print("processed per instance:", served)
    assert set(served) == {"http://127.0.0.1:%d" % ONE, "http://127.0.0.1:%d" % TWO}
    # the names the dashboard's router row reads are those this router exports
    from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.monitoring import plan as vm
    assert vm.missing_metrics(text, vm.router_metric_names()) == []
    assert all(v >= 1 for v in served.values()) and sum(served.values()) >= 12
    # the key: enforced through the router (the instances check the header it passes on)
    assert complete(ROUTER, "no key", key=None)[0] == 401
    assert complete(ROUTER, "wrong key", key="wrong")[0] == 401
    # the readiness check ran through the router; the write-back names it the host's endpoint
    assert "Wait until the endpoint serves through the router" in host["converge"]
    with open(os.path.join(os.path.dirname(host["inventory"]), "host_vars", HOST,
                           "vllm_benchmark.yml")) as f:
        saved = yaml.safe_load(f)["vllm_benchmark_results"]
    assert saved["endpoint"] == "http://127.0.0.1:%d" % ROUTER
    assert sorted(saved["instances"]) == ["one", "two"]


def test_router_unit_is_hardened_and_holds_no_secret(host):
    show = unit_show("vllm_router.service", "User", "MainPID", "ActiveState",
                     "NoNewPrivileges", "ProtectSystem", "FragmentPath")
    assert show["ActiveState"] == "active" and show["User"] == "vllm"
    assert show["NoNewPrivileges"] == "yes" and show["ProtectSystem"] == "strict"
    rc, unit = ssh("cat " + show["FragmentPath"])
    assert rc == 0 and "--worker-urls" in unit and KEY not in unit
    # vllm-router retitles its process (vllm::router): its argv is the unit's ExecStart
    rc, argv = ssh("tr '\\0' ' ' < /proc/%s/cmdline" % show["MainPID"])
    assert rc == 0 and argv.startswith("vllm::router") and KEY not in argv
    exec_start = unit_show("vllm_router.service", "ExecStart")["ExecStart"]
    assert "--policy round_robin" in exec_start and KEY not in exec_start
    rc, env = ssh("tr '\\0' '\\n' < /proc/%s/environ" % show["MainPID"])
    assert rc == 0 and KEY not in env
    assert KEY not in host["converge"]


def test_kill9_router_comes_back_and_instances_stay(host):
    units = ("vllm-one.service", "vllm-two.service")
    inst_before = dict((u, unit_show(u, "MainPID", "NRestarts")) for u in units)
    r_before = unit_show("vllm_router.service", "MainPID", "NRestarts")
    rc, _unused = ssh("kill -9 %s" % r_before["MainPID"])
    assert rc == 0
    t0 = time.time()
    back = None
    while time.time() - t0 < 60:
        try:
            status, _unused = complete(ROUTER, "after the kill")
        except OSError:
            status = None
        if status == 200:
            back = time.time() - t0
            break
        time.sleep(0.5)
    print("router serving again %.1f s after kill -9" % (back or -1))
    assert back is not None
    r_after = unit_show("vllm_router.service", "MainPID", "NRestarts", "ActiveState")
    assert r_after["ActiveState"] == "active" and r_after["MainPID"] != r_before["MainPID"]
    assert int(r_after["NRestarts"]) == int(r_before["NRestarts"]) + 1
    for u in units:
        assert unit_show(u, "MainPID", "NRestarts") == inst_before[u], u


BAD = [
    ({"vllm_router_port": ONE}, "vllm_router_port=%d is the port of vLLM instance one" % ONE),
    ({"vllm_router_port": SSH_PORT}, "vllm_router_port=%d is the port of sshd" % SSH_PORT),
    ({"vllm_router_policy": "fastest"}, "vllm_router_policy='fastest' is not a policy of vllm-router"),
    ({"vllm_router_instances": ["three"]}, "no vLLM instance stands behind the router"),
    ({"vllm_service_instances": [{"name": "one", "port": ONE},
                                 {"name": "two", "port": TWO, "served_model_name": "tiny-two"}]},
     "the instances behind the router serve different models"),
]


def test_bad_router_settings_refused_before_any_change(host, tmp_path):
    unit_before = unit_show("vllm_router.service", "MainPID")
    rc, stamp = ssh("stat -c %Y /etc/systemd/system/vllm_router.service /etc/systemd/system/vllm-two.service")
    assert rc == 0

    def run(i):
        path = tmp_path / ("extra-%d.yml" % i)
        path.write_text(yaml.safe_dump(BAD[i][0]))
        return playbook(host["inventory"], "-e", "@" + str(path), timeout=600)

    # each run stops in the validation play (checked below): they run side by side
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(len(BAD)) as pool:
        runs = list(pool.map(run, range(len(BAD))))
    for (_unused, message), (rc, out) in zip(BAD, runs):
        assert rc != 0, out[-3000:]
        assert message in out, out[-3000:]
        converge = out.partition("PLAY [Converge vLLM hosts]")[2]
        assert "TASK [" not in converge, "a converge task ran:\n" + out[-3000:]
    assert ssh("stat -c %Y /etc/systemd/system/vllm_router.service /etc/systemd/system/vllm-two.service") == (0, stamp)
    assert unit_show("vllm_router.service", "MainPID") == unit_before
    assert complete(ROUTER, "still serving")[0] == 200


def test_the_tuner_measures_a_candidate_through_the_router(host):
    """The tuner's one-candidate play (vllm_ops.deploy.tune) on a host with the router: the
    candidate (here the host's own two instances, so nothing restarts) is swept through the
    front door at its total concurrency (2 instances x the per-instance level); with
    vllm_tune_through_router false, each instance at its own port, both at once."""
    from vllm_deploy.runner import run_playbook
    units = ("vllm-one.service", "vllm-two.service", "vllm_router.service")
    pids = dict((u, unit_show(u, "MainPID")["MainPID"]) for u in units)
    ev = {"vllm_tune_host": HOST, "vllm_service_profile": "cpu-tiny",
          "vllm_service_instances": GROUP_VARS["vllm_service_instances"],
          "vllm_tune_stop_units": [], "vllm_tune_levels": [1, 2], "vllm_tune_duration_s": 3,
          "vllm_tune_input_len": 16, "vllm_tune_output_len": 16,
          "vllm_tune_stop_on_saturation": False}
    measured = {}
    for through in (True, False):
        before = processed_per_worker()
        runner, collector, _info = run_playbook("vllm_ops.deploy.tune", host["inventory"],
                                                limit=HOST,
                                                extravars=dict(ev, vllm_tune_through_router=through))
        assert runner.rc == 0, [f.describe() for f in collector.failures_for(HOST)]
        m = collector.facts[HOST]["vllm_tune_measurement"]
        after = processed_per_worker()
        routed = sum(after.values()) - sum(before.values())
        measured[through] = (m, routed)
        print("through_router=%s: through %s, levels %s, router requests %d" % (
            through, m["through"], [[lv["concurrency"] for lv in lvs] for lvs in m["levels"]], routed))
        assert sorted(m["instances"]) == ["one", "two"]
        assert all(lv["requests_failed"] == 0 for lvs in m["levels"] for lv in lvs)
    m, routed = measured[True]
    assert m["through"] == "router"
    assert [[lv["concurrency"] for lv in lvs] for lvs in m["levels"]] == [[2, 4]]
    done = sum(lv["requests_ok"] for lv in m["levels"][0])
    assert routed >= done > 0  # the sweep's requests went through the router
    m, routed = measured[False]
    assert m["through"] == "instances"
    assert [[lv["concurrency"] for lv in lvs] for lvs in m["levels"]] == [[1, 2], [1, 2]]
    assert routed <= 1  # the readiness check's one completion at most
    # the same configuration served again: no instance and no router restarted
    assert dict((u, unit_show(u, "MainPID")["MainPID"]) for u in units) == pids


class Load(object):
    """Steady load through the router: WORKERS clients, each sending its next completion
    PAUSE seconds after the last one ended (the instance left serving is busy, not saturated:
    on 2 cores a saturated one starves the instance that restarts beside it). Every request's
    start, end and outcome is kept; a refused or reset connection counts as a failed request."""
    WORKERS = 2
    PAUSE = 0.25

    def __init__(self, port):
        import threading
        self.port, self.stop, self.records = port, threading.Event(), []
        self.threads = [threading.Thread(target=self.worker, args=(i,), daemon=True)
                        for i in range(self.WORKERS)]

    def worker(self, i):
        n = 0
        while not self.stop.is_set():
            t0 = time.time()
            try:
                status, body = complete(self.port, "worker %d request %d %s" % (i, n, "x " * 8))
                ok = status == 200 and json.loads(body)["usage"]["completion_tokens"] == 4
                why = "" if ok else "HTTP %s %s" % (status, body[:200])
            except Exception as e:  # noqa: BLE001 - every failure is counted, none is raised
                ok, why = False, repr(e)
            self.records.append((t0, time.time(), ok, why))
            n += 1
            self.stop.wait(self.PAUSE)

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(180)

    def window(self, start, end):
        """(completions per second, median seconds per completion) of the requests that
        ended in [start, end)."""
        done = sorted(r[1] - r[0] for r in self.records if start <= r[1] < end and r[2])
        return len(done) / max(end - start, 1e-9), (done[len(done) // 2] if done else None)


def greedy(prompt="The rolling change keeps"):
    status, body = http("POST", "http://127.0.0.1:%d/v1/completions" % ROUTER,
                        {"model": "tiny-llama", "prompt": prompt, "max_tokens": 12,
                         "temperature": 0, "ignore_eos": True})
    assert status == 200, body
    return json.loads(body)["choices"][0]["text"]


def rolled_change(host, tmp_path, name, extra, tags):
    """Run the playbook with ``extra`` on top of the extra vars of the changes rolled before
    (host["declared"]: what the host runs now, so that a tag run without vllm_service finds
    the instances running as declared) and ``--tags tags`` (the roles the change is in; the
    validation play runs on every run) under steady load through the router; print the
    failed requests, the completion rate before and during the change and the drains; return
    the instances' new main PIDs."""
    units = ("vllm-one.service", "vllm-two.service")
    before = dict((u, unit_show(u, "MainPID")["MainPID"]) for u in units)
    router_before = unit_show("vllm_router.service", "MainPID")["MainPID"]
    declared = dict(host["declared"], **extra)
    path = tmp_path / ("%s.yml" % name)
    path.write_text(yaml.safe_dump(dict(declared, vllm_benchmark_enabled=False)))
    with Load(ROUTER) as load:
        time.sleep(15)
        t_change = time.time()
        rc, out = playbook(host["inventory"], "-e", "@" + str(path), "--tags", tags)
        t_done = time.time()
        time.sleep(5)
    assert rc == 0, out[-6000:]
    host["declared"] = declared
    failed = [r for r in load.records if not r[2]]
    drains = [line.strip().strip('"') for line in out.splitlines() if "drained after" in line]
    base_rate, base_lat = load.window(t_change - 15, t_change)
    buckets = [load.window(t, t + 15) for t in range(int(t_change), int(t_done) - 14, 15)]
    print("%s: %d requests ok, %d failed; the change took %.0f s" % (
        name, len(load.records) - len(failed), len(failed), t_done - t_change))
    print("%s: before: %.2f completions/s, median %.2f s; during the change per 15 s: %s" % (
        name, base_rate, base_lat or -1,
        ", ".join("%.2f/s %.2fs" % (r, lat or -1) for r, lat in buckets)))
    if buckets and base_rate:
        print("%s: lowest 15 s rate / before = %.2f" % (name, min(r for r, _l in buckets) / base_rate))
    print("%s: drains: %s" % (name, drains))
    assert failed == [], failed[:5]
    assert "rolling through the router, one instance at a time: one, two" in out, out[-4000:]
    assert len(drains) == 2, drains
    assert any("instance one: drained" in d for d in drains), drains
    assert any("instance two: drained" in d for d in drains), drains
    after = dict((u, unit_show(u, "MainPID")["MainPID"]) for u in units)
    assert all(after[u] != before[u] for u in units), (before, after)  # both restarted
    assert unit_show("vllm_router.service", "MainPID")["MainPID"] == router_before
    status, body = http("GET", "http://127.0.0.1:%d/list_workers" % ROUTER, key=None)
    assert sorted(json.loads(body)["urls"]) == ["http://127.0.0.1:%d" % ONE,
                                                "http://127.0.0.1:%d" % TWO]
    return after


def test_changes_roll_through_the_router_under_load_with_no_failed_request(host, tmp_path):
    """A serving flag of both instances and a swap of both to model B, as one change: it runs
    under steady load through the router and rolls one instance at a time; no request fails
    and the router never restarts. Both kinds of change take the same roll (an instance stops
    when its unit or environment changes, whatever changed in it), so one change with both
    proves each of them: every restarted instance runs with the new flag and answers with
    model B's weights. (A swap back to model A takes the swap's path again: not repeated.)"""
    text_a = greedy()
    # model B under the same served name: the clients' requests keep their model name
    after = rolled_change(host, tmp_path, "flag+swap-b", {
        "vllm_service_args": ["--max-logprobs", "21"],
        "model_weights_name": "tiny-b",
        "model_weights_local_dir": os.path.join(ROOT, ".cache", "tiny-model-b"),
        "vllm_service_previous_models": "keep"}, "model_weights,vllm_service")
    for unit in ("vllm-one.service", "vllm-two.service"):
        rc, argv = ssh("tr '\\0' ' ' < /proc/%s/cmdline" % after[unit])
        assert rc == 0 and "--max-logprobs 21" in argv, argv
    text_b = greedy()
    assert text_b != text_a, "model B answered like model A: %r" % text_b


def test_new_vllm_pin_rolls_through_the_router_under_load(host, tmp_path):
    """A new vLLM pin (its own venv: one more requirement, one vLLM already meets) switches
    blue/green and restarts the instances one at a time through the router, under steady
    load; no request fails. The upgrade gate is off here: it measures candidates on ports of
    their own, outside the router, and would double the job's time."""
    rc, old_venv = ssh("readlink /opt/vllm-deploy/current")
    assert rc == 0 and old_venv.strip(), old_venv
    after = rolled_change(host, tmp_path, "pin", {"vllm_install_extra_requirements": ["packaging"],
                                                  "vllm_install_gate_enabled": False}, "vllm_install")
    rc, new_venv = ssh("readlink /opt/vllm-deploy/current")
    assert rc == 0 and new_venv.strip() not in ("", old_venv.strip()), (old_venv, new_venv)
    for unit in ("vllm-one.service", "vllm-two.service"):
        # the restarted processes have the new venv's libraries mapped (the kernel shows
        # the path the current link resolved to)
        rc, maps = ssh("grep -c '%s/' /proc/%s/maps || true" % (new_venv.strip(), after[unit]))
        assert rc == 0 and int(maps.strip() or 0) > 0, (unit, maps)
    assert greedy()
