"""Unit tests for plugins/module_utils/service/vllm_ready.py against a real local HTTP server that
behaves like vLLM's OpenAI server (loading = connection refused, API key, usage counts)."""
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ansible_collections.vllm_ops.deploy.plugins.module_utils.service.vllm_ready import (
    EndpointError, LoadTimeout, completion_check, health, served_models, wait_ready)


class FakeVLLM(BaseHTTPRequestHandler):
    api_key = None
    models = ["tiny"]
    short_by = 0
    health_status = 200

    def log_message(self, *a):
        pass

    def _send(self, status, doc):
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _authorised(self):
        return self.api_key is None or \
            self.headers.get("Authorization") == "Bearer " + self.api_key

    def do_GET(self):
        if self.path == "/health":
            return self._send(self.health_status, {})
        if not self._authorised():
            return self._send(401, {"error": "Unauthorized"})
        if self.path == "/v1/models":
            return self._send(200, {"data": [{"id": m} for m in self.models]})
        self._send(404, {})

    def do_POST(self):
        if not self._authorised():
            return self._send(401, {"error": "Unauthorized"})
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        n = req["max_tokens"] - self.short_by
        self._send(200, {"choices": [{"text": "x" * n}],
                         "usage": {"completion_tokens": n, "prompt_tokens": 4}})


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture
def server():
    handler = type("H", (FakeVLLM,), {})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield "http://127.0.0.1:%d" % srv.server_address[1], handler
    srv.shutdown()
    srv.server_close()


def test_ready_server(server):
    url, _h = server
    out = wait_ready(url, "tiny", 5, tokens=3)
    assert out["models"] == ["tiny"] and out["completion_tokens"] == 3


def test_api_key_401_without_and_ok_with(server):
    url, h = server
    h.api_key = "k-123"
    with pytest.raises(EndpointError, match="401"):
        served_models(url)
    assert served_models(url, api_key="k-123") == ["tiny"]
    assert completion_check(url, "tiny", 2, api_key="k-123")["usage"]["completion_tokens"] == 2
    with pytest.raises(EndpointError, match="401"):
        completion_check(url, "tiny", 2, api_key="wrong")


def test_model_not_served_and_short_completion(server):
    url, h = server
    with pytest.raises(EndpointError, match="'other' is not served; served names: tiny"):
        wait_ready(url, "other", 5)
    h.short_by = 1
    with pytest.raises(EndpointError, match="returned 7 tokens, 8 were requested"):
        wait_ready(url, "tiny", 5)


def test_refused_connection_is_loading_and_times_out_with_progress():
    url = "http://127.0.0.1:%d" % free_port()
    assert health(url) is None
    seen = []
    t = [0.0]

    def clock():
        return t[0]

    def sleep(s):
        t[0] += s

    with pytest.raises(LoadTimeout) as e:
        wait_ready(url, "tiny", 10, poll_s=2, clock=clock, sleep=sleep,
                   on_wait=lambda el, last: seen.append((el, last)))
    assert e.value.last is None and e.value.elapsed >= 10
    assert "connection refused" in str(e.value)
    assert [s[0] for s in seen] == [0, 2, 4, 6, 8]


def test_on_wait_can_stop_the_wait(server):
    url, h = server
    h.health_status = 503

    def crashed(elapsed, last):
        raise EndpointError("unit failed (last /health %s)" % last)

    with pytest.raises(EndpointError, match="last /health 503"):
        wait_ready(url, "tiny", 5, on_wait=crashed)
