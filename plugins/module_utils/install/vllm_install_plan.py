"""Plan a vLLM install for the vllm_install role: the pin, its venv and the uv argv.

Builds on vllm_source (validation, nightly wheel selection, pin matching, install argv) and
adds what the role needs on top: a pin identity that also covers extra requirements and
excluded packages (each distinct package set gets its own venv, so a change is a blue/green
switch and never an in-place rebuild of the serving venv), and the exact uv command line.

Pure Python (Python >= 3.9); wheel names through vllm_source (packaging where importable).
"""
from __future__ import annotations

import hashlib
import json
import posixpath
import re

from ansible_collections.vllm_ops.deploy.plugins.module_utils.install.vllm_source import (
    SourceError, index_url, install_command, metadata_url, normalize_name, parse_wheel_filename,
    select_wheel, validate_source, variant_missing_message, variants_from_project_list,
    version_matches_pin)

_REQ_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?\s*"
                     r"((==|>=|<=|~=|!=|<|>)[^\s;]+(\s*,\s*(==|>=|<=|~=|!=|<|>)[^\s;]+)*)?$")
_PKG_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
TORCH_BACKEND_RE = re.compile(r"^(auto|none|cpu|cu[0-9]{2,3}|rocm[0-9.]+|xpu)$")
# Never installed into the venv from a no-deps wheelhouse: the installer itself.
NO_DEPS_SKIP = ("uv",)


def parse_wheel_name(filename):
    """(normalized name, version) of a wheel file name, or None when it is not one."""
    try:
        info = parse_wheel_filename(posixpath.basename(str(filename)))
    except SourceError:
        return None
    return info["package_name"], info["version"]


def find_wheel(filenames, name, version=""):
    """The file name of ``name``'s wheel among ``filenames`` at ``version`` (or any, when
    empty; a local version label such as +cpu or +cu130 also matches), else None."""
    want = normalize_name(name)
    for filename in sorted(filenames or []):
        parsed = parse_wheel_name(filename)
        if parsed and parsed[0] == want and (
                not version or parsed[1] == version or parsed[1].split("+")[0] == version):
            return posixpath.basename(str(filename))
    return None


def no_deps_wheels(filenames, package, version, excludes=(), prefix="vllm_install_"):
    """The wheels of a no-deps wheelhouse install, sorted file names.

    Every wheel of the directory goes in, with ``--no-deps`` (nothing is resolved: the
    directory IS the environment, as an air-gapped wheelhouse made for one machine is), except
    the installer (uv) and the excluded distributions. Refused: no wheel of ``package`` at
    ``version``, two versions of one distribution (which one would win is undefined), and
    files that are not wheels by name.
    """
    wheelhouse = prefix + "wheelhouse"
    chosen, seen = [], {}
    skip = set(normalize_name(x) for x in NO_DEPS_SKIP) | set(normalize_name(x) for x in excludes or [])
    for filename in sorted(posixpath.basename(str(f)) for f in filenames or []):
        parsed = parse_wheel_name(filename)
        if parsed is None:
            raise SourceError("%s: %r is not a wheel file name (NAME-VERSION-PY-ABI-PLATFORM.whl)"
                              % (wheelhouse, filename))
        name, ver = parsed
        if name in skip:
            continue
        seen.setdefault(name, []).append(filename)
        chosen.append(filename)
    twice = dict((n, files) for n, files in seen.items() if len(files) > 1)
    if twice:
        listed = "; ".join("%s (%s)" % (n, ", ".join(f)) for n, f in sorted(twice.items()))
        raise SourceError("%s holds more than one wheel of %s; with %sno_deps every wheel is "
                          "installed, so keep one of each"
                          % (wheelhouse, listed,
                             wheelhouse + "_"))
    if not find_wheel(chosen, package, version):
        present = [parse_wheel_name(f)[1] for f in seen.get(normalize_name(package), [])]
        raise SourceError("%s has no %s wheel%s (present: %s)"
                          % (wheelhouse, package, " of version " + version if version else "",
                             ", ".join(present) or "none"))
    return chosen


def _clean_site_dirs(site_dirs, prefix):
    out = []
    for value in site_dirs or []:
        value = str(value).strip()
        if not value.startswith("/") or "\n" in value or "\r" in value:
            raise SourceError("%ssite_dirs: %r must be an absolute path" % (prefix, value))
        value = posixpath.normpath(value)
        if value not in out:
            out.append(value)
    return out


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


def make_pin(source, extra_requirements=(), excludes=(), wheel=None, wheels=None,
             site_dirs=()):
    """The pin: what decides the venv (its id) and what the marker file records.

    Two installs with the same pin produce the same venv; any change (another source, other
    extra requirements, other excluded packages, another set of no-deps wheels, other site
    directories) gives a new id, hence a new venv.
    """
    extras = sorted(extra_requirements or [])
    excl = sorted(excludes or [])
    site_dirs = list(site_dirs or [])
    pin_id = source["pin_id"]
    identity = {"extra_requirements": extras, "excludes": excl}
    if wheels is not None:
        identity["no_deps_wheels"] = sorted(wheels)
    if site_dirs:
        identity["site_dirs"] = site_dirs
    if extras or excl or wheels is not None or site_dirs:
        digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:8]
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
        "no_deps": wheels is not None,
        "site_dirs": site_dirs,
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
         check_paths=False, resolve=True, prefix="vllm_install_", wheelhouse_wheels=None,
         site_dirs=(), compile_bytecode=True):
    """Validate the settings and compute {source, pin, venv, argv, wheel, metadata_url}.

    settings: the vllm_source.validate_source keys. root: the install root (venvs go to
    ROOT/venvs/<pin id>). torch_backend: "" picks per source (commit -> its variant, pypi and
    wheel URL -> auto, cpu and wheelhouse -> none: torch from find_links / the torch index);
    "none" never passes --torch-backend. With ``resolve`` false a commit source is validated
    but its wheel is not selected (argv is then None).

    wheelhouse_wheels: for a wheelhouse source, the file names in the directory: then every
    wheel is installed with --no-deps (no_deps_wheels) instead of resolving the package's
    requirements; None resolves. site_dirs: directories the venv sees after its own
    site-packages (a .pth file the role writes), e.g. a machine's preinstalled torch.

    compile_bytecode: ``uv pip install --compile-bytecode``: every module is compiled at install
    time. The venv belongs to root and the service user cannot write ``__pycache__`` there, so
    without it each process of every start (API server, engine core, workers) compiles from
    source whatever root's own import check did not load.
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
    site = _clean_site_dirs(site_dirs, prefix)
    wheels = None
    if wheelhouse_wheels is not None:
        if source["kind"] != "wheelhouse":
            raise SourceError("%swheelhouse_no_deps applies only to %swheelhouse (the source is %s)"
                              % (prefix, prefix, source["kind"]))
        if extras:
            raise SourceError("%sextra_requirements cannot be resolved with %swheelhouse_no_deps "
                              "(every wheel of %s is installed as it is): put those wheels in "
                              "the wheelhouse instead" % (prefix, prefix, source["wheelhouse_dir"]))
        wheels = no_deps_wheels(wheelhouse_wheels, source["package"], source["version"], excl,
                                prefix=prefix)
    wheel = None
    if resolve:
        wheel = resolve_wheel(source, metadata, project_list, machine, python)
    pin = make_pin(source, extras, excl, wheel, wheels=wheels, site_dirs=site)
    venv = posixpath.join(root, "venvs", pin["id"])
    result = {"source": source, "pin": pin, "venv": venv, "wheel": wheel, "argv": None,
              "metadata_url": (metadata_url(source["commit"], source["variant"])
                               if source["kind"] == "commit" else None)}
    if source["kind"] == "commit" and wheel is None:
        return result

    if wheels is not None:
        python_path = posixpath.join(venv, "bin", "python")
        result["argv"] = ([uv, "pip", "install", "--python", python_path, "--no-index", "--no-deps",
                           "--system-certs"] + (["--compile-bytecode"] if compile_bytecode else [])
                          + [posixpath.join(source["wheelhouse_dir"], w) for w in wheels]
                          + [str(a) for a in (uv_extra_args or [])])
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
    if compile_bytecode:
        argv.append("--compile-bytecode")
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
