"""tests/harness/run_suite.py: jobs N at a time, each job's output whole under its header,
the suite fails when any job fails."""
import io
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "harness"))
import run_suite  # noqa: E402

PY = sys.executable


def job(name, code):
    return name, [PY, "-c", code]


def test_jobs_run_two_at_a_time_and_output_stays_whole(tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    script = tmp_path / "job.py"
    # each job records when it started and ended and prints three lines with pauses
    script.write_text(
        "import os, sys, time\n"
        "d, n = sys.argv[1], sys.argv[2]\n"
        "open(os.path.join(d, n + '.start'), 'w').write(repr(time.time()))\n"
        "for i in range(3):\n"
        "    print('%s line %d' % (n, i), flush=True)\n"
        "    time.sleep(0.4)\n"
        "open(os.path.join(d, n + '.end'), 'w').write(repr(time.time()))\n")
    jobs = [(n, [PY, str(script), str(marks), n]) for n in ("a", "b", "c")]
    out = io.StringIO()
    rc = run_suite.run(jobs, 2, str(tmp_path / "logs"), out=out)
    assert rc == 0
    start = {n: float((marks / ("%s.start" % n)).read_text()) for n in "abc"}
    end = {n: float((marks / ("%s.end" % n)).read_text()) for n in "abc"}
    # a and b overlapped; c started only after one of them ended (two at a time)
    assert start["b"] < end["a"] and start["a"] < end["b"]
    assert start["c"] >= min(end["a"], end["b"]) - 0.05
    text = out.getvalue()
    for n in "abc":
        block = text.split("=== output of %s\n" % n)[1].split("=== %s: passed" % n)[0]
        assert block == "".join("%s line %d\n" % (n, i) for i in range(3))
    assert "=== suite: 3 jobs, 2 at a time" in text


def test_a_failing_job_fails_the_suite_and_is_named(tmp_path):
    out = io.StringIO()
    rc = run_suite.run([job("ok", "print('fine')"), job("bad", "import sys; print('boom'); sys.exit(3)")],
                       2, str(tmp_path), out=out)
    text = out.getvalue()
    assert rc == 1
    assert "=== bad: FAILED (rc 3)" in text and "boom" in text
    assert "failed: bad" in text and "=== ok: passed" in text
    assert (tmp_path / "bad.log").read_text() == "boom\n"


def test_one_at_a_time_is_serial(tmp_path):
    t0 = time.time()
    rc = run_suite.run([job("x", "import time; time.sleep(1)"), job("y", "import time; time.sleep(1)")],
                       1, str(tmp_path), out=io.StringIO())
    assert rc == 0 and time.time() - t0 >= 2


def test_bad_job_specs_are_refused(capsys):
    import pytest
    for argv in (["noequals"], ["--jobs", "0", "a=true"], ["a=true", "a=false"]):
        with pytest.raises(SystemExit) as e:
            run_suite.main(argv)
        assert e.value.code == 2


def test_a_light_job_takes_no_slot_and_its_failure_fails_the_suite(tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    script = tmp_path / "job.py"
    # a job with a peer waits (up to 20 s) until the peer has started: the light job and the
    # first heavy job each wait for the other, so they can only both pass by running together
    script.write_text(
        "import os, sys, time\n"
        "d, n, rc, peer = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]\n"
        "open(os.path.join(d, n + '.start'), 'w').write(repr(time.time()))\n"
        "t0 = time.time()\n"
        "while peer != '-' and not os.path.exists(os.path.join(d, peer + '.start')):\n"
        "    if time.time() - t0 > 20:\n"
        "        sys.exit(9)\n"
        "    time.sleep(0.05)\n"
        "open(os.path.join(d, n + '.end'), 'w').write(repr(time.time()))\n"
        "sys.exit(rc)\n")
    heavy = [("h1", [PY, str(script), str(marks), "h1", "0", "checks"]),
             ("h2", [PY, str(script), str(marks), "h2", "0", "-"])]
    light = [("checks", [PY, str(script), str(marks), "checks", "4", "h1"])]
    out = io.StringIO()
    rc = run_suite.run(heavy, 1, str(tmp_path / "logs"), out=out, light=light)
    text = out.getvalue()
    # both waited for each other and passed: they ran side by side, the light job took no slot
    assert "=== h1: passed" in text and "=== checks: FAILED (rc 4)" in text, text
    # the heavy jobs still one at a time
    end_h1 = float((marks / "h1.end").read_text())
    assert float((marks / "h2.start").read_text()) >= end_h1 - 0.05
    assert rc == 1 and "=== start checks (light)" in text and "failed: checks" in text
    assert "=== h2: passed" in text


def test_light_and_heavy_names_must_differ():
    import pytest
    with pytest.raises(SystemExit) as e:
        run_suite.main(["--light", "a=true", "a=false"])
    assert e.value.code == 2


def _start_order(text):
    return [line.split()[2] for line in text.splitlines() if line.startswith("=== start ")]


def test_times_order_jobs_longest_first_unmeasured_first_and_are_written_back(tmp_path):
    times = tmp_path / "job_times.json"
    times.write_text('{"jobs": {"short": 1, "long": 50, "mid": 7, "gone": 99}}')
    jobs = [job("short", "pass"), job("mid", "pass"), job("new", "pass"),
            job("long", "import time; time.sleep(3)"),
            job("broken", "import sys; sys.exit(5)")]
    out = io.StringIO()
    rc = run_suite.run(jobs, 1, str(tmp_path / "logs"), out=out, times_file=str(times))
    text = out.getvalue()
    assert rc == 1
    # unknown jobs first in the order given, then longest first by the recorded seconds
    assert _start_order(text) == ["new", "broken", "long", "mid", "short"]
    import json
    doc = json.loads(times.read_text())
    # passing jobs get this run's seconds; a failed job is not recorded; others are kept
    assert 3 <= doc["jobs"]["long"] < 50 and doc["jobs"]["mid"] < 3
    assert doc["jobs"]["short"] < 3 and doc["jobs"]["new"] < 3
    assert "broken" not in doc["jobs"] and doc["jobs"]["gone"] == 99
    assert all(type(v) is int for v in doc["jobs"].values()), doc["jobs"]
    assert list(doc["jobs"])[0] == "gone"  # written longest first
    assert doc["last_run"]["result"] == "failed" and doc["last_run"]["jobs_at_a_time"] == 1
    assert set(doc["last_run"]["job_s"]) == {"short", "mid", "new", "long", "broken"}
    # the next run follows the new measurements: long (now ~3 s) still before the ~1 s jobs,
    # broken (still unmeasured) first
    out2 = io.StringIO()
    run_suite.run(jobs, 1, str(tmp_path / "logs"), out=out2, times_file=str(times))
    assert _start_order(out2.getvalue())[:2] == ["broken", "long"]


def test_the_table_lists_every_job_with_seconds_and_result(tmp_path):
    out = io.StringIO()
    run_suite.run([job("quick", "pass"), job("slow", "import time; time.sleep(1.2)"),
                   job("bad", "import sys; sys.exit(2)")], 3, str(tmp_path), out=out,
                  light=[job("lint", "pass")])
    table = out.getvalue().split("=== suite: 4 jobs")[1].splitlines()[1:]
    assert table[0].split() == ["job", "seconds", "result"]
    rows = {r.split()[0]: r.split()[1:] for r in table[1:6]}
    assert set(rows) == {"quick", "slow", "bad", "lint", "total"}
    assert rows["bad"][1] == "FAILED" and rows["slow"][1] == "passed"
    assert int(rows["slow"][0]) >= 1
    assert table[1].split()[0] == "slow"  # longest first
    assert not (tmp_path / "job_times.json").exists()  # nothing written without --times


def test_times_without_a_file_start_in_the_order_given_and_create_it(tmp_path):
    times = tmp_path / "t.json"
    out = io.StringIO()
    rc = run_suite.run([job("b", "pass"), job("a", "pass")], 1, str(tmp_path / "l"), out=out,
                       times_file=str(times))
    assert rc == 0 and _start_order(out.getvalue()) == ["b", "a"]
    import json
    assert set(json.loads(times.read_text())["jobs"]) == {"a", "b"}


def test_a_bad_times_file_is_refused_with_its_path(tmp_path, capsys):
    import pytest
    for body in ("not json", '{"jobs": {"a": "slow"}}', '{"jobs": [1]}', '{"jobs": {"a": -1}}'):
        bad = tmp_path / "times.json"
        bad.write_text(body)
        with pytest.raises(SystemExit) as e:
            run_suite.main(["--times", str(bad), "a=true"])
        assert e.value.code == 2
        assert "--times: %s" % bad in capsys.readouterr().err


def test_the_recorded_times_name_the_makefile_jobs():
    """The file in the repository holds a time for every heavy job `make test` runs."""
    import json
    import re
    root = os.path.join(os.path.dirname(__file__), "..", "..", "..")
    recorded = json.load(open(os.path.join(root, "tests", "harness", "job_times.json")))["jobs"]
    makefile = open(os.path.join(root, "Makefile")).read()
    scenarios = re.search(r"^MOLECULE_SCENARIOS \?= (.*)$", makefile, re.M).group(1).split()
    expected = {"molecule-%s" % s for s in scenarios} | {"integration", "router", "api", "checks"}
    assert expected <= set(recorded), sorted(expected - set(recorded))


def test_jobs_kept_apart_never_run_together_and_the_next_free_job_starts():
    from run_suite import next_job
    pending = [("molecule-service", ["x"], False), ("integration", ["y"], False)]
    apart = {("molecule-install", "molecule-service")}
    # install runs: service must wait, integration takes the free slot
    assert next_job(pending, ["molecule-install"], 2, apart) == 1
    # the pair given the other way round counts too
    assert next_job(pending, ["molecule-install"], 2, {("molecule-service", "molecule-install")}) == 1
    # no free slot: nothing starts
    assert next_job(pending, ["molecule-install", "api"], 2, apart) is None
    # only the kept-apart job is left: it waits until install ends
    assert next_job(pending[:1], ["molecule-install"], 2, apart) is None
    assert next_job(pending[:1], [], 2, apart) == 0
    # light jobs start whatever runs
    assert next_job([("checks", ["z"], True)] + pending, ["a", "b"], 2, apart) == 0


def test_apart_jobs_end_to_end(tmp_path):
    import run_suite
    import io
    out = io.StringIO()
    jobs = [("a", [sys.executable, "-c", "import time; time.sleep(1.5)"]),
            ("b", [sys.executable, "-c", "pass"]),
            ("c", [sys.executable, "-c", "pass"])]
    rc = run_suite.run(jobs, 2, str(tmp_path), out=out, apart={("a", "b")})
    text = out.getvalue()
    assert rc == 0, text
    starts = [ln.split()[2] for ln in text.splitlines() if ln.startswith("=== start")]
    ends = [ln.split()[1].rstrip(":") for ln in text.splitlines()
            if ln.startswith("=== ") and (" passed in " in ln)]
    # b starts only after a has ended; c took the slot beside a
    assert starts[:2] == ["a", "c"] and starts.index("b") > 1
    assert ends.index("a") < ends.index("b")


def test_what_failed_is_repeated_after_the_table(tmp_path):
    # a pytest-like failing job with much passing output; the digest after the table names
    # the failed test and its assertion, and a passing job gets no digest
    code = ("print('\\n'.join('tests/x.py::test_%d PASSED' % i for i in range(200)));"
            "print('E   assert 0.517 >= 0.95');"
            "print('FAILED tests/integration/test_gate.py::test_accept - assert 0.517 >= 0.95');"
            "print('=========== 1 failed, 200 passed in 9.00s ===========');"
            "import sys; sys.exit(1)")
    out = io.StringIO()
    rc = run_suite.run([job("ok", "print('fine')"), job("integration", code)], 2, str(tmp_path),
                       out=out)
    assert rc == 1
    tail = out.getvalue().split("=== suite:")[1]
    digest = tail.split("=== what failed in integration (3 line(s); the whole output is above)\n")[1]
    assert digest.splitlines()[:3] == [
        "E   assert 0.517 >= 0.95",
        "FAILED tests/integration/test_gate.py::test_accept - assert 0.517 >= 0.95",
        "=========== 1 failed, 200 passed in 9.00s ===========",
    ]
    assert "PASSED" not in tail and "what failed in ok" not in tail


def test_the_digest_keeps_a_failed_ansible_task_with_its_task_line():
    lines = ["TASK [vllm_install : fine]\n", "ok: [h1]\n",
             "TASK [vllm_install : Gate: compare]\n",
             "fatal: [h1]: FAILED! => {\"msg\": \"candidate slower\"}\n",
             "TASK [later]\n", "ok: [h1]\n"]
    assert run_suite.failure_digest(lines) == [
        "TASK [vllm_install : Gate: compare]",
        "fatal: [h1]: FAILED! => {\"msg\": \"candidate slower\"}"]
    assert run_suite.failure_digest(["all fine\n"]) == ["(no failure line found in the job's output)"]


def test_the_digest_reads_molecule_output_keeps_the_result_and_leaves_out_ignored_failures():
    bar = "  \x1b[2m\u2502\x1b[0m "
    lines = [bar + "TASK [Refuse a bad pin]\n",
             bar + "\x1b[0;31mfatal: [h1]: FAILED! =>\x1b[0m\n",
             bar + "    msg: expected refusal\n",
             bar + "...ignoring\n",
             bar + "TASK [Check the model answers]\n",
             bar + "fatal: [h1]: FAILED! =>\n",
             bar + "    assertion: _reply.status == 200\n",
             bar + "    msg: the model did not answer\n",
             bar + "\n",
             bar + "PLAY RECAP\n",
             "\x1b[31mERROR   \x1b[0m service \u279c verify: Executed: Failed\n"]
    assert run_suite.failure_digest(lines) == [
        "TASK [Check the model answers]",
        "fatal: [h1]: FAILED! =>",
        "    assertion: _reply.status == 200",
        "    msg: the model did not answer",
        "ERROR    service \u279c verify: Executed: Failed"]
