"""prompt_format text: the preflight's word selection and check against a real HTTP /tokenize
(aiohttp.web, in-process) whose tokenizer is a small word-level one with the quirks real
tokenizers have (a BOS token, words known only after a space, pairs merged across a space),
and the per-level prompt-length report. The real tokenizer (vLLM serving the tiny model) is
tests/integration/test_sweep_real.py::test_chunk_usage_gives_tokens_per_chunk."""
import asyncio
import random

import pytest

aiohttp = pytest.importorskip("aiohttp")  # pinned in requirements/tools.txt: never skips there
from aiohttp import web  # noqa: E402
from aio_server import ThreadedServer, servers, sweep_params  # noqa: E402  (this directory's helper)

from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.vllm_sweep import (  # noqa: E402
    PROMPT_WORDS, Sweep, SweepError, check_params)
from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.metrics import (  # noqa: E402
    Record, format_table, headline, prompt_length_check, summarize_level)

MODEL = "tiny"
KNOWN = [w for w in PROMPT_WORDS if len(w) <= 4]  # the toy vocabulary: short words


class Toy(object):
    """Word-level tokenizer: a known word is one token, anything else one token per character;
    ``bos`` special tokens in front when add_special_tokens. ``start_plain``: a known word at
    the very start without a space before it is one token (else never one token).
    ``merge_repeats``: a word repeated right after itself joins it (a merge across a space)."""

    def __init__(self, bos=1, start_plain=True, merge_repeats=False, known=None):
        self.bos, self.start_plain, self.merge = bos, start_plain, merge_repeats
        self.known = set(KNOWN if known is None else known)

    def count(self, text, special=True):
        n = self.bos if special else 0
        prev = None
        pieces = text.split(" ")
        for i, w in enumerate(pieces):
            if w == "":
                continue
            spaced = i > 0
            if self.merge and w == prev:
                prev = None
                continue
            if not spaced and not self.start_plain:
                n += len(w) + 1  # e.g. SentencePiece without a dummy prefix: never one token
            elif w in self.known:
                n += 1
            else:
                n += len(w)
            prev = w
        return n


class TokenizeServer(ThreadedServer):
    """/v1/models and /tokenize (or no /tokenize) on 127.0.0.1, in its own thread."""

    def __init__(self, toy, tokenize=True):
        self.toy, self.with_tokenize = toy, tokenize
        self.calls = 0
        super(TokenizeServer, self).__init__()

    def routes(self, app):
        app.router.add_get("/v1/models", self.models)
        if self.with_tokenize:
            app.router.add_post("/tokenize", self.tokenize)

    async def models(self, request):
        return web.json_response({"object": "list", "data": [
            {"id": MODEL, "object": "model", "max_model_len": 4096}]})

    async def tokenize(self, request):
        body = await request.json()
        self.calls += 1
        assert body["model"] == MODEL
        n = self.toy.count(body["prompt"], body.get("add_special_tokens", True))
        return web.json_response({"count": n, "max_model_len": 4096, "tokens": list(range(n))})


@pytest.fixture
def server():
    yield from servers(TokenizeServer)


def params(base_url, **kw):
    return sweep_params(base_url, MODEL, **dict({"input_len": 24, "prompt_format": "text",
                                                 "seed": 7}, **kw))


def preflight(srv, **kw):
    async def go():
        sweep = Sweep(params(srv.base_url, **kw))
        async with aiohttp.ClientSession() as session:
            sweep.session = session
            await sweep.preflight()
        return sweep
    return asyncio.run(go())


def prompt_of(sweep, rng):
    import json
    return json.loads(sweep._body(rng))["prompt"]


@pytest.mark.parametrize("bos", [0, 1, 2])
@pytest.mark.parametrize("input_len", [3, 24, 128])
def test_text_prompts_tokenize_to_exactly_input_len(server, bos, input_len):
    toy = Toy(bos=bos)
    srv = server(toy)
    sweep = preflight(srv, input_len=input_len)
    info = sweep.server["prompt_text"]
    assert sweep.server["prompt_format"] == "text"
    assert info["special_tokens"] == bos and info["leading_space"] is False
    assert info["words"] == len(KNOWN) and info["checked_prompts"] == 8
    assert sweep.server["vocab_size"] is None  # no vocabulary probe (no /v1/completions here)
    rng = random.Random("%d/%d" % (sweep.seed, 1))
    prompts = [prompt_of(sweep, rng) for _unused in range(200)]
    assert all(isinstance(p, str) for p in prompts)
    assert all(toy.count(p) == input_len for p in prompts)
    if input_len >= 24:  # unique per request: prefix caching cannot flatter repeats
        assert len(set(prompts)) == 200
    # seeded: the same seed and level give the same prompts, another seed others
    again = preflight(srv, input_len=input_len)
    rng2 = random.Random("%d/%d" % (again.seed, 1))
    assert [prompt_of(again, rng2) for _unused in range(200)] == prompts
    other = preflight(srv, input_len=input_len, seed=8)
    rng3 = random.Random("%d/%d" % (other.seed, 1))
    assert [prompt_of(other, rng3) for _unused in range(20)] != prompts[:20]


def test_words_known_only_after_a_space_start_the_prompt_with_one(server):
    toy = Toy(start_plain=False)
    sweep = preflight(server(toy))
    assert sweep.server["prompt_text"]["leading_space"] is True
    rng = random.Random(1)
    for _unused in range(50):
        p = prompt_of(sweep, rng)
        assert p.startswith(" ") and toy.count(p) == 24


def test_a_tokenizer_that_merges_across_words_fails_the_check_naming_prompt_format(server):
    # every single word is one token after a space, but a repeated pair becomes one token:
    # random prompts then come out short, and the preflight says so before any level
    srv = server(Toy(merge_repeats=True))
    with pytest.raises(SweepError) as e:
        preflight(srv)
    msg = str(e.value)
    assert msg.startswith("prompt_format=text: ")
    assert "random prompts of 23 words came out at" in msg and "not input_len 24" in msg
    assert "use prompt_format=token_ids" in msg


def test_no_tokenize_endpoint_fails_naming_prompt_format(server):
    srv = server(Toy(), tokenize=False)
    with pytest.raises(SweepError) as e:
        preflight(srv)
    assert "prompt_format=text needs the server's /tokenize endpoint" in str(e.value)
    assert "HTTP 404" in str(e.value)


def test_too_few_one_token_words_fail(server):
    srv = server(Toy(known=["the", "of"]))  # and the one-letter words ("a", "i")
    with pytest.raises(SweepError, match=r"prompt_format=text: only 4 of %d candidate words .*"
                                         r"at least 16 needed" % len(PROMPT_WORDS)):
        preflight(srv)


def test_input_len_not_above_the_special_tokens_fails(server):
    with pytest.raises(SweepError, match="adds 2 special tokens.*input_len 2 cannot be made"):
        preflight(server(Toy(bos=2)), input_len=2)


def test_prompt_format_parameters():
    base = params("http://x")
    check_params(base)
    check_params(dict(base, prompt_format="token_ids"))
    check_params(dict(base, prompt_format=None))  # the default: token_ids
    with pytest.raises(SweepError, match="prompt_format must be 'token_ids' or 'text'"):
        check_params(dict(base, prompt_format="words"))
    with pytest.raises(SweepError, match="prompt_format=text applies to endpoint=completions"):
        check_params(dict(base, endpoint="chat"))
    check_params(dict(base, endpoint="chat", prompt_format="token_ids"))


# --- the per-level prompt-length report ----------------------------------------------------

def rec(start, prompt, ok=True):
    return Record(level=2, start=start, end=start + 0.5, chunk_times=[start + 0.1, start + 0.4],
                  completion_tokens=4, prompt_tokens=prompt, expected_tokens=4,
                  error=None if ok else "HTTP 500: x")


def test_prompt_length_check_counts_every_miss():
    records = [rec(0.0, 24), rec(0.1, 23), rec(0.2, 25), rec(0.3, 24), rec(0.4, None, ok=False)]
    chk = prompt_length_check(records, 24, "text")
    assert chk == {"expected": 24, "prompt_format": "text", "checked": 4, "mismatched": 2,
                   "fraction": 0.5, "marked": True, "prompt_tokens_total": 96,
                   "lengths_seen": [23, 25]}
    exact = prompt_length_check(records[:1] + records[3:4], 24, "token_ids")
    assert exact["mismatched"] == 0 and exact["marked"] is False
    assert exact["prompt_tokens_total"] == 48
    chat = prompt_length_check(records, None, "chat")  # no length to compare with
    assert chat["mismatched"] is None and chat["marked"] is False
    assert chat["prompt_tokens_total"] == 96


def test_level_summary_table_and_headline_show_prompt_length_misses():
    records = [rec(0.1 * i, 24 if i % 5 else 23) for i in range(20)]
    s = summarize_level(records, 2, 0.0, 3.0, 4, expected_prompt_tokens=24,
                        prompt_format="text")
    s.update(client={}, server_check={"match": True}, saturation_signal=None)
    assert s["input_length"]["mismatched"] == 4 and s["input_length"]["marked"] is True
    assert s["input_length"]["prompt_tokens_total"] == 24 * 20 - 4
    table = format_table([s])
    assert "in_miss" in table[0].split()
    row = table[1].split()
    assert row[table[0].split().index("in_miss")] == "4"
    assert "prompt-length-miss" in table[1]
    assert headline([s])["input_length_marked_levels"] == [2]
    clean = summarize_level([rec(0.1 * i, 24) for i in range(20)], 2, 0.0, 3.0, 4,
                            expected_prompt_tokens=24, prompt_format="token_ids")
    clean.update(client={}, server_check={"match": True}, saturation_signal=None)
    assert "prompt-length-miss" not in format_table([clean])[1]
    assert headline([clean])["input_length_marked_levels"] == []
