# -*- coding: utf-8 -*-
"""Shared documentation of the attributes every module of vllm_ops.deploy declares, the way
community.docker does: modules extend ``vllm_ops.deploy.attributes`` (check_mode, diff_mode) and
the fragments below where they apply, and state their own ``support`` level."""
from __future__ import annotations


class ModuleDocFragment(object):
    # Every module: check mode and diff mode.
    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    description: Can run in C(check_mode) and return changed status prediction without modifying target.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in C(check_mode)), when in diff mode.
"""

    # Modules that run on the target host.
    PLATFORM = r"""
options: {}
attributes:
  platform:
    description: Target OS/families that can be operated against.
    support: N/A
    platforms: posix
"""

    # Read-only modules (the _info and _facts modules, plans and checks): they change nothing on
    # the host, so they run the same in check mode and have no diff. A module may add its own
    # details.
    INFO = r"""
options: {}
attributes:
  check_mode:
    support: full
    details: Reads only; the same in check mode.
  diff_mode:
    support: none
"""

    # Modules that return facts.
    FACTS = r"""
options: {}
attributes:
  facts:
    description: Action returns an C(ansible_facts) dictionary that will update existing host facts.
    support: full
"""

    # Modules with an action plugin of the same name (parts run on the controller).
    ACTION = r"""
options: {}
attributes:
  action:
    description: Indicates this has a corresponding action plugin so some parts of the options can be executed on the controller.
    support: full
"""

    # Action plugins that run on the controller only.
    CONTROLLER = r"""
options: {}
attributes:
  action:
    description: Indicates this has a corresponding action plugin so some parts of the options can be executed on the controller.
    support: full
  platform:
    description: Runs on the controller (the machine running ansible-playbook).
    support: full
    platforms: posix
"""
