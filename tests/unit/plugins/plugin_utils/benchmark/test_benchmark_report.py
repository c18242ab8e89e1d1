"""plugins/plugin_utils/benchmark/report.py and the action vllm_ops.deploy.vllm_report: CSV,
tables, request-log checks, plots and run comparison.

Level summaries are computed by sweep_metrics.summarize_level from hand-made request records,
so the report reads exactly what the module produces; expected numbers are worked out by hand.
"""
import csv
import json
import os
import subprocess
import sys

import pytest
import yaml

from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.metrics import (
    Record, headline, summarize_level)
from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.benchmark import report as sr

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))))

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def closed_loop(conc, n_per_worker, dur, ttft, tokens, prompt, fail_last=False):
    """Each worker sends n requests back to back, each lasting ``dur`` seconds."""
    recs = []
    for w in range(conc):
        for i in range(n_per_worker):
            start = i * dur
            recs.append(Record(level=conc, worker=w, start=start, end=start + dur,
                               chunk_times=[start + ttft, start + dur],
                               chunk_tokens=[1, tokens - 1], completion_tokens=tokens,
                               prompt_tokens=prompt, expected_tokens=tokens))
    if fail_last:
        recs[-1].error = "HTTP 500: boom"
        recs[-1].completion_tokens = None
        recs[-1].prompt_tokens = None
    return recs


def make_run(tmp_path, name, scale=1.0, levels=(1, 2), asked=(1, 2, 4), fail_at=None,
             stop="stopped after concurrency 2: saturated", model="tiny", host="h1"):
    """A run directory as the role writes it: sweep.json and requests.jsonl."""
    summaries, log = [], []
    for c in levels:
        # requests of 1/scale s, TTFT 0.1/scale s, 11 tokens, 5 prompt tokens; window (1, 4]/scale
        recs = closed_loop(c, 5, 1.0 / scale, 0.1 / scale, 11, 5, fail_last=(c == fail_at))
        s = summarize_level(recs, c, 1.0 / scale, 4.0 / scale, 11)
        s["server_check"] = {"client_output_tokens": sum(r.completion_tokens or 0 for r in recs),
                             "server_output_tokens": None, "match": None}
        s["saturation_signal"] = None
        summaries.append(s)
        log.extend(dict(r.to_dict(), phase="window") for r in recs)
    d = tmp_path / name
    d.mkdir(parents=True)
    sweep = {"levels": summaries, "headline": headline(summaries), "stop_reason": stop,
             "parameters": {"levels": list(asked), "input_len": 5, "output_len": 11},
             "provenance": {"model": model, "host": host},
             "measured_at": "2026-01-01T00:00:00Z", "fingerprint": "f" * 16}
    (d / "sweep.json").write_text(json.dumps(sweep))
    (d / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
    return d


def assert_png(path, size=(800, 500)):
    from PIL import Image
    with open(path, "rb") as f:
        assert f.read(8) == PNG_MAGIC
    with Image.open(path) as im:
        im.load()  # decodes the whole image: fails on a truncated file
        assert im.size == size
        colours = im.convert("RGB").getcolors(maxcolors=1 << 20)
        assert len(colours) > 10  # axes, lines, text: not a blank canvas


def test_level_row_hand_checked(tmp_path):
    run = sr.load_run(str(make_run(tmp_path, "r")))
    row = sr.level_row(run["levels"][0])
    # concurrency 1: completions at 2, 3, 4 s in (1, 4]: 3 x 11 tokens over 3 s
    assert row["concurrency"] == 1
    assert row["output_tok_s"] == pytest.approx(11.0)
    assert row["total_tok_s"] == pytest.approx(16.0)  # + 3 x 5 prompt tokens
    assert row["ttft_p50_ms"] == pytest.approx(100.0)
    assert row["tpot_p50_ms"] == pytest.approx(90.0)  # (1000 - 100) / (11 - 1)
    assert row["client_output_tokens"] == 55
    assert row["flags"] == ""
    row2 = sr.level_row(run["levels"][1])
    assert row2["output_tok_s"] == pytest.approx(22.0)


def test_write_csv_round_trip(tmp_path):
    run = sr.load_run(str(make_run(tmp_path, "r", fail_at=2)))
    path = sr.write_csv(str(tmp_path / "levels.csv"), run["levels"])
    with open(path) as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0].keys()) == sr.CSV_COLUMNS
    assert [r["concurrency"] for r in rows] == ["1", "2"]
    assert rows[1]["requests_failed"] == "1" and rows[1]["flags"] == "errors"
    assert rows[0]["goodput_request_s"] == ""  # None -> empty cell, not "None"


def test_check_requests_agrees_and_detects_gaps(tmp_path):
    d = make_run(tmp_path, "r")
    run = sr.load_run(str(d))
    rows = sr.read_requests(str(d / "requests.jsonl"))
    assert sr.check_requests(run["levels"], rows) == []
    assert sr.check_requests(run["levels"], rows[1:]) == [
        "concurrency 1: 4 requests logged, summary says 5",
        "concurrency 1: 44 output tokens logged, summary says 55"]
    stray = dict(rows[0], level=64)
    assert sr.check_requests(run["levels"], rows + [stray]) == [
        "requests logged for concurrency 64, which has no summary"]


def test_read_requests_names_the_bad_line(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_text('{"level": 1}\n{not json\n')
    with pytest.raises(sr.ReportError, match="line 2"):
        sr.read_requests(str(p))


def test_render_writes_csv_plots_and_summary(tmp_path):
    d = make_run(tmp_path, "r", fail_at=2)
    files = sr.render(str(d))
    names = sorted(os.path.basename(f) for f in files)
    assert names == ["levels.csv", "summary.txt", "throughput.png", "tpot.png", "ttft.png"]
    for png in ("throughput.png", "ttft.png", "tpot.png"):
        assert_png(str(d / png))
    summary = (d / "summary.txt").read_text()
    assert "stop: stopped after concurrency 2: saturated" in summary
    assert "stopped early: levels [4] were not run" in summary
    assert "errors" in summary  # the flagged level
    assert "matches the level summaries" in summary


def test_render_refuses_a_log_that_disagrees(tmp_path):
    d = make_run(tmp_path, "r")
    lines = (d / "requests.jsonl").read_text().splitlines(True)
    (d / "requests.jsonl").write_text("".join(lines[:-1]))
    with pytest.raises(sr.ReportError, match="concurrency 2: 9 requests logged, summary says 10"):
        sr.render(str(d))
    assert not (d / "levels.csv").exists()


def test_compare_rows_ratios_and_missing_levels(tmp_path):
    a = sr.load_run(str(make_run(tmp_path, "a", levels=(1, 2, 4))))
    b = sr.load_run(str(make_run(tmp_path, "b", scale=2.0, levels=(1, 2), model="other")))
    rows = sr.compare_rows([a, b])
    assert [r["concurrency"] for r in rows] == [1, 2, 4]
    assert rows[0]["runs"][1]["vs_first"] == pytest.approx(2.0)  # twice as fast
    assert rows[0]["runs"][1]["ttft_p50_ms"] == pytest.approx(50.0)
    assert rows[2]["runs"][1]["output_tok_s"] is None and rows[2]["runs"][1]["vs_first"] is None
    table = sr.compare_table([a, b])
    assert any(line.startswith("  [2] other@h1") for line in table)
    assert any("2.00x" in line for line in table)


def test_compare_writes_table_csv_and_overlaid_plots(tmp_path):
    a = make_run(tmp_path, "a")
    b = make_run(tmp_path, "b", scale=1.5)
    out = tmp_path / "cmp"
    lines, files = sr.compare([str(a), str(b)], str(out))
    assert sorted(os.path.basename(f) for f in files) == [
        "compare.csv", "compare.txt", "throughput.png", "tpot.png", "ttft.png"]
    # identical labels are numbered so the legends tell the runs apart
    assert any(line.endswith("Z #1: in/out 5/11 tokens; single stream 11.0 tok/s; peak 22.0 tok/s "
                             "at concurrency 2; stop: stopped after concurrency 2: saturated; "
                             "stopped early: levels [4] were not run") for line in lines)
    assert any("[2] tiny@h1 2026-01-01T00:00:00Z #2: " in line for line in lines)
    with open(str(out / "compare.csv")) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4
    assert float(rows[1]["output_tok_s_vs_first"]) == pytest.approx(1.5)
    for png in ("throughput.png", "ttft.png", "tpot.png"):
        assert_png(str(out / png))


def test_compare_needs_two_runs_and_matching_labels(tmp_path):
    a = make_run(tmp_path, "a")
    with pytest.raises(sr.ReportError, match="at least two runs"):
        sr.compare([str(a)], str(tmp_path / "o"))
    with pytest.raises(sr.ReportError, match="1 labels for 2 runs"):
        sr.compare([str(a), str(a)], str(tmp_path / "o"), labels=["x"])


def test_host_directory_resolves_to_newest_run(tmp_path):
    host = tmp_path / "h1"
    host.mkdir()
    make_run(host, "20260101T000000Z")
    make_run(host, "20260102T000000Z", model="newer")
    run = sr.load_run(str(host))
    assert run["path"].endswith("20260102T000000Z")
    assert run["label"].startswith("newer@h1")


def test_inventory_results_file_is_a_run(tmp_path):
    """The compact host_vars summary (vllm_sweep_compact levels) can be compared too."""
    full = sr.load_run(str(make_run(tmp_path, "a")))
    compact = [sr.compact_level(lv) for lv in full["levels"]]
    p = tmp_path / "vllm_benchmark.yml"
    p.write_text(yaml.safe_dump({"vllm_benchmark_results": {
        "levels": compact, "headline": full["headline"], "stop_reason": "ran all levels",
        "provenance": {"model": "tiny", "host": "h2"}, "parameters": {"levels": [1, 2]}}}))
    run = sr.load_run(str(p))
    assert run["label"] == "tiny@h2"
    assert sr.level_row(run["levels"][0])["output_tok_s"] == pytest.approx(11.0)
    assert sr.stop_lines(run) == ["stop: ran all levels"]
    lines, _unused = sr.compare([str(tmp_path / "a"), str(p)], str(tmp_path / "o"))
    assert any(" 1.00x" in line for line in lines)


@pytest.mark.parametrize("content,message", [
    (None, "no such run directory"),
    ("{}", "does not hold a sweep result"),
    ('{"levels": [{"concurrency": 1}]}', "lacks concurrency/output_tok_s"),
    ("{broken", "sweep.json"),
])
def test_load_run_errors_name_the_path(tmp_path, content, message):
    d = tmp_path / "run"
    if content is not None:
        d.mkdir()
        (d / "sweep.json").write_text(content)
    with pytest.raises(sr.ReportError, match=message):
        sr.load_run(str(d))


def test_instance_directories_resolve_to_the_newest_run(tmp_path):
    """<root>/<host>/<instance>/<timestamp>/: a host's directory means its newest run of any
    instance, an instance's directory its own newest."""
    host = tmp_path / "h1"
    make_run(host / "one", "20260101T000000Z", model="one-old")
    make_run(host / "two", "20260103T000000Z", model="two-new")
    make_run(host / "one", "20260102T000000Z", model="one-new")
    assert sr.load_run(str(host))["label"].startswith("two-new@")
    assert sr.load_run(str(host / "one"))["label"].startswith("one-new@")


def report_action(args, check=False, diff=False):
    """The action plugin as a task runs it (ansible ad hoc, on the controller)."""
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"),
               ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json",
               ANSIBLE_LOCALHOST_WARNING="0", ANSIBLE_INVENTORY_UNPARSED_WARNING="0")
    cmd = [os.path.join(os.path.dirname(sys.executable), "ansible"), "localhost", "-i",
           "localhost,", "-c", "local", "-m", "vllm_ops.deploy.vllm_report", "-a",
           json.dumps(args)] + (["--check"] if check else []) + (["--diff"] if diff else [])
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
                         check=False)
    return json.loads(out.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]


def test_report_action_render_compare_table_and_check_mode(tmp_path):
    a = make_run(tmp_path, "a")
    b = make_run(tmp_path, "b", scale=3.0)
    res = report_action({"mode": "render", "run": str(a)}, check=True)
    assert res["changed"] is True and not (a / "levels.csv").exists()  # check mode: nothing
    assert sorted(os.path.basename(f) for f in res["files"]) == sorted(
        ["levels.csv", "throughput.png", "ttft.png", "tpot.png", "summary.txt"])
    res = report_action({"mode": "render", "run": str(a)}, diff=True)
    assert not res.get("failed"), res
    assert (a / "levels.csv").exists() and (a / "throughput.png").read_bytes()[:8] == PNG_MAGIC
    assert res["diff"]["before"]["files"] == [] and len(res["diff"]["after"]["files"]) == 5
    out = tmp_path / "o"
    res = report_action({"mode": "compare", "runs": [str(a), str(b)], "dest": str(out),
                         "labels": ["slow", "fast"]})
    assert not res.get("failed"), res
    assert any("[2] fast" in line for line in res["lines"])
    assert any("3.00x" in line for line in res["lines"])
    assert (out / "compare.csv").exists()
    res = report_action({"mode": "table", "run": str(tmp_path / "missing")})
    assert res["failed"] is True and "no such run directory" in res["msg"]
    res = report_action({"mode": "compare", "runs": [str(a)]})
    assert res["failed"] is True and "dest" in res["msg"]
