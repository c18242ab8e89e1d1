"""The generated documentation stays equal to its sources.

docs/reference/variables.md is generated from roles/*/meta/argument_specs.yml by
tools/docs/gen_variables.py; the filter plugins' documentation (plugins/filter/<name>.yml)
is read by ansible-doc. Both are checked here against what the code declares.
"""
import importlib.util
import json
import os
import subprocess
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
COMMITTED = os.path.join(ROOT, "docs", "reference", "variables.md")


def _generator():
    spec = importlib.util.spec_from_file_location(
        "gen_variables", os.path.join(ROOT, "tools", "docs", "gen_variables.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_variables_reference_is_generated_from_the_argument_specs(tmp_path):
    out = tmp_path / "variables.md"
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "docs", "gen_variables.py"),
                    "--out", str(out)], check=True, capture_output=True)
    with open(COMMITTED) as fh:
        committed = fh.read()
    assert out.read_text() == committed, (
        "docs/reference/variables.md differs from roles/*/meta/argument_specs.yml: run make docs")


def test_every_role_variable_is_in_the_reference_with_its_default():
    with open(COMMITTED) as fh:
        rows = [line for line in fh if line.startswith("| `")]
    by_name = {line.split("`")[1]: line for line in rows}
    roles_dir = os.path.join(ROOT, "roles")
    seen = 0
    for role in sorted(os.listdir(roles_dir)):
        path = os.path.join(roles_dir, role, "meta", "argument_specs.yml")
        if not os.path.exists(path):
            continue
        with open(path) as fh:
            specs = yaml.safe_load(fh)["argument_specs"]
        for ep in specs.values():
            for name, spec in (ep.get("options") or {}).items():
                assert name in by_name, "%s (role %s) missing: run make docs" % (name, role)
                if "default" in spec and isinstance(spec["default"], (bool, int, float)):
                    assert "`%s`" % json.dumps(spec["default"]) in by_name[name], name
                seen += 1
    assert seen > 100


def test_generator_renders_types_choices_secrets_and_markup(tmp_path):
    role = tmp_path / "roles" / "demo_role" / "meta"
    role.mkdir(parents=True)
    role.joinpath("argument_specs.yml").write_text(yaml.safe_dump({"argument_specs": {
        "main": {"short_description": "A role.", "options": {
            "demo_role_mode": {"type": "str", "default": "a", "choices": ["a", "b"],
                               "description": ["Pick C(a) or I(b).", "A | in text."]},
            "demo_role_list": {"type": "list", "elements": "int", "default": [1, 2],
                               "description": "Levels."},
            "demo_role_token": {"type": "str", "default": "", "no_log": True,
                                "description": "A token."},
            "demo_role_host": {"type": "str", "required": True, "description": "Host."}}},
        "assert": {"short_description": "Check.", "options": {}}}}, sort_keys=False))
    text = _generator().render(str(tmp_path))
    assert "## demo_role" in text
    assert "Entry points: `main`, `assert`." in text
    assert ("| `demo_role_mode` | str | `\"a\"` | `\"a\"`, `\"b\"` | Pick `a` or `b`. A \\| in"
            " text. |") in text
    assert "| `demo_role_list` | list of int | `[1, 2]` |  | Levels. |" in text
    assert "A token. (secret: never logged)" in text
    assert "| `demo_role_host` | str | required |" in text


def _filter_names():
    names = []
    filter_dir = os.path.join(ROOT, "plugins", "filter")
    sys.path.insert(0, os.path.join(ROOT, "collections"))
    for fname in sorted(os.listdir(filter_dir)):
        if fname.endswith(".py"):
            mod = importlib.import_module(
                "ansible_collections.vllm_ops.deploy.plugins.filter." + fname[:-3])
            names += list(mod.FilterModule().filters())
    return names


def _ansible_doc(*args):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-doc")]
                          + list(args), cwd=ROOT, env=env, capture_output=True, text=True)


def test_ansible_doc_lists_and_renders_every_filter():
    names = _filter_names()
    assert len(names) == len(set(names)) >= 31
    listed = _ansible_doc("-t", "filter", "-l", "vllm_ops.deploy", "--json")
    assert listed.returncode == 0, listed.stderr
    assert sorted(json.loads(listed.stdout)) == sorted("vllm_ops.deploy." + n for n in names)
    rendered = _ansible_doc("-t", "filter", "--json", *["vllm_ops.deploy." + n for n in names])
    assert rendered.returncode == 0, rendered.stderr
    docs = json.loads(rendered.stdout)
    for name in names:
        doc = docs["vllm_ops.deploy." + name]
        assert doc["doc"]["name"] == name
        assert doc["doc"]["short_description"]
        assert "_input" in doc["doc"]["options"] or doc["doc"].get("positional")
        assert doc["examples"] and "vllm_ops.deploy." + name in doc["examples"]
        assert doc["return"]["_value"]["description"]
