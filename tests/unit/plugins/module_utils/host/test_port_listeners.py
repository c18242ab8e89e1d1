"""Listeners from /proc (plugins/module_utils/host/port_listeners.py): real sockets of this process."""
import os
import socket

from ansible_collections.vllm_ops.deploy.plugins.module_utils.host import port_listeners as listen_ports

# Two lines of a real /proc/net/tcp (127.0.0.1:8000 listening, one established connection)
# and of /proc/net/tcp6 (:::8001 listening).
TCP = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000   998        0 4711 1 0000000000000000 100 0 0 10 0
   1: 0100007F:1F40 0100007F:A2C4 01 00000000:00000000 00:00000000 00000000   998        0 4712 1 0000000000000000 20 4 30 10 -1
"""
TCP6 = (  # lines of up to 174 characters, each written in two pieces
    "  sl  local_address                         remote_address                        st "
    "tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    "   0: 00000000000000000000000000000000:1F41 00000000000000000000000000000000:0000 0A "
    "00000000:00000000 00:00000000 00000000     0        0 815 1 0000000000000000 100 0 0 10 0\n"
    "   1: 00000000000000000000000001000000:1F42 00000000000000000000000000000000:0000 0A "
    "00000000:00000000 00:00000000 00000000     0        0 816 1 0000000000000000 100 0 0 10 0\n")


def test_parse_listen_lines_only():
    assert listen_ports.parse_proc_net(TCP) == [("127.0.0.1", 8000, 4711)]
    assert listen_ports.parse_proc_net(TCP6) == [("::", 8001, 815), ("::1", 8002, 816)]


def test_real_listeners_of_this_process_are_found_with_their_owner():
    s4 = socket.socket()
    s4.bind(("127.0.0.1", 0))
    s4.listen()
    s6 = socket.socket(socket.AF_INET6)
    s6.bind(("::1", 0))
    s6.listen()
    idle = socket.socket()
    idle.bind(("127.0.0.1", 0))  # bound, not listening: not a listener
    p4, p6, pi = s4.getsockname()[1], s6.getsockname()[1], idle.getsockname()[1]
    try:
        found = listen_ports.listeners([p4, p6, pi])
    finally:
        for s in (s4, s6, idle):
            s.close()
    assert found[p4] == [{"address": "127.0.0.1", "pid": os.getpid(), "process": found[p4][0]["process"],
                          "unit": listen_ports.pid_unit(os.getpid())}]
    assert found[p6][0]["address"] == "::1" and found[p6][0]["pid"] == os.getpid()
    assert found[pi] == []
    assert "(pid %d" % os.getpid() in listen_ports.describe(found[p4])
    assert listen_ports.describe(found[p4]).endswith(" on 127.0.0.1")


def test_a_closed_port_is_free():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    assert listen_ports.listeners([port]) == {port: []}


def test_the_unit_comes_from_the_cgroup_path():
    # /proc/<pid>/cgroup of a vLLM server inside a test host (cgroup v2) and of a v1 host
    assert listen_ports.unit_of("0::/system.slice/vllm-two.service\n") == "vllm-two.service"
    assert listen_ports.unit_of("12:pids:/system.slice/ssh.service\n1:name=systemd:/system.slice/ssh.service\n") \
        == "ssh.service"
    assert listen_ports.unit_of("0::/user.slice/user-0.slice/session-3.scope\n") == "session-3.scope"
    assert listen_ports.unit_of("0::/\n") is None
    assert listen_ports.unit_of("") is None
    described = listen_ports.describe([{"address": "0.0.0.0", "pid": 7, "process": "python3",
                                        "unit": "vllm-a.service"}])
    assert described == "python3 (pid 7, unit vllm-a.service) on 0.0.0.0"
