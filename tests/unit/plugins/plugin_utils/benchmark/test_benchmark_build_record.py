"""The benchmark record's one owner (plugins/plugin_utils/benchmark/record.py): build_record
makes what the vllm_benchmark role stores per instance (through the vllm_benchmark_record
filter), and instance_records reads a host's results back, old single-record files included."""
from ansible_collections.vllm_ops.deploy.plugins.filter.sweep import FilterModule
from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.benchmark.record import (
    PROVENANCE_KEYS, build_record, instance_records)
from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.benchmark.report import compact_level

LEVEL = {"concurrency": 1, "requests_ok": 9, "requests_failed": 0, "output_tok_s": 120.5,
         "total_tok_s": 240.0, "request_s": 3.0, "achieved_concurrency": 0.98, "window_s": 3.1,
         "ttft_ms": {"mean": 20.0, "p50": 19.0, "p90": 25.0, "p99": 30.0},
         "client": {"client_limited": True}}
SWEEP = {"levels": [LEVEL, dict(LEVEL, concurrency=2, output_tok_s=200.0)],
         "headline": {"peak_output_tok_s": 200.0, "peak_level": 2},
         "stop_reason": "stopped after concurrency 2: saturation", "parameters": {"seed": 7}}
TARGET = {"name": "a", "url": "http://127.0.0.1:8000", "model": "tiny", "unit": "vllm-a.service",
          "gpus": [1]}
CONFIG = {"model_dir": "/srv/models/tiny", "profile": "cpu-tiny", "vllm": "0.32.0",
          "argv": ["python", "-m", "vllm"], "env": {"VLLM_USE_V1": "1"}}
CONTEXT = {"host": "h1", "load_generator": "h1", "load_generators": [], "torch_version": "2.9",
           "gpus": [{"index": 0, "name": "GPU-A"}, {"index": 1, "name": "GPU-B"}],
           "report_dir": "/r", "measured_at": "2026-12-02T08:00:00Z", "levels": [1, 2, 4]}


def test_the_record_of_one_instance():
    r = build_record(SWEEP, TARGET, CONFIG, "0123456789abcdef", CONTEXT)
    assert list(r) == ["fingerprint", "measured_at", "provenance", "parameters", "headline",
                       "stop_reason", "stopped_early", "levels_not_run", "levels"]
    assert list(r["provenance"]) == list(PROVENANCE_KEYS)
    assert r["provenance"]["gpus"] == ["GPU-B"]  # the instance's GPU set only
    assert r["provenance"]["instance"] == "a" and r["provenance"]["vllm_version"] == "0.32.0"
    assert r["stopped_early"] is True and r["levels_not_run"] == [4]
    assert r["levels"] == [compact_level(lv) for lv in SWEEP["levels"]]
    assert r["levels"][0]["flags"] == ["client-limited"]
    assert FilterModule().filters()["vllm_benchmark_record"](
        SWEEP, TARGET, CONFIG, "0123456789abcdef", CONTEXT) == r


def test_all_gpus_when_the_instance_has_no_gpu_set():
    r = build_record(SWEEP, dict(TARGET, gpus=None), CONFIG, "f", CONTEXT)
    assert r["provenance"]["gpus"] == ["GPU-A", "GPU-B"]
    assert build_record(SWEEP, TARGET, CONFIG, "f", dict(CONTEXT, levels=[1, 2]))[
        "stopped_early"] is False


def test_instance_records_new_and_old_files():
    r = build_record(SWEEP, TARGET, CONFIG, "f", CONTEXT)
    assert instance_records(dict(r, instances={"a": r, "b": r})) == {"a": r, "b": r}
    assert instance_records(r) == {"a": r}  # an old file: its one record, by its instance
    old = dict(r, provenance={"host": "h1"})
    assert instance_records(old) == {"main": old}
    assert instance_records({}) == {} and instance_records(None) == {}
