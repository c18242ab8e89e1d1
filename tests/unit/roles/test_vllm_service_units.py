"""Render the vllm_service unit and environment file for EVERY shipped profile with jinja2 and
the role's filters, and check each unit with `systemd-analyze verify` (no warnings allowed).

The interpreter path in ExecStart points at a stub executable in a temp dir: verify checks that
ExecStart's binary exists and is executable, which the real venv path is not on this machine.
"""
import os
import re
import shutil
import subprocess

import jinja2
import pytest
import yaml

from ansible_collections.vllm_ops.deploy.plugins.filter import systemd as systemd_filters
from ansible_collections.vllm_ops.deploy.plugins.filter import vllm_instances as instance_filters
from ansible_collections.vllm_ops.deploy.plugins.module_utils.host import vllm_unit_path as unit_path
from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.service.profiles import (
    known_profiles, load_profile)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
ROLE = os.path.join(ROOT, "roles", "vllm_service")
PROFILES = sorted(known_profiles())

needs_systemd = pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                                   reason="systemd-analyze not installed")


# The templates call the collection's filters by FQCN, as Ansible resolves them.
FILTERS = {}
for _mod in (systemd_filters, instance_filters):
    FILTERS.update(("vllm_ops.deploy." + k, v) for k, v in _mod.FilterModule().filters().items())


def load_profiles():
    return {name: load_profile(name) for name in PROFILES}


def role_defaults():
    with open(os.path.join(ROLE, "defaults", "main.yml")) as f:
        d = yaml.safe_load(f)
    # Values that are templates in defaults/main.yml, as the shared role vllm_deploy sets them.
    d.update(vllm_service_user="vllm", vllm_service_group="vllm",
             vllm_service_home="/var/lib/vllm", vllm_service_config_dir="/etc/vllm-deploy",
             ansible_managed="Ansible managed: test render")
    return d


def render(template, **variables):
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(os.path.join(ROLE, "templates")),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters.update(FILTERS)
    env.filters["bool"] = bool
    return env.get_template(template).render(**variables)


def resolve(profile, python, **over):
    inst = dict(name="main", port=8000, host="0.0.0.0", profile=profile, profile_overrides={},
                model_dir="/srv/models/" + profile, served_model_name="", args=[],
                extra_args=[], env={}, cuda_visible_devices="", python=python,
                home="/var/lib/vllm")
    inst.update(over)
    out = FILTERS["vllm_ops.deploy.vllm_resolve_instances"]([], inst)
    assert out["errors"] == []
    return out["instances"][0]


def render_pair(tmp_path, profile, **extra_vars):
    stub = tmp_path / "venv" / "bin" / "python"
    stub.parent.mkdir(parents=True, exist_ok=True)
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    ninja = stub.parent / "ninja"  # a tool that exists only in the venv
    ninja.write_text("#!/bin/sh\nexit 0\n")
    ninja.chmod(0o755)
    reap = tmp_path / "vllm-reap-leftovers"  # stands in for the role's helper (files/)
    reap.write_text("#!/bin/sh\nexit 0\n")
    reap.chmod(0o755)
    inst = resolve(profile, str(stub))
    variables = role_defaults()
    variables.update(_vllm_service_reap_script=str(reap))
    paths = {inst["name"]: unit_path.build(str(stub), ["ninja"])["path"]}
    variables.update(_vllm_service_inst=inst, _vllm_service_paths=paths,
                     vllm_service_api_key="canary-api-key-0123",
                     vllm_service_hf_token="hf_canaryTOKENcanaryTOKEN0123")
    variables.update(extra_vars)
    unit = render("vllm.service.j2", **variables)
    envfile = render("vllm.env.j2", **variables)
    path = tmp_path / inst["unit"]
    path.write_text(unit)
    return inst, path, unit, envfile


def verify(path):
    return subprocess.run(["systemd-analyze", "verify", "--man=no", "--generators=no",
                           str(path)], capture_output=True, text=True, timeout=60, check=False)


def directives(unit):
    out = {}
    for line in unit.splitlines():
        if "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            out.setdefault(key, []).append(value)
    return out


def test_every_profile_is_covered():
    assert "cpu-tiny" in PROFILES and len(PROFILES) >= 7


@needs_systemd
@pytest.mark.parametrize("profile", PROFILES)
def test_unit_of_every_profile_passes_systemd_analyze_verify(tmp_path, profile):
    _inst, path, _unit, _env = render_pair(tmp_path, profile)
    done = verify(path)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "", done.stderr  # unknown keys are only warnings: none allowed


@needs_systemd
def test_verify_catches_a_broken_unit(tmp_path):
    """The check above can fail: a misspelt directive or missing binary is reported."""
    _inst, path, unit, _env = render_pair(tmp_path, "cpu-tiny")
    path.write_text(unit.replace("KillMode=control-group", "KilMode=control-group"))
    assert "Unknown key" in verify(path).stderr
    path.write_text(unit.replace(str(tmp_path), "/nonexistent"))
    assert verify(path).returncode != 0


@pytest.mark.parametrize("profile", PROFILES)
def test_unit_hardening(tmp_path, profile):
    inst, _path, unit, _env = render_pair(tmp_path, profile)
    d = directives(unit)
    assert d["Type"] == ["exec"]
    assert d["User"] == ["vllm"] and d["Group"] == ["vllm"]
    # HOME, then a PATH that starts with the venv's bin/ (vLLM runs ninja/nvcc by name)
    assert d["Environment"][0] == "HOME=/var/lib/vllm"
    assert len(d["Environment"]) == 2 and d["Environment"][1].startswith('"PATH=')
    path = d["Environment"][1].strip('"')[len("PATH="):].split(":")
    assert path[0] == os.path.dirname(inst["argv"][0])
    assert path[-6:] == list(unit_path.SYSTEM_PATH)
    assert d["EnvironmentFile"] == ["/etc/vllm-deploy/main.env"]
    assert d["KillMode"] == ["control-group"]
    assert int(d["TimeoutStartSec"][0]) >= 1800
    assert int(d["TimeoutStopSec"][0]) >= 60
    assert d["Restart"] == ["on-failure"]
    assert int(d["StartLimitBurst"][0]) >= 1 and int(d["StartLimitIntervalSec"][0]) > 0
    assert int(d["LimitNOFILE"][0]) >= 65535
    gpu = load_profiles()[profile]["gpu"]["required"]
    assert ("nvidia-persistenced.service" in d["After"][0]) == gpu
    # no hardening option that breaks vLLM (RestrictAddressFamilies, IPAddressDeny, ProtectClock)
    for bad in ("RestrictAddressFamilies", "IPAddressDeny", "ProtectClock"):
        assert bad not in d
    # secrets stay out of the unit
    assert "canary" not in unit.lower()
    # Before each start, as root, the helper stops what an earlier start left in the cgroup
    assert d["ExecStartPre"] == ["+" + str(_path.parent / "vllm-reap-leftovers")]
    assert unit.index("ExecStartPre=") < unit.index("ExecStart=")
    # ExecStart carries the rendered argv, each argument quoted
    assert d["ExecStart"][0].startswith('"%s" "-m" "vllm.entrypoints.openai.api_server"'
                                        % inst["argv"][0])


@pytest.mark.parametrize("profile", PROFILES)
def test_environment_file(tmp_path, profile):
    inst, _path, _unit, envfile = render_pair(tmp_path, profile)
    lines = [ln for ln in envfile.splitlines() if ln and not ln.startswith("#")]
    env = dict(re.match(r'^([A-Za-z_][A-Za-z0-9_]*)="(.*)"$', ln).groups() for ln in lines)
    assert env["VLLM_API_KEY"] == "canary-api-key-0123"
    assert env["HF_TOKEN"] == "hf_canaryTOKENcanaryTOKEN0123"
    for key in ("VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "XDG_CACHE_HOME",
                "FLASHINFER_WORKSPACE_BASE", "TORCHINDUCTOR_CACHE_DIR"):
        assert env[key].startswith("/var/lib/vllm/.cache")
    assert env["HF_HUB_OFFLINE"] == "1"
    for key, value in load_profiles()[profile]["env"].items():
        assert env[key] == str(value)


def test_no_secret_lines_without_secrets(tmp_path):
    _inst, _path, _unit, envfile = render_pair(tmp_path, "cpu-tiny", vllm_service_api_key="",
                                               vllm_service_hf_token="")
    assert "VLLM_API_KEY" not in envfile and "HF_TOKEN" not in envfile


@needs_systemd
def test_two_instances_render_two_valid_units(tmp_path):
    stub = tmp_path / "python"
    stub.write_text("#!/bin/sh\n")
    stub.chmod(0o755)
    defaults = dict(name="main", port=8000, host="127.0.0.1", profile="minimax-m2.5-tp4",
                    profile_overrides={}, model_dir="/srv/models/m", served_model_name="",
                    args=[], extra_args=[], env={}, cuda_visible_devices="",
                    python=str(stub), home="/var/lib/vllm")
    out = FILTERS["vllm_ops.deploy.vllm_resolve_instances"](
        [{"name": "a", "port": 8001, "cuda_visible_devices": "0,1,2,3"},
         {"name": "b", "port": 8002, "cuda_visible_devices": "4,5,6,7"}],
        defaults, [], 8)
    assert out["errors"] == []
    for inst in out["instances"]:
        variables = role_defaults()
        variables.update(_vllm_service_inst=inst, vllm_service_api_key="",
                         vllm_service_hf_token="", _vllm_service_reap_script=str(stub),
                         _vllm_service_paths={inst["name"]: "%s:/usr/bin:/bin" % tmp_path})
        path = tmp_path / inst["unit"]
        path.write_text(render("vllm.service.j2", **variables))
        done = verify(path)
        assert done.returncode == 0 and done.stderr == "", done.stderr
        assert "EnvironmentFile=/etc/vllm-deploy/%s.env" % inst["name"] in path.read_text()
    assert [i["env"]["CUDA_VISIBLE_DEVICES"] for i in out["instances"]] == ["0,1,2,3", "4,5,6,7"]
