"""hub_check: the validation play's read-only Hub check (hf_model_info).

The Hub answers are served by a stdlib HTTP server on loopback that answers the two calls the
check makes the way huggingface.co documents them (200 with the commit sha; 404 with
X-Error-Code RevisionNotFound; 401 with X-Error-Code RepoNotFound; 401 GatedRepo). It stands
in for huggingface.co, which is not reachable here; the real Hub-compatible server (olah) is
exercised end to end by tests/integration/test_bad_input.py, which also shows olah's own
answers (a missing revision as RepoNotFound). The weights "already present" are written with
hf_weights.build_manifest, the function the download uses.
"""
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ansible_collections.vllm_ops.deploy.plugins.module_utils.weights.hf_weights import build_manifest
from ansible_collections.vllm_ops.deploy.plugins.module_utils.weights import hub_check as hc

SHA = "a" * 40
CONFIG = {"architectures": ["LlamaForCausalLM"], "max_position_embeddings": 2048,
          "quantization_config": {"quant_method": "fp8", "kv_cache_scheme": {"num_bits": 8}}}
ROLE_NAMES = {"repo_id": "model_weights_repo_id", "revision": "model_weights_revision",
              "overrides": "model_weights_overrides", "token": "model_weights_hf_token",
              "endpoint": "model_weights_endpoint", "remote": "model_weights_validate_remote",
              "disk_margin_bytes": "model_weights_disk_margin_bytes"}


class Hub(BaseHTTPRequestHandler):
    seen = []
    redirect_to = None

    def log_message(self, *args):
        pass

    def _send(self, status, body, headers=()):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        Hub.seen.append((self.path, self.headers.get("Authorization")))
        p = self.path
        if p.startswith("/api/models/org/gated/"):
            return self._send(200, {"id": "org/gated", "sha": SHA, "gated": "manual"})
        if p.startswith("/org/gated/resolve/"):
            return self._send(401, {"error": "gated"}, [("X-Error-Code", "GatedRepo")])
        if p.startswith("/api/models/org/tiny/revision/"):
            rev = p.rsplit("/", 1)[1]
            if rev in ("main", "v1", SHA):
                return self._send(200, {"id": "org/tiny", "sha": SHA})
            return self._send(404, {"error": "Invalid rev id: %s" % rev},
                              [("X-Error-Code", "RevisionNotFound")])
        if p == "/org/tiny/resolve/%s/config.json" % SHA:
            if Hub.redirect_to:
                return self._send(302, b"", [("Location", Hub.redirect_to)])
            return self._send(200, CONFIG)
        if p.startswith("/org/tiny/resolve/"):
            return self._send(404, {"error": "Entry not found"}, [("X-Error-Code", "EntryNotFound")])
        return self._send(401, {"error": "Repository not found"}, [("X-Error-Code", "RepoNotFound")])


@pytest.fixture
def hub():
    Hub.seen, Hub.redirect_to = [], None
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield "http://127.0.0.1:%d" % server.server_address[1]
    server.shutdown()
    server.server_close()


def params(tmp_path, endpoint, **kw):
    p = dict(repo_id="org/tiny", revision="main", endpoint=endpoint, token=None,
             local_dir=str(tmp_path / "model"), manifest=".hf-manifest.json", allow_patterns=None,
             ignore_patterns=None, overrides=[], remote=True, timeout=5, disk_margin_bytes=0,
             variable_names=ROLE_NAMES)
    p.update(kw)
    return p


def test_urls_follow_the_hub_layout():
    assert hc.revision_url("", "org/m", "refs/pr/1") == \
        "https://huggingface.co/api/models/org/m/revision/refs%2Fpr%2F1"
    assert hc.resolve_url("http://mirror:8080/", "org/m", SHA, "sub dir/config.json") == \
        "http://mirror:8080/org/m/resolve/%s/sub%%20dir/config.json" % SHA


def test_existing_revision_and_override_keys_pass(tmp_path, hub):
    r = hc.check(params(tmp_path, hub, overrides=[
        {"file": "config.json", "delete": "quantization_config.kv_cache_scheme"},
        {"file": "config.json", "set": "max_position_embeddings", "value": 4096}]), host="host h1")
    assert r["sha"] == SHA and r["remote_checked"] and not r["present"]
    assert r["overrides_checked"] == ["config.json"]
    assert r["asked"] == [hub + "/api/models/org/tiny/revision/main",
                          hub + "/org/tiny/resolve/%s/config.json" % SHA]
    assert [path for path, _auth in Hub.seen] == ["/api/models/org/tiny/revision/main",
                                                  "/org/tiny/resolve/%s/config.json" % SHA]


def test_missing_revision_names_the_variable_host_and_endpoint(tmp_path, hub):
    with pytest.raises(hc.HubCheckError) as e:
        hc.check(params(tmp_path, hub, revision="nope"), host="host h1")
    msg = str(e.value)
    assert msg.startswith("model_weights_revision='nope' does not exist in org/tiny on %s" % hub)
    assert "asked from host h1: GET %s/api/models/org/tiny/revision/nope answered HTTP 404 " \
           "RevisionNotFound" % hub in msg


def test_missing_repository_names_the_variable_and_the_token(tmp_path, hub):
    with pytest.raises(hc.HubCheckError) as e:
        hc.check(params(tmp_path, hub, repo_id="org/none", revision="v2"), host="host h1")
    msg = str(e.value)
    assert msg.startswith("model_weights_repo_id='org/none': no such repository on %s" % hub)
    assert "set model_weights_hf_token" in msg
    # the default branch was asked too, to tell a missing repository from a missing revision
    assert [path for path, _a in Hub.seen] == ["/api/models/org/none/revision/v2",
                                               "/api/models/org/none/revision/main"]


def test_override_key_missing_at_the_revision_names_its_index(tmp_path, hub):
    with pytest.raises(hc.HubCheckError) as e:
        hc.check(params(tmp_path, hub, overrides=[
            {"file": "config.json", "delete": "max_position_embeddings"},
            {"file": "config.json", "delete": "quantization_config.kv_scheme"},
            {"file": "hf_quant_config.json", "delete": "quantization.kv_cache_quant_algo"}]))
    msg = str(e.value)
    assert ("model_weights_overrides[1] (delete quantization_config.kv_scheme in config.json): "
            "key quantization_config.kv_scheme not found in config.json at org/tiny@%s on %s"
            % (SHA, hub)) in msg
    assert ("model_weights_overrides[2] names hf_quant_config.json, which org/tiny@%s on %s does "
            "not have (HTTP 404 EntryNotFound)" % (SHA, hub)) in msg
    assert "model_weights_overrides[0]" not in msg


def test_token_only_in_the_header_and_not_across_hosts(tmp_path, hub):
    # A redirect to another host (a CDN) must not carry the token.
    other = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        Hub.redirect_to = "http://localhost:%d/org/tiny/resolve/%s/config.json" % (
            other.server_address[1], SHA)
        with pytest.raises(hc.HubCheckError):  # the CDN stand-in redirects again: gives up
            hc.check(params(tmp_path, hub, token="hf_SECRET", overrides=[
                {"file": "config.json", "delete": "max_position_embeddings"}]))
    finally:
        other.shutdown()
        other.server_close()
    auths = [auth for _p, auth in Hub.seen]
    assert auths[0] == "Bearer hf_SECRET" and auths[1] == "Bearer hf_SECRET"
    assert auths[2] is None  # the request that reached the other host
    assert all("hf_SECRET" not in path for path, _a in Hub.seen)


def test_gated_repository_names_the_token(tmp_path, hub):
    with pytest.raises(hc.HubCheckError) as e:
        hc.check(params(tmp_path, hub, repo_id="org/gated", overrides=[
            {"file": "config.json", "delete": "a"}]))
    assert "the repository is gated: set model_weights_hf_token" in str(e.value)


def test_unreachable_hub_names_the_endpoint_and_the_skip(tmp_path):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends
    with pytest.raises(hc.HubCheckError) as e:
        hc.check(params(tmp_path, "http://127.0.0.1:%d" % port), host="host h1")
    msg = str(e.value)
    assert msg.startswith("host h1: the Hub at http://127.0.0.1:%d did not answer (" % port)
    assert "Fix model_weights_endpoint or the host's proxy, or set " \
           "model_weights_validate_remote: false to skip this check" in msg


def test_remote_false_asks_nothing_and_says_so(tmp_path):
    r = hc.check(params(tmp_path, "http://127.0.0.1:9", remote=False,
                        overrides=[{"file": "config.json", "delete": "a"}]))
    assert not r["remote_checked"] and r["asked"] == []
    assert r["skipped"] == ("model_weights_validate_remote: false: the Hub at http://127.0.0.1:9 "
                            "was not asked whether org/tiny@main exists or has the files "
                            "model_weights_overrides patches")


def _present(tmp_path, overrides_applied=()):
    d = tmp_path / "model"
    d.mkdir()
    raw = json.dumps(CONFIG).encode()
    (d / "config.json").write_bytes(raw)
    (d / "model.safetensors").write_bytes(b"\0" * 100)
    expected = {"config.json": {"size": len(raw), "oid": None, "sha256": None},
                "model.safetensors": {"size": 100, "oid": None, "sha256": "0" * 64}}
    request = {"repo_id": "org/tiny", "revision": "main", "allow_patterns": None,
               "ignore_patterns": None, "overrides": []}
    (d / ".hf-manifest.json").write_text(json.dumps(
        build_manifest(request, SHA, expected, False, list(overrides_applied))))
    return d


def test_weights_present_at_the_revision_make_no_network_call(tmp_path):
    _present(tmp_path)

    class NoNetwork(object):
        def open(self, *a, **kw):
            raise AssertionError("the Hub was asked")

    r = hc.check(params(tmp_path, "http://127.0.0.1:9", overrides=[
        {"file": "config.json", "delete": "quantization_config.kv_cache_scheme"}]),
        opener=NoNetwork())
    assert r["present"] and r["sha"] == SHA and not r["remote_checked"] and r["asked"] == []
    assert r["overrides_checked"] == ["config.json"]
    with pytest.raises(hc.HubCheckError) as e:
        hc.check(params(tmp_path, "http://127.0.0.1:9", overrides=[
            {"file": "config.json", "set": "rope_scaling.factor", "value": 2}]), opener=NoNetwork())
    assert ("model_weights_overrides[0] (set rope_scaling.factor in config.json): key "
            "rope_scaling not found in config.json at org/tiny@%s in %s"
            % (SHA, tmp_path / "model")) in str(e.value)


def test_an_earlier_override_is_checked_against_the_original(tmp_path):
    d = _present(tmp_path)
    # an earlier run deleted the key: the pristine file is config.json.orig
    os.rename(str(d / "config.json"), str(d / "config.json.orig"))
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    docs, missing = hc.local_override_documents(str(d), ["config.json", "nope.json"])
    assert docs["config.json"] == CONFIG and missing == ["nope.json"]


def test_a_changed_revision_or_pattern_is_not_present(tmp_path):
    _present(tmp_path)
    base = {"repo_id": "org/tiny", "revision": "main", "allow_patterns": None,
            "ignore_patterns": None}
    assert hc.local_state(str(tmp_path / "model"), ".hf-manifest.json", base)[0]
    assert hc.local_state(str(tmp_path / "model"), ".hf-manifest.json",
                          dict(base, revision="v1"))[:2] == (False, "revision changed")
    assert hc.local_state(str(tmp_path / "model"), ".hf-manifest.json",
                          dict(base, allow_patterns=["*.json"]))[:2] == \
        (False, "allow_patterns changed")


def test_disk_margin_never_met_is_refused_or_a_warning_when_present():
    err, warn = hc.disk_verdict(10 ** 12, 5 * 10 ** 11, 10 ** 15, False, "/srv/m", "host h", "mv")
    assert err == ("mv=1000000000000000 (1000.0 TB) is larger than the filesystem of /srv/m on "
                   "host h (1.0 TB in all, 500.0 GB free): no download can ever keep that much "
                   "free: lower mv") and warn is None
    err, warn = hc.disk_verdict(10 ** 12, 5 * 10 ** 11, 10 ** 15, True, "/srv/m", "host h", "mv")
    assert err is None and "no download runs now, but a new revision would be refused: lower mv" in warn
    err, warn = hc.disk_verdict(10 ** 12, 5 * 10 ** 11, 6 * 10 ** 11, False, "/srv/m", "host h", "mv")
    assert err.startswith("mv=600000000000 (600.0 GB) alone is more than the filesystem") and warn is None
    assert hc.disk_verdict(10 ** 12, 5 * 10 ** 11, 6 * 10 ** 11, True, "/srv/m", "h", "mv") == (None, None)
    assert hc.disk_verdict(10 ** 12, 5 * 10 ** 11, 10 ** 9, False, "/srv/m", "h", "mv") == (None, None)


def test_unknown_variable_names_are_refused():
    with pytest.raises(hc.HubCheckError, match="variable_names: unknown keys bogus"):
        hc.variable_names({"bogus": "x"})


def test_an_endpoint_that_is_no_hub_is_named(tmp_path):
    class NotAHub(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            self.send_response(404)
            self.send_header("Content-Length", "9")
            self.end_headers()
            self.wfile.write(b"not found")

    server = ThreadingHTTPServer(("127.0.0.1", 0), NotAHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(hc.HubCheckError) as e:
            hc.check(params(tmp_path, "http://127.0.0.1:%d" % server.server_address[1]))
    finally:
        server.shutdown()
        server.server_close()
    assert "check that model_weights_endpoint is a Hub endpoint" in str(e.value)
