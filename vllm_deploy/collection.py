"""The one way vllm_deploy reaches the collection's Python (plugins/plugin_utils,
plugins/module_utils): imported from this checkout's collections path, where
collections/ansible_collections/vllm_ops/deploy links to the repository root, exactly as Ansible
and the tests import it."""
from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

from .errors import UsageError

PACKAGE = "ansible_collections.vllm_ops.deploy.plugins"


def project_root() -> str:
    """The repository holding playbooks/, roles/ and plugins/ (env VLLM_DEPLOY_ROOT wins)."""
    root = os.environ.get("VLLM_DEPLOY_ROOT") or os.path.dirname(
        os.path.dirname(os.path.abspath(__file__)))
    if not os.path.isfile(os.path.join(root, "playbooks", "deploy.yml")):
        raise UsageError("no playbooks/deploy.yml under %s: set VLLM_DEPLOY_ROOT to the "
                         "vllm-deploy repository" % root)
    return root


def plugin_module(name: str, root: str = None) -> ModuleType:
    """The collection's module ``plugins.<name>`` (e.g. ``plugin_utils.tune.tuner``)."""
    path = os.path.join(root or project_root(), "collections")
    if path not in sys.path:
        sys.path.insert(0, path)
    return importlib.import_module("%s.%s" % (PACKAGE, name))
