#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: pinned Hugging Face weight download with preflight, verify and manifest
(the logic is in plugins/module_utils/hf_download.py and hf_weights.py)."""
from __future__ import annotations

DOCUMENTATION = r"""
module: hf_model_download
short_description: Download a Hugging Face model at a pinned commit, verified, with a manifest
description:
  - Runs on the target host with the interpreter of a dedicated downloader venv that has
    huggingface_hub 1.x or 2.x (C(ansible_python_interpreter=<venv>/bin/python)). Tested with
    huggingface_hub 2.4.0 against olah 0.5.4.
  - If the manifest in I(local_dir) matches the request (repo, sha or recorded revision,
    patterns, overrides) and every listed file has its recorded size, nothing is contacted and
    nothing changes.
  - Otherwise resolves a branch/tag to a commit sha (once; the sha is recorded in the
    manifest), lists the repo tree with sizes at that sha, selects files with the patterns,
    checks the disk (bytes still missing + I(disk_margin_bytes) vs free bytes), probes access to
    one file (gated repos fail here, before anything is written), checks I(overrides) against
    the pinned JSON files, runs snapshot_download in a child process, verifies the result,
    applies I(overrides), and writes the manifest.
  - While the child downloads, one JSON line per I(progress_interval) seconds is appended to
    C(<local_dir>/.download-progress.json) with bytes_done, bytes_total, rate_bytes_per_s,
    eta_s and downloader_pid. Run the task with C(async) to poll it.
  - "A download killed mid-way resumes at file granularity on the next run: finished files are
    kept, and the part files (C(*.incomplete)) of the killed process are deleted first, since
    huggingface_hub names them per process and never reuses them."
  - The write phase holds a lock in C(<local_dir>/.cache/huggingface/), so a second writer on
    the same directory is refused.
options:
  repo_id:
    description:
      - Model repo id (org/name). Required unless I(offline=true), where leaving out both
        I(repo_id) and I(revision) verifies the files against the manifest's own request.
    type: str
  revision:
    description:
      - Commit sha (recommended), branch or tag. A branch or tag is resolved to a sha.
        Required unless I(offline=true) (see I(repo_id)).
    type: str
  local_dir:
    description: Absolute target directory.
    type: path
    required: true
  allow_patterns:
    description: Glob patterns of files to fetch (huggingface_hub semantics, case-sensitive).
    type: list
    elements: str
  ignore_patterns:
    description: Glob patterns of files to skip.
    type: list
    elements: str
  max_workers:
    description: Parallel file downloads.
    type: int
    default: 8
  endpoint:
    description: Hub endpoint or mirror (what HF_ENDPOINT would hold).
    type: str
  token:
    description:
      - Hub token for gated or private repos. Passed to huggingface_hub as an argument in this
        process and through the HF_TOKEN environment of the downloader child; never on a
        command line, never written to a file.
    type: str
  high_performance:
    description: Set HF_XET_HIGH_PERFORMANCE=1 for the download.
    type: bool
    default: false
  disk_margin_bytes:
    description: Free bytes to keep on top of the download.
    type: int
    default: 5000000000
  verify_hashes:
    description: Also sha256 every LFS file after the download (slow on large checkpoints).
    type: bool
    default: false
  overrides:
    description:
      - JSON patches on JSON files of the download. Each is a dict with C(file) and one of
        C(set) or C(delete) (a key path), plus C(value) and C(create) for C(set). A key path is
        a dotted string or a list (a list for keys containing dots, ints for list indexes).
      - C(set) replaces an existing key (C(create=true) allows a new key); C(delete) removes
        one. A missing key is an error and nothing is written. The original is kept once as
        C(<file>.orig); applying again is a no-op; re-applied after a re-download.
    type: list
    elements: dict
    default: []
  manifest:
    description: Manifest file name inside local_dir.
    type: str
    default: .hf-manifest.json
  progress_interval:
    description: Seconds between progress lines.
    type: float
    default: 5
  offline:
    description:
      - Verify only. Succeeds (unchanged) when the manifest in I(local_dir) proves the request
        (what a re-run checks before any network call); otherwise fails, naming why, without
        contacting the Hub or writing anything. For weights on shared storage or copied from
        another host. Needs no huggingface_hub (any Python >= 3.9 runs it).
    type: bool
    default: false
notes:
  - Check mode reports the plan (bytes_needed, bytes_free) after the read-only Hub calls.
  - Plain-HTTP downloads are refused by huggingface_hub above 50 GB per file; larger files
    need the Xet path of the real Hub.
extends_documentation_fragment:
  - vllm_ops.deploy.attributes
  - vllm_ops.deploy.attributes.PLATFORM
attributes:
  check_mode:
    support: full
    details: Reports the plan (bytes_needed, bytes_free) after the read-only Hub calls; downloads and writes nothing.
  diff_mode:
    support: full
    details: The manifest's commit and files before, and after (predicted in check mode).
author:
  - vllm-deploy contributors (@vllm-ops)
"""

EXAMPLES = r"""
- name: Fetch MiniMax-M2.5 at a pinned commit (downloader venv interpreter)
  vllm_ops.deploy.hf_model_download:
    repo_id: MiniMaxAI/MiniMax-M2.5
    revision: "<40-hex commit sha>"
    local_dir: /srv/models/MiniMax-M2.5
    allow_patterns: ["*.json", "*.safetensors", "*.py", "*.txt", "*.jinja"]
    max_workers: 16
    high_performance: true
    token: "{{ vault_hf_token | default(omit) }}"
  vars:
    ansible_python_interpreter: /opt/hf-downloader/bin/python

- name: Drop the FP8 KV-cache scheme declared by the checkpoint (SM120)
  vllm_ops.deploy.hf_model_download:
    repo_id: org/model-fp8
    revision: main
    local_dir: /srv/models/model-fp8
    overrides:
      - {file: config.json, delete: quantization_config.kv_cache_scheme}
      - {file: hf_quant_config.json, delete: quantization.kv_cache_quant_algo}
"""

RETURN = r"""
sha:
  description: Commit sha of the files.
  returned: always
  type: str
revision:
  description: Revision asked for.
  returned: always
  type: str
files:
  description: Selected files and their sizes in bytes.
  returned: always
  type: dict
bytes:
  description: Total bytes of the selected files.
  returned: always
  type: int
bytes_needed:
  description: Bytes still to download before this run.
  returned: when the Hub was contacted
  type: int
bytes_free:
  description: Free bytes on the target filesystem before this run.
  returned: when the Hub was contacted
  type: int
downloaded:
  description: Whether snapshot_download ran.
  returned: always
  type: bool
would_download:
  description: In check mode, whether a download is needed.
  returned: check mode
  type: bool
verified:
  description: Whether the cheap verification passed (sizes, metadata commit, no .incomplete).
  returned: always
  type: bool
hashes_verified:
  description: Whether the sha256 of LFS files were checked.
  returned: always
  type: bool
manifest:
  description: Path of the manifest.
  returned: always
  type: str
progress_file:
  description: Path of the progress JSON-lines file.
  returned: always
  type: str
overrides_applied:
  description: One entry per patched file with file, changed, backup and sha256 (after).
  returned: always
  type: list
stale_incomplete_removed:
  description: Part files of an earlier killed download deleted before downloading.
  returned: when a download ran
  type: int
damaged_removed:
  description: Files present with the wrong size, deleted (with their metadata) so they are fetched again.
  returned: when a download ran
  type: list
  elements: str
reason:
  description: Why the Hub was or was not contacted.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_ops.deploy.plugins.module_utils.hf_download import (
    DownloadFailed, download)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            repo_id=dict(type="str"),
            revision=dict(type="str"),
            local_dir=dict(type="path", required=True),
            allow_patterns=dict(type="list", elements="str"),
            ignore_patterns=dict(type="list", elements="str"),
            max_workers=dict(type="int", default=8),
            endpoint=dict(type="str"),
            token=dict(type="str", no_log=True),
            high_performance=dict(type="bool", default=False),
            disk_margin_bytes=dict(type="int", default=5000000000),
            verify_hashes=dict(type="bool", default=False),
            overrides=dict(type="list", elements="dict", default=[]),
            manifest=dict(type="str", default=".hf-manifest.json"),
            progress_interval=dict(type="float", default=5.0),
            offline=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
        required_if=[("offline", False, ("repo_id", "revision"))],
        required_together=[("repo_id", "revision")],
    )
    try:
        result = download(module.params, check_mode=module.check_mode)
    except DownloadFailed as exc:
        module.fail_json(msg=str(exc), **exc.result)
    if not module._diff:
        result.pop("diff", None)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
