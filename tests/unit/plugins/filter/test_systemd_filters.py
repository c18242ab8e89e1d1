"""Unit tests for plugins/filter/systemd.py (ExecStart= quoting, EnvironmentFile= lines)."""
import shutil
import subprocess

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.vllm_ops.deploy.plugins.filter import systemd as sd


def test_quote_escapes_what_systemd_would_interpret():
    assert sd.systemd_quote("plain") == '"plain"'
    assert sd.systemd_quote('{"cudagraph_mode": "PIECEWISE"}') == \
        '"{\\"cudagraph_mode\\": \\"PIECEWISE\\"}"'
    assert sd.systemd_quote("$HOME %h") == '"$$HOME %%h"'
    assert sd.systemd_quote("a\\b") == '"a\\\\b"'
    assert sd.systemd_quote(8000) == '"8000"'


def test_exec_args_and_refusals():
    assert sd.systemd_exec_args(["/p/python", "-m", "x y"]) == '"/p/python" "-m" "x y"'
    for bad in ([], "str", None):
        with pytest.raises(AnsibleFilterError):
            sd.systemd_exec_args(bad)
    for bad in ("a\nb", "a\0b", True, None, ["x"]):
        with pytest.raises(AnsibleFilterError):
            sd.systemd_quote(bad)


def test_env_line():
    assert sd.systemd_env_line("VLLM_API_KEY", 'k"e\\y$x') == 'VLLM_API_KEY="k\\"e\\\\y$x"'
    for key in ("1A", "A-B", "", "A B"):
        with pytest.raises(AnsibleFilterError):
            sd.systemd_env_line(key, "v")
    with pytest.raises(AnsibleFilterError):
        sd.systemd_env_line("A", "x\ny")


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_quoted_exec_start_verifies(tmp_path):
    """systemd accepts the quoting: an ExecStart with JSON, $, % and spaces verifies clean."""
    stub = tmp_path / "bin"
    stub.write_text("#!/bin/sh\n")
    stub.chmod(0o755)
    unit = tmp_path / "q.service"
    unit.write_text("[Service]\nType=exec\nExecStart=%s\n" % sd.systemd_exec_args(
        [str(stub), "--compilation-config", '{"cudagraph_mode": "PIECEWISE"}', "$HOME",
         "50%", "a b", "back\\slash"]))
    done = subprocess.run(["systemd-analyze", "verify", "--man=no", "--generators=no",
                           str(unit)], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and done.stderr == "", done.stderr
