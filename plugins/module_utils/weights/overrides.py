# -*- coding: utf-8 -*-
"""Declarative JSON overrides of a checkpoint's files (set / delete at a key path), planned
against the pristine files and written with a one-time ``.orig`` backup.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os

from ansible_collections.vllm_ops.deploy.plugins.module_utils.weights.local_files import (
    git_blob_oid, HfWeightsError)


OVERRIDE_OPS = ("set", "delete")

# Example: drop the FP8 KV-cache scheme a checkpoint declares (SM120 cannot run it, and a
# scheme declared in the checkpoint forces FP8 KV whatever --kv-cache-dtype says: vLLM issue
# 34752; editing config.json / hf_quant_config.json is the working fix). Use the entries that
# exist in the checkpoint: a missing key is an error.
FP8_KV_CACHE_OVERRIDE_EXAMPLE = [
    {"file": "config.json", "delete": "quantization_config.kv_cache_scheme"},
    {"file": "hf_quant_config.json", "delete": "quantization.kv_cache_quant_algo"},
]


# ---------------------------------------------------------------- JSON overrides

def _key_path(raw, where):
    if isinstance(raw, str):
        parts = raw.split(".")
    elif isinstance(raw, (list, tuple)):
        parts = list(raw)
    else:
        raise HfWeightsError("%s: key path must be a dotted string or a list, got %r"
                             % (where, raw))
    if not parts or any(isinstance(p, bool) or not isinstance(p, (str, int)) or p == ""
                        for p in parts):
        raise HfWeightsError("%s: bad key path %r" % (where, raw))
    return parts


def normalize_overrides(overrides):
    """Validate ``overrides`` (a list of {file, set|delete, value, create}) into a canonical
    list of {"file", "op", "path", ["value"], ["create"]}."""
    if overrides is None:
        return []
    if not isinstance(overrides, list):
        raise HfWeightsError("overrides must be a list, got %s" % type(overrides).__name__)
    out = []
    for i, item in enumerate(overrides):
        where = "overrides[%d]" % i
        if not isinstance(item, dict):
            raise HfWeightsError("%s must be a dict, got %r" % (where, item))
        ops = [op for op in OVERRIDE_OPS if op in item]
        unknown = sorted(set(item) - set(OVERRIDE_OPS) - {"file", "value", "create"})
        if unknown:
            raise HfWeightsError("%s: unknown keys %s" % (where, ", ".join(unknown)))
        if len(ops) != 1:
            raise HfWeightsError("%s needs exactly one of set / delete" % where)
        f = item.get("file")
        if not isinstance(f, str) or not f.endswith(".json") or f.startswith("/") \
                or ".." in f.replace("\\", "/").split("/"):
            raise HfWeightsError("%s: file must be a repo-relative .json path, got %r"
                                 % (where, f))
        op = ops[0]
        entry = {"file": f, "op": op, "path": _key_path(item[op], where)}
        if op == "set":
            if "value" not in item:
                raise HfWeightsError("%s: set needs a value" % where)
            entry["value"] = item["value"]
            entry["create"] = bool(item.get("create", False))
        elif "value" in item or "create" in item:
            raise HfWeightsError("%s: delete takes no value/create" % where)
        out.append(entry)
    return out


def _fmt_path(parts):
    return ".".join(str(p) for p in parts)


def apply_json_ops(obj, ops, filename):
    """Apply canonical ops to a deep copy of obj. A missing key/parent is an error."""
    obj = copy.deepcopy(obj)
    for op in ops:
        parts = op["path"]
        node = obj
        for depth, key in enumerate(parts[:-1]):
            node = _child(node, key, filename, parts[:depth + 1])
        last = parts[-1]
        if op["op"] == "delete":
            _child(node, last, filename, parts)
            del node[last]
        else:
            if not (op.get("create") and isinstance(node, dict)):
                _child(node, last, filename, parts)
            node[last] = copy.deepcopy(op["value"])
    return obj


def _child(node, key, filename, shown):
    if isinstance(node, dict) and isinstance(key, str) and key in node:
        return node[key]
    if isinstance(node, list) and isinstance(key, int) and -len(node) <= key < len(node):
        return node[key]
    raise HfWeightsError("override: key %s not found in %s" % (_fmt_path(shown), filename))


def _load_json(path, label):
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except (IOError, OSError) as exc:
        raise HfWeightsError("override: cannot read %s: %s" % (label, exc))
    try:
        return raw, json.loads(raw.decode("utf-8"))
    except ValueError as exc:
        raise HfWeightsError("override: %s is not valid JSON: %s" % (label, exc))


def _dump_json(obj):
    return (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def plan_overrides(local_dir, overrides, pristine_oids=None):
    """Compute every override in memory (nothing written). ``pristine_oids`` maps a file to
    its git blob id at the pinned sha: a current file with that id is a fresh download (the
    base to patch and back up); otherwise the ``.orig`` backup is the base when present.
    Returns a list of {"file", "changed", "write_backup", "content", "sha256"}."""
    pristine_oids = pristine_oids or {}
    by_file = {}
    order = []
    for op in overrides:
        if op["file"] not in by_file:
            by_file[op["file"]] = []
            order.append(op["file"])
        by_file[op["file"]].append(op)
    plans = []
    for rel in order:
        full = os.path.join(local_dir, rel)
        cur_raw, cur = _load_json(full, rel)
        backup = full + ".orig"
        fresh = pristine_oids.get(rel) == git_blob_oid(cur_raw)
        if os.path.exists(backup) and not fresh:
            base_raw, base = _load_json(backup, rel + ".orig")
        else:
            base_raw, base = cur_raw, cur
        new = apply_json_ops(base, by_file[rel], rel)
        changed = new != cur
        write_backup = base_raw is cur_raw and (
            not os.path.exists(backup) or _load_json(backup, rel + ".orig")[0] != cur_raw)
        content = _dump_json(new) if changed else cur_raw
        plans.append({"file": rel, "changed": changed, "write_backup": changed and write_backup,
                      "content": content, "sha256": hashlib.sha256(content).hexdigest()})
    return plans


def write_overrides(local_dir, plans):
    """Write planned overrides: backup first (only when planned), then the patched file."""
    for plan in plans:
        if not plan["changed"]:
            continue
        full = os.path.join(local_dir, plan["file"])
        if plan["write_backup"]:
            with open(full, "rb") as f:
                raw = f.read()
            with open(full + ".orig.tmp", "wb") as f:
                f.write(raw)
            os.replace(full + ".orig.tmp", full + ".orig")
        mode = os.stat(full).st_mode & 0o7777
        with open(full + ".tmp", "wb") as f:
            f.write(plan["content"])
        os.chmod(full + ".tmp", mode)
        os.replace(full + ".tmp", full)
    return [{"file": p["file"], "changed": p["changed"], "backup": p["file"] + ".orig",
             "sha256": p["sha256"]} for p in plans]
