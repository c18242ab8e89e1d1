"""Which programs listen on given TCP ports, read from /proc (no ss, no netstat).

/proc/net/tcp and /proc/net/tcp6 list every socket of the network namespace with its state
(0A = LISTEN), local address and inode; /proc/<pid>/fd/* links to ``socket:[inode]`` name
the process holding it, and /proc/<pid>/cgroup its systemd unit (so a port held by one of
the role's own vLLM instances is told apart from another program). Hosts without iproute2
(minimal or air-gapped images) answer the same question. Pure Python, no Ansible:
unit-tested directly.
"""
from __future__ import annotations

import os
import socket
import struct

LISTEN = "0A"


def _addr(hex_addr):
    host, port = hex_addr.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        ip = socket.inet_ntop(socket.AF_INET, struct.pack("<I", struct.unpack(">I", raw)[0]))
    else:  # four 32-bit words, each in host (little-endian) order
        words = struct.unpack(">4I", raw)
        ip = socket.inet_ntop(socket.AF_INET6, struct.pack("<4I", *words))
    return ip, int(port, 16)


def parse_proc_net(text):
    """[(address, port, inode)] of the LISTEN sockets in a /proc/net/tcp{,6} text."""
    out = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != LISTEN:
            continue
        ip, port = _addr(fields[1])
        out.append((ip, port, int(fields[9])))
    return out


def socket_owners(proc="/proc"):
    """inode -> (pid, command name) for every socket a readable process holds."""
    owners = {}
    for pid in os.listdir(proc):
        if not pid.isdigit():
            continue
        fd_dir = os.path.join(proc, pid, "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        name = None
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if target.startswith("socket:["):
                if name is None:
                    try:
                        with open(os.path.join(proc, pid, "comm")) as f:
                            name = f.read().strip()
                    except OSError:
                        name = "?"
                owners[int(target[8:-1])] = (int(pid), name)
    return owners


def unit_of(text):
    """The systemd unit (``*.service``/``*.scope``) of a /proc/<pid>/cgroup text, or None."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1] if line.count(":") >= 2 else ""
        for part in reversed(path.strip("/").split("/")):
            if part.endswith((".service", ".scope")):
                return part
    return None


def pid_unit(pid, proc="/proc"):
    try:
        with open(os.path.join(proc, str(pid), "cgroup")) as f:
            return unit_of(f.read())
    except OSError:
        return None


def listeners(ports, proc="/proc"):
    """{port: [{'address', 'pid', 'process', 'unit'}]} for each of ports (an empty list:
    free); unit is the systemd unit of the process (None when unknown)."""
    wanted = {int(p) for p in ports}
    found = {p: [] for p in sorted(wanted)}
    sockets = []
    for name in ("tcp", "tcp6"):
        try:
            with open(os.path.join(proc, "net", name)) as f:
                sockets.extend(parse_proc_net(f.read()))
        except OSError:
            continue
    hits = [s for s in sockets if s[1] in wanted]
    owners = socket_owners(proc) if hits else {}
    for ip, port, inode in hits:
        pid, process = owners.get(inode, (None, None))
        found[port].append({"address": ip, "pid": pid, "process": process,
                            "unit": pid_unit(pid, proc) if pid else None})
    return found


def describe(entries):
    """'python3 (pid 42, unit x.service) on 127.0.0.1, ...' for a port's listeners."""
    def who(e):
        if not e.get("pid"):
            return "an unknown process"
        unit = (", unit %s" % e["unit"]) if e.get("unit") else ""
        return "%s (pid %s%s)" % (e["process"], e["pid"], unit)
    return ", ".join("%s on %s" % (who(e), e["address"]) for e in entries)
