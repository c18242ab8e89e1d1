"""model_weights' progress poll (roles/model_weights/tasks/progress.yml): the shell command it
runs, against a job file as Ansible's async wrapper writes it (no final newline) and a newer
progress file, gives one line each, and the task's own expressions parse both."""
import json
import os
import subprocess
import time

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
TASKS = os.path.join(ROOT, "roles", "model_weights", "tasks", "progress.yml")


def poll(tmp_path, job_text, progress_text=None):
    task = yaml.safe_load(open(TASKS))[0]
    argv = list(task["ansible.builtin.command"]["argv"])
    job, prog = tmp_path / "job", tmp_path / ".download-progress.json"
    job.write_text(job_text)
    if progress_text is not None:
        time.sleep(1.1)  # newer than the job file, to the second
        prog.write_text(progress_text)
    argv[-2:] = [str(job), str(prog)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return task, out.splitlines()


def test_job_file_without_newline_and_progress_give_a_line_each(tmp_path):
    job = {"started": True, "finished": False, "ansible_job_id": "j1.2"}
    progress = {"bytes_done": 5, "bytes_total": 10, "rate_bytes_per_s": 1.0, "eta_s": 5}
    task, lines = poll(tmp_path, json.dumps(job), json.dumps(progress) + "\n")
    assert len(lines) == 2, lines
    # the task's _job and _progress take the line after its prefix
    assert "_lines[0][4:] | from_json" in task["vars"]["_job"]
    assert "_lines[1][9:] | from_json" in task["vars"]["_progress"]
    assert json.loads(lines[0][4:]) == job and json.loads(lines[1][9:]) == progress


def test_no_progress_file_gives_the_job_line_only(tmp_path):
    _task, lines = poll(tmp_path, json.dumps({"finished": True}))
    assert lines == ['job {"finished": true}']


def evaluate(task, lines):
    """The task's vars, as Ansible templates them, for this poll output."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template
    variables = dict(((k, trust_as_template(v)) for k, v in task["vars"].items()),
                     _model_weights_poll={"stdout_lines": lines},
                     model_weights_progress_steps=4, _step=4)
    templar = Templar(loader=DataLoader(), variables=variables)
    return dict((k, templar.template(trust_as_template("{{ %s }}" % k))) for k in ("_job", "_progress", "_finished"))


def test_a_job_is_finished_when_its_file_holds_the_module_result(tmp_path):
    """The async wrapper's own record has 'started'; the result it writes when the module
    returns has not (async_status reads it so). The result is written after the downloader's
    last progress line, so that line is not shown then: the poll must end on the job line."""
    running = {"started": True, "finished": False, "ansible_job_id": "j1.2"}
    task, lines = poll(tmp_path, json.dumps(running), json.dumps({"bytes_done": 1}) + "\n")
    out = evaluate(task, lines)
    assert out["_finished"] in (False, "False") and out["_progress"]["bytes_done"] == 1
    result = {"changed": True, "downloaded": True, "revision": "abc"}
    task, lines = poll(tmp_path, json.dumps(result))
    out = evaluate(task, lines)
    assert out["_finished"] in (True, "True") and out["_progress"] == {}, out
