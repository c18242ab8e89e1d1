"""vllm_ready's crash watch: the wait ends as soon as the unit's main process has ended and
nothing will start it again, with the journal's error line; a unit between restarts or still
loading keeps the wait going. systemctl's answers are given as systemd prints them (a real
systemd run is in tests/integration/test_ready_dead_unit.py)."""
import pytest

from ansible_collections.vllm_ops.deploy.plugins.module_utils.service.vllm_ready import EndpointError
from ansible_collections.vllm_ops.deploy.plugins.modules import vllm_ready

OOM = ("ValueError: Free memory on device cuda:0 (9.33/139.8 GiB) on startup is less than "
       "desired GPU memory utilization (0.92, 128.62 GiB)")
JOURNAL = ["INFO Starting vLLM API server", "Traceback (most recent call last):",
           '  File "worker.py", line 10, in init', OOM,
           "vllm-gate-main.service: Main process exited, code=exited, status=1/FAILURE"]


def watch(states, journal=JOURNAL, max_restarts=2):
    seq = iter(states)
    return vllm_ready.crash_watch("vllm-gate-main.service", max_restarts, first=0,
                                  props=lambda unit: next(seq), journal=lambda unit: journal)


def show(active, load="loaded", sub="running", restarts="0", status="0"):
    return {"ActiveState": active, "LoadState": load, "SubState": sub, "NRestarts": restarts,
            "ExecMainStatus": status, "MainPID": "0" if active != "active" else "4242"}


def test_a_collected_transient_unit_that_died_ends_the_wait_with_its_error():
    check = watch([show("active"), show("inactive", load="not-found", sub="dead")])
    check(3.0, None)
    with pytest.raises(EndpointError) as e:
        check(15.0, None)
    assert "is gone" in str(e.value) and OOM in str(e.value)


def test_an_inactive_unit_ends_the_wait_with_its_exit_status():
    check = watch([show("inactive", sub="dead", status="1")])
    with pytest.raises(EndpointError, match=r"exited with status 1 and nothing restarts it.*Free memory"):
        check(2.0, None)


def test_failed_and_restarted_units_end_the_wait():
    with pytest.raises(EndpointError, match="failed"):
        watch([show("failed", sub="failed", status="1")])(5.0, None)
    with pytest.raises(EndpointError, match="restarted 2 times"):
        watch([show("activating", sub="auto-restart", restarts="2")])(40.0, None)


def test_loading_or_between_restarts_keeps_waiting():
    check = watch([show("active"), show("activating", sub="auto-restart", restarts="1"),
                   show("active", restarts="1"), show("reloading")])
    for t in (1.0, 2.0, 3.0, 4.0):
        check(t, None)


def test_no_systemd_answer_keeps_waiting():
    watch([{}])(1.0, None)


def test_error_line_prefers_the_exception_over_systemd_lines():
    assert vllm_ready.error_line(JOURNAL) == OOM
    assert vllm_ready.error_line(["a", "b: Main process exited, code=killed, status=9/KILL"]) \
        .endswith("status=9/KILL")
    assert vllm_ready.error_line(["only this"]) == "only this"
    assert vllm_ready.error_line([]) == ""


def test_error_line_names_the_engine_error_not_the_api_servers_pointer_to_it():
    # as the H200 journal showed it: the engine's traceback, then the API server's
    journal = ["(EngineCore pid=2800) Traceback (most recent call last):",
               "(EngineCore pid=2800) " + OOM,
               "(APIServer pid=2755) Traceback (most recent call last):",
               '(APIServer pid=2755)   File "utils.py", line 1272, in wait_for_engine_startup',
               "(APIServer pid=2755)     raise RuntimeError(",
               "(APIServer pid=2755) RuntimeError: Engine core initialization failed. See root "
               "cause above. Failed core proc(s): {}",
               "vllm-gate-main.service: Main process exited, code=exited, status=1/FAILURE"]
    assert vllm_ready.error_line(journal) == "(EngineCore pid=2800) " + OOM
    assert "See root cause above" in vllm_ready.error_line(journal[2:])
    assert vllm_ready.error_line(["x", "  File \"a.py\", line 3, in f", "    raise OSError(",
                                  "x.service: Main process exited, code=exited, status=1/FAILURE"]) \
        == "raise OSError("
