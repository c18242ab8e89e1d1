"""tests/harness/cpu_account.py: acct_v3 records read back, sorted by process kind, and the
suite's wiring (run_suite --cpu-account)."""
import io
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "harness"))
import cpu_account  # noqa: E402
import run_suite  # noqa: E402


def record(comm, cpu_ticks, etime_ticks, pid=100, ppid=1, version=b"\x03"):
    # utime carries the CPU (a comp_t below 8192 is its own value), stime 0
    return cpu_account.RECORD.pack(b"\0", version, 0, 0, 0, 0, pid, ppid, 1764800000,
                                   float(etime_ticks), cpu_ticks, 0, 0, 0, 0, 0, 0, 0,
                                   comm.encode())


def test_comp_t_scales_the_mantissa_by_its_base_8_exponent():
    assert cpu_account.comp_t(100) == 100
    assert cpu_account.comp_t((1 << 13) | 5) == 40        # exponent 1: 5 * 8
    assert cpu_account.comp_t((2 << 13) | 0x1FFF) == 0x1FFF * 64


def test_records_read_back_with_cpu_and_lifetime_in_seconds(tmp_path):
    path = tmp_path / "acct"
    path.write_bytes(record("ansible-playboo", 250, 1200, pid=7, ppid=3)
                     + record("VLLM::EngineCor", (1 << 13) | 1000, 90000))
    recs = cpu_account.read(str(path))
    assert recs[0] == {"pid": 7, "ppid": 3, "btime": 1764800000, "etime_s": 12.0, "cpu_s": 2.5,
                       "comm": "ansible-playboo"}
    assert recs[1]["cpu_s"] == 80.0 and recs[1]["comm"] == "VLLM::EngineCor"


def test_a_file_of_other_records_is_refused_naming_the_offset(tmp_path):
    path = tmp_path / "acct"
    path.write_bytes(record("sh", 1, 1) + record("sh", 1, 1, version=b"\x02"))
    with pytest.raises(ValueError, match="record at byte 64 is not an acct_v3 record"):
        cpu_account.read(str(path))


@pytest.mark.parametrize("comm,lived,kind", [
    ("ansible-playboo", 0.5, 0), ("molecule", 900, 0),
    ("python3", 0.4, 1), ("python3", 40, 3),
    ("VLLM::EngineCor", 300, 2), ("gloo_tcp_loop", 120, 2), ("ZMQbg/Reaper", 80, 2),
    ("python", 200, 3), ("python", 2, 4),
    ("uv", 30, 5), ("cc1plus", 3, 6), ("sshd", 1, 7), ("bash", 1, 8),
])
def test_each_process_name_has_its_kind(comm, lived, kind):
    assert cpu_account.kind({"comm": comm, "etime_s": lived}) == cpu_account.KINDS[kind]


def test_the_table_puts_the_largest_kind_first_with_shares_and_the_total(tmp_path):
    path = tmp_path / "acct"
    path.write_bytes(record("python3", 30, 50) * 10 + record("ansible-playboo", 900, 9000)
                     + record("bash", 100, 100))
    lines = cpu_account.table(cpu_account.read(str(path)))
    assert lines[1].split()[:3] == ["9", "69.2%", "1"] and lines[1].endswith(cpu_account.KINDS[0])
    assert lines[2].split()[:3] == ["3", "23.1%", "10"] and lines[2].endswith(cpu_account.KINDS[1])
    assert lines[3].split()[:3] == ["1", "7.7%", "1"] and lines[3].endswith("other")
    assert lines[-1].split() == ["13", "12", "total"]


def test_accounting_that_cannot_start_says_why_and_the_suite_goes_on(tmp_path):
    missing = str(tmp_path / "no-such-dir" / "acct")
    assert cpu_account.start(missing).startswith("cannot write %s" % missing)
    out = io.StringIO()
    rc = run_suite.run([("ok", [sys.executable, "-c", "print('fine')"])], 1, str(tmp_path / "logs"),
                       out=out, cpu_file=missing)
    text = out.getvalue()
    assert rc == 0 and "=== ok: passed" in text
    assert "=== no CPU accounting (cannot write %s" % missing in text
    assert "CPU by process kind" not in text


def test_the_suite_prints_the_kinds_and_records_them_with_its_times(tmp_path, monkeypatch):
    # The kernel's accounting is global (one file per PID namespace) and the unit tests run
    # inside `make test`, whose own run holds it: here start/stop stand in for acct(2), and
    # the file they would fill is written by the test. Every `make test` runs the real calls.
    acct = tmp_path / "acct"
    calls = []
    def stop():
        calls.append(("stop",))
        acct.write_bytes(record("ansible-playboo", 400, 900) + record("python3", 100, 50))

    monkeypatch.setattr(cpu_account, "start", lambda p: calls.append(("start", p)))
    monkeypatch.setattr(cpu_account, "stop", stop)
    times = tmp_path / "times.json"
    out = io.StringIO()
    rc = run_suite.run([("ok", [sys.executable, "-c", "pass"])], 1, str(tmp_path / "logs"),
                       out=out, times_file=str(times), cpu_file=str(acct))
    assert rc == 0 and calls == [("start", str(acct)), ("stop",)]
    text = out.getvalue()
    assert "=== CPU by process kind (BSD process accounting, %s)" % acct in text
    assert "       4  80.0%         1  " + cpu_account.KINDS[0] in text
    doc = json.loads(times.read_text())
    assert doc["last_run"]["cpu_s"] == {cpu_account.KINDS[0]: 4, cpu_account.KINDS[1]: 1}
