#!/usr/bin/python
"""Ansible module: make flashinfer-cubin / flashinfer-jit-cache match flashinfer-python."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: flashinfer_reconcile
short_description: Reconcile flashinfer-cubin and flashinfer-jit-cache with flashinfer-python in a venv
description:
  - Run with the venv's own interpreter (C(ansible_python_interpreter=<venv>/bin/python)). Reads the
    installed versions of flashinfer-python, flashinfer-cubin and flashinfer-jit-cache with
    importlib.metadata, and torch's CUDA version from C(torch/version.py) without importing torch.
  - flashinfer refuses to import when cubin differs from flashinfer-python, or when jit-cache does
    not carry flashinfer-python's version. In mode C(match) the mismatched extra is installed at the
    matching version (jit-cache as C(<version>+cuXYZ) for torch's CUDA) from a configurable index;
    in mode C(remove) it is uninstalled. Extras that are not installed are left alone.
  - Then proves the result with C(python -c "import flashinfer") in the venv, with
    FLASHINFER_DISABLE_VERSION_CHECK removed from that check's environment. The bypass variable is
    never set.
  - Idempotent; check mode reports the plan and changes nothing.
options:
  mode:
    description: C(match) installs the matching build; C(remove) uninstalls the mismatched extra.
    type: str
    choices: [match, remove]
    default: match
  cubin_index_url:
    description:
      - Index for flashinfer-cubin (passed as C(--index-url)). PyPI only holds <= 0.6.13.
      - Empty string means the installer's own configured index.
    type: str
    default: https://flashinfer.ai/whl
  jit_cache_index_url:
    description:
      - Index for flashinfer-jit-cache; C({cuda_tag}) becomes e.g. C(cu130).
      - Empty string means the installer's own configured index.
    type: str
    default: https://flashinfer.ai/whl/{cuda_tag}
  pip_extra_args:
    description: Extra installer arguments for installs, e.g. C([--no-index, --find-links, /srv/wheels]).
    type: list
    elements: str
    default: []
  installer:
    description: C(pip) runs C(<venv python> -m pip); C(uv) runs C(uv pip --python <venv python>);
      C(auto) uses pip when the venv has it, else uv.
    type: str
    choices: [auto, pip, uv]
    default: auto
  uv_path:
    description: uv executable for C(installer=uv|auto); looked up on PATH when not given.
    type: path
  verify_import:
    description: Run C(python -c "import flashinfer") at the end and fail with its stderr if it fails.
    type: bool
    default: true
extends_documentation_fragment:
  - vllm_ops.deploy.attributes
  - vllm_ops.deploy.attributes.PLATFORM
attributes:
  check_mode:
    support: full
    details: Reports the planned installs and removals; changes nothing.
  diff_mode:
    support: full
    details: The three packages' versions before and after (predicted in check mode).
author:
  - vllm-deploy contributors (@vllm-ops)
"""

EXAMPLES = r"""
- name: Reconcile flashinfer extras in the vLLM venv
  vllm_ops.deploy.flashinfer_reconcile:
    mode: match
  vars:
    ansible_python_interpreter: /opt/vllm/current/bin/python

- name: Air-gapped host, cubin and jit-cache from a local wheel directory
  vllm_ops.deploy.flashinfer_reconcile:
    cubin_index_url: ""
    jit_cache_index_url: ""
    pip_extra_args: [--no-index, --find-links, /srv/wheels]
  vars:
    ansible_python_interpreter: /opt/vllm/current/bin/python
"""

RETURN = r"""
actions:
  description: Planned (check mode) or applied actions.
  returned: always
  type: list
  elements: dict
  sample:
    - {package: flashinfer-cubin, action: install, from: 0.6.12, to: 0.6.13,
       requirement: flashinfer-cubin==0.6.13, index_url: https://flashinfer.ai/whl}
summary:
  description: One line per action, C(package from -> to).
  returned: always
  type: list
  elements: str
  sample: ["flashinfer-cubin: 0.6.12 -> 0.6.13 (from https://flashinfer.ai/whl)"]
versions_before:
  description: Installed versions before (null when not installed).
  returned: always
  type: dict
  sample: {flashinfer-python: 0.6.13, flashinfer-cubin: 0.6.12, flashinfer-jit-cache: null}
versions_after:
  description: Installed versions after applying (equal to versions_before in check mode).
  returned: always
  type: dict
torch_cuda:
  description: torch.version.cuda in the venv (null for CPU torch or no torch).
  returned: always
  type: str
cuda_tag:
  description: C(cuXYZ) derived from torch_cuda, or null.
  returned: always
  type: str
import_ok:
  description: Whether C(import flashinfer) succeeded (null when not run).
  returned: always
  type: bool
python:
  description: The interpreter the module ran with (the venv's).
  returned: always
  type: str
"""

import importlib.util
import json
import os
import subprocess
import sys

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_ops.deploy.plugins.module_utils.install.flashinfer_reconcile import (
    DEFAULT_CUBIN_INDEX_URL, DEFAULT_JIT_CACHE_INDEX_URL, PACKAGES, ReconcileError, action_argv,
    describe, plan_reconcile, predict_versions, public_actions, torch_cuda_version,
    versions_diff)

_READ_VERSIONS = (
    "import json, importlib.metadata as m\n"
    "out = {}\n"
    "for p in %r:\n"
    "    try:\n"
    "        out[p] = m.version(p)\n"
    "    except m.PackageNotFoundError:\n"
    "        out[p] = None\n"
    "print(json.dumps(out))\n" % (PACKAGES,)
)


def read_versions(python):
    """Installed versions, read by a fresh ``python`` process (no stale metadata caches)."""
    proc = subprocess.run([python, "-c", _READ_VERSIONS], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError("reading installed versions failed: %s" % proc.stderr.strip())
    return json.loads(proc.stdout)


def import_check(python):
    env = dict(os.environ)
    env.pop("FLASHINFER_DISABLE_VERSION_CHECK", None)
    proc = subprocess.run([python, "-c", "import flashinfer"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, env=env,
                          cwd="/", check=False)
    return proc.returncode == 0, proc.stderr


def main():
    module = AnsibleModule(
        argument_spec=dict(
            mode=dict(type="str", choices=["match", "remove"], default="match"),
            cubin_index_url=dict(type="str", default=DEFAULT_CUBIN_INDEX_URL),
            jit_cache_index_url=dict(type="str", default=DEFAULT_JIT_CACHE_INDEX_URL),
            pip_extra_args=dict(type="list", elements="str", default=[]),
            installer=dict(type="str", choices=["auto", "pip", "uv"], default="auto"),
            uv_path=dict(type="path"),
            verify_import=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    p = module.params
    python = sys.executable
    result = dict(changed=False, actions=[], summary=[], python=python, import_ok=None)
    try:
        before = read_versions(python)
        torch_cuda = torch_cuda_version()
        plan = plan_reconcile(before, torch_cuda, mode=p["mode"],
                              cubin_index_url=p["cubin_index_url"],
                              jit_cache_index_url=p["jit_cache_index_url"])
    except (ReconcileError, RuntimeError, SyntaxError) as exc:
        module.fail_json(msg=str(exc), **result)
    result.update(versions_before=before, versions_after=before, torch_cuda=torch_cuda,
                  cuda_tag=plan["cuda_tag"], actions=public_actions(plan["actions"]),
                  summary=describe(plan["actions"]))
    if plan["note"]:
        module.exit_json(msg=plan["note"], **result)

    if plan["actions"]:
        result["changed"] = True
        if module.check_mode:
            if module._diff:
                result["diff"] = versions_diff(before, predict_versions(before, plan["actions"]))
            module.exit_json(msg="would change: " + "; ".join(result["summary"]), **result)
        installer = p["installer"]
        if installer == "auto":
            installer = "pip" if importlib.util.find_spec("pip") is not None else "uv"
        uv = None
        if installer == "uv":
            uv = p["uv_path"] or module.get_bin_path("uv", required=True)
        for action in plan["actions"]:
            argv = action_argv(action, python, installer=installer, uv=uv,
                               extra_args=p["pip_extra_args"])
            rc, out, err = module.run_command(argv)
            if rc != 0:
                result["versions_after"] = read_versions(python)
                module.fail_json(msg="%s %s failed (rc=%d): %s"
                                 % (action["action"], action["requirement"], rc,
                                    (err or out).strip()[-2000:]), **result)
        after = read_versions(python)
        result["versions_after"] = after
        if module._diff:
            result["diff"] = versions_diff(before, after)
        left = plan_reconcile(after, torch_cuda, mode=p["mode"],
                              cubin_index_url=p["cubin_index_url"],
                              jit_cache_index_url=p["jit_cache_index_url"])["actions"]
        if left:
            module.fail_json(msg="still mismatched after reconciling: "
                             + "; ".join(describe(left)), **result)

    if p["verify_import"]:
        ok, err = import_check(python)
        result["import_ok"] = ok
        if not ok:
            module.fail_json(msg="import flashinfer failed in %s: %s"
                             % (python, err.strip()[-3000:]), stderr=err, **result)
    module.exit_json(msg="; ".join(result["summary"]) or "flashinfer packages already match",
                     **result)


if __name__ == "__main__":
    main()
