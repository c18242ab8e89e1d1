"""Real flashinfer mismatch, repaired by the flashinfer_reconcile module (no mocks).

A scratch venv gets flashinfer-python 0.6.13 and flashinfer-cubin 0.6.12 from PyPI, the pair
that makes `import flashinfer` raise `RuntimeError: flashinfer-cubin version (0.6.12) does not
match flashinfer version (0.6.13)`, the crash a stale cubin causes once vLLM is upgraded. The module is then run the way the role
runs it: through `ansible` with the venv's python as ansible_python_interpreter (AnsiballZ
ships the module and its module_utils), in check mode, mode=match (cubin 0.6.13 comes from
PyPI, which still holds it) and mode=remove, each followed by a second run that must plan
nothing. The vllm_install_facts module is read against the same venv.

Why the venv is not `pip install flashinfer-python==0.6.13` with all dependencies: that pulls
~4 GB, of which ~1 GB is CUDA tooling (nvidia-cutlass-dsl, cuda-toolkit, cuda-tile,
nvidia-cudnn-frontend) that a CPU machine never loads. Checked by hand on this machine: with
the full set, `import flashinfer` fails with the RuntimeError and imports fine once the
versions agree; with torch (CPU wheel, /opt/wheels) plus flashinfer-python --no-deps and only
its pure-python imports (apache-tvm-ffi, numpy, packaging, requests, tqdm, nvidia-ml-py,
einops, click, tabulate) it behaves the same. The cubin wheels are real (~450 MB each).

The venv is built once for the module (`python -m venv`, so it has pip, the installer the
module picks; uv, from its cache, installs the packages into it with their bytecode), and each
test that changes it gets a copy of it whose files are hard links (`cp -al`): each starts from
the mismatched pair, and no test installs cubin 0.6.12 again.

Needs PyPI, uv (requirements/tools.txt) and a CPU torch wheel for this Python in /opt/wheels
(or TORCH_CPU_WHEEL=path). About a minute; marked slow.
"""
import glob
import json
import os
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FLASHINFER_RUNTIME_DEPS = [
    "apache-tvm-ffi>=0.1.6,<0.2,!=0.1.8,!=0.1.8.post0", "numpy", "packaging>=24.2", "requests",
    "tqdm", "nvidia-ml-py", "einops", "click", "tabulate",
]
CRASH = "flashinfer-cubin version (0.6.12) does not match flashinfer version (0.6.13)"


def sh(argv, env=None, check=True):
    proc = subprocess.run([str(a) for a in argv], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, env=env, check=False)
    if check and proc.returncode != 0:
        raise AssertionError("%s failed (rc=%d):\n%s\n%s"
                             % (argv, proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:]))
    return proc


def torch_cpu_wheel():
    wheel = os.environ.get("TORCH_CPU_WHEEL")
    if wheel:
        return wheel
    tag = "cp%d%d" % sys.version_info[:2]
    found = sorted(glob.glob("/opt/wheels/torch-*+cpu-%s-%s-*.whl" % (tag, tag)))
    return found[-1] if found else None


def uv():
    """The test venv's own uv (requirements/tools.txt installs it there)."""
    found = os.path.join(os.path.dirname(sys.executable), "uv")
    assert os.path.exists(found), "no uv beside %s: run make setup" % sys.executable
    return found


@pytest.fixture(scope="module")
def base_venv(tmp_path_factory):
    """The mismatched venv, built once: pip from the venv module (the installer the module
    under test picks), the packages installed by uv from its cache, bytecode compiled."""
    wheel = torch_cpu_wheel()
    if not wheel:
        pytest.skip("no CPU torch wheel for this Python in /opt/wheels (set TORCH_CPU_WHEEL)")
    base = tmp_path_factory.mktemp("flashinfer-real")
    path = base / "venv"
    sh([sys.executable, "-m", "venv", path])
    install = [uv(), "pip", "install", "-q", "--system-certs", "--compile-bytecode",
               "--python", path / "bin" / "python"]
    sh(install + [wheel] + FLASHINFER_RUNTIME_DEPS)
    sh(install + ["--no-deps", "flashinfer-python==0.6.13", "flashinfer-cubin==0.6.12"])
    assert installed(path) == {"flashinfer-python": "0.6.13", "flashinfer-cubin": "0.6.12",
                               "flashinfer-jit-cache": None}
    yield path
    sh(["rm", "-rf", base])


@pytest.fixture
def venv(base_venv, tmp_path):
    """A copy of the mismatched venv for one test, its files hard links to the base venv's
    (pip never writes into an installed file: it unlinks it and writes a new one)."""
    path = tmp_path / "venv"
    sh(["cp", "-al", base_venv, path])
    yield path
    sh(["rm", "-rf", path])


def python_of(venv):
    return str(venv / "bin" / "python")


def installed(venv):
    code = ("import json, importlib.metadata as m\n"
            "def v(p):\n"
            "    try:\n        return m.version(p)\n"
            "    except m.PackageNotFoundError:\n        return None\n"
            "print(json.dumps({p: v(p) for p in ('flashinfer-python', 'flashinfer-cubin',"
            " 'flashinfer-jit-cache')}))")
    return json.loads(sh([python_of(venv), "-c", code]).stdout)


def import_flashinfer(venv):
    env = dict(os.environ)
    env.pop("FLASHINFER_DISABLE_VERSION_CHECK", None)
    return sh([python_of(venv), "-c", "import flashinfer; print(flashinfer.__version__)"],
              env=env, check=False)


def set_cubin(venv, version):
    sh([python_of(venv), "-m", "pip", "install", "-q", "--no-deps",
        "flashinfer-cubin==%s" % version])


def run_module(venv, args, check_mode=False, extra_env=None, module="flashinfer_reconcile",
               diff=False):
    """Run one of plugins/modules through ansible under the venv's python; its result dict."""
    ansible = os.path.join(os.path.dirname(sys.executable), "ansible")
    if not os.path.exists(ansible):
        ansible = shutil.which("ansible")
    env = dict(os.environ)
    env.update(ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"),
               ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
               ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json")
    env.update(extra_env or {})
    argv = [ansible, "localhost", "-i", "localhost,", "-c", "local",
            "-m", "vllm_ops.deploy." + module, "-a", json.dumps(args),
            "-e", "ansible_python_interpreter=%s" % python_of(venv)]
    if check_mode:
        argv.append("--check")
    if diff:
        argv.append("--diff")
    proc = sh(argv, env=env, check=False)
    try:
        out = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError("ansible printed no JSON (rc=%d):\n%s\n%s"
                             % (proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:]))
    return out["plays"][0]["tasks"][0]["hosts"]["localhost"]


def test_match_mode_installs_the_matching_cubin(venv, tmp_path):
    set_cubin(venv, "0.6.12")
    assert installed(venv)["flashinfer-cubin"] == "0.6.12"
    crash = import_flashinfer(venv)
    assert crash.returncode != 0
    assert "RuntimeError: " + CRASH in crash.stderr

    planned = run_module(venv, {"mode": "match"}, check_mode=True, diff=True)
    assert planned["changed"] is True and not planned.get("failed")
    assert planned["diff"]["before"] == "flashinfer-python==0.6.13\nflashinfer-cubin==0.6.12\n"
    assert planned["diff"]["after"] == "flashinfer-python==0.6.13\nflashinfer-cubin==0.6.13\n"
    assert [(a["package"], a["action"], a["from"], a["to"]) for a in planned["actions"]] == [
        ("flashinfer-cubin", "install", "0.6.12", "0.6.13")]
    assert planned["actions"][0]["index_url"] == "https://flashinfer.ai/whl"
    assert planned["torch_cuda"] is None
    assert installed(venv)["flashinfer-cubin"] == "0.6.12"  # check mode changed nothing

    # an index without the wheel: the module fails with pip's error, venv untouched
    empty = tmp_path / "empty-index"
    empty.mkdir()
    failed = run_module(venv, {"cubin_index_url": empty.as_uri()},
                        extra_env={"PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": "",
                                   "PIP_EXTRA_INDEX_URL": ""})
    assert failed.get("failed") is True
    assert "install flashinfer-cubin==0.6.13 failed" in failed["msg"]
    assert "No matching distribution found for flashinfer-cubin==0.6.13" in failed["msg"]
    assert installed(venv)["flashinfer-cubin"] == "0.6.12"

    fixed = run_module(venv, {"mode": "match", "cubin_index_url": "https://pypi.org/simple"})
    assert not fixed.get("failed"), fixed.get("msg")
    assert fixed["changed"] is True
    assert fixed["summary"] == ["flashinfer-cubin: 0.6.12 -> 0.6.13 (from https://pypi.org/simple)"]
    assert fixed["versions_before"]["flashinfer-cubin"] == "0.6.12"
    assert fixed["versions_after"] == {"flashinfer-python": "0.6.13",
                                       "flashinfer-cubin": "0.6.13",
                                       "flashinfer-jit-cache": None}
    assert fixed["import_ok"] is True
    assert installed(venv)["flashinfer-cubin"] == "0.6.13"
    ok = import_flashinfer(venv)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == "0.6.13"

    again = run_module(venv, {"mode": "match", "cubin_index_url": "https://pypi.org/simple"})
    assert again["changed"] is False and again["actions"] == [] and again["import_ok"] is True


def test_remove_mode_uninstalls_the_stale_cubin(venv):
    set_cubin(venv, "0.6.12")
    assert CRASH in import_flashinfer(venv).stderr

    removed = run_module(venv, {"mode": "remove"}, diff=True)
    assert not removed.get("failed"), removed.get("msg")
    assert removed["changed"] is True
    assert removed["diff"]["after"] == "flashinfer-python==0.6.13\n"  # the real after-state
    assert removed["summary"] == ["flashinfer-cubin: 0.6.12 -> removed"]
    assert removed["versions_after"]["flashinfer-cubin"] is None
    assert installed(venv)["flashinfer-cubin"] is None
    ok = import_flashinfer(venv)
    assert ok.returncode == 0, ok.stderr

    again = run_module(venv, {"mode": "remove"})
    assert again["changed"] is False and again["actions"] == [] and again["import_ok"] is True


def test_install_facts_read_the_venv(base_venv):
    venv = base_venv  # read only: no copy needed
    facts = run_module(venv, {"extra_packages": ["numpy"]}, check_mode=True,
                       module="vllm_install_facts")
    assert not facts.get("failed"), facts.get("msg")
    assert facts["changed"] is False
    torch_version = os.path.basename(torch_cpu_wheel()).split("-")[1]  # e.g. 2.13.0+cpu
    assert facts["versions"]["torch"] == torch_version
    assert facts["versions"]["flashinfer-python"] == "0.6.13"
    assert facts["versions"]["numpy"] == installed_numpy(venv)
    assert facts["versions"]["vllm"] is None and facts["vllm_package"] is None
    assert facts["torch_cuda"] is None  # CPU torch
    assert facts["python"] == python_of(venv)
    assert facts["ansible_facts"]["vllm_installed"]["versions"] == facts["versions"]


def installed_numpy(venv):
    return sh([python_of(venv), "-c", "import numpy; print(numpy.__version__)"]).stdout.strip()
