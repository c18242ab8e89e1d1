"""Where a test run's CPU goes: the kernel's BSD process accounting over the run, summed by
process kind.

On the 2-core machine the suite is CPU-bound (the cores are busy all through a run), so its
wall time is about the CPU it spends divided by two; this says which kind of process spends
it. The kernel writes one record when a process exits (its own user + system CPU, not its
children's), for the processes of the test hosts too (their PID namespaces are children of
this one). A record names the process by the kernel's 16-byte name of its last thread, so the
kinds are sorted by that name and by how long the process lived; they are approximate where a
name is shared (``python`` is a vLLM API server, a uv compile worker or a helper script).

Needs root and a kernel with BSD process accounting; only one accounting file is active per
PID namespace, so a second run that turns it on takes it from the first.

    cpu_account.py report FILE      # the table of a finished accounting file
"""
import collections
import ctypes
import os
import struct
import sys

# struct acct_v3 (linux/acct.h): flag, version, tty, exitcode, uid, gid, pid, ppid, btime,
# etime (float, 1/100 s), utime, stime, mem, io, rw, minflt, majflt, swaps (comp_t), comm[16]
RECORD = struct.Struct("<ccHIIIIIIf8H16s")
TICKS = 100.0  # AHZ: the unit of etime, utime and stime in version 3 records

ANSIBLE = {"ansible-playboo", "ansible", "ansible-galaxy", "ansible-config", "ansible-doc",
           "ansible-lint", "ansible-test", "ansible-invento", "molecule"}
VLLM_THREADS = {"gloo_tcp_loop", "pt_gloo_runloop", "main2"}
COMPILERS = {"cc1", "cc1plus", "as", "ld", "collect2", "gcc", "g++", "c++"}
KINDS = [
    "Ansible on the controller (ansible-playbook and its workers, molecule, lint)",
    "python3 living < 10 s (Ansible modules on the test hosts and local ones)",
    "vLLM engine processes (named by their threads)",
    "python living >= 10 s (vLLM API servers, uv compile workers, pytest, load generators)",
    "python living < 10 s (helper scripts)",
    "uv, pip (and tokio-named: uv, vllm-router)",
    "C/C++ compiler",
    "ssh, sshd",
    "other",
]


def comp_t(value):
    """A comp_t: 13-bit mantissa, 3-bit base-8 exponent."""
    return (value & 0x1FFF) << (3 * ((value >> 13) & 7))


def read(path):
    """The records of an accounting file: dicts of pid, ppid, btime (epoch s), etime_s, cpu_s
    (user + system) and comm."""
    with open(path, "rb") as f:
        data = f.read()
    out = []
    for off in range(0, len(data) - RECORD.size + 1, RECORD.size):
        r = RECORD.unpack_from(data, off)
        if r[1] != b"\x03":
            raise ValueError("%s: record at byte %d is not an acct_v3 record (version %r)"
                             % (path, off, r[1]))
        out.append({"pid": r[6], "ppid": r[7], "btime": r[8], "etime_s": r[9] / TICKS,
                    "cpu_s": (comp_t(r[10]) + comp_t(r[11])) / TICKS,
                    "comm": r[18].split(b"\0", 1)[0].decode("utf-8", "replace")})
    return out


def kind(rec):
    """The kind (one of KINDS) of a record."""
    comm, lived = rec["comm"], rec["etime_s"]
    if comm in ANSIBLE:
        return KINDS[0]
    if comm == "python3" and lived < 10:
        return KINDS[1]
    if comm.startswith("VLLM::") or comm.startswith("ZMQbg") or comm in VLLM_THREADS:
        return KINDS[2]
    if comm in ("python", "python3", "python3.11"):
        return KINDS[3] if lived >= 10 else KINDS[4]
    if comm in ("uv", "pip", "tokio-rt-worker"):
        return KINDS[5]
    if comm in COMPILERS:
        return KINDS[6]
    if comm in ("ssh", "sshd", "sshd-session"):
        return KINDS[7]
    return KINDS[8]


def summarize(records):
    """{kind: [cpu seconds, processes]} for every kind with a process, and the total CPU."""
    by = collections.OrderedDict((k, [0.0, 0]) for k in KINDS)
    for rec in records:
        row = by[kind(rec)]
        row[0] += rec["cpu_s"]
        row[1] += 1
    return {k: v for k, v in by.items() if v[1]}, sum(r["cpu_s"] for r in records)


def table(records):
    """The lines of the table: CPU seconds, share and processes per kind, largest first."""
    by, total = summarize(records)
    lines = ["    %8s %6s %9s  %s" % ("CPU s", "share", "processes", "kind")]
    for name, (cpu, n) in sorted(by.items(), key=lambda kv: -kv[1][0]):
        lines.append("    %8.0f %5.1f%% %9d  %s" % (cpu, 100.0 * cpu / total if total else 0.0,
                                                    n, name))
    lines.append("    %8.0f %6s %9d  total" % (total, "", len(records)))
    return lines


def _acct(path):
    libc = ctypes.CDLL(None, use_errno=True)
    arg = None if path is None else os.fsencode(path)
    if libc.acct(arg) != 0:
        err = ctypes.get_errno()
        return "acct(%s): %s" % (path, os.strerror(err))
    return None


def start(path):
    """Turn accounting on into PATH (emptied first). None, or why it could not."""
    try:
        with open(path, "wb"):
            pass
    except OSError as e:
        return "cannot write %s: %s" % (path, e)
    return _acct(path)


def stop():
    """Turn accounting off. None, or why it could not."""
    return _acct(None)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] != "report":
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    for line in table(read(argv[1])):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
