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
