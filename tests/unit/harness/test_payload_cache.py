"""tests/harness/ansible_plugins/callback/vd_payload_cache.py: module payloads kept between
ansible-playbook runs, keyed by their sources, and equal to the ones Ansible builds."""
import base64
import importlib.util
import io
import json
import marshal
import os
import subprocess
import sys
import zipfile

from ansible.executor import module_common

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PLUGIN_DIR = os.path.join(ROOT, "tests", "harness", "ansible_plugins", "callback")
sys.path.insert(0, PLUGIN_DIR)
import vd_payload_cache as pc  # noqa: E402

OWN = os.path.join(ROOT, "collections", "ansible_collections", "vllm_ops", "deploy")
GPU_FACTS = os.path.join(OWN, "plugins", "modules", "gpu_facts.py")
STAT = os.path.join(os.path.dirname(module_common.__file__), "..", "modules", "stat.py")


# Builds run in a child process: Ansible's collection loader is installed process-wide there.
BUILDER = r"""
import base64, hashlib, io, json, os, sys, zipfile
sys.path.insert(0, sys.argv[1])
from ansible.executor import module_common
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.loader import init_plugin_loader
from ansible.template import Templar
init_plugin_loader([sys.argv[2]])
import vd_payload_cache as pc
calls = []
real_finder = module_common.recursive_finder
def counting(*a, **kw):
    calls.append(a[1])
    return real_finder(*a, **kw)
module_common.recursive_finder = counting
mode, out, zips = sys.argv[3], [], []
if mode in ("cache", "source"):
    pc.install(sys.argv[4], bytecode=mode == "cache")
else:
    module_common.C.DEFAULT_LOCAL_TMP = sys.argv[4]
for spec in sys.argv[5:]:
    name, path = spec.split("=", 1)
    built = module_common._find_module_utils(
        module_name=name, b_module_data=open(path, "rb").read(), module_path=path, module_args={},
        task_vars={"ansible_python_interpreter": "/usr/bin/python3"}, templar=Templar(loader=DataLoader()), module_compression="ZIP_DEFLATED",
        async_timeout=0, become_plugin=None, environment={})
    text = built.b_module_data.decode()
    blob = max((p for p in text.replace('"', "'").split("'") if len(p) > 1000), key=len)
    with zipfile.ZipFile(io.BytesIO(base64.b64decode(blob))) as z:
        out.append({n: hashlib.sha256(z.read(n)).hexdigest() for n in z.namelist()})
        zips.append(base64.b64encode(z.fp.getvalue()).decode())
print(json.dumps({"payloads": out, "built": len(calls), "zips": zips}))
"""


def build(mode, directory, *specs):
    """Each NAME=PATH built in one child process (one ansible-playbook run, as far as Ansible's
    caches go): the zip members' hashes of each payload and how many were built from source."""
    out = subprocess.run([sys.executable, "-c", BUILDER, PLUGIN_DIR, os.path.join(ROOT, "collections"),
                          mode, str(directory)] + list(specs),
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_kept_payload_is_built_once_and_holds_what_ansible_builds_and_its_bytecode(tmp_path):
    base = tmp_path / "cache"
    first = build("cache", base, "gpu_facts=" + GPU_FACTS, "stat=" + STAT)
    assert first["built"] == 2
    # a second run reads both kept payloads: nothing is built from source
    again = build("cache", base, "gpu_facts=" + GPU_FACTS, "stat=" + STAT)
    assert again["built"] == 0
    assert again["payloads"] == first["payloads"]
    assert any(n.endswith("vllm_ops/deploy/plugins/module_utils/host/gpu_facts.py")
               for n in first["payloads"][0]), sorted(first["payloads"][0])
    assert len(os.listdir(str(base))) == 2  # one directory per module's sources
    # Ansible alone, its per-run cache in a fresh directory, builds the same files, byte for
    # byte; the kept payload adds, beside each Python source, its bytecode and nothing else
    plain = build("plain", tmp_path / "fresh", "gpu_facts=" + GPU_FACTS, "stat=" + STAT)
    assert plain["built"] == 2
    for kept, built, blob in zip(first["payloads"], plain["payloads"], first["zips"]):
        assert {n: h for n, h in kept.items() if not n.endswith(".pyc")} == built
        sources = [n for n in built if n.endswith(".py")]
        assert sorted(n for n in kept if n.endswith(".pyc")) == sorted(n + "c" for n in sources)
        with zipfile.ZipFile(io.BytesIO(base64.b64decode(blob))) as z:
            for n in sources:
                pyc = z.read(n + "c")
                assert pyc[:4] == importlib.util.MAGIC_NUMBER
                assert pyc[8:16] == importlib.util.source_hash(z.read(n))
                assert marshal.loads(pyc[16:]) == compile(z.read(n), n, "exec", dont_inherit=True)
    assert pc.payload_key(STAT) != pc.payload_key(GPU_FACTS)


def test_without_bytecode_a_kept_payload_is_the_one_ansible_builds(tmp_path):
    base = tmp_path / "cache"
    kept = build("source", base, "gpu_facts=" + GPU_FACTS)
    plain = build("plain", tmp_path / "fresh", "gpu_facts=" + GPU_FACTS)
    assert kept["payloads"] == plain["payloads"]
    assert not any(n.endswith(".pyc") for n in kept["payloads"][0])
    # kept apart from the payloads with bytecode
    assert build("cache", base, "gpu_facts=" + GPU_FACTS)["built"] == 1
    assert build("source", base, "gpu_facts=" + GPU_FACTS)["built"] == 0


def test_zipimport_loads_the_kept_bytecode_and_a_python_of_another_version_the_source(tmp_path):
    blob = build("cache", tmp_path / "cache", "stat=" + STAT)["zips"][0]
    payload = tmp_path / "payload.zip"
    payload.write_bytes(base64.b64decode(blob))
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import ansible.module_utils.basic as b; "
             "print(b.AnsibleModule.__init__.__code__.co_filename)")
    out = subprocess.run([sys.executable, "-c", probe, str(payload)], capture_output=True,
                         text=True, check=True)
    # compiled here from the payload's own name: the bytecode was loaded, not the source
    assert out.stdout.strip() == "ansible/module_utils/basic.py"
    # bytecode of another Python version: zipimport falls back to the source
    other = tmp_path / "other.zip"
    with zipfile.ZipFile(str(payload)) as z, zipfile.ZipFile(str(other), "w") as w:
        for info in z.infolist():
            data = z.read(info)
            w.writestr(info, b"\0\0\r\n" + data[4:] if info.filename.endswith(".pyc") else data)
    out = subprocess.run([sys.executable, "-c", probe, str(other)], capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == os.path.join(str(other), "ansible", "module_utils", "basic.py")


def test_an_edit_of_a_module_utils_file_or_the_module_makes_a_new_key(tmp_path, monkeypatch):
    coll = tmp_path / "ansible_collections" / "vllm_ops" / "deploy" / "plugins"
    (coll / "modules").mkdir(parents=True)
    (coll / "module_utils" / "host").mkdir(parents=True)
    mod = coll / "modules" / "m.py"
    util = coll / "module_utils" / "host" / "m.py"
    mod.write_text("x = 1\n")
    util.write_text("y = 1\n")
    monkeypatch.setattr(pc, "_stamps", {})
    k1 = pc.payload_key(str(mod))
    assert k1 and k1 == pc.payload_key(str(mod))
    util.write_text("y = 22\n")
    monkeypatch.setattr(pc, "_stamps", {})  # a new ansible-playbook process
    k2 = pc.payload_key(str(mod))
    assert k2 != k1
    mod.write_text("x = 333\n")
    assert pc.payload_key(str(mod)) not in (k1, k2)


def test_other_collections_and_non_python_modules_are_not_kept(tmp_path):
    other = tmp_path / "ansible_collections" / "community" / "general" / "plugins" / "modules"
    other.mkdir(parents=True)
    (other / "x.py").write_text("")
    (tmp_path / "script.sh").write_text("")
    assert pc.payload_key(str(other / "x.py")) is None
    assert pc.payload_key(str(tmp_path / "script.sh")) is None


def test_ansible_loads_it_from_the_callback_path_and_prints_nothing(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(ANSIBLE_CALLBACK_PLUGINS=PLUGIN_DIR, VD_PAYLOAD_CACHE=str(tmp_path / "c"),
               ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, "collections"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "t"))
    play = tmp_path / "p.yml"
    play.write_text("- hosts: localhost\n  gather_facts: false\n  tasks:\n"
                    "    - ansible.builtin.stat: {path: /}\n")
    out = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"),
                          "-i", "localhost,", "-c", "local", "-e", "ansible_python_interpreter=" + sys.executable,
                          str(play)],
                         env=env, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "WARNING" not in out.stdout + out.stderr
    assert "vd_payload_cache" not in out.stdout + out.stderr
    kept = os.listdir(str(tmp_path / "c"))
    assert len(kept) == 1 and any(n.startswith("ansible.modules.stat-")
                                  for n in os.listdir(str(tmp_path / "c" / kept[0] / "ansiballz_cache")))
