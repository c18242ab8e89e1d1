"""Throwaway test hosts: Debian bookworm containers booted with systemd (systemd-nspawn).

Each test host is a real machine as far as Ansible is concerned: systemd is PID 1, sshd
listens on its own loopback port, and Ansible reaches it over SSH with a generated key.
The hosts share the machine's network namespace, so every service inside must use a port
of its own (the harness hands out the SSH port; roles take the service port as a variable).

    testhost.py rootfs                       build (or reuse) the cached rootfs
    testhost.py create NAME --port P         boot a host on an overlay of the rootfs
    testhost.py create NAME --port P --netns-address 10.213.0.2/24
                                             ... in a network namespace of its own (below)
    testhost.py renet NAME --netns-address A stop a running host and boot it again, same disk,
                                             in its own network namespace
    testhost.py destroy PREFIX               stop and remove every host whose name starts with PREFIX
    testhost.py list                         show running hosts
    testhost.py inventory NAME... --out F    write an Ansible inventory for running hosts

With --netns-address the host gets a network namespace of its own (named like the host)
with one interface, eth0, holding that private address; its peer sits in a bridge on this
machine (--bridge, default vdtest0) that holds --bridge-address. sshd then listens on the
host's address and port, Ansible connects there, and hosts on one bridge reach each other
on their own addresses. Nothing is routed further: the namespace has no default route, so
such a host has no internet (install what it needs before, e.g. with `renet`: converge on
the shared network first, then move the host into its namespace). `destroy` removes the
namespaces of the hosts it removes, and the bridge once no host uses it.

A host's root is an overlayfs mount (machines/NAME/root): the cached rootfs is its read-only
lower layer, and what the host writes goes to machines/NAME/upper. Nothing is copied at
create (a copy of the 814 MB rootfs took 8-16 s on the 2-core machine); `destroy` unmounts
it, and `renet` boots the same mount again.

State (rootfs cache, machines, SSH key, shared pip/uv caches) lives under $VD_CACHE_DIR
(default /var/cache/vllm-deploy). The hosts also share vLLM's compile caches (VLLM_CACHE_ROOT
of the default service home, /var/lib/vllm/.cache/vllm, and TORCHINDUCTOR_CACHE_DIR,
/var/lib/vllm/.cache/torchinductor: torch.compile artifacts and the C++ kernels inductor built
for them, keyed by vLLM/torch version, source, config and compiler command): a host's first
start of a model another host (or an earlier run) already served
with the same venv path and flags loads the kernels instead of compiling them again. The
directory pip's find-links points at (if any) is offered to the host read-only as
/srv/wheelhouse. The hosts get no extra CA certificates
here: `machine_ca_certs` lists this machine's, and the inventory hands them to the
host_prep role (the same feature real hosts behind a TLS-inspecting proxy use).
"""
from __future__ import annotations

import argparse
import fcntl
import hashlib
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

CACHE = os.environ.get("VD_CACHE_DIR", "/var/cache/vllm-deploy")
ROOTFS = os.path.join(CACHE, "rootfs-bookworm")
MACHINES = os.path.join(CACHE, "machines")
SSH_DIR = os.path.join(CACHE, "ssh")
KEY = os.path.join(SSH_DIR, "id_ed25519")
SHARED_CACHES = {  # host path -> path inside the test host
    os.path.join(CACHE, "host-cache", "pip"): "/root/.cache/pip",
    os.path.join(CACHE, "host-cache", "uv"): "/root/.cache/uv",
    # Written by the service user (whose uid is the same on every host: the same rootfs, the
    # same host_prep), so world-writable with the sticky bit, like /tmp.
    os.path.join(CACHE, "host-cache", "vllm-compile"): "/var/lib/vllm/.cache/vllm",
    # Inductor's own caches (FX graphs, the C++ kernels it built), where torch.compile keeps
    # them when vLLM's AOT compile cache is off (the cpu-tiny profile turns it off).
    os.path.join(CACHE, "host-cache", "torchinductor"): "/var/lib/vllm/.cache/torchinductor",
}
STICKY_SHARED = {os.path.join(CACHE, "host-cache", "vllm-compile"),
                 os.path.join(CACHE, "host-cache", "torchinductor")}
WHEELHOUSE_IN_HOST = "/srv/wheelhouse"
ROOTFS_VERSION = "5"  # bump when the package list changes
PACKAGES = [
    "systemd", "systemd-sysv", "dbus", "openssh-server", "python3", "python3-venv",
    "sudo", "ca-certificates", "iproute2", "procps", "curl", "rsync", "git", "less",
    # What the roles install anyway (saves minutes per test host; apt still checks them):
    "libnuma1", "gcc", "g++", "python3-dev",
]
MIRROR = os.environ.get("VD_DEBIAN_MIRROR", "http://deb.debian.org/debian")


class HarnessError(Exception):
    pass


def log(msg):
    print("testhost: " + msg, file=sys.stderr, flush=True)


def run(cmd, check=True, **kw):
    return subprocess.run(cmd, check=check, **kw)


def require_root_tools():
    if os.geteuid() != 0:
        raise HarnessError("must run as root (systemd-nspawn and debootstrap need it)")
    missing = [t for t in ("debootstrap", "systemd-nspawn", "ssh", "ssh-keygen")
               if shutil.which(t) is None]
    if missing:
        raise HarnessError("missing tools: %s (run `make setup` to install them)"
                           % ", ".join(missing))


def _lock(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


# --------------------------------------------------------------------------- rootfs
def build_rootfs():
    """Build the cached rootfs once; a half-built tree from an aborted run is discarded."""
    require_root_tools()
    stamp = os.path.join(ROOTFS, ".vd-rootfs-version")
    fd = _lock(os.path.join(CACHE, "rootfs.lock"))
    try:
        if os.path.exists(stamp) and open(stamp).read().strip() == ROOTFS_VERSION:
            return ROOTFS
        users = _overlay_roots_on(ROOTFS)
        if users:  # a lower layer must not change under a mounted overlay
            raise HarnessError("the rootfs must be rebuilt, but test hosts run on it (%s): "
                               "destroy them first" % ", ".join(users))
        tmp = ROOTFS + ".partial"
        shutil.rmtree(tmp, ignore_errors=True)
        log("building the Debian bookworm rootfs with debootstrap (about a minute)")
        run(["debootstrap", "--variant=minbase", "--include=" + ",".join(PACKAGES),
             "bookworm", tmp, MIRROR], stdout=subprocess.DEVNULL)
        # sshd: root login by key only; no DNS lookups (slow logins without a resolver).
        with open(os.path.join(tmp, "etc/ssh/sshd_config.d/10-testhost.conf"), "w") as f:
            f.write("PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                    "UseDNS no\nListenAddress 127.0.0.1\n")
        # Nothing in the rootfs may need a terminal; the console getty is useless here.
        for unit in ("console-getty.service", "getty@tty1.service"):
            link = os.path.join(tmp, "etc/systemd/system", unit)
            if not os.path.lexists(link):
                os.symlink("/dev/null", link)
        # Host keys are generated per host at create time, not shared through the cache.
        for name in os.listdir(os.path.join(tmp, "etc/ssh")):
            if name.startswith("ssh_host_"):
                os.unlink(os.path.join(tmp, "etc/ssh", name))
        with open(os.path.join(tmp, ".vd-rootfs-version"), "w") as f:
            f.write(ROOTFS_VERSION + "\n")
        shutil.rmtree(ROOTFS, ignore_errors=True)
        os.rename(tmp, ROOTFS)
        log("rootfs ready at %s" % ROOTFS)
        return ROOTFS
    finally:
        os.close(fd)


def ensure_key():
    os.makedirs(SSH_DIR, mode=0o700, exist_ok=True)
    if not os.path.exists(KEY):
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "vllm-deploy-testhost",
             "-f", KEY])
    return KEY


def pip_find_links():
    """The directory pip on this machine already uses for local wheels (if any)."""
    value = os.environ.get("PIP_FIND_LINKS", "")
    if not value:
        try:
            out = subprocess.run([sys.executable, "-m", "pip", "config", "get",
                                  "global.find-links"], capture_output=True, text=True, check=False)
            value = out.stdout.strip() if out.returncode == 0 else ""
        except OSError:
            value = ""
    for item in value.split():
        path = item[len("file://"):] if item.startswith("file://") else item
        if os.path.isdir(path):
            return path
    return None


# --------------------------------------------------------------------------- machines
def machine_dir(name):
    return os.path.join(MACHINES, name)


def _overlay_roots_on(lower):
    """Mount points of the overlays whose lower layer is ``lower``."""
    found = []
    with open("/proc/self/mounts") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 3 and fields[2] == "overlay":
                opts = fields[3].split(",")
                if "lowerdir=" + lower in opts:
                    found.append(fields[1].replace("\\040", " "))
    return found


def _mount_root(mdir):
    """The host's root: an overlay of the cached rootfs (read-only) and the host's own
    upper directory. Mounting again what is mounted is a no-op (renet boots the same root)."""
    root = os.path.join(mdir, "root")
    if os.path.ismount(root):
        return root
    for sub in ("root", "upper", "work"):
        os.makedirs(os.path.join(mdir, sub), exist_ok=True)
    run(["mount", "-t", "overlay", "overlay", "-o",
         "lowerdir=%s,upperdir=%s,workdir=%s" % (ROOTFS, os.path.join(mdir, "upper"),
                                                 os.path.join(mdir, "work")), root])
    return root


def _unmount_root(mdir):
    """Unmount the host's root; lazily if something still holds it (it goes once that
    ends), so that removing the machine directory never walks through the overlay."""
    root = os.path.join(mdir, "root")
    if os.path.ismount(root) and run(["umount", root], check=False,
                                     stderr=subprocess.DEVNULL).returncode != 0:
        run(["umount", "--lazy", root])
    if os.path.ismount(root):
        raise HarnessError("could not unmount %s" % root)


def _state(name):
    path = os.path.join(machine_dir(name), "state.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _nspawn_pids(prefix):
    """systemd-nspawn processes of our hosts whose machine name starts with prefix.

    Found through /proc, so hosts left by an aborted run (or a lost state dir) are found too.
    """
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % entry, "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if not argv or not argv[0].endswith(b"systemd-nspawn"):
            continue
        args = [a.decode(errors="replace") for a in argv]
        if "--setenv=VD_TESTHOST=1" not in args:
            continue
        for a in args:
            if a.startswith("--machine="):
                name = a.split("=", 1)[1]
                if name.startswith(prefix):
                    found[name] = int(entry)
    return found


def port_in_use(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def ssh_base(port, address="127.0.0.1"):
    return ["ssh", "-i", KEY, "-p", str(port), "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
            "-o", "BatchMode=yes", "-o", "ConnectTimeout=3", "root@" + address]


# --------------------------------------------------------------------------- netns
DEFAULT_BRIDGE = "vdtest0"


def check_netns_args(name, address, bridge, bridge_address):
    """Private IPv4 addresses in one subnet, short interface names; raises HarnessError."""
    try:
        host_if = ipaddress.ip_interface(address)
        br_if = ipaddress.ip_interface(bridge_address)
    except ValueError as e:
        raise HarnessError("bad --netns-address/--bridge-address: %s" % e)
    if host_if.version != 4 or not host_if.network.is_private or host_if.network.prefixlen < 16:
        raise HarnessError("--netns-address %s must be a private IPv4 address with a /16 or "
                           "smaller subnet (e.g. 10.213.0.2/24)" % address)
    if br_if.network != host_if.network or br_if.ip == host_if.ip:
        raise HarnessError("--bridge-address %s must be another address in the subnet of "
                           "--netns-address %s" % (bridge_address, address))
    if not bridge.replace("-", "").isalnum() or len(bridge) > 15:
        raise HarnessError("bad --bridge %r: at most 15 letters, digits or '-'" % bridge)


def _veth_names(name):
    digest = hashlib.sha1(name.encode()).hexdigest()[:8]
    return "vdh" + digest, "vdc" + digest  # this machine's end, the host's end (<= 15 chars)


def _bridge_address_present(bridge, bridge_address):
    out = run(["ip", "-o", "addr", "show", "dev", bridge], capture_output=True,
              text=True).stdout
    return (" %s " % bridge_address) in out


def setup_netns(name, address, bridge, bridge_address):
    """Namespace NAME with eth0=address, its peer in `bridge` (created with bridge_address)."""
    if not os.path.exists("/sys/class/net/%s" % bridge):
        run(["ip", "link", "add", bridge, "type", "bridge"])
    elif not os.path.isdir("/sys/class/net/%s/bridge" % bridge):
        raise HarnessError("%s exists and is not a bridge" % bridge)
    if not _bridge_address_present(bridge, bridge_address):
        run(["ip", "addr", "add", bridge_address, "dev", bridge])
    run(["ip", "link", "set", bridge, "up"])
    teardown_netns(name)
    outer, inner = _veth_names(name)
    run(["ip", "netns", "add", name])
    run(["ip", "link", "add", outer, "type", "veth", "peer", "name", inner])
    run(["ip", "link", "set", inner, "netns", name])
    run(["ip", "-n", name, "link", "set", inner, "name", "eth0"])
    run(["ip", "-n", name, "addr", "add", address, "dev", "eth0"])
    run(["ip", "-n", name, "link", "set", "eth0", "up"])
    run(["ip", "-n", name, "link", "set", "lo", "up"])
    run(["ip", "link", "set", outer, "master", bridge])
    run(["ip", "link", "set", outer, "up"])


def teardown_netns(name):
    outer, _unused = _veth_names(name)
    if os.path.exists("/sys/class/net/%s" % outer):
        run(["ip", "link", "del", outer], check=False)
    if os.path.exists("/run/netns/%s" % name):
        run(["ip", "netns", "del", name], check=False)


def remove_bridge_if_unused(bridge):
    brif = "/sys/class/net/%s/brif" % bridge
    if os.path.isdir(brif) and not os.listdir(brif):
        run(["ip", "link", "del", bridge], check=False)
        log("removed bridge %s" % bridge)


def _netns_names(prefix):
    if not os.path.isdir("/run/netns"):
        return []
    return sorted(n for n in os.listdir("/run/netns") if n.startswith(prefix))


def create(name, port, memory=None, timeout=120, netns_address=None, bridge=DEFAULT_BRIDGE,
           bridge_address=None, keep_root=False):
    require_root_tools()
    if not name.replace("-", "").replace("_", "").isalnum():
        raise HarnessError("bad host name %r: letters, digits, '-' and '_' only" % name)
    if netns_address:
        if not bridge_address:
            raise HarnessError("--netns-address needs --bridge-address (this machine's "
                               "address on the bridge, e.g. 10.213.0.1/24)")
        check_netns_args(name, netns_address, bridge, bridge_address)
    if name in _nspawn_pids(name) and _nspawn_pids(name)[name]:
        st = _state(name)
        if st and st.get("port") == port:
            log("%s is already running on port %d" % (name, port))
            return st
        raise HarnessError("%s is already running (destroy it first)" % name)
    if not netns_address and port_in_use(port):
        raise HarnessError("port %d on 127.0.0.1 is already in use: choose another SSH port"
                           % port)
    key = ensure_key()
    mdir = machine_dir(name)
    root = os.path.join(mdir, "root")
    if keep_root:
        if not os.path.isdir(os.path.join(mdir, "upper")):
            raise HarnessError("%s has no disk to boot again (create it first)" % name)
        _mount_root(mdir)
    else:
        build_rootfs()
        _unmount_root(mdir)
        shutil.rmtree(mdir, ignore_errors=True)
        os.makedirs(mdir)
        log("mounting an overlay of the rootfs for %s" % name)
        _mount_root(mdir)

    with open(os.path.join(root, "etc/hostname"), "w") as f:
        f.write(name + "\n")
    with open(os.path.join(root, "etc/hosts"), "w") as f:
        f.write("127.0.0.1 localhost\n127.0.1.1 %s\n" % name)
    with open(os.path.join(root, "etc/ssh/sshd_config.d/20-port.conf"), "w") as f:
        f.write("Port %d\n" % port)
        if netns_address:  # besides 127.0.0.1 (10-testhost.conf), its own loopback there
            f.write("ListenAddress %s\n" % netns_address.split("/")[0])
    ssh_root = os.path.join(root, "root/.ssh")
    os.makedirs(ssh_root, mode=0o700, exist_ok=True)
    shutil.copy(key + ".pub", os.path.join(ssh_root, "authorized_keys"))
    os.chmod(os.path.join(ssh_root, "authorized_keys"), 0o600)
    if not keep_root:
        run(["chroot", root, "ssh-keygen", "-A"], stdout=subprocess.DEVNULL)
    args = ["systemd-nspawn", "--boot", "--register=no", "--keep-unit", "--quiet",
            "--machine=" + name, "--directory=" + root, "--setenv=VD_TESTHOST=1",
            "--resolv-conf=copy-host", "--timezone=off"]
    if netns_address:
        setup_netns(name, netns_address, bridge, bridge_address)
        args.append("--network-namespace-path=/run/netns/%s" % name)
    for host_path, guest_path in SHARED_CACHES.items():
        if host_path in STICKY_SHARED and not os.path.isdir(host_path):
            # only when made: the first converge gives it the service user (the same uid and
            # mode on every host); changing it back here while another job's host runs its
            # idempotence check would show that check a change
            os.makedirs(host_path)
            os.chmod(host_path, 0o1777)
        os.makedirs(host_path, exist_ok=True)
        args.append("--bind=%s:%s" % (host_path, guest_path))
    wheelhouse = pip_find_links()
    if wheelhouse:
        args.append("--bind-ro=%s:%s" % (wheelhouse, WHEELHOUSE_IN_HOST))
    console = open(os.path.join(mdir, "console.log"), "ab" if keep_root else "wb")
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=console,
                            stderr=subprocess.STDOUT, start_new_session=True)
    state = {"name": name, "port": port, "pid": proc.pid, "root": root, "key": key,
             "wheelhouse": WHEELHOUSE_IN_HOST if wheelhouse else None}
    address = "127.0.0.1"
    if netns_address:
        address = netns_address.split("/")[0]
        state.update({"address": address, "netns": name, "bridge": bridge})
    with open(os.path.join(mdir, "state.json"), "w") as f:
        json.dump(state, f)
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise HarnessError("systemd-nspawn for %s exited with %s; see %s"
                               % (name, proc.returncode, os.path.join(mdir, "console.log")))
        r = subprocess.run(ssh_base(port, address)
                           + ["systemctl is-system-running --wait >/dev/null; true"],
                           capture_output=True, timeout=60, check=False)
        if r.returncode == 0:
            log("%s is up: ssh root@%s -p %d -i %s" % (name, address, port, key))
            return state
        time.sleep(1)
    raise HarnessError("%s did not answer on SSH port %d within %d s; see %s"
                       % (name, port, timeout, os.path.join(mdir, "console.log")))


def _stop(pids, timeout):
    for name, pid in pids.items():
        log("stopping %s (pid %d)" % (name, pid))
        try:
            os.kill(pid, signal.SIGTERM)  # nspawn asks the container's systemd to power off
        except ProcessLookupError:
            pass
    deadline = time.time() + timeout
    for name, pid in pids.items():
        while _pid_alive(pid) and time.time() < deadline:
            time.sleep(0.5)
        if _pid_alive(pid):
            log("%s did not stop in %d s: killing it" % (name, timeout))
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
            time.sleep(1)


def _kill(pids):
    """SIGKILL each host's nspawn (its process group); what runs inside the host outlives it
    and is killed by _kill_rooted."""
    for name, pid in pids.items():
        log("killing %s (nspawn pid %d)" % (name, pid))
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    _wait_gone(list(pids.values()), 10)


def _wait_gone(pids, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline and any(_pid_alive(p) and not _zombie(p) for p in pids):
        time.sleep(0.1)


def _zombie(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def _kill_rooted(root):
    """SIGKILL every process whose root directory is ``root`` (the same inode; inside the
    host's mount namespace its root reads as "/"): a host's systemd and services outlive an
    nspawn that was killed (their PID namespace keeps its init), and its sshd would keep the
    host's SSH port, answering for a deleted root filesystem."""
    try:
        want = os.stat(root)
    except OSError:
        return []
    killed = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            st = os.stat("/proc/%s/root" % entry)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (want.st_dev, want.st_ino):
            try:
                os.kill(int(entry), signal.SIGKILL)
                killed.append(int(entry))
            except ProcessLookupError:
                pass
    return killed


def renet(name, netns_address, bridge=DEFAULT_BRIDGE, bridge_address=None, timeout=120):
    """Stop a running host and boot it again from the same disk in its own namespace."""
    st = _state(name)
    if not st:
        raise HarnessError("no test host named %s (create it first)" % name)
    if not bridge_address:
        raise HarnessError("renet needs --bridge-address")
    check_netns_args(name, netns_address, bridge, bridge_address)
    pid = _nspawn_pids(name).get(name)
    if pid:
        _stop({name: pid}, 60)
    return create(name, st["port"], timeout=timeout, netns_address=netns_address,
                  bridge=bridge, bridge_address=bridge_address, keep_root=True)


def destroy(prefix):
    """Kill and remove the hosts whose names start with ``prefix``: nspawn, then every process
    in the host's root. Their disks go, so a clean power-off (which waited out its services'
    stop timeouts) gains nothing."""
    if not prefix:
        raise HarnessError("destroy needs a non-empty name prefix")
    pids = _nspawn_pids(prefix)
    bridges = set()
    if os.path.isdir(MACHINES):
        for name in os.listdir(MACHINES):
            if name.startswith(prefix) and (_state(name) or {}).get("bridge"):
                bridges.add(_state(name)["bridge"])
    _kill(pids)
    for ns in _netns_names(prefix):
        teardown_netns(ns)
        log("removed network namespace %s" % ns)
    for bridge in sorted(bridges):
        remove_bridge_if_unused(bridge)
    removed = []
    if os.path.isdir(MACHINES):
        for name in sorted(os.listdir(MACHINES)):
            if name.startswith(prefix):
                left = _kill_rooted(os.path.join(machine_dir(name), "root"))
                if left:
                    log("%s: killed %d process(es) its stopped nspawn left running" % (name, len(left)))
                    _wait_gone(left, 20)
                _unmount_root(machine_dir(name))
                shutil.rmtree(machine_dir(name), ignore_errors=True)
                removed.append(name)
    for name in removed:
        log("removed %s" % name)
    return sorted(set(removed) | set(pids))


def list_hosts():
    running = _nspawn_pids("")
    out = []
    if os.path.isdir(MACHINES):
        for name in sorted(os.listdir(MACHINES)):
            st = _state(name) or {"name": name}
            st["running"] = name in running
            out.append(st)
    return out


def machine_ca_certs():
    """This machine's extra CA certificates (Debian's local-CA folder)."""
    folder = "/usr/local/share/ca-certificates"
    if not os.path.isdir(folder):
        return []
    return sorted(os.path.join(folder, n) for n in os.listdir(folder)
                  if n.endswith(".crt") and os.path.isfile(os.path.join(folder, n)))


def harness_vars(with_wheelhouse=None):
    """Group vars a test host needs from this machine: its extra CAs (HTTPS through the
    TLS-inspecting egress, installed by host_prep like on a real host behind a proxy) and,
    where pip here has a local wheelhouse, that directory (offered read-only in the host)
    instead of PyTorch's CPU index, which this machine cannot reach."""
    if with_wheelhouse is None:
        with_wheelhouse = pip_find_links() is not None
    out = {"host_prep_extra_ca_certs": machine_ca_certs()}
    if with_wheelhouse:
        out["vllm_install_find_links"] = [WHEELHOUSE_IN_HOST]
        out["vllm_install_torch_index_url"] = ""
    return out


def write_yaml_vars(data, out):
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        f.write("# Written by tests/harness/testhost.py for this machine's test hosts.\n")
        json.dump(data, f, indent=2)  # JSON is valid YAML
        f.write("\n")
    os.replace(tmp, out)
    return out


def write_inventory(names, out, group="vllm_hosts", extra_vars=None):
    hosts = {}
    for name in names:
        st = _state(name)
        if not st:
            raise HarnessError("no test host named %s (create it first)" % name)
        hv = {
            "ansible_host": st.get("address") or "127.0.0.1",
            "ansible_port": st["port"],
            "ansible_user": "root",
            "ansible_ssh_private_key_file": st["key"],
            "ansible_ssh_common_args": "-o StrictHostKeyChecking=no "
                                       "-o UserKnownHostsFile=/dev/null",
            "ansible_python_interpreter": "/usr/bin/python3",
        }
        hosts[name] = hv
    group_vars = harness_vars(any((_state(n) or {}).get("wheelhouse") for n in names))
    group_vars.update(extra_vars or {})
    doc = {"all": {"children": {group: {"hosts": hosts, "vars": group_vars}}}}
    return write_yaml_vars(doc, out)


def main(argv=None):
    ap = argparse.ArgumentParser(description="systemd-nspawn test hosts for vllm-deploy")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("rootfs")
    c = sub.add_parser("create")
    r = sub.add_parser("renet", help="boot a running host again in its own namespace")
    r.add_argument("name")
    r.add_argument("--timeout", type=int, default=120)
    c.add_argument("name")
    c.add_argument("--port", type=int, required=True, help="sshd port on 127.0.0.1")
    c.add_argument("--timeout", type=int, default=120)
    for p in (c, r):
        p.add_argument("--netns-address", default=None,
                       help="boot in a network namespace of its own with this private "
                            "address (e.g. 10.213.0.2/24); sshd listens there")
        p.add_argument("--bridge", default=DEFAULT_BRIDGE,
                       help="bridge on this machine joining the namespaces")
        p.add_argument("--bridge-address", default=None,
                       help="this machine's address on the bridge (e.g. 10.213.0.1/24)")
    d = sub.add_parser("destroy")
    d.add_argument("prefix")
    sub.add_parser("list")
    i = sub.add_parser("inventory")
    i.add_argument("names", nargs="+")
    i.add_argument("--out", required=True)
    i.add_argument("--group", default="vllm_hosts")
    i.add_argument("--vars-json", default=None, help="group vars as a JSON object")
    h = sub.add_parser("harness-vars", help="write the group vars test hosts need here")
    h.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "rootfs":
            print(build_rootfs())
        elif args.cmd == "create":
            print(json.dumps(create(args.name, args.port, timeout=args.timeout,
                                    netns_address=args.netns_address, bridge=args.bridge,
                                    bridge_address=args.bridge_address)))
        elif args.cmd == "renet":
            if not args.netns_address:
                raise HarnessError("renet needs --netns-address")
            print(json.dumps(renet(args.name, args.netns_address, bridge=args.bridge,
                                   bridge_address=args.bridge_address, timeout=args.timeout)))
        elif args.cmd == "destroy":
            destroy(args.prefix)
        elif args.cmd == "list":
            for st in list_hosts():
                print("%-24s port=%-6s %s%s" % (st["name"], st.get("port"),
                                                "running" if st["running"] else "stopped",
                                                " address=%s" % st["address"]
                                                if st.get("address") else ""))
        elif args.cmd == "inventory":
            extra = json.loads(args.vars_json) if args.vars_json else None
            print(write_inventory(args.names, args.out, args.group, extra))
        elif args.cmd == "harness-vars":
            print(write_yaml_vars(harness_vars(), args.out))
    except HarnessError as e:
        print("testhost: error: %s" % e, file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as e:
        print("testhost: error: %s failed with exit code %d" % (" ".join(e.cmd), e.returncode),
              file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
