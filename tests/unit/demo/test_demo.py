"""The demo (demo/demo.py) explains a client-limited sweep level."""
import importlib.util
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _demo():
    spec = importlib.util.spec_from_file_location("demo_entry", os.path.join(ROOT, "demo", "demo.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_client_limited_levels_are_named_with_their_reasons_and_why():
    sweep = {"levels": [
        {"concurrency": 1, "client": {"client_limited": False, "client_limited_reasons": []}},
        {"concurrency": 4, "client": {"client_limited": True,
                                      "client_limited_reasons": ["loop lag p99 41 ms > 20 ms"]}},
        {"concurrency": 8, "client": {"client_limited": True,
                                      "client_limited_reasons": ["client CPU 97 % of a core"]}}]}
    lines = _demo().client_limited_note(sweep, 2)
    text = "\n".join(lines)
    assert "concurrency 4, 8 client-limited" in lines[0]
    assert "concurrency 4: loop lag p99 41 ms > 20 ms" in text
    assert "concurrency 8: client CPU 97 % of a core" in text
    assert "2 CPU core(s)" in text and "vLLM CPU engine" in text and "API server" in text


def test_no_note_when_no_level_was_client_limited():
    sweep = {"levels": [{"concurrency": 1, "client": {"client_limited": False}}]}
    assert _demo().client_limited_note(sweep, 2) == []
    assert _demo().client_limited_note({}, 2) == []


def test_newest_sweep_of_this_run_is_read(tmp_path, monkeypatch):
    demo = _demo()
    monkeypatch.setattr(demo, "REPORTS", str(tmp_path))
    old = tmp_path / demo.HOST / "main" / "20260101T000000Z" / "sweep.json"
    new = tmp_path / demo.HOST / "main" / "20260102T000000Z" / "sweep.json"
    for path, conc in ((old, 1), (new, 2)):
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"levels": [{"concurrency": conc}]}))
    os.utime(str(old), (1000, 1000))
    os.utime(str(new), (2000, 2000))
    assert demo.newest_sweep(1500)["levels"][0]["concurrency"] == 2
    assert demo.newest_sweep(3000) is None


def test_a_model_without_chat_template_is_made_again(tmp_path):
    demo = _demo()
    assert demo.model_ready(str(tmp_path)) is False
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>"}))
    assert demo.model_ready(str(tmp_path)) is False
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ x }}"}))
    assert demo.model_ready(str(tmp_path)) is True


def test_the_endpoint_follows_a_port_given_on_the_command_line():
    demo = _demo()
    assert demo.endpoint([]) == "http://127.0.0.1:8100/v1"
    assert demo.endpoint(["-e", "vllm_service_port=26020"]) == "http://127.0.0.1:26020/v1"
