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
