"""The tuner's measurement journal read back (plugins/plugin_utils/tune/journal.py) and a run
resumed from it (tuner.py): what the journal measured is not served again, the default is
measured again first, and each taken measurement is anchored on it. The plays here answer in
the tune playbook's real fact shape (one list of level summaries per instance)."""
import json

import pytest

from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.tune import journal as jr
from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.tune.tuner import (
    TuneError, Tuner)

KNOBS = {"max-num-seqs": [16, 64]}
SETTINGS = dict(slo_class="mlperf-server", knobs=KNOBS, grid=True, budget_candidates=3,
                levels=[2], base_window_s=4.0, max_rounds=1)


def level(tok_s, half=3.0, c=2):
    return {"concurrency": c, "output_tok_s": tok_s, "total_tok_s": 2 * tok_s,
            "request_s": tok_s / 32.0, "slo": {"met": True}, "ttft_ms": {"p99": 40.0},
            "goodput": {"output_tok_s": tok_s, "request_s": tok_s / 32.0},
            "precision": {"output_tok_s": {"value": tok_s, "ci_low": tok_s - half,
                                           "ci_high": tok_s + half, "se": half / 2}}}


def player(rates, served):
    """A play that serves and measures: each candidate's rate by its max-num-seqs."""
    def play(extravars):
        if extravars.get("vllm_tune_measure") is False:  # the restore at the end
            return {"rc": 0, "facts": {}}
        inst = extravars["vllm_service_instances"][0]
        seqs = next((a for a in inst.get("extra_args") or [] if a.isdigit()), None)
        served.append(seqs)
        rate = rates[seqs]
        return {"rc": 0, "facts": {"vllm_tune_measurement": {
            "levels": [[level(rate)]], "measure_s": 1.0,
            "correctness": [{"prompt": "p", "token_ids": [1, 2, 3],
                             "top1_logprobs": [-0.1, -0.2, -0.3]}]}}}
    return play


def drifting_player(default_rates, served):
    """A play whose default measures each of ``default_rates`` in turn (the host's drift), the
    candidates with max-num-seqs 16 and 64 at 112 and 60 tok/s, each with a tight interval."""
    def play(extravars):
        if extravars.get("vllm_tune_measure") is False:
            return {"rc": 0, "facts": {}}
        inst = extravars["vllm_service_instances"][0]
        seqs = next((a for a in inst.get("extra_args") or [] if a.isdigit()), None)
        served.append(seqs)
        rate = default_rates.pop(0) if seqs is None else {"16": 112.0, "64": 60.0}[seqs]
        return {"rc": 0, "facts": {"vllm_tune_measurement": {
            "levels": [[level(rate, half=1.0)]], "measure_s": 1.0}}}
    return play


def stopped_journal(tmp_path, rates, n):
    """The journal of a grid stopped after its first ``n`` candidates."""
    path = tmp_path / "first" / jr.JOURNAL_FILE
    served = []
    t = Tuner("h1", "cpu-tiny", player(rates, served), journal=str(path), **SETTINGS)
    for cand in t.cands[:n]:
        t.measure(cand, 4.0, [2])
    return path, t.cands


def test_a_resumed_grid_serves_only_what_the_journal_lacks_and_anchors_on_the_default(tmp_path):
    then = {None: 100.0, "16": 90.0, "64": 120.0}
    path, cands = stopped_journal(tmp_path, then, 2)
    assert [c.get("default") for c in cands[:1]] == [True]
    # the host is slower now: every candidate at 80 % of its earlier rate
    now = dict((k, 0.8 * v) for k, v in then.items())
    served = []
    t = Tuner("h1", "cpu-tiny", player(now, served), journal=str(tmp_path / "second.jsonl"),
              resume=str(path.parent), **SETTINGS)
    doc, _points, _final = t.run()
    seqs = [None if c.get("default") else str(c["knobs"]["max-num-seqs"]) for c in cands]
    # the default again (the anchor), the one candidate the journal lacks, the default last
    assert served == [None, seqs[2], None]
    ranked = dict((r["id"], r) for r in doc["ranked"])
    taken = cands[1]["id"]
    was = then[seqs[1]]
    # anchored by the default's 80/100: what it would measure now
    assert ranked[taken]["goodput_tok_s"] == pytest.approx(0.8 * was)
    iv = ranked[taken]["interval"]
    # its own +-3 widened by both defaults' +-3/100 and +-3/80 in quadrature
    half = 0.8 * was * ((3 / was) ** 2 + (3 / 100.0) ** 2 + (3 / 80.0) ** 2) ** 0.5
    assert iv == [pytest.approx(0.8 * was - half, abs=1e-3),
                  pytest.approx(0.8 * was + half, abs=1e-3)]
    assert doc["winner"]["id"] == cands[max(range(3), key=lambda i: then[seqs[i]])]["id"]
    res = doc["evidence"]["resumed"]
    assert res["candidates"] == [taken] and res["from"] == [str(path)]
    assert res["taken"][taken]["anchor"]["levels"][2]["factor"] == pytest.approx(0.8)
    run = next(r for r in doc["evidence"]["runs"] if r["candidate"] == taken)
    assert run["resumed_from"] == str(path) and run["anchor_factor"] == pytest.approx(0.8)
    # the new journal holds only what this run measured
    recs = [json.loads(x) for x in (tmp_path / "second.jsonl").read_text().splitlines()]
    assert [r["candidate"] for r in recs] == [cands[0]["id"], cands[2]["id"], cands[0]["id"]]
    assert recs[0]["settings"]["input_len"] == 32 and recs[0]["outputs"]


def test_the_journal_of_other_settings_is_refused_naming_the_setting(tmp_path):
    path, _c = stopped_journal(tmp_path, {None: 100.0, "16": 90.0, "64": 120.0}, 2)
    with pytest.raises(TuneError) as e:
        Tuner("h1", "cpu-tiny", player({}, []), resume=str(path), **dict(SETTINGS, input_len=64))
    assert "resume: " in str(e.value) and "input_len=32, this run has input_len=64" in str(e.value)


def test_a_journal_from_before_min_lifetimes_counts_as_fixed_windows(tmp_path):
    """A journal written before the setting existed was measured with the window alone
    (min_lifetimes 0): resumable by a run with 0, refused by one that lengthens windows."""
    path, cands = stopped_journal(tmp_path, {None: 100.0, "16": 90.0, "64": 120.0}, 2)
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    assert all(r["settings"]["min_lifetimes"] == 5 for r in recs)
    for r in recs:
        r["settings"].pop("min_lifetimes")
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    with pytest.raises(TuneError) as e:
        Tuner("h1", "cpu-tiny", player({}, []), resume=str(path), **SETTINGS)
    assert "min_lifetimes=0, this run has min_lifetimes=5" in str(e.value)
    served = []
    t = Tuner("h1", "cpu-tiny", player({None: 100.0, "16": 90.0, "64": 120.0}, served),
              resume=str(path), **dict(SETTINGS, min_lifetimes=0))
    t.run()
    assert served == [None, str(cands[2]["knobs"]["max-num-seqs"]), None]


def test_a_cut_last_line_is_left_out_and_a_bad_line_elsewhere_is_an_error(tmp_path):
    path, _c = stopped_journal(tmp_path, {None: 100.0, "16": 90.0, "64": 120.0}, 2)
    good = path.read_text()
    path.write_text(good + good.splitlines()[0][:40])  # killed while writing a third line
    fpath, recs, notes = jr.read(str(path))
    assert len(recs) == 2 and "cut short" in notes[0]
    path.write_text("{not json\n" + good)
    with pytest.raises(TuneError, match="resume: line 1 of .* is not a measurement record"):
        jr.read(str(path))
    with pytest.raises(TuneError, match="resume: no measurement journal at"):
        jr.read(str(tmp_path / "nowhere"))


def test_failed_and_foreign_records_are_served_again(tmp_path):
    path, cands = stopped_journal(tmp_path, {None: 100.0, "16": 90.0, "64": 120.0}, 3)
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    recs[1]["rc"], recs[1]["score"] = 2, None           # failed then: served again
    recs[2]["knobs"] = {"max-num-seqs": 128}             # another candidate: ignored
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    said, served = [], []
    t = Tuner("h1", "cpu-tiny", player({None: 100.0, "16": 90.0, "64": 120.0}, served),
              resume=str(path), log=said.append, **SETTINGS)
    t.run()
    assert served == [None] + [str(c["knobs"]["max-num-seqs"]) for c in cands[1:]] + [None]
    assert any("left out (failed)" in s for s in said)
    assert any("left out (other candidates)" in s for s in said)


def test_an_older_journal_without_settings_or_outputs_is_taken_and_says_so(tmp_path):
    path, cands = stopped_journal(tmp_path, {None: 100.0, "16": 90.0, "64": 120.0}, 2)
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    for r in recs:
        r.pop("settings")
        r.pop("outputs")
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    said, served = [], []
    t = Tuner("h1", "cpu-tiny", player({None: 100.0, "16": 90.0, "64": 120.0}, served),
              resume=str(path), log=said.append, **SETTINGS)
    doc, _p, _f = t.run()
    assert served == [None, str(cands[2]["knobs"]["max-num-seqs"]), None]
    assert any("do not record their settings" in s for s in said)
    assert any("correctness not checked" in s for s in said)
    row = next(r for r in doc["ranked"] if r["id"] == cands[1]["id"])
    was = {"16": 90.0, "64": 120.0}[str(cands[1]["knobs"]["max-num-seqs"])]
    assert row["goodput_tok_s"] == pytest.approx(was) and row["correctness"] is None


def test_resume_needs_the_default_as_reference(tmp_path):
    path, cands = stopped_journal(tmp_path, {None: 100.0, "16": 90.0, "64": 120.0}, 1)
    with pytest.raises(TuneError, match="resume: the reference must be the default"):
        Tuner("h1", "cpu-tiny", player({}, []), resume=str(path), reference=cands[1]["id"],
              **SETTINGS)
    with pytest.raises(TuneError, match="resume must be the path"):
        Tuner("h1", "cpu-tiny", player({}, []), resume="", **SETTINGS)


def test_two_journals_each_anchored_on_its_own_default(tmp_path):
    """A run resumed twice: the first journal's candidate is scaled by the default's 100 -> 50,
    the second's by 40 -> 50, and only the third candidate is served."""
    rates = {None: 100.0, "16": 90.0, "64": 120.0}
    first, cands = stopped_journal(tmp_path, rates, 2)
    seqs = [None if c.get("default") else str(c["knobs"]["max-num-seqs"]) for c in cands]
    second = tmp_path / "second" / jr.JOURNAL_FILE
    t = Tuner("h1", "cpu-tiny", player(dict((k, 0.4 * v) for k, v in rates.items()), []),
              journal=str(second), **SETTINGS)
    t.measure(cands[0], 4.0, [2])
    t.measure(cands[2], 4.0, [2])
    served = []
    t = Tuner("h1", "cpu-tiny", player(dict((k, 0.5 * v) for k, v in rates.items()), served),
              resume=[str(first), str(second.parent)], **SETTINGS)
    doc, _p, _f = t.run()
    assert served == [None]  # nothing served after the default: no second measurement
    ranked = dict((r["id"], r) for r in doc["ranked"])
    for i in (1, 2):
        assert ranked[cands[i]["id"]]["goodput_tok_s"] == pytest.approx(0.5 * rates[seqs[i]])
    taken = doc["evidence"]["resumed"]["taken"]
    assert taken[cands[1]["id"]]["from"] == str(first)
    assert taken[cands[2]["id"]]["from"] == str(second)
    assert taken[cands[2]["id"]]["anchor"]["overall"]["factor"] == pytest.approx(1.25)


def test_the_grid_measures_the_default_again_last_and_its_drift_is_the_noise(tmp_path):
    """The host speeds up by 20 % during the run: the default measures 100 first and 120 last.
    A candidate at 112 with a tight interval would beat the first measurement; within the
    measured drift it is a tie, and the default is kept."""
    served = []
    default_rates = [100.0, 120.0]

    play = drifting_player(default_rates, served)
    t = Tuner("h1", "cpu-tiny", play, **SETTINGS)
    doc, _p, _f = t.run()
    assert served[0] is None and served[-1] is None and len(served) == 4
    drift = doc["evidence"]["drift"]
    assert drift["first"]["goodput_tok_s"] == 100.0 and drift["last"]["goodput_tok_s"] == 120.0
    assert drift["ratio"] == pytest.approx(1.2) and drift["spread"] == pytest.approx(20 / 110.0, abs=1e-4)
    assert doc["winner"]["id"] == next(c["id"] for c in t.cands if c.get("default"))
    assert doc["decision"]["tie"] is True
    row = next(r for r in doc["ranked"] if r["goodput_tok_s"] == 112.0)
    assert row["noise"] == pytest.approx(20 / 110.0, abs=1e-4)
    assert any("the default again, last" in line for line in doc["evidence"]["search_log"])

    # the CLI's table says it too
    import io
    from rich.console import Console
    from vllm_deploy.cli import render_tune
    buf = io.StringIO()
    render_tune(Console(file=buf, width=200), doc)
    assert "drift: vLLM's defaults measured 100.0 tok/s first and 120.0 last (x1.200): a " \
           "difference within 18.2 % is a tie" in buf.getvalue()


def test_reference_every_measures_the_default_between_candidates_and_the_cli_shows_it(tmp_path):
    """The host speeds up by 30 % between the grid's two other candidates and slows down again:
    first and last alone (100, 100) show no drift; with the default measured again after each
    candidate, 130 in between makes the candidate at 112 a tie."""
    served = []
    default_rates = [100.0, 130.0, 100.0]

    play = drifting_player(default_rates, served)
    t = Tuner("h1", "cpu-tiny", play, reference_every=1, **SETTINGS)
    doc, _p, _f = t.run()
    assert served[0] is None and served[2] is None and served[-1] is None and len(served) == 5
    drift = doc["evidence"]["drift"]
    assert [r["goodput_tok_s"] for r in drift["references"]] == [130.0, 100.0]
    assert drift["ratio"] == pytest.approx(1.0) and drift["spread"] == pytest.approx(0.2727, abs=1e-3)
    assert doc["decision"]["tie"] is True
    assert doc["winner"]["id"] == next(c["id"] for c in t.cands if c.get("default"))

    import io
    from rich.console import Console
    from vllm_deploy.cli import render_tune
    buf = io.StringIO()
    render_tune(Console(file=buf, width=200), doc)
    assert "drift: vLLM's defaults measured 100.0 tok/s first, 130.0 between and 100.0 last " \
           "(x1.000): a difference within 27.3 % is a tie" in buf.getvalue()
