"""Plan a vLLM install for the vllm_install role: the pin, its venv and the uv argv.

Builds on vllm_source (validation, nightly wheel selection, pin matching, install argv) and
adds what the role needs on top: a pin identity that also covers extra requirements and
excluded packages (each distinct package set gets its own venv, so a change is a blue/green
switch and never an in-place rebuild of the serving venv), and the exact uv command line.

Pure Python (stdlib only, Python >= 3.9).
"""
from __future__ import annotations

import hashlib
import json
import posixpath
import re

from ansible.module_utils.vllm_source import (
    SourceError, index_url, install_command, metadata_url, select_wheel,
    validate_source, variant_missing_message, variants_from_project_list,
    version_matches_pin)

_REQ_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?\s*"
                     r"((==|>=|<=|~=|!=|<|>)[^\s;]+(\s*,\s*(==|>=|<=|~=|!=|<|>)[^\s;]+)*)?$")
_PKG_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
TORCH_BACKEND_RE = re.compile(r"^(auto|none|cpu|cu[0-9]{2,3}|rocm[0-9.]+|xpu)$")


def _clean_list(values, what, pattern, prefix):
    out = []
    for value in values or []:
        value = str(value).strip()
        if not pattern.match(value):
            raise SourceError("%s%s: %r is not a %s" % (
                prefix, what, value,
                "requirement such as transformers==5.19.0" if what == "extra_requirements"
                else "package name"))
        out.append(value)
    return sorted(set(out))


def make_pin(source, extra_requirements=(), excludes=(), wheel=None):
    """The pin: what decides the venv (its id) and what the marker file records.

    Two installs with the same pin produce the same venv; any change (another source, other
    extra requirements, other excluded packages) gives a new id, hence a new venv.
    """
    extras = sorted(extra_requirements or [])
    excl = sorted(excludes or [])
    pin_id = source["pin_id"]
    if extras or excl:
        digest = hashlib.sha256(json.dumps({"extra_requirements": extras, "excludes": excl},
                                           sort_keys=True).encode()).hexdigest()[:8]
        pin_id = "%s-%s" % (pin_id, digest)
    return {
        "id": pin_id,
        "pin": source["pin"],
        "kind": source["kind"],
        "package": source["package"],
        "version": source["version"],
        "commit": source["commit"],
        "variant": source["variant"],
        "wheel_url": source["wheel_url"] or (wheel or {}).get("url"),
        "wheel": (wheel or {}).get("filename"),
        "wheelhouse_dir": source["wheelhouse_dir"],
        "extra_requirements": extras,
        "excludes": excl,
    }


def resolve_wheel(source, metadata=None, project_list=None, machine="x86_64", python=(3, 11)):
    """For a commit source: the exact wheel from the commit's metadata.json, else None.

    ``metadata`` is the text (or list) of ``metadata_url(commit, variant)``; None means the
    index answered no metadata.json for that variant (HTTP 403/404), which is reported with
    the variants ``project_list`` (the HTML of ``index_url(commit)``) shows.
    """
    if source["kind"] != "commit":
        return None
    present = variants_from_project_list(project_list) if project_list else []
    if metadata is None or metadata == "":
        raise SourceError(
            "%s (no %s)" % (variant_missing_message(source["commit"],
                                                    source["variant"] or "default", present),
                            metadata_url(source["commit"], source["variant"])))
    return select_wheel(metadata, source["commit"], source["variant"], machine=machine,
                        python=tuple(python), available_variants=present)


def plan(settings, root, uv="uv", metadata=None, project_list=None, machine="x86_64",
         python=(3, 11), extra_requirements=(), excludes=(), excludes_file=None,
         find_links=(), torch_index_url="", torch_backend="", uv_extra_args=(),
         check_paths=False, resolve=True, prefix="vllm_install_"):
    """Validate the settings and compute {source, pin, venv, argv, wheel, metadata_url}.

    settings: the vllm_source.validate_source keys. root: the install root (venvs go to
    ROOT/venvs/<pin id>). torch_backend: "" picks per source (commit -> its variant, pypi and
    wheel URL -> auto, cpu and wheelhouse -> none: torch from find_links / the torch index);
    "none" never passes --torch-backend. With ``resolve`` false a commit source is validated
    but its wheel is not selected (argv is then None).
    """
    source = validate_source(settings, prefix=prefix, check_paths=check_paths)
    extras = _clean_list(extra_requirements, "extra_requirements", _REQ_RE, prefix)
    excl = _clean_list(excludes, "excludes", _PKG_RE, prefix)
    torch_backend = (torch_backend or "").strip()
    if torch_backend and not TORCH_BACKEND_RE.match(torch_backend):
        raise SourceError("%storch_backend=%r is not a uv torch backend (auto, none, cpu, "
                          "cu128, cu129, cu130, ...)" % (prefix, torch_backend))
    if source["kind"] == "wheelhouse" and torch_backend not in ("", "none"):
        raise SourceError("%storch_backend=%r does not apply to a wheelhouse (installed with "
                          "--no-index): put the torch wheel in %s"
                          % (prefix, torch_backend, source["wheelhouse_dir"]))
    wheel = None
    if resolve:
        wheel = resolve_wheel(source, metadata, project_list, machine, python)
    pin = make_pin(source, extras, excl, wheel)
    venv = posixpath.join(root, "venvs", pin["id"])
    result = {"source": source, "pin": pin, "venv": venv, "wheel": wheel, "argv": None,
              "metadata_url": (metadata_url(source["commit"], source["variant"])
                               if source["kind"] == "commit" else None)}
    if source["kind"] == "commit" and wheel is None:
        return result

    backend = torch_backend
    extra_index_urls = []
    extra = []
    if source["kind"] == "commit":
        # The commit's own index as well, as in vLLM's documented install: dependencies
        # built for that nightly resolve from there.
        extra_index_urls.append(index_url(source["commit"], source["variant"]))
    if source["kind"] == "cpu":
        backend = backend or "none"
        if torch_index_url:
            extra_index_urls.append(torch_index_url)
            extra += ["--index-strategy", "unsafe-best-match"]
    if source["kind"] == "wheelhouse":
        backend = "none"
    argv = install_command(source, venv, installer="uv", uv=uv,
                           wheel_url=wheel["url"] if wheel else None,
                           torch_backend=backend or None,
                           find_links=list(find_links or []),
                           extra_index_urls=extra_index_urls)
    argv += ["--system-certs"] + extra
    if excl:
        if not excludes_file:
            raise SourceError("excludes given but no excludes_file to write them to")
        argv += ["--excludes", excludes_file]
    argv += [str(a) for a in (uv_extra_args or [])]
    argv += extras
    result["argv"] = argv
    return result


def check_installed(installed, settings, prefix="vllm_install_"):
    """(ok, reason): does the installed version satisfy the pin described by ``settings``?"""
    return version_matches_pin(installed, validate_source(settings, prefix=prefix))
