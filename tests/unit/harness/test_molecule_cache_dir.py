"""Every molecule scenario reaches its test hosts with the key of the harness's cache,
$VD_CACHE_DIR (tests/harness/testhost.py): one setting, no literal cache path in a scenario."""
import glob
import os
import subprocess
import sys

import yaml
from molecule.interpolation import Interpolator, TemplateWithDefaults

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def harness_key(env):
    """The key testhost.py makes and installs in the hosts, under this environment."""
    code = "import sys; sys.path.insert(0, 'tests/harness'); import testhost; print(testhost.KEY)"
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True,
                          capture_output=True, text=True).stdout.strip()


def molecule_key(env):
    """private_key_file of the ansible.cfg molecule writes, interpolated the way molecule does."""
    with open(os.path.join(ROOT, ".config", "molecule", "config.yml")) as f:
        text = Interpolator(TemplateWithDefaults, env).interpolate(f.read())
    return yaml.safe_load(text)["provisioner"]["config_options"]["defaults"]["private_key_file"]


def test_the_key_follows_vd_cache_dir(tmp_path):
    base = {k: v for k, v in os.environ.items() if k != "VD_CACHE_DIR"}
    other = dict(base, VD_CACHE_DIR=str(tmp_path / "cache"))
    assert molecule_key(other) == harness_key(other) == str(tmp_path / "cache" / "ssh" / "id_ed25519")
    assert molecule_key(base) == harness_key(base) == "/var/cache/vllm-deploy/ssh/id_ed25519"


def test_no_scenario_names_a_cache_path_or_key():
    files = [p for p in glob.glob(os.path.join(ROOT, "molecule", "**", "*.yml"), recursive=True)
             if not p.endswith("harness.yml")]  # written per machine by the create step
    assert len(files) > 20
    for path in files:
        with open(path) as f:
            text = f.read()
        rel = os.path.relpath(path, ROOT)
        assert "ansible_ssh_private_key_file" not in text, rel
        # a default for the env lookup is fine; a path that ignores VD_CACHE_DIR is not
        for line in text.splitlines():
            if "/var/cache/vllm-deploy" in line:
                assert "lookup('ansible.builtin.env', 'VD_CACHE_DIR'" in line, (rel, line)
