"""The vLLM instances a host runs now, read from the files the vllm_service role wrote.

Every unit the role writes is ``/etc/systemd/system/vllm-<name>.service`` and carries the line
``# vLLM OpenAI-compatible server, instance <name>`` (its template's second line); its
``EnvironmentFile=`` is ``<config_dir>/<name>.env``. Reading them back gives what each
instance on the host runs (argv, environment, port, model directory, GPU set), so a change can
be described, ports and GPU sets checked against instances about to be removed, and instances
no longer declared in the inventory found. Units without the marker are not the role's and are
never reported (so never removed).

Secrets never leave here: values of environment variables whose name looks secret
(``VLLM_API_KEY``, ``HF_TOKEN``, anything with token/api_key/secret/password) are replaced by
``<secret>``. Pure Python apart from ``read_instances`` (files) and the module's systemctl
calls; unit-tested directly.
"""
from __future__ import annotations

import glob
import os
import re

from ansible_collections.vllm_ops.deploy.plugins.module_utils.service.secrets import is_secret_name

MARKER = "# vLLM OpenAI-compatible server, instance "
UNIT_RE = re.compile(r"^vllm-([a-z0-9][a-z0-9_-]{0,39})\.service$")
REDACTED = "<secret>"


def _unescape_systemd(token):
    return token.replace("$$", "$").replace("%%", "%")


def split_exec(line):
    """Split an ExecStart= value the way systemd does for what systemd_exec_args writes:
    double-quoted words with backslash escapes ($$ and %% are systemd's own), or bare words."""
    out, i, n = [], 0, len(line)
    while i < n:
        while i < n and line[i] in " \t":
            i += 1
        if i >= n:
            break
        word = []
        if line[i] == '"':
            i += 1
            while i < n and line[i] != '"':
                if line[i] == "\\" and i + 1 < n:
                    i += 1
                word.append(line[i])
                i += 1
            i += 1  # the closing quote
        else:
            while i < n and line[i] not in " \t":
                word.append(line[i])
                i += 1
        out.append(_unescape_systemd("".join(word)))
    return out


def parse_env(text):
    """KEY="VALUE" lines of an EnvironmentFile= (what systemd_env_line writes) -> dict."""
    env = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        if len(value) >= 2 and value[0] == '"' and value[-1] == '"':
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        env[key.strip()] = value
    return env


def redact(env):
    return dict((k, REDACTED if is_secret_name(k) else v) for k, v in env.items())


def parse_unit(text):
    """{'managed', 'name', 'argv', 'env_file'} of a unit file's text."""
    name, argv, env_file = None, [], None
    for line in text.splitlines():
        if line.startswith(MARKER):
            name = line[len(MARKER):].strip()
        elif line.startswith("ExecStart="):
            argv = split_exec(line[len("ExecStart="):])
        elif line.startswith("EnvironmentFile="):
            env_file = line[len("EnvironmentFile="):].strip().lstrip("-")
    return {"managed": name is not None, "name": name, "argv": argv, "env_file": env_file}


def _flag(argv, flag):
    for pos, arg in enumerate(argv):
        if arg == flag and pos + 1 < len(argv):
            return argv[pos + 1]
        if arg.startswith(flag + "="):
            return arg[len(flag) + 1:]
    return None


def gpu_set(value):
    """'0,1' -> [0, 1]; '' / None / not a list of indices -> None (every GPU, or unknown)."""
    if not value:
        return None
    parts = [p.strip() for p in str(value).split(",")]
    if not all(p.isdigit() for p in parts):
        return None
    return [int(p) for p in parts]


def instance_from_files(unit_name, unit_text, env_text):
    """What one instance on the host runs, from its unit and environment file (None when the
    unit is not the role's)."""
    parsed = parse_unit(unit_text)
    match = UNIT_RE.match(unit_name)
    if not parsed["managed"] or not match:
        return None
    env = parse_env(env_text or "")
    port = _flag(parsed["argv"], "--port")
    return {
        "name": match.group(1),
        "unit": unit_name,
        "argv": parsed["argv"],
        "env_file": parsed["env_file"],
        "env": redact(env),
        "port": int(port) if port and port.isdigit() else None,
        "model_dir": _flag(parsed["argv"], "--model"),
        "served_model_name": _flag(parsed["argv"], "--served-model-name"),
        "gpus": gpu_set(env.get("CUDA_VISIBLE_DEVICES")),
    }


def read_instances(unit_dir="/etc/systemd/system"):
    """{name: instance} for every unit of the role in unit_dir (see instance_from_files)."""
    found = {}
    for path in sorted(glob.glob(os.path.join(unit_dir, "vllm-*.service"))):
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        try:
            with open(path) as f:
                unit_text = f.read()
        except OSError:
            continue
        env_file = parse_unit(unit_text)["env_file"]
        env_text = ""
        if env_file:
            try:
                with open(env_file) as f:
                    env_text = f.read()
            except OSError:
                env_text = ""
        inst = instance_from_files(os.path.basename(path), unit_text, env_text)
        if inst:
            inst["unit_path"] = path
            found[inst["name"]] = inst
    return found


def parse_show(text):
    """`systemctl show -p ...` output -> dict."""
    out = {}
    for line in text.splitlines():
        if "=" in line:
            key, value = line.split("=", 1)
            out[key] = value
    return out
