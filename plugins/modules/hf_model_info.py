#!/usr/bin/python
"""Ansible module: read-only check of a pinned Hub model before it is downloaded."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: hf_model_info
short_description: Check that a Hub repository, revision and JSON overrides exist, before any change
description:
  - Read only. Answers, on the host that will download, whether I(repo_id) at I(revision) can be
    downloaded into I(local_dir) as asked, so that a wrong name, revision or override key is refused
    before anything changes on the host.
  - When I(local_dir) already holds the repository at that revision (its download manifest matches,
    every file at its size), the Hub is not asked; the overrides are checked against the local files
    (the C(.orig) copy of a file an earlier run patched).
  - Otherwise, with I(remote=true), one metadata call C(GET <endpoint>/api/models/<repo>/revision/<revision>)
    resolves the commit (a missing repository or revision is refused), then each JSON file an override
    patches is read at that commit (C(GET <endpoint>/<repo>/resolve/<sha>/<file>)) and every override is
    applied in memory (a missing key is refused). With I(remote=false) nothing goes over the network and
    the result says what was not checked.
  - Refuses a I(disk_margin_bytes) larger than the filesystem that holds I(local_dir), or larger than its
    free space when a download will run; warns when the weights are already there.
  - Uses only the Python standard library (the downloader venv need not exist yet), the host's proxy
    variables and CA store plus I(ca_pem). The token goes only in an C(Authorization) header, is not sent
    on a redirect to another host, and is never logged.
  - Every refusal names the variable to change (see I(variable_names)) and which host asked which endpoint.
options:
  repo_id:
    description: Repository id, C(org/name).
    type: str
    required: true
  revision:
    description: Branch, tag or 40-hex commit sha.
    type: str
    required: true
  endpoint:
    description: Hub endpoint (HF_ENDPOINT semantics); empty means C(https://huggingface.co).
    type: str
    default: ""
  token:
    description: Hub token for private or gated repositories (sent only as an Authorization header).
    type: str
  local_dir:
    description: Directory the weights are (or will be) downloaded into.
    type: path
    required: true
  manifest:
    description: File name of the download manifest inside I(local_dir).
    type: str
    default: .hf-manifest.json
  allow_patterns:
    description: The download's allow patterns (part of what "already present" means).
    type: list
    elements: str
  ignore_patterns:
    description: The download's ignore patterns.
    type: list
    elements: str
  overrides:
    description: The download's JSON overrides (C({file, set|delete, value, create})) to check.
    type: list
    elements: raw
    default: []
  remote:
    description: Ask the Hub when the weights are not already present; false checks only what is local.
    type: bool
    default: true
  timeout:
    description: Seconds to wait for each Hub answer.
    type: float
    default: 30
  disk_margin_bytes:
    description: Free space the download keeps on the target filesystem on top of the files.
    type: int
    default: 0
  ca_pem:
    description: PEM text of CA certificates to trust besides the host's store (a TLS-inspecting proxy's).
    type: str
  host_name:
    description: Name of the host in the messages (e.g. C(inventory_hostname)). Default the host's name.
    type: str
  variable_names:
    description:
      - Names the messages tell the user to change, keyed by C(repo_id), C(revision), C(endpoint), C(token),
        C(overrides), C(allow_patterns), C(ignore_patterns), C(disk_margin_bytes), C(remote) and C(local_dir)
        (a role passes its own, e.g. C(model_weights_revision)). Missing keys keep the option name.
    type: dict
    default: {}
extends_documentation_fragment:
  - vllm_ops.deploy.attributes
  - vllm_ops.deploy.attributes.PLATFORM
attributes:
  check_mode:
    support: full
    details: Reads only; the same in check mode.
  diff_mode:
    support: none
author:
  - vllm-deploy contributors (@vllm-ops)
"""

EXAMPLES = r"""
- name: Refuse a repository, revision or override key the Hub does not have
  vllm_ops.deploy.hf_model_info:
    repo_id: Qwen/Qwen3-0.6B
    revision: c1899de289a04d12100db370d81485cdf75e47ca
    local_dir: /srv/models/qwen3
    overrides:
      - {file: config.json, set: max_position_embeddings, value: 16384}
    token: "{{ hf_token }}"
  register: _hub
"""

RETURN = r"""
endpoint:
  description: The endpoint that was (or would have been) asked.
  returned: always
  type: str
sha:
  description: The commit the revision resolves to (from the Hub, or the local manifest); null when not asked.
  returned: always
  type: str
present:
  description: Whether I(local_dir) already holds the repository at the revision (no download needed).
  returned: always
  type: bool
present_reason:
  description: Why the weights count as present, or why not.
  returned: always
  type: str
remote_checked:
  description: Whether the Hub was asked.
  returned: always
  type: bool
asked:
  description: The URLs asked, in order (no token in them).
  returned: always
  type: list
  elements: str
skipped:
  description: What was not checked because I(remote=false).
  returned: when the Hub was not asked because of I(remote=false)
  type: str
overrides_checked:
  description: The JSON files every override was checked against.
  returned: always
  type: list
  elements: str
filesystem:
  description: The filesystem that holds I(local_dir) (its nearest existing directory), total and free bytes.
  returned: always
  type: dict
"""

import platform

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_ops.deploy.plugins.module_utils.weights.hf_weights import HfWeightsError
from ansible_collections.vllm_ops.deploy.plugins.module_utils.weights.hub_check import (
    HubCheckError, check)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            repo_id=dict(type="str", required=True),
            revision=dict(type="str", required=True),
            endpoint=dict(type="str", default=""),
            token=dict(type="str", no_log=True),
            local_dir=dict(type="path", required=True),
            manifest=dict(type="str", default=".hf-manifest.json"),
            allow_patterns=dict(type="list", elements="str"),
            ignore_patterns=dict(type="list", elements="str"),
            overrides=dict(type="list", elements="raw", default=[]),
            remote=dict(type="bool", default=True),
            timeout=dict(type="float", default=30),
            disk_margin_bytes=dict(type="int", default=0),
            ca_pem=dict(type="str"),
            host_name=dict(type="str"),
            variable_names=dict(type="dict", default={}),
        ),
        supports_check_mode=True,
    )
    host = "host %s" % (module.params["host_name"] or platform.node())
    try:
        result = check(module.params, host=host)
    except (HubCheckError, HfWeightsError) as exc:
        module.fail_json(msg=str(exc))
    for warning in result.pop("warnings"):
        module.warn(warning)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
