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
    script.write_text(
        "import os, sys, time\n"
        "d, n, rc = sys.argv[1], sys.argv[2], int(sys.argv[3])\n"
        "open(os.path.join(d, n + '.start'), 'w').write(repr(time.time()))\n"
        "time.sleep(0.6)\n"
        "open(os.path.join(d, n + '.end'), 'w').write(repr(time.time()))\n"
        "sys.exit(rc)\n")
    heavy = [(n, [PY, str(script), str(marks), n, "0"]) for n in ("h1", "h2")]
    light = [("checks", [PY, str(script), str(marks), "checks", "4"])]
    out = io.StringIO()
    rc = run_suite.run(heavy, 1, str(tmp_path / "logs"), out=out, light=light)
    start = {n: float((marks / ("%s.start" % n)).read_text()) for n in ("h1", "h2", "checks")}
    end = {n: float((marks / ("%s.end" % n)).read_text()) for n in ("h1", "h2", "checks")}
    # the light job ran beside the first heavy one; the heavy ones still one at a time
    assert start["checks"] < end["h1"] and start["h1"] < end["checks"]
    assert start["h2"] >= end["h1"] - 0.05
    text = out.getvalue()
    assert rc == 1 and "=== start checks (light)" in text and "failed: checks" in text
    assert "=== h1: passed" in text and "=== h2: passed" in text


def test_light_and_heavy_names_must_differ():
    import pytest
    with pytest.raises(SystemExit) as e:
        run_suite.main(["--light", "a=true", "a=false"])
    assert e.value.code == 2
