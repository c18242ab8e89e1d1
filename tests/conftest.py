"""Shared pytest set-up: make the repo's module_utils importable as ansible.module_utils.*"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULE_UTILS = os.path.join(ROOT, "plugins", "module_utils")
MODULES = os.path.join(ROOT, "plugins", "modules")

import ansible.module_utils  # noqa: E402  (needs ansible-core in the tools venv)

if MODULE_UTILS not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(MODULE_UTILS)
if MODULES not in sys.path:
    sys.path.insert(0, MODULES)


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
