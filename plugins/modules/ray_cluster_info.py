#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import annotations

DOCUMENTATION = r"""
---
module: ray_cluster_info
short_description: Wait until every expected node is in a Ray cluster, with its resources
description:
  - Reads the Ray GCS node table (as C(ray status) does, without starting a driver) with the
    Python interpreter of a venv that has Ray, and compares the alive nodes with the expected
    ones by IP address, CPUs and GPUs.
  - Polls until every expected node is present or the timeout passes; then fails with the list
    of missing nodes and why each is missing.
  - Reads only; runs the same in check mode.
options:
  python:
    description: Interpreter of the venv that has Ray.
    type: path
    required: true
  address:
    description: GCS address of the head, C(ip:port).
    type: str
    required: true
  expected:
    description: Nodes that must be present, each with C(host), C(ip), C(cpus), C(gpus) (at least).
    type: list
    elements: dict
    required: true
  timeout_s:
    description: How long to wait for the nodes.
    type: int
    default: 120
  poll_s:
    description: Seconds between reads.
    type: int
    default: 3
extends_documentation_fragment:
  - vllm_ops.deploy.attributes
  - vllm_ops.deploy.attributes.PLATFORM
  - vllm_ops.deploy.attributes.INFO
author:
  - vllm-deploy contributors (@vllm-ops)
"""

EXAMPLES = r"""
- name: Gate vLLM on the Ray cluster
  vllm_ops.deploy.ray_cluster_info:
    python: /opt/vllm-deploy/current/bin/python
    address: 10.0.0.1:6379
    expected:
      - {host: gpu-a, ip: 10.0.0.1, cpus: 1, gpus: 8}
      - {host: gpu-b, ip: 10.0.0.2, cpus: 1, gpus: 8}
    timeout_s: 300
"""

RETURN = r"""
ok:
  description: Whether every expected node is present with its resources.
  type: bool
  returned: always
missing:
  description: Expected nodes not (yet) in the cluster, with host, ip and reason.
  type: list
  returned: always
extra:
  description: IPs of alive nodes that were not expected.
  type: list
  returned: always
nodes:
  description: Alive nodes by IP (node_id, hostname, cpus, gpus).
  type: dict
  returned: always
message:
  description: One-line summary.
  type: str
  returned: always
elapsed_s:
  description: Seconds spent waiting.
  type: float
  returned: always
"""

import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_ops.deploy.plugins.module_utils.host.ray_cluster import (
    NODE_TABLE_SCRIPT, RayStatusError, check_cluster, parse_node_table, validate_expected)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            python=dict(type="path", required=True),
            address=dict(type="str", required=True),
            expected=dict(type="list", elements="dict", required=True),
            timeout_s=dict(type="int", default=120),
            poll_s=dict(type="int", default=3),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        validate_expected(p["expected"])
    except RayStatusError as e:
        module.fail_json(msg="expected: %s" % e)
    start = time.time()
    deadline = start + max(p["timeout_s"], 0)
    result = None
    last_error = ""
    while True:
        rc, out, err = module.run_command([p["python"], "-c", NODE_TABLE_SCRIPT, p["address"]])
        if rc == 0:
            try:
                result = check_cluster(parse_node_table(out), p["expected"])
                last_error = ""
            except RayStatusError as e:
                last_error = str(e)
        else:
            tail = (err or out).strip().splitlines()[-1:] or ["exit code %d" % rc]
            last_error = "cannot read the node table from %s: %s" % (p["address"], tail[0])
        if result is not None and result["ok"] or time.time() >= deadline:
            break
        time.sleep(max(p["poll_s"], 1))
    elapsed = round(time.time() - start, 1)
    if result is None:
        module.fail_json(msg="Ray head at %s did not answer within %d s: %s"
                         % (p["address"], p["timeout_s"], last_error),
                         ok=False, missing=[dict(host=e["host"], ip=e["ip"],
                                                 reason="cluster not readable")
                                            for e in p["expected"]],
                         extra=[], nodes={}, message=last_error, elapsed_s=elapsed)
    result["elapsed_s"] = elapsed
    if not result["ok"]:
        module.fail_json(msg="Ray cluster at %s incomplete after %d s: %s"
                         % (p["address"], p["timeout_s"], result["message"]), **result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
