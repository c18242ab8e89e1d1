"""Fetch the GPU-check wheels here and pack them into carry batches for the device tool.

The GPU machines have no registry access, so every wheel travels with a `run` call, at most
64 MiB per call, working tree included (the tree counts in 4 KiB blocks: about 8.5 MiB for
this checkout, so a part of 55 MiB fits and one of 57 MiB no longer does). This script

1. downloads (``pip download --no-deps``, CPython 3.12, manylinux x86_64) the exact files named
   in a wheelhouse list (one wheel file name a line, ``#`` comments), plus ansible-core and the
   few wheels it needs that the GPU image lacks, plus uv (the vllm_install role installs with it);
2. packs them into ``OUT/partN/`` directories of at most ``--cap-mib`` each. Whole wheels are
   packed first; a wheel larger than the room left (vLLM's is ~250 MB) is cut into byte-range
   pieces ``NAME.piece.NNN`` spread over the parts;
3. writes ``OUT/manifest.json`` (every wheel's size and sha256, and which pieces make it).

On the device, ``tests/gpu/run.sh stage N`` copies ``partN`` into the wheelhouse and
``run.sh install`` joins the pieces and checks every sha256 against the manifest.

    python tests/gpu/stage_wheels.py --list tests/gpu/wheelhouse-vllm-0.25.0.txt \
        --out build/gpu-wheels --cap-mib 55
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys

# ansible-core for connection-local runs there, and what it needs that the image lacks
# (jinja2, PyYAML, MarkupSafe and packaging are in the GPU image already).
EXTRA = ["ansible-core==2.19.14", "resolvelib==1.2.1", "cryptography==50.0.2", "cffi==2.1.1",
         "pycparser==3.12", "uv==0.13.9"]
PLATFORMS = ["manylinux_2_%d_x86_64" % n for n in (5, 17, 24, 26, 27, 28, 31, 34)] + [
    "manylinux1_x86_64", "manylinux2014_x86_64"]


def requirements_from_list(path):
    reqs = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if not line.endswith(".whl"):
                raise SystemExit("%s: not a wheel file name: %r" % (path, line))
            name, version = line.split("-")[:2]
            reqs.append("%s==%s" % (name.replace("_", "-"), version))
    return reqs


def download(reqs, dest, pip):
    os.makedirs(dest, exist_ok=True)
    cmd = [pip, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", "-d", dest]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    subprocess.run(cmd + reqs, check=True)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def pack(files, cap, first=()):
    """files: [(name, size)] -> parts: [[(name, offset, length)]]; big files are split.
    Names starting with a prefix in ``first`` go into part 1 (what the first call needs)."""
    parts, room = [], []

    def early(name):
        return any(name.lower().startswith(p) for p in first)
    whole = sorted((f for f in files if f[1] <= cap), key=lambda f: (not early(f[0]), -f[1]))
    big = [f for f in files if f[1] > cap]
    for name, size in whole:  # first fit, largest first
        for i, r in enumerate(room):
            if size <= r:
                parts[i].append((name, 0, size))
                room[i] -= size
                break
        else:
            parts.append([(name, 0, size)])
            room.append(cap - size)
    for name, size in big:
        off = 0
        i = 0
        while off < size:
            if i == len(parts):
                parts.append([])
                room.append(cap)
            take = min(room[i], size - off)
            if take > 0:
                parts[i].append((name, off, take))
                room[i] -= take
                off += take
            i += 1
    return parts


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", required=True, help="wheelhouse list (one wheel file name a line)")
    ap.add_argument("--out", default="build/gpu-wheels")
    ap.add_argument("--cap-mib", type=float, default=55.0)
    ap.add_argument("--pip-python", default=sys.executable)
    args = ap.parse_args(argv)
    src = os.path.join(args.out, "download")
    download(requirements_from_list(args.list) + EXTRA, src, args.pip_python)
    files = sorted((n, os.path.getsize(os.path.join(src, n)))
                   for n in os.listdir(src) if n.endswith(".whl"))
    names = {n.split("-")[0].lower() for n, _unused in files}
    if len(names) != len(files):
        raise SystemExit("two versions of one distribution in %s: remove one" % src)
    cap = int(args.cap_mib * 1024 * 1024)
    parts = pack(files, cap,
                 first=("ansible_core-", "resolvelib-", "cryptography-", "cffi-", "pycparser-"))
    for d in os.listdir(args.out):
        if d.startswith("part"):
            shutil.rmtree(os.path.join(args.out, d))
    manifest = {"wheels": {n: {"size": s, "sha256": sha256(os.path.join(src, n)), "pieces": []}
                           for n, s in files}, "parts": len(parts)}
    for i, part in enumerate(parts, 1):
        d = os.path.join(args.out, "part%d" % i)
        os.makedirs(d)
        for name, off, length in part:
            if off == 0 and length == manifest["wheels"][name]["size"]:
                shutil.copyfile(os.path.join(src, name), os.path.join(d, name))
                continue
            piece = "%s.piece.%03d" % (name, len(manifest["wheels"][name]["pieces"]))
            with open(os.path.join(src, name), "rb") as fi, open(os.path.join(d, piece), "wb") as fo:
                fi.seek(off)
                fo.write(fi.read(length))
            manifest["wheels"][name]["pieces"].append(piece)
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
    # the manifest travels with the first part
    shutil.copyfile(os.path.join(args.out, "manifest.json"),
                    os.path.join(args.out, "part1", "manifest.json"))
    for i in range(1, len(parts) + 1):
        d = os.path.join(args.out, "part%d" % i)
        mib = sum(os.path.getsize(os.path.join(d, n)) for n in os.listdir(d)) / 1048576.0
        print("part%d: %d files, %.1f MiB" % (i, len(os.listdir(d)), mib))
    return 0


if __name__ == "__main__":
    sys.exit(main())
