#!/usr/bin/python
"""Ansible module: the programs listening on TCP ports, from /proc (no ss needed)."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: port_listeners_info
short_description: Report which processes listen on given TCP ports (read from /proc)
description:
  - Reads C(/proc/net/tcp) and C(/proc/net/tcp6) for sockets in the LISTEN state on I(ports) and
    names the process holding each one (C(/proc/<pid>/fd)). Needs neither C(ss) nor C(netstat), so it
    works on minimal and air-gapped hosts. Changes nothing.
options:
  ports:
    description: TCP ports to look at.
    type: list
    elements: int
    required: true
extends_documentation_fragment:
  - vllm_ops.deploy.attributes
  - vllm_ops.deploy.attributes.PLATFORM
  - vllm_ops.deploy.attributes.INFO
author:
  - vllm-deploy contributors (@vllm-ops)
"""

EXAMPLES = r"""
- name: Who listens on 8000 and 8001?
  vllm_ops.deploy.port_listeners_info:
    ports: [8000, 8001]
  register: _ports

- name: Refuse a busy port
  ansible.builtin.assert:
    that: _ports.listeners['8000'] | length == 0
"""

RETURN = r"""
listeners:
  description: Port (as a string key) -> list of listeners, each with address, pid and process
    (pid and process are null when the owner is not readable). An empty list means free.
  returned: always
  type: dict
  sample: {"8000": [{"address": "127.0.0.1", "pid": 4242, "process": "python3"}], "8001": []}
described:
  description: Port -> a one-line description of its listeners ("" when free).
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_ops.deploy.plugins.module_utils.host.port_listeners import (
    describe, listeners)


def main():
    module = AnsibleModule(argument_spec=dict(ports=dict(type="list", elements="int", required=True)),
                           supports_check_mode=True)
    found = listeners(module.params["ports"])
    module.exit_json(changed=False,
                     listeners={str(p): v for p, v in found.items()},
                     described={str(p): describe(v) for p, v in found.items()})


if __name__ == "__main__":
    main()
