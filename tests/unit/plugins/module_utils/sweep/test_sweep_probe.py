"""The sweep client's vocabulary probe against real HTTP servers (aiohttp.web, in-process).

vLLM answers an out-of-vocabulary prompt token id with HTTP 400 "... out of vocabulary ...",
but vLLM 0.25.0 (CUDA build) raised an unhandled ValueError instead and the connection was
reset (errno 104); other versions may answer HTTP 500. These servers reproduce each behaviour
over real TCP so the probe's handling of it is tested end to end, plus one that dies mid-probe.
"""
import asyncio
import json
import socket
import struct
import sys

import pytest

aiohttp = pytest.importorskip("aiohttp")  # pinned in requirements/tools.txt: never skips there
from aiohttp import web  # noqa: E402
from aio_server import ThreadedServer, servers, sweep_params  # noqa: E402  (this directory's helper)

from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep import vllm_sweep as sweep_client  # noqa: E402
from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.vllm_sweep import (  # noqa: E402
    RequestLogError, Sweep, SweepError, failure_message, run_sweep)

MODEL = "tiny"


class FakeServer(ThreadedServer):
    """A /v1/models + /v1/completions server on 127.0.0.1 in its own thread and event loop.

    ``mode`` says what a prompt token id >= ``vocab`` gets: "400" (vLLM's validation error),
    "reset" (TCP RST, as vLLM 0.25.0), "close" (connection closed without an answer), "500",
    "die-reset" / "die-500" (the first such probe kills the server: from then on every request
    is reset / answered 500).
    """

    def __init__(self, mode, vocab):
        self.mode, self.vocab = mode, vocab
        self.dead = False
        self.probes = []  # token ids of every /v1/completions request, in order
        super(FakeServer, self).__init__()

    def routes(self, app):
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.completions)

    @staticmethod
    def _drop(request, rst):
        sock = request.transport.get_extra_info("socket")
        if rst and sock is not None:  # close with SO_LINGER 0: the peer gets a RST (errno 104)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        request.transport.abort()
        raise asyncio.CancelledError()  # nothing more to send on this connection

    def _dead(self, request):
        if self.mode == "die-reset":
            self._drop(request, rst=True)
        return web.Response(status=500, text="Internal Server Error")

    async def models(self, request):
        if self.dead:
            return self._dead(request)
        return web.json_response({"object": "list", "data": [
            {"id": MODEL, "object": "model", "max_model_len": 4096}]})

    async def completions(self, request):
        body = await request.json()
        tok = body["prompt"][0]
        self.probes.append(tok)
        if self.dead:
            return self._dead(request)
        if tok < self.vocab:
            return web.json_response({"choices": [{"text": "x", "index": 0}],
                                      "usage": {"prompt_tokens": 1, "completion_tokens": 1}})
        if self.mode == "400":
            return web.json_response(
                {"object": "error", "type": "BadRequestError", "code": 400,
                 "message": "Token id %d is out of vocabulary" % tok}, status=400)
        if self.mode in ("reset", "close"):
            self._drop(request, rst=self.mode == "reset")
        if self.mode == "500":
            return web.Response(status=500, text="Internal Server Error: Token id %d is out "
                                                 "of vocabulary" % tok)
        self.dead = True  # die-*: this probe is the last one answered properly
        return self._dead(request)


@pytest.fixture
def server():
    yield from servers(FakeServer)


def params(base_url, **kw):
    return sweep_params(base_url, MODEL, **kw)


def preflight(srv):
    """Run the sweep's preflight (models, vocabulary probe, metrics) and return its facts."""
    async def go():
        sweep = Sweep(params(srv.base_url))
        async with aiohttp.ClientSession() as session:
            sweep.session = session
            await sweep.preflight()
        return sweep.server
    return asyncio.run(go())


# --- the probe finds the vocabulary whichever way the server refuses an id --------------

@pytest.mark.parametrize("mode", ["400", "reset", "close", "500"])
@pytest.mark.parametrize("vocab", [2, 2048, 151936, 1 << 21])
def test_probe_finds_vocab_size_exactly(server, mode, vocab):
    srv = server(mode, vocab)
    facts = preflight(srv)
    assert facts["vocab_size"] == vocab
    assert facts["metrics_available"] is False  # no /metrics here: the probe does not need it
    refused = [t for t in srv.probes if t >= vocab]
    if mode == "400":
        assert len(srv.probes) == 22  # token 0, then 21 halvings of [0, 2**21)
    else:  # each refused id costs one check that token 0 still works
        assert len(srv.probes) == 22 + len(refused)
    assert len(refused) <= 20


def test_reset_probe_really_resets_the_connection(server):
    """The "reset" server does what vLLM 0.25.0 did: the client sees errno 104, no answer."""
    srv = server("reset", 16)

    async def go():
        async with aiohttp.ClientSession() as s:
            async with s.post(srv.base_url + "/v1/completions",
                              json={"model": MODEL, "prompt": [16]}) as r:
                await r.text()
    with pytest.raises((aiohttp.ClientOSError, aiohttp.ServerDisconnectedError,
                        aiohttp.ClientPayloadError)) as e:
        asyncio.run(go())
    assert "reset" in str(e.value).lower() or "disconnected" in str(e.value).lower()


# --- a server that stops answering fails the sweep, naming vocab_size ------------------

@pytest.mark.parametrize("mode", ["die-reset", "die-500"])
def test_server_dying_during_probe_fails_with_vocab_size_hint(server, mode):
    srv = server(mode, 2048)
    with pytest.raises(SweepError) as e:
        preflight(srv)
    msg = str(e.value)
    assert "stopped answering during the vocabulary probe" in msg
    assert "vocab_size" in msg
    assert "token id 1048576" in msg  # the probe that killed it
    assert srv.probes == [0, 1 << 20, 0]  # one re-check of token id 0, then it gives up


def test_token_zero_refused_still_fails_as_before(server):
    srv = server("400", 0)
    with pytest.raises(SweepError, match="rejects token id 0; pass vocab_size"):
        preflight(srv)
    assert srv.probes == [0]


def test_token_zero_dropped_fails_with_vocab_size_hint(server):
    srv = server("reset", 0)
    with pytest.raises(SweepError, match="stopped answering during the vocabulary probe "
                                         r"\(token id 0: .*vocab_size"):
        preflight(srv)
    assert srv.probes == [0]


def test_given_vocab_size_skips_the_probe(server):
    srv = server("die-reset", 2048)

    async def go():
        sweep = Sweep(params(srv.base_url, vocab_size=100))
        async with aiohttp.ClientSession() as session:
            sweep.session = session
            await sweep.preflight()
        return sweep.server
    assert asyncio.run(go())["vocab_size"] == 100
    assert srv.probes == []


# --- the module blames request_log_path only for the request log ----------------------

def test_failure_message_names_the_error_not_the_log():
    msg = failure_message(ConnectionResetError(104, "Connection reset by peer"))
    assert msg == "sweep failed: ConnectionResetError: [Errno 104] Connection reset by peer"
    assert failure_message(SweepError("x")) == "x"


def test_unwritable_request_log_is_a_request_log_error(server, tmp_path):
    srv = server("reset", 2048)
    path = str(tmp_path / "missing-dir" / "log.jsonl")
    with pytest.raises(RequestLogError, match="request_log_path %s: " % path):
        run_sweep(params(srv.base_url), request_log_path=path)
    assert sweep_client.RequestLogError.__mro__[1] is SweepError


def run_module(args, capsys):
    from ansible.module_utils.testing import patch_module_args
    from ansible_collections.vllm_ops.deploy.plugins.modules import vllm_sweep

    with patch_module_args(args), pytest.raises(SystemExit):
        vllm_sweep.main()
    return json.loads(capsys.readouterr().out)


def test_module_reports_a_dead_server_without_blaming_the_log(server, tmp_path, capsys):
    srv = server("die-reset", 2048)
    path = str(tmp_path / "log.jsonl")
    out = run_module({"base_url": srv.base_url, "model": MODEL, "levels": [1],
                      "request_log_path": path}, capsys)
    assert out["failed"] is True
    assert "request_log_path" not in out["msg"]
    assert "stopped answering during the vocabulary probe" in out["msg"]
    assert "vocab_size" in out["msg"]


def test_module_names_other_os_errors_by_type(tmp_path, capsys, monkeypatch):
    from ansible_collections.vllm_ops.deploy.plugins.modules import vllm_sweep

    def boom(params, request_log_path=None):
        raise ConnectionResetError(104, "Connection reset by peer")
    monkeypatch.setattr(vllm_sweep, "run_sweep", boom)
    out = run_module({"base_url": "http://127.0.0.1:1", "model": MODEL, "levels": [1],
                      "request_log_path": str(tmp_path / "log.jsonl")}, capsys)
    assert out["failed"] is True
    assert out["msg"] == "sweep failed: ConnectionResetError: [Errno 104] Connection reset by peer"


def test_module_reports_an_unwritable_log_as_request_log_path(server, tmp_path, capsys):
    srv = server("400", 2048)
    path = str(tmp_path / "missing-dir" / "log.jsonl")
    out = run_module({"base_url": srv.base_url, "model": MODEL, "levels": [1],
                      "request_log_path": path}, capsys)
    assert out["failed"] is True
    assert out["msg"].startswith("request_log_path %s: " % path)


# --- the client's event loop ------------------------------------------------------------------
def test_loop_factory_choices(monkeypatch):
    import types
    from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.vllm_sweep import loop_factory
    monkeypatch.setitem(sys.modules, "uvloop", None)  # not importable
    assert loop_factory("asyncio") is None
    assert loop_factory("auto") is None
    with pytest.raises(SweepError, match="event_loop=uvloop but uvloop is not importable"):
        loop_factory("uvloop")
    fake = types.ModuleType("uvloop")
    fake.new_event_loop = asyncio.new_event_loop
    monkeypatch.setitem(sys.modules, "uvloop", fake)
    assert loop_factory("auto") is fake.new_event_loop
    assert loop_factory("uvloop") is fake.new_event_loop
    assert loop_factory("asyncio") is None


def test_run_sweep_refuses_an_unknown_loop_before_sending_anything():
    with pytest.raises(SweepError, match="event_loop must be auto, asyncio or uvloop, got 'trio'"):
        run_sweep(params("http://127.0.0.1:9", event_loop="trio"))
