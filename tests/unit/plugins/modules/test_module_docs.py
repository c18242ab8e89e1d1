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
