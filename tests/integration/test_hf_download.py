"""Integration tests of the hf_model_download module against a real Hub-compatible server.

The server is olah (PyPI), started by tests/harness/hubserver.py on a free loopback port and serving
a git repository made here from a small model directory (a few small files plus three 4 MB
dummy shards stored as Git LFS objects). The client under test is the real huggingface_hub,
run by the module the way Ansible runs it (`ansible localhost -m hf_model_download` with the
downloader venv as interpreter).

Two small helpers live in this file, and neither answers Hub API calls itself:
* ``ThrottleRelay``: a TCP relay that slows server->client bytes so a download can be killed
  mid-way (olah serves loopback too fast for that).
* ``GatedProxy``: olah has no gated repositories offline (every local mirror is public), so
  this stand-in for the Hub's gate forwards everything to olah but answers
  ``/resolve/`` requests without the right ``Authorization: Bearer`` header with HTTP 401 and
  ``X-Error-Code: GatedRepo``, as huggingface.co does for a gated repo.

Environment: HF_VENV (default /tmp/hf-venv) must hold huggingface_hub and olah==0.5.4;
ANSIBLE_BIN (default: ansible next to the test interpreter).
"""
import hashlib
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ansible_collections.vllm_ops.deploy.plugins.module_utils.weights.hf_weights import file_complete

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HF_VENV = os.environ.get("HF_VENV", "/tmp/hf-venv")
HF_PYTHON = os.path.join(HF_VENV, "bin", "python")
ANSIBLE = os.environ.get("ANSIBLE_BIN", os.path.join(os.path.dirname(sys.executable), "ansible"))
REPO = "org/tiny"
SHARD = 4 * 1000 * 1000
SHARDS = ["model-%05d-of-00003.safetensors" % i for i in (1, 2, 3)]
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
          "quantization_config": {"quant_method": "fp8",
                                  "kv_cache_scheme": {"type": "float", "num_bits": 8}}}
QUANT = {"quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}
KV_OVERRIDES = [{"file": "config.json", "delete": "quantization_config.kv_cache_scheme"},
                {"file": "hf_quant_config.json", "delete": "quantization.kv_cache_quant_algo"}]

if not os.path.exists(HF_PYTHON) or not os.path.exists(os.path.join(HF_VENV, "bin", "olah-cli")):
    pytest.skip("needs %s with huggingface_hub and olah==0.5.4" % HF_VENV,
                allow_module_level=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------ server fixtures

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("model")
    (d / "config.json").write_text(json.dumps(CONFIG, indent=2))
    (d / "hf_quant_config.json").write_text(json.dumps(QUANT, indent=2))
    (d / "tokenizer_config.json").write_text('{"model_max_length": 2048}')
    (d / "README.md").write_text("# tiny test model\n")
    for i, name in enumerate(SHARDS):
        (d / name).write_bytes(os.urandom(SHARD - i))  # distinct sizes
    (d / "original").mkdir()
    (d / "original" / "params.json").write_text("{}")
    return d


@pytest.fixture(scope="module")
def hub(model_dir, tmp_path_factory):
    state = tmp_path_factory.mktemp("hubstate")
    port = free_port()
    out = subprocess.run(
        [HF_PYTHON, os.path.join(ROOT, "tests", "harness", "hubserver.py"), "start", "--model-dir",
         str(model_dir), "--repo", REPO, "--port", str(port), "--state-dir", str(state),
         "--tag", "v1"], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    info["state"] = str(state)
    yield info
    subprocess.run([HF_PYTHON, os.path.join(ROOT, "tests", "harness", "hubserver.py"), "stop",
                    "--state-dir", str(state)], check=True, timeout=60)


def requests_seen(hub, pattern=r'"(GET|HEAD) '):
    """Lines of olah's access log matching pattern."""
    with open(hub["log"]) as f:
        return [line for line in f if re.search(pattern, line)]


def resolve_gets(hub, path):
    return requests_seen(hub, r'"GET /%s/resolve/[0-9a-f]{40}/%s ' % (REPO, re.escape(path)))


# ------------------------------------------------------------------ running the module

def run_module(args, check=False, env=None, background=False, diff=False):
    """`ansible localhost -m hf_model_download` with the downloader venv as interpreter."""
    cmd = [ANSIBLE, "localhost", "-i", "localhost,", "-c", "local", "-m",
           "vllm_ops.deploy.hf_model_download",
           "-e", "ansible_python_interpreter=%s" % HF_PYTHON, "-a", json.dumps(args)]
    if check:
        cmd.append("--check")
    if diff:
        cmd.append("--diff")
    e = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"),
             ANSIBLE_STDOUT_CALLBACK="json", ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
             ANSIBLE_LOCALHOST_WARNING="0")
    e.update(env or {})
    if background:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=e,
                                cwd=ROOT)
    out = subprocess.run(cmd, capture_output=True, text=True, env=e, cwd=ROOT, timeout=300,
                         check=False)
    return parse_result(out.stdout, out.stderr)


def parse_result(stdout, stderr=""):
    try:
        data = json.loads(stdout)
    except ValueError:
        raise AssertionError("no JSON from ansible: %s\n%s" % (stdout[-2000:], stderr[-2000:]))
    return data["plays"][0]["tasks"][0]["hosts"]["localhost"]


def base_args(hub, local_dir, **kw):
    args = {"repo_id": REPO, "revision": hub["sha"], "local_dir": str(local_dir),
            "endpoint": hub["endpoint"], "disk_margin_bytes": 0, "progress_interval": 0.1}
    args.update(kw)
    return args


def sha256(path):
    with open(str(path), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


# ------------------------------------------------------------------ tests

def test_pinned_download_verified_with_hashes(hub, model_dir, tmp_path):
    dest = tmp_path / "w"
    res = run_module(base_args(hub, dest, allow_patterns=["*.json", "*.safetensors"],
                               ignore_patterns=["original/"], verify_hashes=True))
    assert res.get("failed") is not True, res.get("msg")
    assert res["changed"] and res["downloaded"] and res["verified"] and res["hashes_verified"]
    assert res["sha"] == hub["sha"]
    assert sorted(res["files"]) == ["config.json", "hf_quant_config.json"] + SHARDS + \
        ["tokenizer_config.json"]
    assert res["bytes"] == sum(os.path.getsize(str(model_dir / f)) for f in res["files"])
    for f in res["files"]:
        assert sha256(dest / f) == sha256(model_dir / f), f
    assert not (dest / "README.md").exists() and not (dest / "original").exists()
    manifest = json.loads((dest / ".hf-manifest.json").read_text())
    assert manifest["sha"] == hub["sha"] and manifest["bytes"] == res["bytes"]
    assert manifest["lfs_sha256"][SHARDS[0]] == sha256(model_dir / SHARDS[0])
    lines = [json.loads(x) for x in (dest / ".download-progress.json").read_text().splitlines()]
    assert lines[0]["state"] == "downloading" and lines[-1]["state"] == "done"
    assert lines[-1]["bytes_done"] == lines[-1]["bytes_total"] == res["bytes"]


def test_branch_and_tag_resolve_to_sha_then_noop_without_network(hub, tmp_path):
    dest = tmp_path / "w"
    res = run_module(base_args(hub, dest, revision="main", allow_patterns=["*.json"]))
    assert res.get("failed") is not True, res.get("msg")
    assert res["sha"] == hub["sha"] and res["revision"] == "main"
    before = len(requests_seen(hub, r'"(GET|HEAD) '))
    again = run_module(base_args(hub, dest, revision="main", allow_patterns=["*.json"]))
    assert again["changed"] is False and again["downloaded"] is False
    assert again["sha"] == hub["sha"] and again["reason"].startswith("manifest matches")
    assert len(requests_seen(hub, r'"(GET|HEAD) ')) == before  # not a single request
    tag = run_module(base_args(hub, tmp_path / "t", revision="v1", allow_patterns=["*.json"]))
    assert tag["sha"] == hub["sha"]


def test_verify_noop_and_repair(hub, tmp_path):
    dest = tmp_path / "w"
    args = base_args(hub, dest, allow_patterns=["*.safetensors"])
    assert run_module(args)["downloaded"]
    gets = len(resolve_gets(hub, SHARDS[1]))
    mtimes = dict((f, os.stat(str(dest / f)).st_mtime_ns) for f in SHARDS)
    res = run_module(args)
    assert res["changed"] is False and res["downloaded"] is False
    assert dict((f, os.stat(str(dest / f)).st_mtime_ns) for f in SHARDS) == mtimes
    # damage one shard: the manifest no longer matches, only that file is fetched again
    with open(str(dest / SHARDS[1]), "r+b") as f:
        f.truncate(1000)
    fixed = run_module(args)
    assert fixed["changed"] and fixed["downloaded"] and fixed["verified"], fixed.get("msg", fixed)
    assert fixed["bytes_needed"] == SHARD - 1
    assert os.path.getsize(str(dest / SHARDS[1])) == SHARD - 1
    assert len(resolve_gets(hub, SHARDS[1])) == gets + 1
    assert os.stat(str(dest / SHARDS[0])).st_mtime_ns == mtimes[SHARDS[0]]
    # a folder that already holds the files (e.g. shared storage) is verified, not downloaded
    os.remove(str(dest / ".hf-manifest.json"))
    res = run_module(args)
    assert res["downloaded"] is False and res["verified"] and res["bytes_needed"] == 0
    assert len(resolve_gets(hub, SHARDS[1])) == gets + 1


def flip_byte(path, offset=None):
    """Flip one byte (the middle one by default) in place: size and mtime unchanged, as bit rot
    or a bad copy leaves a file."""
    st = os.stat(str(path))
    offset = st.st_size // 2 if offset is None else offset
    with open(str(path), "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))
    os.utime(str(path), ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.path.getsize(str(path)) == st.st_size


def test_same_size_damage_detected_invalidates_and_is_repaired(hub, model_dir, tmp_path):
    """Same-size damage against the real hub: a flipped byte passes the cheap check; a hash check finds
    it, a failed check marks the manifest invalid so the next default run hashes the file again
    and repairs it in the same run (that file alone fetched, byte-identical again); a small
    file is checked by its git blob sha1."""
    dest = tmp_path / "w"
    args = base_args(hub, dest, allow_patterns=["*.json", "*.safetensors"])
    first = run_module(args)
    assert first.get("failed") is not True, first.get("msg")
    assert first["hashes_verified"] and first["hash"]["files"] == len(first["files"])
    assert first["hash"]["bytes"] == first["bytes"] and first["hash"]["mb_per_s"] > 0
    shard = SHARDS[1]
    flip_byte(dest / shard)
    before = len(requests_seen(hub))
    # the cheap default check (sizes, commit, no .incomplete) cannot see it, and says so by
    # hashing nothing
    cheap = run_module(args)
    assert cheap["changed"] is False and cheap["verified"] and cheap["hash"] is None
    assert len(requests_seen(hub)) == before
    # hashing finds it; with on_damage=fail nothing is fetched and the manifest turns invalid
    failed = run_module(dict(args, verify_hashes=True, on_damage="fail"))
    assert failed["failed"] and failed["manifest_invalidated"], failed
    assert ("%s: sha256 %s, expected %s" % (shard, hashlib.sha256(
        (dest / shard).read_bytes()).hexdigest(), sha256(model_dir / shard))) in failed["msg"]
    manifest = json.loads((dest / ".hf-manifest.json").read_text())
    assert list(manifest["invalid"]["files"]) == [shard] and not manifest["hashes_verified"]
    assert len(requests_seen(hub)) == before
    gets = dict((f, len(resolve_gets(hub, f))) for f in SHARDS)
    # the next default run does not trust the manifest: it hashes the flagged file and repairs it
    fixed = run_module(args)
    assert fixed.get("failed") is not True, fixed.get("msg")
    assert fixed["changed"] and fixed["verified"] and fixed["hashes_verified"]
    assert fixed["repaired"] == [shard] and list(fixed["damaged"]) == [shard]
    assert fixed["bytes_fetched"] == os.path.getsize(str(model_dir / shard))
    assert sha256(dest / shard) == sha256(model_dir / shard)
    # that file alone fetched again
    assert dict((f, len(resolve_gets(hub, f))) for f in SHARDS) == dict(gets, **{shard: gets[shard] + 1})
    manifest = json.loads((dest / ".hf-manifest.json").read_text())
    assert manifest["invalid"] is None and manifest["hashes_verified"]
    # a shard and a small file damaged; verify_hashes repairs both in one run (git blob sha1)
    flip_byte(dest / SHARDS[0])
    flip_byte(dest / "tokenizer_config.json", offset=3)
    both = run_module(dict(args, verify_hashes=True))
    assert both.get("failed") is not True, both.get("msg")
    assert both["repaired"] == sorted([SHARDS[0], "tokenizer_config.json"])
    assert "git blob sha1" in both["damaged"]["tokenizer_config.json"]
    assert both["bytes_fetched"] == os.path.getsize(str(model_dir / SHARDS[0])) + \
        os.path.getsize(str(model_dir / "tokenizer_config.json"))
    for f in both["files"]:
        assert sha256(dest / f) == sha256(model_dir / f), f
    # a check that finds nothing changes nothing
    clean = run_module(dict(args, verify_hashes=True))
    assert clean["changed"] is False and clean["hash"]["files"] == len(clean["files"])
    assert clean["repaired"] == [] and clean["bytes_fetched"] == 0


def test_copy_checked_against_its_source_manifest(hub, tmp_path):
    """A copy (fan-out, shared storage) checked offline against the source's manifest: same-size
    damage is reported (on_damage=report) for the caller to copy again, and the copy's own
    manifest is invalid until a check passes."""
    src = tmp_path / "src"
    assert run_module(base_args(hub, src, allow_patterns=["*.safetensors"]))["downloaded"]
    copy = tmp_path / "copy"
    shutil.copytree(str(src), str(copy))
    os.remove(str(copy / ".hf-manifest.json"))
    source_manifest = json.loads((src / ".hf-manifest.json").read_text())
    check = {"local_dir": str(copy), "offline": True, "source_manifest": source_manifest,
             "on_damage": "report"}
    flip_byte(copy / SHARDS[2])
    before = len(requests_seen(hub))
    first = run_module(check)  # a first check of a copy hashes every file
    assert first.get("failed") is not True, first.get("msg")
    assert first["verified"] is False and list(first["damaged"]) == [SHARDS[2]]
    assert first["hash"]["files"] == len(SHARDS) and first["manifest_invalidated"]
    assert json.loads((copy / ".hf-manifest.json").read_text())["invalid"]
    shutil.copy2(str(src / SHARDS[2]), str(copy / SHARDS[2]))  # what the role's rsync does
    again = run_module(dict(check, on_damage="fail"))  # the flagged file is hashed again
    assert again.get("failed") is not True, again.get("msg")
    # no full hash pass has passed on this copy yet: every file is hashed again
    assert again["verified"] and again["hash"]["files"] == len(SHARDS) and again["damaged"] == {}
    assert len(requests_seen(hub)) == before


def test_offline_verifies_against_the_manifest_without_network(hub, tmp_path):
    """offline=true (the role's `path` source and fan-out copies): the manifest proves the
    files or the module fails naming why; never a Hub call, never a write."""
    dest = tmp_path / "w"
    args = base_args(hub, dest, allow_patterns=["*.json", "*.safetensors"],
                     overrides=KV_OVERRIDES)
    assert run_module(args)["downloaded"]
    before = len(requests_seen(hub))
    closed = dict(args, endpoint="http://127.0.0.1:9", offline=True)  # nothing listens there
    res = run_module(closed)
    assert res.get("failed") is not True, res.get("msg")
    assert res["changed"] is False and res["verified"] and res["sha"] == hub["sha"]
    # without repo/revision: the manifest's own request, overrides included
    own = {"local_dir": str(dest), "offline": True}
    res = run_module(own)
    assert res.get("failed") is not True, res.get("msg")
    assert res["sha"] == hub["sha"] and res["verified"]
    with open(str(dest / SHARDS[2]), "r+b") as f:
        f.truncate(10)
    res = run_module(own)
    assert res["failed"]
    assert ("offline verification of %s@%s in %s failed: %s missing or resized"
            % (REPO, hub["sha"], dest, SHARDS[2])) in res["msg"], res["msg"]
    res = run_module(dict(closed, revision="v1"))
    assert res["failed"] and "revision changed" in res["msg"]
    assert len(requests_seen(hub)) == before
    assert os.path.getsize(str(dest / SHARDS[2])) == 10
    res = run_module({"local_dir": str(tmp_path / "none"), "offline": True})
    assert res["failed"] and "no readable manifest at %s" % (tmp_path / "none") in res["msg"]


def test_check_mode_reports_plan_without_writing(hub, tmp_path):
    dest = tmp_path / "w"
    res = run_module(base_args(hub, dest), check=True, diff=True)
    assert res.get("failed") is not True, res.get("msg")
    assert res["changed"] and res["would_download"] and res["downloaded"] is False
    assert res["bytes_needed"] == res["bytes"] > 3 * SHARD - 3
    assert res["bytes_free"] > 0
    assert not dest.exists()
    # --diff: nothing there before; after, the pinned commit's files with their sizes
    assert res["diff"]["before"] == {}
    assert res["diff"]["after"]["sha"] == hub["sha"]
    assert res["diff"]["after"]["files"] == res["files"]
    # a real run reports the same after-state as its diff, and no diff without --diff
    done = run_module(base_args(hub, dest), diff=True)
    assert done["changed"] and done["diff"]["after"]["files"] == res["files"]
    other = run_module(base_args(hub, tmp_path / "w2"))
    assert other["changed"] and "diff" not in other


def test_disk_refusal_names_numbers_and_writes_nothing(hub, tmp_path):
    dest = tmp_path / "w"
    res = run_module(base_args(hub, dest, disk_margin_bytes=10 ** 16))
    assert res["failed"]
    msg = res["msg"]
    assert re.search(r"\d+\.\d MB needed \+ 10000\.0 TB margin \(disk_margin_bytes\), "
                     r"[\d.]+ [GT]B free", msg), msg
    assert str(dest) in msg
    assert not dest.exists()


def test_kill_downloader_then_resume_ends_verified(hub, tmp_path):
    # 1 MB/s: the kill lands about 0.5 MB into the second 4 MB shard, and a poll this test makes
    # late on a loaded machine still finds that shard's part file (at 3 MB/s a 2-core machine
    # running two suites' jobs once polled so late that no part file was left to clean)
    relay = ThrottleRelay(int(hub["endpoint"].rsplit(":", 1)[1]), rate=1000 * 1000)
    dest = tmp_path / "w"
    args = base_args(hub, dest, endpoint="http://127.0.0.1:%d" % relay.port, max_workers=1,
                     allow_patterns=["*.safetensors", "*.json"])
    try:
        proc = run_module(args, background=True)
        progress = dest / ".download-progress.json"
        deadline = time.time() + 60
        line = None
        while time.time() < deadline:
            if progress.exists():
                lines = progress.read_text().splitlines()
                line = json.loads(lines[-1]) if lines else None
                if (line and line["bytes_done"] >= SHARD + 500 * 1000
                        and list(dest.rglob("*.incomplete"))):
                    break
            time.sleep(0.05)
        assert line and line["bytes_done"] < line["bytes_total"], line
        os.kill(line["downloader_pid"], signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
        res = parse_result(out.decode(), err.decode())
        assert res["failed"]
        assert "killed by signal 9" in res["msg"] and "re-run to resume" in res["msg"]
        expected = dict((f, {"size": size}) for f, size in res["files"].items())
        assert expected[SHARDS[2]]["size"] == SHARD - 2
        done_before = [f for f in expected if file_complete(str(dest), f, expected[f], hub["sha"])]
        assert SHARDS[0] in done_before and SHARDS[2] not in done_before
        assert not (dest / ".hf-manifest.json").exists()
        gets = dict((f, len(resolve_gets(hub, f))) for f in SHARDS)
        relay.rate = 0  # the resume's connections, through the same relay, unthrottled
        res = run_module(args)
        assert res.get("failed") is not True, res.get("msg")
        assert res["downloaded"] and res["verified"]
        assert res["bytes_needed"] == sum(expected[f]["size"] for f in expected
                                          if f not in done_before)
        assert res["stale_incomplete_removed"] >= 1  # the killed run's part file
        for f in SHARDS:
            assert os.path.getsize(str(dest / f)) == expected[f]["size"]
            # finished files are not fetched again, the others are
            assert len(resolve_gets(hub, f)) == gets[f] + (0 if f in done_before else 1), f
        assert not list((dest / ".cache").rglob("*.incomplete"))
    finally:
        relay.close()


def test_overrides_backup_idempotent_and_recorded(hub, model_dir, tmp_path):
    dest = tmp_path / "w"
    args = base_args(hub, dest, allow_patterns=["*.json"], overrides=KV_OVERRIDES)
    res = run_module(args)
    assert res.get("failed") is not True, res.get("msg")
    assert [o["file"] for o in res["overrides_applied"]] == ["config.json",
                                                             "hf_quant_config.json"]
    assert all(o["changed"] for o in res["overrides_applied"])
    cfg = json.loads((dest / "config.json").read_text())
    assert "kv_cache_scheme" not in cfg["quantization_config"]
    assert cfg["quantization_config"]["quant_method"] == "fp8"
    assert json.loads((dest / "hf_quant_config.json").read_text()) == \
        {"quantization": {"quant_algo": "FP8"}}
    assert (dest / "config.json.orig").read_bytes() == (model_dir / "config.json").read_bytes()
    manifest = json.loads((dest / ".hf-manifest.json").read_text())
    assert manifest["overrides"][0]["path"] == ["quantization_config", "kv_cache_scheme"]
    assert manifest["overrides_applied"][0]["sha256"] == sha256(dest / "config.json")
    # idempotent: second run is a no-op, the backup still holds the original
    again = run_module(args)
    assert again["changed"] is False
    assert (dest / "config.json.orig").read_bytes() == (model_dir / "config.json").read_bytes()
    # someone restores the original config: the override is applied again
    shutil.copyfile(str(model_dir / "config.json"), str(dest / "config.json"))
    res = run_module(args)
    assert res["changed"] and res["downloaded"] is False
    assert "kv_cache_scheme" not in json.loads((dest / "config.json").read_text())[
        "quantization_config"]


def test_override_on_missing_key_fails_before_download(hub, tmp_path):
    dest = tmp_path / "w"
    res = run_module(base_args(hub, dest, overrides=[
        {"file": "config.json", "delete": "quantization_config.kv_cache_scheme"},
        {"file": "hf_quant_config.json", "delete": "quantization.no_such_key"}]))
    assert res["failed"]
    assert res["msg"] == "override: key quantization.no_such_key not found in " \
                         "hf_quant_config.json"
    assert not dest.exists()


@pytest.mark.parametrize("change, fragments", [
    ({"repo_id": "org/missing"}, ["repo org/missing on http", "not found"]),
    ({"revision": "no-such-branch"}, ["org/tiny", "'no-such-branch'"]),
    ({"revision": "f" * 40}, ["revision '%s' not found in repo org/tiny" % ("f" * 40)]),
    ({"allow_patterns": ["*.gguf"]}, ["allow_patterns[0] '*.gguf' matches no file in org/tiny@"]),
    ({"allow_patterns": ["/abs/*"]}, ["allow_patterns[0] '/abs/*' is not a repo-relative"]),
    ({"overrides": [{"file": "config.json"}]}, ["overrides[0] needs exactly one of"]),
    ({"local_dir": "relative/dir"}, ["local_dir must be an absolute path"]),
])
def test_bad_input_errors_name_the_cause(hub, tmp_path, change, fragments):
    dest = tmp_path / "w"
    args = base_args(hub, dest)
    args.update(change)
    res = run_module(args)
    assert res["failed"], res
    for frag in fragments:
        assert frag in res["msg"], res["msg"]
    assert not dest.exists()


def test_gated_repo_needs_token(hub, tmp_path):
    token = "hf_testtoken_" + hashlib.sha1(os.urandom(8)).hexdigest()
    gate = GatedProxy(int(hub["endpoint"].rsplit(":", 1)[1]), token)
    dest = tmp_path / "w"
    args = base_args(hub, dest, endpoint="http://127.0.0.1:%d" % gate.port,
                     allow_patterns=["*.json"])
    try:
        res = run_module(args)
        assert res["failed"]
        assert "repo org/tiny on http://127.0.0.1:%d is gated (HTTP 401) and no token was " \
               "given: set token" % gate.port in res["msg"], res["msg"]
        assert not dest.exists()
        # token from the environment of the ansible run into the module's no_log param
        args["token"] = "{{ lookup('env', 'TEST_HF_TOKEN') }}"
        res = run_module(args, env={"TEST_HF_TOKEN": token})
        assert res.get("failed") is not True, res.get("msg")
        assert res["verified"] and res["downloaded"]
        assert "Bearer %s" % token in gate.auth_seen
        assert token not in json.dumps(res)
        for path in dest.rglob("*"):
            if path.is_file():
                assert token.encode() not in path.read_bytes(), path
    finally:
        gate.close()


def test_second_writer_is_refused_while_locked(hub, tmp_path):
    import fcntl
    dest = tmp_path / "w"
    lock_dir = dest / ".cache" / "huggingface"
    lock_dir.mkdir(parents=True)
    with open(str(lock_dir / "hf_model_download.lock"), "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        res = run_module(base_args(hub, dest, allow_patterns=["*.json"]))
    assert res["failed"]
    assert "another hf_model_download is writing into %s" % dest in res["msg"]
    assert not (dest / "config.json").exists()


# ------------------------------------------------------------------ helpers (not the Hub)

class ThrottleRelay(object):
    """Loopback TCP relay limiting server->client bytes per connection to `rate` B/s."""

    def __init__(self, upstream_port, rate):
        self.upstream = ("127.0.0.1", upstream_port)
        self.rate = rate
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                client, _unused = self.sock.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.upstream)
            threading.Thread(target=self._pump, args=(client, upstream, 0), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, self.rate),
                             daemon=True).start()

    @staticmethod
    def _pump(src, dst, rate):
        try:
            while True:
                data = src.recv(16384)
                if not data:
                    break
                if rate:
                    time.sleep(len(data) / float(rate))
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self.closed = True
        self.sock.close()


class GatedProxy(object):
    """Stand-in for the Hub's gate in front of olah (which has no gated repos offline):
    file requests without `Authorization: Bearer <token>` get 401 + X-Error-Code: GatedRepo,
    like huggingface.co; everything else is forwarded to olah unchanged."""

    def __init__(self, upstream_port, token):
        self.auth_seen = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _handle(self):
                auth = self.headers.get("Authorization", "")
                outer.auth_seen.append(auth)
                if "/resolve/" in self.path and auth != "Bearer %s" % token:
                    body = json.dumps({"error": "Access to model org/tiny is restricted. You "
                                                "must have access to it and be authenticated "
                                                "to access it. Please log in."}).encode()
                    self.send_response(401)
                    self.send_header("X-Error-Code", "GatedRepo")
                    self.send_header("X-Error-Message", "Access to model org/tiny is restricted")
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(body)
                    return
                conn = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=60)
                headers = dict((k, v) for k, v in self.headers.items()
                               if k.lower() not in ("host", "connection"))
                conn.request(self.command, self.path, headers=headers)
                resp = conn.getresponse()
                body = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length",
                                         "date", "server"):
                        self.send_header(k, v)
                length = resp.getheader("Content-Length") if self.command == "HEAD" \
                    else str(len(body))
                self.send_header("Content-Length", length or "0")
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)
                conn.close()

            do_GET = _handle
            do_HEAD = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
