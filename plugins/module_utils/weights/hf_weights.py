# -*- coding: utf-8 -*-
"""Pure logic for pinned Hugging Face weight downloads (no Ansible, no huggingface_hub).

Used by plugins/module_utils/weights/hf_model_download.py (the hf_model_download module). Everything here works on plain dicts and the
local filesystem so it can be unit-tested without a network:

* pattern validation and filtering (same semantics as huggingface_hub's filter_repo_objects:
  ``fnmatch.fnmatchcase``, ``*`` crosses ``/``, a pattern ending in ``/`` means the folder);
* disk preflight (selected bytes + margin vs free bytes on the target filesystem);
* cheap verification of a ``local_dir`` download (sizes, ``.cache/huggingface/download/
  <path>.metadata`` commit == pinned sha, no ``*.incomplete``);
* hash verification against the digests the Hub lists (sha256 = LFS oid of a large file, git
  blob sha1 of a small one), in parallel (weights_hash), and which files a run must hash;
* progress sampling (bytes on disk during a download);
* the manifest written next to the weights (with per-file digests, when every file was last
  hashed, and an ``invalid`` record after a failed hash check), and whether it allows a
  no-network no-op;
* declarative JSON overrides (set / delete at a key path) with a one-time ``.orig`` backup.

Expected files are given as ``{path: {"size": int, "sha256": str|None, "oid": str|None}}``
(``sha256`` for LFS files, ``oid`` = git blob id for the others), as listed by the Hub tree API.

The parts: local_files.py, manifest.py, overrides.py; their names are imported here.
"""
from __future__ import annotations

from ansible_collections.vllm_ops.deploy.plugins.module_utils.weights.local_files import (
    bytes_missing, check_hashes, digest_of, discard_damaged, disk_preflight, existing_ancestor,
    expected_from_manifest, file_complete, files_to_hash, find_incomplete, flagged_files,
    free_bytes, git_blob_oid, HfWeightsError, human_bytes, incomplete_bytes, is_commit_sha,
    MANIFEST_FORMAT, merge_reports, metadata_path, normalize_patterns, path_selected,
    progress_bytes, read_download_metadata, remove_incomplete, select_files, verify_local_dir)
from ansible_collections.vllm_ops.deploy.plugins.module_utils.weights.manifest import (
    build_manifest, content_of, invalid_record, manifest_matches, read_manifest,
    request_from_manifest, utc_now, with_state, write_json_atomic)
from ansible_collections.vllm_ops.deploy.plugins.module_utils.weights.overrides import (
    apply_json_ops, FP8_KV_CACHE_OVERRIDE_EXAMPLE, normalize_overrides, plan_overrides,
    write_overrides)

__all__ = (
    "apply_json_ops", "build_manifest", "bytes_missing", "check_hashes", "content_of",
    "digest_of", "discard_damaged", "disk_preflight", "existing_ancestor",
    "expected_from_manifest", "file_complete", "files_to_hash", "find_incomplete",
    "flagged_files", "FP8_KV_CACHE_OVERRIDE_EXAMPLE", "free_bytes", "git_blob_oid",
    "HfWeightsError", "human_bytes", "incomplete_bytes", "invalid_record", "is_commit_sha",
    "MANIFEST_FORMAT", "manifest_matches", "merge_reports", "metadata_path",
    "normalize_overrides", "normalize_patterns", "path_selected", "plan_overrides",
    "progress_bytes", "read_download_metadata", "read_manifest", "remove_incomplete",
    "request_from_manifest", "select_files", "utc_now", "verify_local_dir", "with_state",
    "write_json_atomic", "write_overrides")
