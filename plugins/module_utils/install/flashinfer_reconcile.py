"""Plan how to bring flashinfer-cubin / flashinfer-jit-cache in line with flashinfer-python.

On import, flashinfer (flashinfer/jit/env.py) raises
``RuntimeError: flashinfer-cubin version (X) does not match flashinfer version (Y)`` when the
cubin package's version differs from its own, and the same for flashinfer-jit-cache when that
version does not start with its own (newer releases compare the public part exactly; the
jit-cache carries a ``+cuXYZ`` local label, e.g. ``0.6.16+cu130``). Since 0.6.14 cubin and
jit-cache are only on https://flashinfer.ai/whl (jit-cache under /cu129, /cu130), not PyPI
(which holds <= 0.6.13), so upgrading vLLM can leave a stale cubin behind.

Rules used here:
  cubin     must equal flashinfer-python's version exactly;
  jit-cache must be ``<python version>+cu<XY>`` with the CUDA version of the venv's torch.
Mode ``match`` installs the matching build (from a configurable index), mode ``remove``
uninstalls the mismatched extra. An extra that is not installed is left alone. The bypass
variable FLASHINFER_DISABLE_VERSION_CHECK is never set.

Pure Python, stdlib only, Python >= 3.9.
"""
from __future__ import annotations

import ast
import importlib.util
import os
import re

PYTHON_PKG = "flashinfer-python"
CUBIN_PKG = "flashinfer-cubin"
JIT_PKG = "flashinfer-jit-cache"
PACKAGES = (PYTHON_PKG, CUBIN_PKG, JIT_PKG)
DEFAULT_CUBIN_INDEX_URL = "https://flashinfer.ai/whl"
DEFAULT_JIT_CACHE_INDEX_URL = "https://flashinfer.ai/whl/{cuda_tag}"
MODES = ("match", "remove")


class ReconcileError(ValueError):
    """The versions cannot be reconciled as asked (raised before anything changes)."""


def cuda_tag(torch_cuda):
    """torch.version.cuda ('13.0', '12.9', '12.8.1') -> 'cu130', 'cu129', 'cu128'; None -> None."""
    if torch_cuda is None or str(torch_cuda).strip() == "":
        return None
    m = re.match(r"^(\d+)\.(\d+)(?:\.\d+)*$", str(torch_cuda).strip())
    if not m:
        raise ReconcileError("torch CUDA version %r is not of the form MAJOR.MINOR"
                             % (torch_cuda,))
    return "cu%s%s" % (m.group(1), m.group(2))


def split_local(version):
    """'0.6.16+cu130' -> ('0.6.16', 'cu130'); '0.6.16' -> ('0.6.16', None)."""
    public, _unused, local = str(version).partition("+")
    return public, (local or None)


def mask_url(url):
    """Hide user:password in an index URL before it is reported."""
    if not url:
        return url
    return re.sub(r"(://)[^/@]+@", r"\1***@", url)


def plan_reconcile(versions, torch_cuda, mode="match", cubin_index_url=DEFAULT_CUBIN_INDEX_URL,
                   jit_cache_index_url=DEFAULT_JIT_CACHE_INDEX_URL):
    """Compute the actions that make ``import flashinfer`` pass its version checks.

    versions: {package name: installed version or None} for the three packages.
    torch_cuda: torch.version.cuda of the venv (None for CPU torch or no torch).
    cubin_index_url / jit_cache_index_url: where ``match`` installs from; ``{cuda_tag}`` in
    the jit-cache URL becomes e.g. cu130. An empty value means "the installer's configured
    index" (no index flag).

    Returns {python, cuda_tag, actions, ok, note}; each action is
    {package, action: install|uninstall, from, to, requirement, index_url}.
    Raises ReconcileError for a bad mode or a jit-cache whose CUDA build cannot be known.
    """
    if mode not in MODES:
        raise ReconcileError("mode must be one of %s, got %r" % (", ".join(MODES), mode))
    tag = cuda_tag(torch_cuda)
    python_v = versions.get(PYTHON_PKG)
    cubin_v = versions.get(CUBIN_PKG)
    jit_v = versions.get(JIT_PKG)
    result = {"python": python_v, "cuda_tag": tag, "actions": [], "ok": [], "note": None}
    if not python_v:
        result["note"] = ("%s is not installed: nothing to reconcile (installed: %s)"
                          % (PYTHON_PKG, ", ".join("%s %s" % (p, v) for p, v in
                                                   sorted(versions.items()) if v) or "none"))
        return result

    def uninstall(pkg, have):
        return {"package": pkg, "action": "uninstall", "from": have, "to": None,
                "requirement": pkg, "index_url": None}

    if cubin_v:
        if cubin_v == python_v:
            result["ok"].append(CUBIN_PKG)
        elif mode == "remove":
            result["actions"].append(uninstall(CUBIN_PKG, cubin_v))
        else:
            result["actions"].append({
                "package": CUBIN_PKG, "action": "install", "from": cubin_v, "to": python_v,
                "requirement": "%s==%s" % (CUBIN_PKG, python_v),
                "index_url": cubin_index_url or None})

    if jit_v:
        public, local = split_local(jit_v)
        if public == python_v and (tag is None or local == tag):
            # Without a CUDA torch the suffix cannot be checked; flashinfer's own check passes.
            result["ok"].append(JIT_PKG)
        elif mode == "remove":
            result["actions"].append(uninstall(JIT_PKG, jit_v))
        elif tag is None:
            raise ReconcileError(
                "%s %s does not match %s %s, and torch in this venv reports no CUDA version "
                "(torch.version.cuda is None or torch is missing), so the +cuXYZ build to "
                "install is unknown; use mode=remove or install a CUDA build of torch first"
                % (JIT_PKG, jit_v, PYTHON_PKG, python_v))
        else:
            want = "%s+%s" % (python_v, tag)
            url = (jit_cache_index_url or "").replace("{cuda_tag}", tag) or None
            result["actions"].append({
                "package": JIT_PKG, "action": "install", "from": jit_v, "to": want,
                "requirement": "%s==%s" % (JIT_PKG, want), "index_url": url})
    return result


def action_argv(action, python, installer="pip", uv="uv", extra_args=None):
    """The argv (no shell) that carries out one planned action in the venv of ``python``.

    pip: [python, -m, pip, install, --no-deps, REQ, --index-url URL, *extra] (or uninstall -y);
    uv:  [uv, pip, install, --python, python, --no-deps, REQ, --index-url URL, *extra].
    extra_args go to installs only (e.g. --no-index --find-links DIR for air-gapped hosts).
    """
    extra = [str(a) for a in (extra_args or [])]
    if installer == "pip":
        base = [python, "-m", "pip"]
        if action["action"] == "uninstall":
            return base + ["uninstall", "-y", action["package"]]
        argv = base + ["install", "--no-deps", action["requirement"]]
    elif installer == "uv":
        base = [uv, "pip"]
        if action["action"] == "uninstall":
            return base + ["uninstall", "--python", python, action["package"]]
        argv = base + ["install", "--python", python, "--no-deps", action["requirement"]]
    else:
        raise ReconcileError("installer must be 'pip' or 'uv', got %r" % (installer,))
    if action.get("index_url"):
        argv += ["--index-url", action["index_url"]]
    return argv + extra


def describe(actions):
    """Human lines 'flashinfer-cubin: 0.6.12 -> 0.6.13 (install from URL)'."""
    lines = []
    for a in actions:
        if a["action"] == "uninstall":
            lines.append("%s: %s -> removed" % (a["package"], a["from"]))
        else:
            src = " (from %s)" % mask_url(a["index_url"]) if a.get("index_url") else ""
            lines.append("%s: %s -> %s%s" % (a["package"], a["from"], a["to"], src))
    return lines


def predict_versions(versions, actions):
    """The installed versions once ``actions`` ran (what check mode reports)."""
    out = dict(versions)
    for a in actions:
        out[a["package"]] = None if a["action"] == "uninstall" else a["to"]
    return out


def versions_diff(before, after):
    """An Ansible diff of the packages: one ``name==version`` line each (absent: not listed)."""
    def text(versions):
        return "".join("%s==%s\n" % (p, versions[p]) for p in PACKAGES if versions.get(p))
    return {"before": text(before), "after": text(after),
            "before_header": "flashinfer packages", "after_header": "flashinfer packages"}


def public_actions(actions):
    """Actions as reported back (credentials in index URLs masked)."""
    out = []
    for a in actions:
        a = dict(a)
        a["index_url"] = mask_url(a.get("index_url"))
        out.append(a)
    return out


def torch_cuda_version():
    """torch.version.cuda read from torch/version.py without importing torch (None if absent)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    for base in spec.submodule_search_locations:
        path = os.path.join(base, "version.py")
        if not os.path.isfile(path):
            continue
        with open(path) as fh:
            tree = ast.parse(fh.read(), path)
        for node in tree.body:
            target = None
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                target, value = node.target, node.value
            if isinstance(target, ast.Name) and target.id == "cuda":
                try:
                    found = ast.literal_eval(value)
                except ValueError:
                    return None
                return str(found) if found else None
    return None
