"""Unit tests for plugins/module_utils/install/flashinfer_reconcile.py (plan, argv, torch/version.py
reader). The real install/uninstall/import path is covered by
tests/integration/test_flashinfer_real.py."""
import importlib
import sys

import pytest

from ansible_collections.vllm_ops.deploy.plugins.module_utils.install.flashinfer_reconcile import (
    ReconcileError, action_argv, cuda_tag, describe, mask_url, plan_reconcile, public_actions,
    torch_cuda_version)

PY, CUBIN, JIT = "flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache"


def v(python=None, cubin=None, jit=None):
    return {PY: python, CUBIN: cubin, JIT: jit}


@pytest.mark.parametrize("torch_cuda, tag", [
    ("13.0", "cu130"), ("12.9", "cu129"), ("12.8.1", "cu128"), (None, None), ("", None)])
def test_cuda_tag(torch_cuda, tag):
    assert cuda_tag(torch_cuda) == tag


def test_cuda_tag_rejects_garbage():
    with pytest.raises(ReconcileError, match="'rocm6.2' is not of the form MAJOR.MINOR"):
        cuda_tag("rocm6.2")


def test_the_pypi_crash_case_match():
    # flashinfer-python 0.6.13 + flashinfer-cubin 0.6.12: the RuntimeError on import
    plan = plan_reconcile(v("0.6.13", "0.6.12"), None)
    assert plan["actions"] == [{
        "package": CUBIN, "action": "install", "from": "0.6.12", "to": "0.6.13",
        "requirement": "flashinfer-cubin==0.6.13", "index_url": "https://flashinfer.ai/whl"}]
    assert describe(plan["actions"]) == [
        "flashinfer-cubin: 0.6.12 -> 0.6.13 (from https://flashinfer.ai/whl)"]


def test_remove_mode_uninstalls_the_mismatched_extra_only():
    plan = plan_reconcile(v("0.6.16", "0.6.13", "0.6.16+cu130"), "13.0", mode="remove")
    assert [(a["package"], a["action"], a["from"], a["to"]) for a in plan["actions"]] == [
        (CUBIN, "uninstall", "0.6.13", None)]
    assert plan["ok"] == [JIT]
    assert describe(plan["actions"]) == ["flashinfer-cubin: 0.6.13 -> removed"]


def test_jit_cache_gets_torch_cuda_suffix_from_its_index():
    plan = plan_reconcile(v("0.6.16.post3", "0.6.16.post3", "0.6.14+cu129"), "13.0")
    assert plan["ok"] == [CUBIN]
    assert plan["actions"] == [{
        "package": JIT, "action": "install", "from": "0.6.14+cu129", "to": "0.6.16.post3+cu130",
        "requirement": "flashinfer-jit-cache==0.6.16.post3+cu130",
        "index_url": "https://flashinfer.ai/whl/cu130"}]


def test_jit_cache_right_version_wrong_cuda_is_replaced():
    plan = plan_reconcile(v("0.6.16", None, "0.6.16+cu129"), "13.0")
    assert [(a["from"], a["to"]) for a in plan["actions"]] == [("0.6.16+cu129", "0.6.16+cu130")]


def test_prefix_is_not_enough():
    # flashinfer 0.6.13's startswith check would accept 0.6.10+cu130 for 0.6.1; we do not
    plan = plan_reconcile(v("0.6.1", None, "0.6.10+cu130"), "13.0")
    assert plan["actions"][0]["to"] == "0.6.1+cu130"


def test_everything_matching_plans_nothing():
    plan = plan_reconcile(v("0.6.16", "0.6.16", "0.6.16+cu130"), "13.0")
    assert plan["actions"] == [] and plan["ok"] == [CUBIN, JIT]
    assert plan_reconcile(v("0.6.13"), None)["actions"] == []


def test_without_flashinfer_python_nothing_to_do():
    plan = plan_reconcile(v(None, "0.6.12"), "13.0")
    assert plan["actions"] == []
    assert plan["note"] == ("flashinfer-python is not installed: nothing to reconcile "
                            "(installed: flashinfer-cubin 0.6.12)")


def test_jit_mismatch_without_cuda_torch_fails_in_match_but_not_in_remove():
    with pytest.raises(ReconcileError) as err:
        plan_reconcile(v("0.6.16", None, "0.6.13+cu130"), None)
    assert "flashinfer-jit-cache 0.6.13+cu130 does not match flashinfer-python 0.6.16" \
        in str(err.value)
    assert "use mode=remove" in str(err.value)
    plan = plan_reconcile(v("0.6.16", None, "0.6.13+cu130"), None, mode="remove")
    assert plan["actions"][0]["action"] == "uninstall"
    # right public version, CPU torch: flashinfer's own check passes, leave it
    assert plan_reconcile(v("0.6.16", None, "0.6.16+cu130"), None)["actions"] == []


def test_custom_and_empty_indexes():
    plan = plan_reconcile(v("0.6.16", "0.6.12", "0.6.12+cu129"), "12.9",
                          cubin_index_url="", jit_cache_index_url="https://mirror/fi/{cuda_tag}/")
    assert [a["index_url"] for a in plan["actions"]] == [None, "https://mirror/fi/cu129/"]


def test_bad_mode():
    with pytest.raises(ReconcileError, match="mode must be one of match, remove, got 'fix'"):
        plan_reconcile(v("0.6.13", "0.6.12"), None, mode="fix")


def test_action_argv_pip_and_uv():
    install = plan_reconcile(v("0.6.13", "0.6.12"), None,
                             cubin_index_url="https://pypi.org/simple")["actions"][0]
    assert action_argv(install, "/v/bin/python") == [
        "/v/bin/python", "-m", "pip", "install", "--no-deps", "flashinfer-cubin==0.6.13",
        "--index-url", "https://pypi.org/simple"]
    assert action_argv(install, "/v/bin/python", installer="uv", uv="/bin/uv",
                       extra_args=["--no-index", "--find-links", "/w"]) == [
        "/bin/uv", "pip", "install", "--python", "/v/bin/python", "--no-deps",
        "flashinfer-cubin==0.6.13", "--index-url", "https://pypi.org/simple",
        "--no-index", "--find-links", "/w"]
    remove = plan_reconcile(v("0.6.13", "0.6.12"), None, mode="remove")["actions"][0]
    assert action_argv(remove, "/v/bin/python") == [
        "/v/bin/python", "-m", "pip", "uninstall", "-y", "flashinfer-cubin"]
    assert action_argv(remove, "/v/bin/python", installer="uv", uv="uv") == [
        "uv", "pip", "uninstall", "--python", "/v/bin/python", "flashinfer-cubin"]


def test_credentials_in_index_urls_are_masked_in_reports():
    plan = plan_reconcile(v("0.6.13", "0.6.12"), None,
                          cubin_index_url="https://bob:s3cret@mirror.example/simple")
    assert mask_url("https://bob:s3cret@mirror.example/simple") == \
        "https://***@mirror.example/simple"
    assert "s3cret" not in str(public_actions(plan["actions"]))
    assert "s3cret" not in str(describe(plan["actions"]))
    assert plan["actions"][0]["index_url"].startswith("https://bob:s3cret@")  # still used


# torch/version.py as torch 2.13.0 writes it (copied from the torch-2.13.0+cpu wheel),
# with the cuda value varied
TORCH_VERSION_PY = """from typing import Optional

__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip', 'rocm', 'xpu']
__version__ = '2.13.0+{local}'
debug = False
cuda: Optional[str] = {cuda}
git_version = 'cf30153c4c131c8164ee7798e5022d810682e2cb'
hip: Optional[str] = None
rocm: Optional[str] = None
xpu: Optional[str] = None
"""


@pytest.mark.parametrize("cuda, expected", [("'13.0'", "13.0"), ("None", None)])
def test_reads_torch_cuda_without_importing_torch(tmp_path, monkeypatch, cuda, expected):
    pkg = tmp_path / "torch"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise RuntimeError('torch must not be imported')\n")
    (pkg / "version.py").write_text(TORCH_VERSION_PY.format(local="cu130", cuda=cuda))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    importlib.invalidate_caches()
    assert torch_cuda_version() == expected
    assert "torch" not in sys.modules


def test_diff_of_the_packages_before_and_after():
    from ansible_collections.vllm_ops.deploy.plugins.module_utils.install.flashinfer_reconcile import (
        predict_versions, versions_diff)
    before = {"flashinfer-python": "0.6.13", "flashinfer-cubin": "0.6.12",
              "flashinfer-jit-cache": "0.6.12+cu130"}
    plan = plan_reconcile(before, "13.0")
    after = predict_versions(before, plan["actions"])
    assert after == {"flashinfer-python": "0.6.13", "flashinfer-cubin": "0.6.13",
                     "flashinfer-jit-cache": "0.6.13+cu130"}
    d = versions_diff(before, after)
    assert d["before"].splitlines() == ["flashinfer-python==0.6.13", "flashinfer-cubin==0.6.12",
                                        "flashinfer-jit-cache==0.6.12+cu130"]
    assert d["after"].splitlines()[1:] == ["flashinfer-cubin==0.6.13",
                                           "flashinfer-jit-cache==0.6.13+cu130"]
    removed = predict_versions(before, plan_reconcile(before, "13.0", mode="remove")["actions"])
    assert versions_diff(before, removed)["after"] == "flashinfer-python==0.6.13\n"
