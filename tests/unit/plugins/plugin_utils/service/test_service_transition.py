"""vllm_transition.plan / downtime and vllm_host_state: what a change of a running host does."""
from __future__ import annotations

import os

from ansible_collections.vllm_ops.deploy.plugins.filter.systemd import (
    systemd_env_line, systemd_exec_args)
from ansible_collections.vllm_ops.deploy.plugins.module_utils.service import vllm_instance as hs
from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.service import transition as tx

PY = "/opt/vllm/current/bin/python"


def argv(name, port, model="/srv/models/tiny", extra=()):
    return [PY, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
            "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port)] + list(extra)


def declared(name, port, gpus=None, gpu_required=False, env=None, **kw):
    return {"name": name, "unit": "vllm-%s.service" % name, "port": port, "gpus": gpus,
            "gpu_required": gpu_required, "argv": argv(name, port, **kw),
            "env": dict(env or {}), "model_dir": kw.get("model", "/srv/models/tiny")}


def on_host(name, port, state="active", gpus=None, env=None, **kw):
    return {"name": name, "unit": "vllm-%s.service" % name, "port": port, "gpus": gpus,
            "argv": argv(name, port, **kw), "env": dict(env or {}),
            "env_file": "/etc/vllm-deploy/%s.env" % name,
            "unit_path": "/etc/systemd/system/vllm-%s.service" % name,
            "model_dir": kw.get("model", "/srv/models/tiny"), "active_state": state}


def listener(unit, pid=42, process="python3"):
    return {"address": "127.0.0.1", "pid": pid, "process": process, "unit": unit}


def test_nothing_to_do_is_idle():
    p = tx.plan([declared("one", 8220)], {"one": on_host("one", 8220)}, {},
                listeners={8220: [listener("vllm-one.service")]})
    assert p["idle"] and p["start"] == [] and p["stop"] == [] and p["errors"] == []
    assert p["changes"] == []


def test_only_the_changed_instance_restarts_and_the_change_is_named():
    decl = [declared("one", 8220), declared("two", 8221, extra=["--max-model-len", "1024"])]
    host = {"one": on_host("one", 8220), "two": on_host("two", 8221, extra=["--max-model-len", "2048"])}
    p = tx.plan(decl, host, {"two": ["unit"]})
    assert p["start"] == ["two"] and p["stop"] == ["two"] and p["write"] == ["two"]
    assert p["restore"] == ["two"] and p["restore_start"] == ["two"]
    assert p["changes"] == ["instance two: --max-model-len 2048 -> 1024"]


def test_environment_change_is_named_and_secrets_stay_hidden():
    decl = [declared("one", 8220, env={"VLLM_API_KEY": "s3cret", "X": "2"})]
    host = {"one": on_host("one", 8220, env={"VLLM_API_KEY": hs.REDACTED, "X": "1"})}
    p = tx.plan(decl, host, {"one": ["environment"]}, redact=hs.redact)
    assert p["changes"] == ["instance one: environment X=1 -> 2"]
    assert "s3cret" not in repr(p)


def test_secrets_the_template_adds_are_not_a_named_change():
    # the env file holds VLLM_API_KEY and HF_TOKEN besides the declared env
    decl = [declared("one", 8220, env={"X": "2"})]
    host = {"one": on_host("one", 8220, env={"VLLM_API_KEY": hs.REDACTED, "HF_TOKEN": hs.REDACTED,
                                             "X": "1"})}
    p = tx.plan(decl, host, {"one": ["environment"]}, redact=hs.redact)
    assert p["changes"] == ["instance one: environment X=1 -> 2"]
    # only a secret changed: the environment file changed, named without the value
    host["one"]["env"]["X"] = "2"
    p = tx.plan(decl, host, {"one": ["environment"]}, redact=hs.redact)
    assert p["changes"] == ["instance one: environment settings"] and p["start"] == ["one"]


def test_restart_all_restarts_every_instance():
    decl = [declared("one", 8220), declared("two", 8221)]
    host = {"one": on_host("one", 8220), "two": on_host("two", 8221)}
    p = tx.plan(decl, host, {}, restart_all=["new venv"])
    assert p["start"] == ["one", "two"] and p["stop"] == ["one", "two"]
    assert p["write"] == []


def test_new_weights_restart_only_the_instances_serving_them():
    # a swap of instance two to model B: B's weights are new, one serves A and keeps running
    decl = [declared("one", 8220, model="/srv/models/a"), declared("two", 8221, model="/srv/models/b")]
    host = {"one": on_host("one", 8220, model="/srv/models/a"),
            "two": on_host("two", 8221, model="/srv/models/a")}
    p = tx.plan(decl, host, {"two": ["unit"]}, restart={"two": ["new weights in /srv/models/b"]})
    assert p["start"] == ["two"] and p["stop"] == ["two"] and p["write"] == ["two"]
    assert p["changes"] == ["instance two: --model /srv/models/a -> /srv/models/b; "
                            "new weights in /srv/models/b"]
    # new weights in the directory both serve (a new revision): both restart, unchanged files
    p = tx.plan(decl[:1] + [declared("two", 8221, model="/srv/models/a")],
                {"one": host["one"], "two": host["two"]}, {},
                restart={"one": ["new weights"], "two": ["new weights"]})
    assert p["start"] == ["one", "two"] and p["write"] == []


def test_rename_split_frees_the_old_port_first_and_removes_the_old_instance():
    # main holds 8100; a takes 8100 and b 8102: main is stopped first, then removed
    decl = [declared("a", 8100), declared("b", 8102)]
    host = {"main": on_host("main", 8100)}
    p = tx.plan(decl, host, {}, listeners={8100: [listener("vllm-main.service")], 8102: []})
    assert p["errors"] == []
    assert p["new"] == ["a", "b"] and p["start"] == ["a", "b"] and p["write"] == ["a", "b"]
    assert p["remove"] == ["main"] and p["stop"] == ["main"]
    assert p["restore"] == ["main"] and p["restore_start"] == ["main"]
    assert any("instance main: no longer declared" in c for c in p["changes"])


def test_kept_undeclared_instance_keeps_its_port_and_gpus():
    decl = [declared("a", 8100, gpus=[0, 1])]
    host = {"main": on_host("main", 8100, gpus=[1, 2])}
    p = tx.plan(decl, host, {}, remove_undeclared=False,
                listeners={8100: [listener("vllm-main.service")]})
    assert p["keep"] == ["main"] and p["remove"] == [] and p["stop"] == []
    assert len(p["errors"]) == 2
    assert "port 8100 of instance a is held by the undeclared instance main" in p["errors"][0]
    assert "vllm_service_remove_undeclared is false" in p["errors"][0]
    assert "share GPU 1" in p["errors"][1]


def test_kept_instance_on_another_port_and_gpu_is_fine():
    decl = [declared("a", 8100, gpus=[0])]
    host = {"main": on_host("main", 8200, gpus=[1])}
    p = tx.plan(decl, host, {}, remove_undeclared=False, listeners={8100: []})
    assert p["errors"] == [] and p["keep"] == ["main"]
    assert any("kept running" in c for c in p["changes"])


def test_port_held_by_another_program_is_refused_naming_it():
    p = tx.plan([declared("one", 8220)], {}, {},
                listeners={8220: [listener("nginx.service", pid=7, process="nginx")]})
    assert p["errors"] == ["port 8220 of instance one is in use by another program: nginx "
                           "(pid 7, unit nginx.service) on 127.0.0.1; choose another port or "
                           "stop that program"]
    p = tx.plan([declared("one", 8220)], {}, {},
                listeners={"8220": [{"address": "0.0.0.0", "pid": None, "process": None,
                                     "unit": None}]})
    assert "a process this host cannot see" in p["errors"][0]


def test_own_port_is_not_a_conflict():
    p = tx.plan([declared("one", 8220)], {"one": on_host("one", 8220)}, {"one": ["unit"]},
                listeners={8220: [listener("vllm-one.service")]})
    assert p["errors"] == [] and p["start"] == ["one"]


def test_a_port_moving_between_declared_instances_is_freed_by_the_stop():
    # one moves 8220 -> 8222, two takes 8220: both restart, one frees 8220 first
    decl = [declared("one", 8222), declared("two", 8220)]
    host = {"one": on_host("one", 8220), "two": on_host("two", 8221)}
    p = tx.plan(decl, host, {"one": ["unit"], "two": ["unit"]},
                listeners={8220: [listener("vllm-one.service")], 8222: []})
    assert p["errors"] == [] and p["stop"] == ["one", "two"]


def test_an_instance_that_is_not_running_starts_and_is_not_restarted_by_a_rollback():
    p = tx.plan([declared("one", 8220)], {"one": on_host("one", 8220, state="failed")}, {})
    assert p["start"] == ["one"] and p["restore"] == ["one"] and p["restore_start"] == []
    assert p["changes"] == ["instance one: not running (failed)"]


def test_downtime_counts_from_the_stop_for_instances_that_served():
    down = tx.downtime(100.0, {"one": 130.25, "new": 140.0}, ["one", "new", "late"], ["one"])
    assert down == {"one": 30.2, "new": None, "late": None}
    assert tx.downtime(100.0, {"one": 99.0}, ["one"], ["one"]) == {"one": 0.0}


def test_argv_changes_describe_added_removed_and_reordered_flags():
    old = argv("one", 8220, extra=["--enforce-eager"])
    new = argv("one", 8220, extra=["--dtype", "bfloat16"])
    assert tx.argv_changes(old, new) == ["+--dtype bfloat16", "---enforce-eager"]
    assert tx.argv_changes(old, old) == []
    moved = old[:3] + old[5:7] + old[3:5] + old[7:]
    assert tx.argv_changes(old, moved) == ["argument order"]
    assert tx.argv_changes(["/a/python"] + old[1:], old)[0] == "interpreter /a/python -> %s" % PY


def test_host_state_reads_back_what_the_templates_write(tmp_path):
    env_file = tmp_path / "one.env"
    env_file.write_text("\n".join([systemd_env_line("VLLM_API_KEY", 'k"$y'),
                                   systemd_env_line("CUDA_VISIBLE_DEVICES", "0,1"),
                                   systemd_env_line("X", "a b")]) + "\n")
    args = argv("one", 8220, extra=["--chat-template", "{{ 100% $HOME }}"])
    unit = tmp_path / "vllm-one.service"
    unit.write_text("# managed\n%sone\n(profile cpu-tiny).\n[Service]\nEnvironmentFile=%s\n"
                    "ExecStart=%s\n" % (hs.MARKER, env_file, systemd_exec_args(args)))
    (tmp_path / "vllm-other.service").write_text("[Service]\nExecStart=/bin/true\n")
    os.symlink(str(unit), str(tmp_path / "vllm-link.service"))
    found = hs.read_instances(str(tmp_path))
    assert list(found) == ["one"]
    one = found["one"]
    assert one["argv"] == args and one["port"] == 8220 and one["gpus"] == [0, 1]
    assert one["env"] == {"VLLM_API_KEY": hs.REDACTED, "CUDA_VISIBLE_DEVICES": "0,1", "X": "a b"}
    assert one["model_dir"] == "/srv/models/tiny" and one["served_model_name"] == "one"
    assert one["env_file"] == str(env_file) and one["unit_path"] == str(unit)


def test_gpu_set_and_show_parsing():
    assert hs.gpu_set("0, 2") == [0, 2] and hs.gpu_set("") is None and hs.gpu_set("GPU-x") is None
    assert hs.parse_show("ActiveState=active\nMainPID=42\n") == {"ActiveState": "active",
                                                                 "MainPID": "42"}


def test_running_as_declared_only_the_instances_the_host_runs_unchanged():
    from ansible_collections.vllm_ops.deploy.plugins.filter.vllm_instances import (
        vllm_running_as_declared)
    decl = [declared("one", 8220), declared("two", 8221, extra=["--enforce-eager"]),
            declared("three", 8222)]
    host = {"one": on_host("one", 8220), "two": on_host("two", 8221),
            "three": on_host("three", 8222, state="failed")}
    assert [d["name"] for d in vllm_running_as_declared(decl, host)] == ["one"]
    assert vllm_running_as_declared(decl, {}) == []


def test_supported_os_list_is_bookworm_jammy_noble_with_their_pythons():
    import yaml
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.dirname(os.path.abspath(__file__)))))))
    with open(os.path.join(root, "roles", "host_prep", "defaults", "main.yml")) as f:
        supported = yaml.safe_load(f)["host_prep_supported_os"]
    assert supported == [{"distribution": "Debian", "version": "12", "python": "3.11"},
                         {"distribution": "Ubuntu", "version": "22.04", "python": "3.10"},
                         {"distribution": "Ubuntu", "version": "24.04", "python": "3.12"}]
    # trixie (Debian 13, Python 3.13) has no torch wheels of the pinned CPU build: refused
    assert not any(o["distribution"] == "Debian" and o["version"] == "13" for o in supported)
