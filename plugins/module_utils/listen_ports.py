"""Which programs listen on given TCP ports, read from /proc (no ss, no netstat).

/proc/net/tcp and /proc/net/tcp6 list every socket of the network namespace with its state
(0A = LISTEN), local address and inode; /proc/<pid>/fd/* links to ``socket:[inode]`` name
the process holding it. Hosts without iproute2 (minimal or air-gapped images) answer the
same question. Pure Python, no Ansible: unit-tested directly.
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


def listeners(ports, proc="/proc"):
    """{port: [{'address', 'pid', 'process'}]} for each of ports (an empty list: free)."""
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
        found[port].append({"address": ip, "pid": pid, "process": process})
    return found


def describe(entries):
    """'python3 (pid 42) on 127.0.0.1, ...' for a port's listeners."""
    return ", ".join("%s on %s" % ("%s (pid %s)" % (e["process"], e["pid"]) if e["pid"] else
                                   "an unknown process", e["address"]) for e in entries)
