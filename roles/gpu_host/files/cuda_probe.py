"""What a CUDA/NCCL prefix really holds: one JSON object on stdout.

    <prefix>/bin/python cuda_probe.py [--packages NAME...] [--cuda-home DIR] [--nccl-lib PATH]

- packages: the installed version of each distribution (null when missing), read with
  importlib.metadata from the interpreter running the script (the prefix venv);
- nvcc: `<cuda_home>/bin/nvcc --version` -> release ("13.0") and version ("13.0.88");
  cuda_home defaults to the pip layout in this interpreter's site-packages
  (nvidia/cu<major> for CUDA 13 wheels, nvidia/cuda_nvcc for CUDA 12 wheels);
- nccl: libnccl.so.2 loaded with ctypes, ncclGetVersion -> code and "MAJOR.MINOR.PATCH";
  defaults to the pip wheel's nvidia/nccl/lib/libnccl.so.2.
Read only. Exit status 0 even when something is missing (the caller compares with its pins).
Python >= 3.8.
"""
from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import re
import subprocess
import sys
import sysconfig

_NVCC_RE = re.compile(r"release (\d+\.\d+), V(\d+(?:\.\d+)+)")


def parse_nvcc_version(text):
    """`nvcc --version` output -> {"release": "13.0", "version": "13.0.88"}; ValueError else."""
    m = _NVCC_RE.search(text or "")
    if not m:
        raise ValueError("no 'release X.Y, VX.Y.Z' in nvcc output: %r" % (text or "")[-200:])
    return {"release": m.group(1), "version": m.group(2)}


def nccl_code_to_version(code):
    """ncclGetVersion's int -> "2.28.9" (NCCL >= 2.9 encodes X*10000 + Y*100 + Z, older X*1000)."""
    code = int(code)
    if code >= 10000:
        return "%d.%d.%d" % (code // 10000, (code % 10000) // 100, code % 100)
    return "%d.%d.%d" % (code // 1000, (code % 1000) // 100, code % 100)


def pip_cuda_home(site=None):
    """The folder holding bin/nvcc in NVIDIA's wheel layout, or None."""
    site = site or sysconfig.get_paths()["purelib"]
    candidates = sorted(glob.glob(os.path.join(site, "nvidia", "cu[0-9]*")), reverse=True)
    candidates.append(os.path.join(site, "nvidia", "cuda_nvcc"))
    for c in candidates:
        if os.path.isfile(os.path.join(c, "bin", "nvcc")):
            return c
    return None


def package_versions(names):
    from importlib import metadata
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def probe_nvcc(cuda_home):
    res = {"cuda_home": cuda_home, "path": None, "release": None, "version": None, "error": None}
    if not cuda_home:
        res["error"] = "no nvcc in the pip layout of %s" % sys.prefix
        return res
    nvcc = os.path.join(cuda_home, "bin", "nvcc")
    res["path"] = nvcc
    try:
        proc = subprocess.run([nvcc, "--version"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, universal_newlines=True, timeout=60, check=False)
        res["output"] = proc.stdout.strip().splitlines()[-2:]
        res.update(parse_nvcc_version(proc.stdout))
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        res["error"] = "%s: %s" % (nvcc, exc)
    return res


def probe_nccl(path):
    res = {"path": path, "code": None, "version": None, "error": None}
    try:
        lib = ctypes.CDLL(path)
        code = ctypes.c_int()
        rc = lib.ncclGetVersion(ctypes.byref(code))
        if rc != 0:
            res["error"] = "ncclGetVersion returned %d" % rc
        else:
            res["code"] = code.value
            res["version"] = nccl_code_to_version(code.value)
    except (OSError, AttributeError) as exc:
        res["error"] = "%s: %s" % (path, exc)
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    ap.add_argument("--packages", nargs="*", default=[])
    ap.add_argument("--cuda-home", default="")
    ap.add_argument("--nccl-lib", default="")
    ap.add_argument("--skip-tools", action="store_true", help="only report package versions")
    args = ap.parse_args(argv)
    report = {"python": sys.executable, "packages": package_versions(args.packages)}
    if not args.skip_tools:
        site = sysconfig.get_paths()["purelib"]
        report["nvcc"] = probe_nvcc(args.cuda_home or pip_cuda_home(site))
        report["nccl"] = probe_nccl(args.nccl_lib or os.path.join(site, "nvidia", "nccl", "lib",
                                                                  "libnccl.so.2"))
    print(json.dumps(report, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
