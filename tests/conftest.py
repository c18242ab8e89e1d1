"""Shared pytest set-up: the repository's collections path on sys.path.

collections/ansible_collections/vllm_ops/deploy links to the repository root, so the
collection's code imports as ``ansible_collections.vllm_ops.deploy.plugins...``, exactly as
Ansible loads it (module_utils import each other that way too).
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLLECTIONS = os.path.join(ROOT, "collections")

if COLLECTIONS not in sys.path:
    sys.path.insert(0, COLLECTIONS)


# --- under CI, a skipped real-component test is a failure -----------------------------
# The slow tests skip on a developer machine that lacks a prerequisite (a venv, root). In CI
# the Makefile provides all of them, so a skip there means a missing install step: fail.
import pytest  # noqa: E402


def _ci():
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _reason(longrepr):
    return longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if _ci() and rep.skipped and item.get_closest_marker("slow") and not hasattr(rep, "wasxfail"):
        rep.outcome = "failed"
        rep.longrepr = "CI must run this test, but it was skipped: %s" % _reason(rep.longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    rep = outcome.get_result()
    if _ci() and rep.skipped:
        rep.outcome = "failed"
        rep.longrepr = "CI must run %s, but it was skipped: %s" % (collector.nodeid,
                                                                   _reason(rep.longrepr))
