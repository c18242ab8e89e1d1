"""Jinja filters that render values for systemd unit files and environment files.

systemd does not run ExecStart= through a shell: it splits the line itself, honouring
double quotes and C-style escapes, and expands `$VAR`, `${VAR}` and `%` specifiers. To
pass each argument through unchanged, every argument is double-quoted, with backslash,
double quote, `$` and `%` escaped (`$$` and `%%` are systemd's own escapes).
"""
from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.vllm_ops.deploy.plugins.module_utils.service.secrets import secret_names


def _check(value, what):
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise AnsibleFilterError("%s: expected a string or number, got %r" % (what, value))
    text = str(value)
    if "\n" in text or "\r" in text or "\0" in text:
        raise AnsibleFilterError("%s: newlines and NUL bytes cannot be passed: %r"
                                 % (what, text))
    return text


def systemd_quote(value):
    """Quote one argument for ExecStart=."""
    text = _check(value, "systemd_quote")
    text = text.replace("\\", "\\\\").replace('"', '\\"')
    text = text.replace("$", "$$").replace("%", "%%")
    return '"%s"' % text


def systemd_exec_args(argv):
    """Render an argument list as an ExecStart= command line."""
    if not isinstance(argv, (list, tuple)) or not argv:
        raise AnsibleFilterError("systemd_exec_args: expected a non-empty list, got %r" % (argv,))
    return " ".join(systemd_quote(a) for a in argv)


def systemd_env_line(key, value):
    """One KEY="VALUE" line of an EnvironmentFile= (no variable expansion happens there)."""
    key = _check(key, "systemd_env_line key")
    if not key.replace("_", "a").isalnum() or key[0].isdigit():
        raise AnsibleFilterError("systemd_env_line: invalid variable name %r" % key)
    text = _check(value, "systemd_env_line value for " + key)
    text = text.replace("\\", "\\\\").replace('"', '\\"')
    return '%s="%s"' % (key, text)


class FilterModule(object):
    def filters(self):
        return {
            "systemd_quote": systemd_quote,
            "systemd_exec_args": systemd_exec_args,
            "systemd_env_line": systemd_env_line,
            "secret_names": secret_names,
        }
