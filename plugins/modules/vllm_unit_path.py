#!/usr/bin/python
"""Ansible module: the PATH a vLLM (or Ray) unit needs, from where its tools are on the host."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_unit_path
short_description: Compose a systemd unit's PATH from the serving venv and the tools found on the host
description:
  - systemd starts services with a fixed default PATH that holds neither a venv's C(bin/) nor a
    pip-installed CUDA toolkit. vLLM, torch's C++ extensions and FlashInfer's JIT run C(ninja) and
    C(nvcc) by name, so a unit without a PATH naming them crash-loops.
  - Searches, in order, the venv's C(bin/) (the interpreter's folder, not resolved, so a C(current)
    link moves the PATH with it), I(extra_dirs), the C(bin/) of each site directory's environment
    (and the ninja wheel's binary folder), C(CUDA_HOME/bin) and the system directories, for each of
    I(tools). Fails naming every tool it did not find and where it looked. Changes nothing.
options:
  python:
    description: The serving venv's interpreter, e.g. C(/opt/vllm-deploy/current/bin/python).
    type: path
    required: true
  tools:
    description: Programs the service runs by name and that must be found.
    type: list
    elements: str
    default: [ninja]
  site_dirs:
    description: Site directories the venv also imports from (C(vllm_install_site_dirs)).
    type: list
    elements: path
    default: []
  cuda_home:
    description: The CUDA toolkit's root (C(CUDA_HOME)); its C(bin/) goes on PATH.
    type: path
    default: ""
  extra_dirs:
    description: More directories to put on PATH right after the venv's C(bin/).
    type: list
    elements: path
    default: []
extends_documentation_fragment:
  - vllm_ops.deploy.attributes
  - vllm_ops.deploy.attributes.PLATFORM
  - vllm_ops.deploy.attributes.INFO
author:
  - vllm-deploy contributors (@vllm-ops)
"""

EXAMPLES = r"""
- name: Find ninja and nvcc for the unit
  vllm_ops.deploy.vllm_unit_path:
    python: /opt/vllm-deploy/current/bin/python
    tools: [ninja, nvcc]
    site_dirs: [/opt/torch/.venv/lib/python3.12/site-packages]
    cuda_home: /opt/vllm-deploy/cuda/cuda
  register: _unit_path
"""

RETURN = r"""
path:
  description: The PATH for the unit, venv C(bin/) first.
  returned: success
  type: str
  sample: /opt/vllm-deploy/current/bin:/opt/torch/.venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
tools:
  description: Each tool and the file it resolved to.
  returned: success
  type: dict
  sample: {ninja: /opt/vllm-deploy/current/bin/ninja}
searched:
  description: The directories searched, in order.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_ops.deploy.plugins.module_utils.host.vllm_unit_path import (
    UnitPathError, build, candidates)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            python=dict(type="path", required=True),
            tools=dict(type="list", elements="str", default=["ninja"]),
            site_dirs=dict(type="list", elements="path", default=[]),
            cuda_home=dict(type="path", default=""),
            extra_dirs=dict(type="list", elements="path", default=[]),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        result = build(p["python"], p["tools"], p["site_dirs"], p["cuda_home"] or "", p["extra_dirs"])
    except UnitPathError as e:
        module.fail_json(msg=str(e), searched=candidates(p["python"], p["site_dirs"],
                                                         p["cuda_home"] or "", p["extra_dirs"]))
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
