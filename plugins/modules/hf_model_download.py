#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: pinned Hugging Face weight download with preflight, verify and manifest
(the logic is in plugins/module_utils/weights/hf_model_download.py and hf_weights.py)."""
from __future__ import annotations

DOCUMENTATION = r"""
module: hf_model_download
short_description: Download a Hugging Face model at a pinned commit, verified, with a manifest
description:
  - Runs on the target host with the interpreter of a dedicated downloader venv that has
    huggingface_hub 1.x or 2.x (C(ansible_python_interpreter=<venv>/bin/python)). Tested with
    huggingface_hub 2.4.0 against olah 0.5.4.
  - "If the manifest in I(local_dir) matches the request (repo, sha or recorded revision,
    patterns, overrides) and every listed file has its recorded size (the cheap check), nothing
    is contacted and nothing changes. That check does not see a damaged file of the right size;
    file digests (sha256 = LFS oid of a large file, git blob sha1 of a small one, as the Hub's
    tree lists them and the manifest records them) are checked where it matters, see
    I(verify_hashes)."
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
  - "Hashes are checked, in parallel (I(hash_workers)), for: every file on the first download
    (or whenever the manifest records no complete hash pass), every file fetched in the run,
    files a failed check flagged, files in I(hash_files), and every file with
    I(verify_hashes=true). The result's C(hash) says how many files and bytes, and at what MB/s."
  - "A file whose digest is wrong is deleted with its huggingface_hub metadata and lock,
    downloaded again in the same run and hashed again (C(repaired), C(bytes_fetched)); the
    manifest is marked invalid first, so a run that stops there leaves no manifest that a later
    run would accept without hashing those files. A file still wrong after the second download
    fails the task (the endpoint serves content that does not match its own tree)."
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
    description:
      - Check the digest of every file in this run, also when the manifest matches (on a
        500 GB checkpoint this reads 500 GB). Without it, digests are checked only where it
        matters (see the description).
    type: bool
    default: false
  hash_workers:
    description: Threads hashing files in parallel; C(0) = one per core (2 to 16).
    type: int
    default: 0
  hash_files:
    description:
      - Files (repo-relative paths) to hash in this run in any case, e.g. the files an rsync
        just copied. Paths that are not among the selected files are ignored.
    type: list
    elements: str
  source_manifest:
    description:
      - With I(offline=true), the manifest the files must match (the fan-out source's, for a
        copy), instead of the one in I(local_dir). The local manifest then records this copy's
        own state (checked, hashed, invalid) next to the source manifest's content; it is
        written only when that state changes.
    type: dict
  on_damage:
    description:
      - What a failed hash check does. C(repair) (the default unless I(offline)) downloads the
        damaged files again; C(fail) (the default with I(offline)) fails naming them; C(report)
        returns C(verified=false) with the files in C(damaged), for the caller to repair (the
        fan-out copies its source's files again). The manifest is marked invalid in every case.
    type: str
    choices: [repair, fail, report]
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
      - Verify only. Succeeds (unchanged) when the manifest in I(local_dir) (or
        I(source_manifest)) proves the request, with the hash checks described above; otherwise
        fails, naming why, without contacting the Hub or touching the files (only the
        manifest's record of this check is written). For weights on shared storage or copied
        from another host. Needs no huggingface_hub (any Python >= 3.9 runs it).
    type: bool
    default: false
notes:
  - Check mode reports the plan (bytes_needed, bytes_free) after the read-only Hub calls; the
    hash checks run (they only read) and C(would_repair) lists what a run would fetch again.
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

- name: Hash every file now (a damaged one is downloaded again in this run)
  vllm_ops.deploy.hf_model_download:
    repo_id: MiniMaxAI/MiniMax-M2.5
    revision: "<40-hex commit sha>"
    local_dir: /srv/models/MiniMax-M2.5
    verify_hashes: true
  vars:
    ansible_python_interpreter: /opt/hf-downloader/bin/python
  register: weights

- name: Check a copy against its source's manifest, offline, reporting what is damaged
  vllm_ops.deploy.hf_model_download:
    local_dir: /srv/models/MiniMax-M2.5
    offline: true
    source_manifest: "{{ source_manifest_json | from_json }}"
    hash_files: [model-00001-of-00042.safetensors]
    on_damage: report
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
  description: Whether every file's digest has been checked since it was written (in this run or an earlier one).
  returned: always
  type: bool
hash:
  description:
    - The hashing of this run (null when nothing was hashed) with files, bytes, elapsed_s,
      mb_per_s (bytes hashed per second of hashing), workers and passes.
  returned: always
  type: dict
damaged:
  description: Files whose digest was wrong in this run, with the digest found and the one expected.
  returned: always
  type: dict
repaired:
  description: Damaged files downloaded again in this run and then found right.
  returned: always
  type: list
  elements: str
bytes_fetched:
  description: Bytes downloaded in this run (the repair's included).
  returned: always
  type: int
manifest_invalidated:
  description: Whether this run marked the manifest invalid (a failed hash check).
  returned: always
  type: bool
would_repair:
  description: In check mode (or with on_damage=report), the damaged files a run would fetch again.
  returned: when a hash check failed
  type: list
  elements: str
unhashable:
  description: Files with no digest to check against (a manifest written before digests were recorded).
  returned: when files were hashed
  type: list
  elements: str
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
from ansible_collections.vllm_ops.deploy.plugins.module_utils.weights.hf_model_download import (
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
            hash_workers=dict(type="int", default=0),
            hash_files=dict(type="list", elements="str"),
            source_manifest=dict(type="dict"),
            on_damage=dict(type="str", choices=["repair", "fail", "report"]),
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
