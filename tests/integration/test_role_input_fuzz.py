"""No internal error reaches a user from a role's checks: every role's argument spec is fed
type-valid but semantically wrong values, and every refusal must name a variable.

One ansible-playbook run (connection local: the "host" is this machine; the checks only read)
includes each role's tasks/assert.yml (the entry point the validation play of deploy.yml
uses) once with good values, which must pass, then once per variable with that variable set
to a wrong value of its declared type:

* int -7, float -0.5, str/path with choices: a value outside them, path "relative/../dir",
  str "bad value/../ with spaces", list of int [-1], list of str/path ["bad value/../ x"],
  list of dict [{"bogus key": -1}], dict {"bogus key": -1};
* bool and raw options are not fed: a bool has no type-valid wrong value, and raw has no
  declared type to stay within.

Only variables the checks read are fed (named in the role's tasks/assert.yml, the task files
it imports, or its vars/main.yml): feeding the others shows nothing about the checks.
A wrong value may be accepted (some are legal: a str that holds any name); each refusal must
name a variable of the collection and must not carry an internal error (a Jinja attribute or
type error, a Python traceback, an undefined variable).
"""
import json
import os
import re
import subprocess
import sys

import pytest
import yaml

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)
HF = {"model_weights_source": "hf", "model_weights_repo_id": "demo/tiny-llama",
      "model_weights_revision": "main",
      # no Hub answers here; hf_model_info's remote part has its own tests
      "model_weights_validate_remote": False}
# (role, variables of its good baseline besides GOOD): model_weights twice, for the checks of
# a local copy and those of a Hub download.
ROLES = [("host_prep", {}), ("gpu_host", {}), ("vllm_install", {}), ("model_weights", {}),
         ("model_weights", HF), ("vllm_service", {}), ("vllm_benchmark", {}),
         ("vllm_monitoring", {}), ("ray_cluster", {}), ("vllm_tune", {})]
INTERNAL = re.compile(r"object of type|has no attribute|Traceback|is undefined|NoneType|"
                      r"unsupported operand|KeyError|TypeError|AttributeError|"
                      r"not JSON serializable|recursive loop", re.I)
GOOD = {
    "ansible_connection": "local",
    "ansible_python_interpreter": sys.executable,
    "vllm_install_cpu_version": "0.32.0",
    "model_weights_source": "local",
    "model_weights_local_dir": os.path.join(ROOT, "tests", "fixtures", "tiny-model-config"),
    "model_weights_name": "tiny",
    "vllm_service_profile": "cpu-tiny",
    "vllm_service_port": 8999,
    "vllm_service_model_dir": "/srv/models/tiny",
    "vllm_monitoring_enabled": True,
    "vllm_monitoring_server": "fuzzhost",
    "vllm_monitoring_vllm_hosts": ["fuzzhost"],
    "ray_cluster_node_ip": "10.213.0.2",
}


def wrong_value(opt):
    t = opt.get("type", "str")
    if opt.get("choices"):
        return "not-one-of-the-choices"
    if t == "int":
        return -7
    if t == "float":
        return -0.5
    if t == "path":
        return "relative/../dir"
    if t == "str":
        return "bad value/../ with spaces"
    if t == "dict":
        return {"bogus key": -1}
    if t == "list":
        return {"int": [-1], "float": [-1.0], "dict": [{"bogus key": -1}]}.get(
            opt.get("elements", "str"), ["bad value/../ x"])
    return None  # bool, raw


def read_by_checks(role):
    text = ""
    tasks = os.path.join(ROOT, "roles", role, "tasks")
    with open(os.path.join(tasks, "assert.yml")) as f:
        text += f.read()
    for name in re.findall(r"(?:import|include)_tasks:\s*(\S+\.yml)", text):
        with open(os.path.join(tasks, name)) as f:
            text += f.read()
    vars_main = os.path.join(ROOT, "roles", role, "vars", "main.yml")
    if os.path.exists(vars_main):
        with open(vars_main) as f:
            text += f.read()
    return text


def cases():
    out, known = [], set()
    for role, base in ROLES:
        with open(os.path.join(ROOT, "roles", role, "meta", "argument_specs.yml")) as f:
            options = yaml.safe_load(f)["argument_specs"]["assert"]["options"]
        known.update(options)
        text = read_by_checks(role)
        out.append((role, base, None, None))  # the baseline: must pass
        for name, opt in sorted(options.items()):
            value = wrong_value(opt)
            if value is not None and name not in base and re.search(r"\b%s\b" % re.escape(name), text):
                out.append((role, base, name, value))
    with open(os.path.join(ROOT, "roles", "vllm_deploy", "defaults", "main.yml")) as f:
        known.update(yaml.safe_load(f))
    return out, known


RECORD = "{{ _fuzz | default([]) + [{'role': _role, 'var': _var, 'failed': %s, 'msg': %s}] }}"
MSG = ("((ansible_failed_result.msg | default('') | string) ~ ' ' ~ (ansible_failed_result.results"
       " | default([]) | selectattr('failed', 'defined') | selectattr('failed')"
       " | map(attribute='msg') | map('string') | join(' | ')))")


def playbook(all_cases, out_file):
    tasks = []
    for i, (role, base, var, value) in enumerate(all_cases):
        include = {"name": "Checks of %s, %s" % (role, var or "good values"),
                   "ansible.builtin.include_role": {"name": "vllm_ops.deploy." + role,
                                                    "tasks_from": "assert"},
                   "vars": dict(base, **({var: value} if var else {}))}
        tasks.append({
            "name": "Case %d" % i,
            "vars": {"_role": role, "_var": var},
            "block": [include, {"name": "Record a pass",
                                "ansible.builtin.set_fact": {"_fuzz": RECORD % ("false", "''")}}],
            "rescue": [{"name": "Record a refusal",
                        "ansible.builtin.set_fact": {"_fuzz": RECORD % ("true", MSG)}}],
        })
    tasks.append({"name": "Write the results", "ansible.builtin.copy": {
        "content": "{{ _fuzz | to_json }}", "dest": out_file, "mode": "0644"}})
    return [{"name": "Feed wrong values to each role's checks", "hosts": "fuzzhost",
             "gather_facts": False, "tasks": tasks}]


def test_every_refusal_names_a_variable_and_no_internal_error(tmp_path):
    model = os.path.join(ROOT, "tests", "fixtures", "tiny-model-config")
    os.makedirs(model, exist_ok=True)
    with open(os.path.join(model, "config.json"), "w") as f:
        f.write('{"architectures": ["LlamaForCausalLM"]}\n')
    all_cases, known = cases()
    results = str(tmp_path / "results.json")
    (tmp_path / "play.yml").write_text(yaml.safe_dump(playbook(all_cases, results)))
    inv = {"all": {"children": {
        "vllm_hosts": {"hosts": {"fuzzhost": GOOD}},
        "vllm_ray_head": {"hosts": {"fuzzhost": None}},
        "vllm_monitoring": {"hosts": {"fuzzhost": None}}}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inv))
    out = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", str(tmp_path / "hosts.yml"),
                          str(tmp_path / "play.yml")], cwd=ROOT, capture_output=True, text=True,
                         timeout=1200, check=False,
                         env=dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"),
                                  ANSIBLE_NOCOLOR="1"))
    assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-3000:]
    with open(results) as f:
        got = json.load(f)
    assert [(r["role"], r["var"]) for r in got] == [(c[0], c[2]) for c in all_cases]
    baseline_failed = [r for r in got if r["var"] is None and r["failed"]]
    assert not baseline_failed, baseline_failed
    names = re.compile(r"\b(%s)\b" % "|".join(sorted(map(re.escape, known), key=len, reverse=True)))
    bad = []
    for r in got:
        if not r["failed"]:
            continue
        if not names.search(r["msg"]):
            bad.append("%s %s: names no variable: %s" % (r["role"], r["var"], r["msg"][:600]))
        elif INTERNAL.search(r["msg"]):
            bad.append("%s %s: internal error: %s" % (r["role"], r["var"], r["msg"][:600]))
    refused = sum(1 for r in got if r["var"] and r["failed"])
    fed = sum(1 for r in got if r["var"])
    print("fed %d wrong values to %d roles' checks: %d refused, %d accepted"
          % (fed, len(set(r for r, _b in ROLES)), refused, fed - refused))
    assert not bad, "\n".join(bad)
