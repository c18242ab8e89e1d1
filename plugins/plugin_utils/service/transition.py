"""How a host goes from the vLLM instances it runs to the ones the inventory declares.

The inventory is the desired state. ``plan`` compares the declared instances (resolved by
vllm_instances.resolve_instances) with what the host runs now (vllm_host_state: the role's
units and environment files) and with what would be written (which declared instances' files
change), and returns what the vllm_service role's transition does, plus every refusal, before
anything is written:

* ``start``: declared instances that (re)start: their unit or environment changes, every one
  when the serving venv changed (``restart_all``), those serving a model directory whose
  weights changed (``restart``), or they are not running;
* ``write``: declared instances whose files are written;
* ``remove``: instances on the host that are no longer declared (stopped, disabled, their unit
  and environment file deleted), unless ``remove_undeclared`` is false: then ``keep`` reports
  them and they keep running;
* ``stop``: instances on the host stopped before the first start, so ports and GPUs are free
  when the new ones start (the old instance frees them first);
* ``restore``: what a rollback puts back (the previous files of ``stop``), and
  ``restore_start``: which of those served before (started again by a rollback);
* ``changes``: one line per instance naming what changes (arguments, environment keys,
  port, model, unit settings, restart reasons);
* ``errors``: a declared port held by another program, by an undeclared instance that is
  kept, or shared with a kept instance; a GPU set shared with a kept instance.

Pure Python, no Ansible, no I/O; unit-tested directly.
"""
from __future__ import annotations

RUNNING = ("active", "activating", "reloading", "deactivating")


def _flags(argv):
    """[(flag, value or None)] of a vLLM argv after the entry point (python -m module)."""
    out, i = [], 0
    rest = list(argv[3:]) if len(argv) > 3 else []
    while i < len(rest):
        arg = rest[i]
        if arg.startswith("--") and "=" in arg:
            flag, value = arg.split("=", 1)
            out.append((flag, value))
            i += 1
        elif arg.startswith("--") and i + 1 < len(rest) and not rest[i + 1].startswith("--"):
            out.append((arg, rest[i + 1]))
            i += 2
        else:
            out.append((arg, None))
            i += 1
    return out


def _show(flag, value):
    return flag if value is None else "%s %s" % (flag, value)


def argv_changes(old, new):
    """Human description of the difference between two vLLM command lines."""
    if list(old) == list(new):
        return []
    out = []
    if old[:1] != new[:1]:
        out.append("interpreter %s -> %s" % (old[0] if old else "?", new[0] if new else "?"))
    o, n = _flags(old), _flags(new)
    od, nd = dict(o), dict(n)
    for flag, value in n:
        if flag not in od:
            out.append("+" + _show(flag, value))
        elif od[flag] != value:
            out.append("%s %s -> %s" % (flag, od[flag], value))
    for flag, value in o:
        if flag not in nd:
            out.append("-" + _show(flag, value))
    if not out:  # same flags, other order or repeated
        out.append("argument order")
    return out


def env_changes(old, new):
    """Keys added, removed or changed between two environments (values of secret keys are
    already redacted on both sides, so they are never shown)."""
    out = []
    for key in sorted(set(old) | set(new)):
        if key not in old:
            out.append("+%s=%s" % (key, new[key]))
        elif key not in new:
            out.append("-%s" % key)
        elif old[key] != new[key]:
            out.append("%s=%s -> %s" % (key, old[key], new[key]))
    return out


def _secret(key, redact):
    return redact({key: "x"}).get(key) != "x"


def _units(names, by_name):
    return set(by_name[n]["unit"] for n in names if n in by_name)


def plan(declared, host, changed, restart_all=None, remove_undeclared=True, listeners=None,
         redact=None, restart=None):
    """See the module docstring.

    declared: resolved instances (name, unit, port, gpus, gpu_required, argv, env, model_dir).
    host: {name: instance on the host} (vllm_host_state.read_instances + systemd state).
    changed: {name: [files that change, e.g. 'unit', 'environment']} of declared instances.
    restart_all: reasons every declared instance restarts ([] or None: none).
    restart: {name: [reasons]} for some declared instances only (new weights in the model
        directory they serve: the instances serving another directory keep running).
    listeners: {port (str or int): [{'pid', 'process', 'unit', 'address'}]}.
    redact: function env -> env with secret values hidden (vllm_host_state.redact).
    """
    host = dict(host or {})
    changed = dict((k, list(v)) for k, v in (changed or {}).items() if v)
    restart_all = [r for r in (restart_all or []) if r]
    restart = dict((k, [r for r in v if r]) for k, v in (restart or {}).items())
    listeners = dict((int(k), v) for k, v in (listeners or {}).items())
    redact = redact or (lambda env: env)
    names = [d["name"] for d in declared]
    by_decl = dict((d["name"], d) for d in declared)
    errors, changes = [], []

    undeclared = [n for n in sorted(host) if n not in by_decl]
    remove = undeclared if remove_undeclared else []
    keep = [] if remove_undeclared else undeclared

    start, new = [], []
    for d in declared:
        name = d["name"]
        on_host = host.get(name)
        reasons = []
        if on_host is None:
            new.append(name)
            reasons.append("new (port %d, model %s)" % (d["port"], d["model_dir"]))
        else:
            if name in changed:
                what = argv_changes(on_host.get("argv") or [], d["argv"])
                # secrets (the API key, the HF token) are added to the file by its template and
                # never shown: a change of one is named "environment settings" below
                old_env = dict((k, v) for k, v in (on_host.get("env") or {}).items()
                               if not _secret(k, redact))
                new_env = dict((k, v) for k, v in dict(d.get("env") or {}).items()
                               if not _secret(k, redact))
                what += ["environment " + c for c in env_changes(old_env, new_env)]
                if not what:
                    what = ["%s settings" % " and ".join(changed[name])]
                reasons.append("; ".join(what))
            reasons.extend(restart_all)
            reasons.extend(r for r in restart.get(name, []) if r not in reasons)
            state = on_host.get("active_state")
            if not reasons and state not in ("active",):
                reasons.append("not running (%s)" % (state or "unknown state"))
        if reasons:
            start.append(name)
            changes.append("instance %s: %s" % (name, "; ".join(reasons)))
    for name in remove:
        changes.append("instance %s: no longer declared: stopped, disabled, its unit and "
                       "environment file removed" % name)
    for name in keep:
        changes.append("instance %s: no longer declared, kept running "
                       "(vllm_service_remove_undeclared: false)" % name)

    write = [n for n in names if n in changed or n in new]
    stop = [n for n in start + remove if n in host]
    restore = list(stop)
    restore_start = [n for n in restore if host[n].get("active_state") in RUNNING]

    # Ports: who holds a declared port now, and may it?
    freed = _units(stop, host)
    for d in declared:
        for entry in listeners.get(int(d["port"]), []):
            unit = entry.get("unit")
            if unit == d["unit"] or unit in freed:
                continue
            owner = [n for n in keep if host[n]["unit"] == unit]
            if owner:
                errors.append("port %d of instance %s is held by the undeclared instance %s "
                              "(kept: vllm_service_remove_undeclared is false); remove it or "
                              "choose another port" % (d["port"], d["name"], owner[0]))
                continue
            if entry.get("pid"):
                who = "%s (pid %s%s)" % (entry.get("process"), entry["pid"],
                                         ", unit %s" % unit if unit else "")
            else:
                who = "a process this host cannot see (another container or namespace)"
            errors.append("port %d of instance %s is in use by another program: %s on %s; "
                          "choose another port or stop that program"
                          % (d["port"], d["name"], who, entry.get("address")))
    # Kept instances keep their ports and GPUs.
    for k in keep:
        kept = host[k]
        for d in declared:
            if kept.get("port") is not None and kept["port"] == d["port"]:
                msg = ("instance %s and the undeclared instance %s (kept: "
                       "vllm_service_remove_undeclared is false) both use port %d"
                       % (d["name"], k, d["port"]))
                if not any(("port %d of instance %s" % (d["port"], d["name"])) in e
                           for e in errors):
                    errors.append(msg)
            if kept.get("gpus") is not None and d.get("gpus") is not None:
                shared = sorted(set(kept["gpus"]) & set(d["gpus"]))
                if shared:
                    errors.append("instance %s (GPUs %s) and the undeclared instance %s "
                                  "(kept: vllm_service_remove_undeclared is false; GPUs %s) "
                                  "share GPU %s"
                                  % (d["name"], ",".join(map(str, d["gpus"])), k,
                                     ",".join(map(str, kept["gpus"])),
                                     ",".join(map(str, shared))))

    return {"start": start, "new": new, "write": write, "remove": remove, "keep": keep,
            "stop": stop, "restore": restore, "restore_start": restore_start,
            "changes": changes, "errors": errors,
            "idle": not (start or remove)}


def downtime(stopped_at, ready, instances, stop):
    """One line per instance that (re)started: how long its endpoint did not serve.

    stopped_at: controller time (epoch s) just before the first stop; ready: {name:
    controller time it answered}; instances: the started names; stop: names that served
    before (their downtime runs from stopped_at)."""
    out = {}
    for name in instances:
        at = ready.get(name)
        if at is None:
            out[name] = None
        elif name in stop:
            out[name] = round(max(0.0, at - stopped_at), 1)
        else:
            out[name] = None  # it did not serve before: no downtime, only time to ready
    return out
