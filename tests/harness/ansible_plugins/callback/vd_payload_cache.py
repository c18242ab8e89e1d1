# The test suite's module payload cache: Ansible builds each module's AnsiballZ payload once per
# ansible-playbook run (it walks the module's imports and parses every module_utils file they
# reach) and throws the cache away when the run ends. The suite starts a few hundred runs of the
# same modules. This callback, loaded through ANSIBLE_CALLBACK_PLUGINS by the Makefile's heavy
# test jobs only (PAYLOAD_CACHE_ENV), keeps those payloads between runs
# under VD_PAYLOAD_CACHE, in a directory named after everything a payload is made from:
#   - ansible-core's version, this Python's bytecode tag and the module's absolute path;
#   - for a collection's module: size and mtime of every file under the collection's
#     plugins/module_utils and of the module itself, so an edit makes a new directory.
# Modules of other collections (which may import a third collection's module_utils) and
# anything but Python modules are built as Ansible builds them. A kept payload holds every file
# of the one Ansible would build, byte for byte, and beside each Python source its bytecode,
# compiled here from those bytes: zipimport on the host loads it instead of compiling every
# module_utils file again for each task (a host whose Python reads another bytecode version
# compiles the sources, as without this cache). It prints nothing.
from __future__ import annotations

DOCUMENTATION = """
name: vd_payload_cache
type: aggregate
short_description: keep AnsiballZ payloads between ansible-playbook runs of the test suite
description:
  - Test-harness only. Moves Ansible's per-run payload cache to a directory keyed by the module's
    sources, under the VD_PAYLOAD_CACHE environment variable. Without it, does nothing.
"""

import base64
import hashlib
import importlib.util
import io
import marshal
import os
import sys
import zipfile

from ansible import release
from ansible.executor import module_common
from ansible.plugins.callback import CallbackBase

_CORE_MODULES = os.path.join(os.path.dirname(os.path.dirname(module_common.__file__)), "modules") + os.sep
_OWN_COLLECTIONS = ("vllm_ops" + os.sep + "deploy" + os.sep,)
_stamps = {}


def _tree_stamp(root):
    """Size and mtime of every file under root, hashed; computed once per process and root."""
    if root not in _stamps:
        h = hashlib.sha256()
        for d, dirs, files in os.walk(root):
            dirs[:] = sorted(x for x in dirs if x != "__pycache__")
            for f in sorted(files):
                st = os.stat(os.path.join(d, f))
                h.update(("%s\0%d\0%d\n" % (os.path.join(d, f), st.st_size, st.st_mtime_ns)).encode())
        _stamps[root] = h.hexdigest()
    return _stamps[root]


def payload_key(module_path):
    """The cache directory's name for a module, or None where the payload is not kept."""
    path = os.path.abspath(module_path)
    parts = [release.__version__, sys.implementation.cache_tag, path]
    if not path.startswith(_CORE_MODULES):
        marker = os.sep + "plugins" + os.sep + "modules" + os.sep
        root = path.split(marker)[0]
        if marker not in path or not path.endswith(".py") or not (root + os.sep).endswith(_OWN_COLLECTIONS):
            return None
        st = os.stat(path)
        parts += [_tree_stamp(os.path.join(root, "plugins", "module_utils")),
                  "%d-%d" % (st.st_size, st.st_mtime_ns)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


class _Constants:
    """Ansible's constants with DEFAULT_LOCAL_TMP pointing at one module's cache directory."""

    def __init__(self, real, local_tmp):
        self._real, self.DEFAULT_LOCAL_TMP = real, local_tmp

    def __getattr__(self, name):
        return getattr(self._real, name)


def with_bytecode(zip_data):
    """The base64 payload with, beside each Python source, its bytecode (an unchecked
    hash-based .pyc of the same bytes, PEP 552) that zipimport loads instead of compiling."""
    raw = base64.b64decode(zip_data)
    zin = zipfile.ZipFile(io.BytesIO(raw))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            data = zin.read(info)
            zout.writestr(info, data)
            if info.filename.endswith(".py"):
                try:
                    code = compile(data, info.filename, "exec", dont_inherit=True)
                except SyntaxError:
                    continue  # zipimport compiles it on the host, as without this cache
                pyc = bytearray(importlib.util.MAGIC_NUMBER)
                pyc += (1).to_bytes(4, "little")  # hash-based, not checked
                pyc += importlib.util.source_hash(data)
                pyc += marshal.dumps(code)
                zi = zipfile.ZipInfo(info.filename[:-3] + ".pyc", info.date_time)
                zi.compress_type = zipfile.ZIP_DEFLATED
                zout.writestr(zi, bytes(pyc))
    return base64.b64encode(out.getvalue())


def install(base, bytecode=True):
    """Wrap module_common._find_module_utils so that kept payloads are read from base (with
    their bytecode unless ``bytecode`` is false: tests/benchmarks/bench_payload_bytecode.py)."""
    original = module_common._find_module_utils
    if getattr(original, "_vd_payload_cache", None):
        return
    real_constants = module_common.C
    real_dump = module_common._CachedModule.dump

    def dump_with_bytecode(self, path):
        object.__setattr__(self, "zip_data", with_bytecode(self.zip_data))
        return real_dump(self, path)

    def find_module_utils(**kwargs):
        key = payload_key(kwargs["module_path"])
        if key is None:
            return original(**kwargs)
        kept = os.path.join(base, key if bytecode else key + "-source")
        module_common.C = _Constants(real_constants, kept)
        if bytecode:
            module_common._CachedModule.dump = dump_with_bytecode
        try:
            return original(**kwargs)
        finally:
            module_common.C = real_constants
            module_common._CachedModule.dump = real_dump

    find_module_utils._vd_payload_cache = True
    module_common._find_module_utils = find_module_utils


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "vd_payload_cache"
    CALLBACK_NEEDS_ENABLED = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        base = os.environ.get("VD_PAYLOAD_CACHE", "")
        if base:
            install(base, bytecode=os.environ.get("VD_PAYLOAD_BYTECODE", "1") != "0")
