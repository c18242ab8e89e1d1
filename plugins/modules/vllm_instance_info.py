#!/usr/bin/python
"""Ansible module: the vLLM instances the host runs now (the role's units and env files)."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_instance_info
short_description: Read the vLLM instances a host runs now from the role's units and environment files
description:
  - Reads every C(vllm-<name>.service) in I(unit_dir) that the vllm_service role wrote (its
    marker line C(# vLLM OpenAI-compatible server, instance <name>)), the environment file the
    unit names, and the unit's state from systemd. Units without the marker are not reported.
  - Returns each instance's argv, environment (secret values replaced by C(<secret>)), port,
    model directory, GPU set and systemd state, so a change can be described, ports and GPU
    sets checked against instances about to be removed, and undeclared instances found.
    Changes nothing.
options:
  unit_dir:
    description: Where the units are.
    type: path
    default: /etc/systemd/system
extends_documentation_fragment:
  - vllm_ops.deploy.attributes
  - vllm_ops.deploy.attributes.PLATFORM
  - vllm_ops.deploy.attributes.INFO
author:
  - vllm-deploy contributors (@vllm-ops)
"""

EXAMPLES = r"""
- name: Read the instances on the host
  vllm_ops.deploy.vllm_instance_info:
  register: _state

- name: Show them
  ansible.builtin.debug:
    msg: "{{ _state.instances | dict2items | map(attribute='key') | list }}"
"""

RETURN = r"""
instances:
  description:
    - Instance name -> unit, unit_path, argv, env_file, env (secrets redacted), port, model_dir,
      served_model_name, gpus (list, or null for every GPU), active_state, sub_state,
      unit_file_state, main_pid, n_restarts.
  returned: always
  type: dict
  sample: {"main": {"unit": "vllm-main.service", "port": 8000, "active_state": "active", "gpus": null}}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_ops.deploy.plugins.module_utils.service.vllm_instance import (
    parse_show, read_instances)

PROPS = ("ActiveState", "SubState", "UnitFileState", "MainPID", "NRestarts")


def main():
    module = AnsibleModule(argument_spec=dict(unit_dir=dict(type="path", default="/etc/systemd/system")),
                           supports_check_mode=True)
    found = read_instances(module.params["unit_dir"])
    systemctl = module.get_bin_path("systemctl")
    for inst in found.values():
        show = {}
        if systemctl:
            args = [systemctl, "show", inst["unit"]] + ["--property=" + p for p in PROPS]
            rc, out, _err = module.run_command(args)
            if rc == 0:
                show = parse_show(out)
        inst.update(active_state=show.get("ActiveState"), sub_state=show.get("SubState"),
                    unit_file_state=show.get("UnitFileState"),
                    main_pid=int(show["MainPID"]) if show.get("MainPID", "").isdigit() else 0,
                    n_restarts=int(show["NRestarts"]) if show.get("NRestarts", "").isdigit() else 0)
    module.exit_json(changed=False, instances=found)


if __name__ == "__main__":
    main()
