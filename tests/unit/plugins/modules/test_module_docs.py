"""Every module's DOCUMENTATION, EXAMPLES and RETURN parse as YAML (ansible-doc and
ansible-lint refuse a module whose documentation does not), and DOCUMENTATION names the module
and documents at least one option."""
import ast
import os

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
MODULES = os.path.join(ROOT, "plugins", "modules")
NAMES = sorted(f[:-3] for f in os.listdir(MODULES) if f.endswith(".py") and not f.startswith("_"))


def doc_strings(path):
    tree = ast.parse(open(path).read(), path)
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                isinstance(node.targets[0], ast.Name) and \
                node.targets[0].id in ("DOCUMENTATION", "EXAMPLES", "RETURN"):
            out[node.targets[0].id] = node.value.value
    return out


def test_there_are_modules():
    assert "vllm_sweep" in NAMES and len(NAMES) >= 5


@pytest.mark.parametrize("name", NAMES)
def test_module_documentation_parses(name):
    docs = doc_strings(os.path.join(MODULES, name + ".py"))
    assert set(docs) == {"DOCUMENTATION", "EXAMPLES", "RETURN"}, sorted(docs)
    doc = yaml.safe_load(docs["DOCUMENTATION"])
    assert doc["module"] == name
    assert doc.get("options"), "no options documented"
    for option, spec in doc["options"].items():
        assert spec.get("description"), "%s has no description" % option
    assert isinstance(yaml.safe_load(docs["EXAMPLES"]), list)
    yaml.safe_load(docs["RETURN"])


def test_modules_declare_their_attributes_as_ansible_doc_shows_them():
    """Documentation as ansible-doc renders it (fragments of plugins/doc_fragments resolved):
    every module states check_mode and diff_mode support and where it runs, and its examples
    call it by its FQCN."""
    import json
    import subprocess
    import sys
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"))
    out = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-doc"), "--json",
                          "-t", "module"] + ["vllm_ops.deploy." + n for n in NAMES],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
                         check=True)
    docs = json.loads(out.stdout)
    assert sorted(docs) == ["vllm_ops.deploy." + n for n in NAMES]
    for fqcn, doc in docs.items():
        attrs = doc["doc"]["attributes"]
        assert attrs["check_mode"]["support"] in ("full", "partial", "none"), fqcn
        assert attrs["diff_mode"]["support"] in ("full", "partial", "none"), fqcn
        assert "platform" in attrs, fqcn
        assert attrs["check_mode"]["description"], fqcn  # from the shared fragment
        examples = yaml.safe_load(doc["examples"])
        short = fqcn.rsplit(".", 1)[1]
        assert any(fqcn in task for task in examples), fqcn
        assert not any(short in task or "ansible.legacy." + short in task for task in examples)
        assert doc["doc"]["author"] == ["vllm-deploy contributors (@vllm-ops)"]
    # modules that change something say what in diff mode
    for name in ("flashinfer_reconcile", "hf_model_download", "vllm_report"):
        assert docs["vllm_ops.deploy." + name]["doc"]["attributes"]["diff_mode"]["support"] == "full"
