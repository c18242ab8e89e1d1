"""The PATH of a service unit: the serving venv's bin/ first, then where the tools the
service runs by name were found on the host.

systemd's default PATH (/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin) holds
neither a venv's bin/ nor a pip-installed CUDA toolkit, and vLLM, torch's C++ extensions
and FlashInfer's JIT run ``ninja`` and ``nvcc`` by name: a unit without a PATH that names
them crash-loops (``FileNotFoundError: 'ninja'``) where a shell-started server works.

Pure Python, no Ansible: unit-tested directly.
"""
from __future__ import annotations

import os
import re

SYSTEM_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
_SITE_PACKAGES = re.compile(r"^(?P<prefix>/.+)/lib(?:64)?/python3(?:\.\d+)?/(?:site|dist)-packages/?$")


class UnitPathError(Exception):
    """A required tool is not found in any candidate directory."""


def _is_exe(path):
    return os.path.isfile(path) and os.access(path, os.X_OK)


def site_dir_bins(site_dir):
    """Candidate bin directories belonging to a site-packages directory: its environment's
    ``bin/`` (``<prefix>/lib/pythonX.Y/site-packages`` -> ``<prefix>/bin``) and the ninja
    wheel's own binary folder inside it."""
    out = []
    m = _SITE_PACKAGES.match(site_dir.rstrip("/") + "/")
    if m:
        out.append(os.path.join(m.group("prefix"), "bin"))
    out.append(os.path.join(site_dir, "ninja", "data", "bin"))
    return out


def _unique(items):
    seen, out = set(), []
    for item in items:
        if item and item not in seen:
            seen.add(item)
            out.append(item)
    return out


def candidates(python, site_dirs=(), cuda_home="", extra_dirs=(), system_path=SYSTEM_PATH):
    """Directories searched for tools, in order: the venv's bin (the interpreter's folder,
    not resolved, so a `current` link moves PATH along with it), extra_dirs, the site
    directories' bins, CUDA_HOME/bin, then the system directories."""
    venv_bin = os.path.dirname(python)
    dirs = [venv_bin] + list(extra_dirs)
    for site in site_dirs:
        dirs.extend(site_dir_bins(site))
    if cuda_home:
        dirs.append(os.path.join(cuda_home, "bin"))
    dirs.extend(system_path)
    return _unique(dirs)


def build(python, tools, site_dirs=(), cuda_home="", extra_dirs=(), system_path=SYSTEM_PATH,
          is_exe=_is_exe):
    """Find each tool and compose the unit's PATH.

    Returns {'path': 'A:B:...', 'tools': {name: full path}, 'searched': [dirs]}. PATH is the
    venv's bin, extra_dirs, every directory a tool was found in, CUDA_HOME/bin (when given)
    and the system directories, each once. Raises UnitPathError naming every missing tool
    and the directories searched."""
    if not python or not python.startswith("/"):
        raise UnitPathError("python must be an absolute path, got %r" % (python,))
    searched = candidates(python, site_dirs, cuda_home, extra_dirs, system_path)
    found, missing = {}, []
    for tool in tools:
        hit = next((os.path.join(d, tool) for d in searched if is_exe(os.path.join(d, tool))), None)
        if hit:
            found[tool] = hit
        else:
            missing.append(tool)
    if missing:
        raise UnitPathError(
            "%s not found in %s" % (", ".join(missing), ":".join(searched)))
    venv_bin = os.path.dirname(python)
    path = _unique([venv_bin] + list(extra_dirs) + [os.path.dirname(p) for p in found.values()]
                   + ([os.path.join(cuda_home, "bin")] if cuda_home else []) + list(system_path))
    return {"path": ":".join(path), "tools": found, "searched": searched}
