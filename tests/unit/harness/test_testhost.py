"""The test-host harness's pure parts (no container is booted here)."""
import json
import os
import socket
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "tests", "harness"))
import testhost  # noqa: E402


def test_harness_vars_offer_the_wheelhouse_only_when_pip_has_one(monkeypatch, tmp_path):
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    v = testhost.harness_vars()
    assert v["vllm_install_find_links"] == [testhost.WHEELHOUSE_IN_HOST]
    assert v["vllm_install_torch_index_url"] == ""
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "missing"))
    monkeypatch.setattr(testhost.subprocess, "run",
                        lambda *a, **k: type("R", (), {"returncode": 1, "stdout": ""})())
    v = testhost.harness_vars()
    assert "vllm_install_find_links" not in v
    assert "vllm_install_torch_index_url" not in v


def test_ca_certs_are_pem_files_of_the_local_ca_folder():
    for path in testhost.machine_ca_certs():
        assert path.startswith("/usr/local/share/ca-certificates/")
        assert path.endswith(".crt")
        with open(path) as f:
            assert "BEGIN CERTIFICATE" in f.read()


def test_inventory_is_valid_yaml_with_the_hosts_port_and_key(tmp_path, monkeypatch):
    monkeypatch.setattr(testhost, "MACHINES", str(tmp_path / "machines"))
    os.makedirs(tmp_path / "machines" / "vd-x-1")
    state = {"name": "vd-x-1", "port": 2999, "key": "/k/id", "wheelhouse": None}
    (tmp_path / "machines" / "vd-x-1" / "state.json").write_text(json.dumps(state))
    out = testhost.write_inventory(["vd-x-1"], str(tmp_path / "inv" / "hosts.yml"),
                                   extra_vars={"vllm_service_port": 8111})
    import yaml
    doc = yaml.safe_load(open(out))
    group = doc["all"]["children"]["vllm_hosts"]
    host = group["hosts"]["vd-x-1"]
    assert host["ansible_port"] == 2999
    assert host["ansible_ssh_private_key_file"] == "/k/id"
    assert group["vars"]["vllm_service_port"] == 8111
    assert "vllm_install_find_links" not in group["vars"]
    with pytest.raises(testhost.HarnessError, match="no test host named vd-y"):
        testhost.write_inventory(["vd-y"], str(tmp_path / "x.yml"))


def test_create_refuses_bad_names_and_busy_ports(monkeypatch):
    monkeypatch.setattr(testhost, "require_root_tools", lambda: None)
    with pytest.raises(testhost.HarnessError, match="bad host name"):
        testhost.create("bad name;rm", 2999)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        with pytest.raises(testhost.HarnessError, match="port %d on 127.0.0.1 is already in use"
                           % port):
            testhost.create("vd-unit-free-name", port)


def test_destroy_needs_a_prefix():
    with pytest.raises(testhost.HarnessError, match="non-empty name prefix"):
        testhost.destroy("")


def test_no_host_processes_match_an_unused_prefix():
    assert testhost._nspawn_pids("vd-unit-no-such-prefix-") == {}


def test_destroy_kills_what_a_killed_nspawn_left_in_the_host_root(tmp_path):
    """A process whose root directory is a host's root (found by inode, as a container's
    processes read their root as "/") is killed; the others live on."""
    import signal as _signal
    root = tmp_path / "root"
    root.mkdir()
    pid = os.fork()
    if pid == 0:  # the child: root moved into the host's directory, then it waits
        try:
            os.chroot(str(root))
            os.chdir("/")
            time.sleep(120)
        finally:
            os._exit(0)
    other = subprocess.Popen(["sleep", "120"])
    reaped = False
    try:
        deadline = time.time() + 10
        while os.stat("/proc/%d/root" % pid).st_ino != os.stat(str(root)).st_ino:
            assert time.time() < deadline
            time.sleep(0.05)
        assert testhost._kill_rooted(str(root)) == [pid]
        _wpid, status = os.waitpid(pid, 0)
        reaped = True
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == _signal.SIGKILL
        assert other.poll() is None
    finally:
        if not reaped:  # a failed assertion above: the chrooted child must not outlive the test
            os.kill(pid, _signal.SIGKILL)
            os.waitpid(pid, 0)
        other.kill()
        other.wait()


def test_a_hosts_root_is_an_overlay_that_leaves_the_rootfs_alone(tmp_path, monkeypatch):
    """What a host writes lands in its upper directory; the rootfs (the lower layer) is
    unchanged, a second mount is a no-op, and rebuilding the rootfs is refused while mounted."""
    lower = tmp_path / "rootfs"
    (lower / "etc").mkdir(parents=True)
    (lower / "etc" / "hostname").write_text("rootfs\n")
    monkeypatch.setattr(testhost, "ROOTFS", str(lower))
    monkeypatch.setattr(testhost, "CACHE", str(tmp_path))  # its build lock
    monkeypatch.setattr(testhost, "require_root_tools", lambda: None)
    mdir = tmp_path / "machines" / "vd-unit-1"
    root = testhost._mount_root(str(mdir))
    try:
        assert os.path.ismount(root)
        assert testhost._mount_root(str(mdir)) == root
        with open(os.path.join(root, "etc", "hostname"), "w") as f:
            f.write("vd-unit-1\n")
        os.unlink(os.path.join(root, "etc", "hostname"))
        with open(os.path.join(root, "etc", "hostname"), "w") as f:
            f.write("vd-unit-1\n")
        assert (lower / "etc" / "hostname").read_text() == "rootfs\n"
        assert (mdir / "upper" / "etc" / "hostname").read_text() == "vd-unit-1\n"
        assert testhost._overlay_roots_on(str(lower)) == [root]
        (lower / ".vd-rootfs-version").write_text("old\n")
        with pytest.raises(testhost.HarnessError, match="test hosts run on it"):
            testhost.build_rootfs()
    finally:
        testhost._unmount_root(str(mdir))
    assert not os.path.ismount(root) and testhost._overlay_roots_on(str(lower)) == []
    testhost._unmount_root(str(mdir))  # not mounted: nothing to do
