"""Every role has argument specs that cover its defaults and agree with them: each variable
of defaults/main.yml is documented for the role's main and assert entry points (other entry
points, task files included by other roles, document their own inputs), and where the spec states a
default it is the value defaults/main.yml sets (templates in defaults are not compared)."""
import os

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
ROLES = sorted(d for d in os.listdir(os.path.join(ROOT, "roles"))
               if os.path.isdir(os.path.join(ROOT, "roles", d)))


def load(role, *parts):
    path = os.path.join(ROOT, "roles", role, *parts)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return yaml.safe_load(f)


def test_the_roles_and_their_shared_defaults():
    assert "vllm_deploy" in ROLES and len(ROLES) == 11  # with vllm_monitoring, vllm_tune, vllm_router
    for role in ROLES:
        deps = (load(role, "meta", "main.yml") or {}).get("dependencies") or []
        if role == "vllm_deploy":
            assert deps == []
        else:  # every other role gets the shared settings from vllm_deploy
            assert {"role": "vllm_ops.deploy.vllm_deploy"} in deps, role


@pytest.mark.parametrize("role", ROLES)
def test_argument_specs_cover_and_agree_with_the_defaults(role):
    specs = load(role, "meta", "argument_specs.yml")["argument_specs"]
    assert "main" in specs
    if os.path.exists(os.path.join(ROOT, "roles", role, "tasks", "assert.yml")):
        assert "assert" in specs, "%s: tasks/assert.yml has no entry point" % role
    defaults = load(role, "defaults", "main.yml") or {}
    for entry, spec in specs.items():
        options = spec.get("options") or {}
        if entry in ("main", "assert"):  # the role's own entry points use all its defaults
            missing = sorted(set(defaults) - set(options))
            assert not missing, "%s %s: undocumented %s" % (role, entry, missing)
        for name, opt in options.items():
            assert opt.get("description"), "%s: %s has no description" % (role, name)
            assert name.startswith(role + "_"), "%s: %s lacks the role prefix" % (role, name)
            value = defaults.get(name)
            if "default" in opt and not (isinstance(value, str) and "{{" in value):
                assert opt["default"] == value, "%s: %s spec default %r, defaults/main.yml %r" % (
                    role, name, opt["default"], value)
            if isinstance(value, str) and "{{" in value:
                assert "default" not in opt, "%s: %s is a template in defaults" % (role, name)
