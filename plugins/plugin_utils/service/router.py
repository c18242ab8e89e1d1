"""The host's front door: vLLM's own router (``vllm-router``) in front of the host's vLLM
instances that serve one model. Controller-side planning for the vllm_router role: which
instances stand behind the router, the router's argument list, and every refusal (each
naming its variable), computed from the resolved instances before anything changes.

Facts about vllm-router 0.1.17 this relies on (checked against the installed wheel):
- ``vllm-router --host H --port P --worker-urls URL... --policy NAME`` serves the OpenAI
  API on one port and routes each request to one worker; ``--prometheus-host/-port`` serve
  its metrics on a separate listener.
- It forwards each client's ``Authorization`` header unchanged and adds none: the API key of
  the instances is enforced for every request that passes through it. Its own ``--api-key``
  is only for its calls to workers in data-parallel-aware mode and is an argv flag, so it is
  never set here (argv is visible in the process list).
- ``POST /remove_worker?url=U`` and ``POST /add_worker?url=U`` take a worker out and put it
  back at run time (``GET /list_workers`` lists them); these answer on the serving port
  without authentication.
- ``kv_aware`` needs KV event sources the role does not configure; ``power_of_two`` needs
  two or more workers.
"""
from __future__ import annotations

POLICIES = ("cache_aware", "round_robin", "random", "power_of_two", "consistent_hash",
            "sticky_least_loaded")
# Flags the role sets itself; vllm_router_args may not set them again.
MANAGED_FLAGS = ("--host", "--port", "--worker-urls", "--policy", "--prometheus-host",
                 "--prometheus-port", "--api-key", "--health-check-interval-secs",
                 "--worker-startup-timeout-secs")
UNIT = "vllm_router.service"


def _int(value):
    if isinstance(value, bool):
        raise ValueError(value)
    return int(str(value).strip())


def _port(value, name, errors):
    try:
        port = _int(value)
    except (TypeError, ValueError):
        errors.append("%s=%r must be a TCP port (1-65535)" % (name, value))
        return None
    if not 1 <= port <= 65535:
        errors.append("%s=%r must be a TCP port (1-65535)" % (name, value))
        return None
    return port


def _positive(value, name, errors):
    try:
        number = _int(value)
    except (TypeError, ValueError):
        number = 0
    if number < 1:
        errors.append("%s=%r must be an integer >= 1 (seconds)" % (name, value))
        return None
    return number


def router_plan(instances, settings):
    """Plan the router of one host.

    instances: the host's resolved vLLM instances (vllm_service's, each with name, port,
    url, unit, served_model_name).
    settings: enabled, host, port, metrics_host, metrics_port, policy, instances (names
    behind the router; [] = every instance), args, health_check_interval_s,
    worker_startup_timeout_s, binary (the vllm-router program), ssh_port, gate_enabled, gate_port.

    Returns {'enabled', 'errors', 'workers' [{name, url, unit}], 'model', 'url', 'argv',
    'metrics_url'}; errors name the variable that is wrong.
    """
    errors = []
    enabled = bool(settings.get("enabled"))
    out = {"enabled": enabled, "errors": errors, "workers": [], "model": "", "url": "",
           "argv": [], "metrics_url": "", "unit": UNIT}
    if not enabled:
        return out
    instances = list(instances or [])
    by_name = dict((str(i.get("name")), i) for i in instances)

    policy = settings.get("policy")
    if policy not in POLICIES:
        errors.append("vllm_router_policy=%r is not a policy of vllm-router: use one of %s"
                      % (policy, ", ".join(POLICIES)))
    host = settings.get("host")
    if not isinstance(host, str) or not host.strip():
        errors.append("vllm_router_host=%r must be a listen address" % (host,))
        host = "0.0.0.0"
    metrics_host = settings.get("metrics_host")
    if not isinstance(metrics_host, str) or not metrics_host.strip():
        errors.append("vllm_router_metrics_host=%r must be a listen address" % (metrics_host,))
        metrics_host = "127.0.0.1"
    port = _port(settings.get("port"), "vllm_router_port", errors)
    metrics_port = _port(settings.get("metrics_port"), "vllm_router_metrics_port", errors)
    interval = _positive(settings.get("health_check_interval_s"),
                         "vllm_router_health_check_interval_s", errors)
    startup = _positive(settings.get("worker_startup_timeout_s"),
                        "vllm_router_worker_startup_timeout_s", errors)

    names = settings.get("instances")
    if names is None:
        names = []
    if not isinstance(names, (list, tuple)) or any(not isinstance(n, str) for n in names):
        errors.append("vllm_router_instances=%r must be a list of instance names" % (names,))
        names = []
    unknown = [n for n in names if n not in by_name]
    if unknown:
        errors.append("vllm_router_instances names %s, not an instance of the host "
                      "(vllm_service_instances: %s)"
                      % (", ".join(unknown), ", ".join(by_name) or "none"))
    behind = [by_name[n] for n in names if n in by_name] if names else instances
    if not behind:
        errors.append("vllm_router_enabled is true but no vLLM instance stands behind the "
                      "router (vllm_router_instances=%r, vllm_service_instances declares %s)"
                      % (list(names), ", ".join(by_name) or "none"))
    models = sorted(set(str(i.get("served_model_name") or "") for i in behind))
    if len(models) > 1:
        errors.append("the instances behind the router serve different models (%s): "
                      "one router fronts one model; choose instances of one model with "
                      "vllm_router_instances"
                      % "; ".join("%s: %s" % (i["name"], i.get("served_model_name"))
                                  for i in behind))
    if policy == "power_of_two" and len(behind) < 2:
        errors.append("vllm_router_policy=power_of_two needs two or more instances behind the "
                      "router (vllm_router_instances has %d)" % len(behind))

    # Ports on the host the router's listeners must not take.
    taken = {}
    for inst in instances:
        try:
            taken[_int(inst.get("port"))] = "vLLM instance %s (vllm_service_instances)" % inst.get("name")
        except (TypeError, ValueError):
            pass
    if settings.get("gate_enabled"):
        gate = settings.get("gate_port")
        try:
            gate = _int(gate)
        except (TypeError, ValueError):
            gate = 0
        if gate:
            taken.setdefault(gate, "the upgrade gate's candidate (vllm_install_gate_port)")
        else:
            for inst in instances:
                try:
                    taken.setdefault(_int(inst.get("port")) + 100,
                                     "the upgrade gate's candidate of instance %s "
                                     "(its port + 100, vllm_install_gate_port=0)" % inst.get("name"))
                except (TypeError, ValueError):
                    pass
    ssh = {22}
    try:
        ssh.add(_int(settings.get("ssh_port")))
    except (TypeError, ValueError):
        pass
    for p in sorted(ssh):
        taken.setdefault(p, "sshd (port 22 / ansible_port)")
    for name, value in (("vllm_router_port", port), ("vllm_router_metrics_port", metrics_port)):
        if value is not None and value in taken:
            errors.append("%s=%d is the port of %s" % (name, value, taken[value]))
    if port is not None and port == metrics_port:
        errors.append("vllm_router_metrics_port=%d is vllm_router_port too" % port)

    args = settings.get("args")
    if args is None:
        args = []
    if not isinstance(args, (list, tuple)) or any(not isinstance(a, str) for a in args):
        errors.append("vllm_router_args=%r must be a list of strings" % (args,))
        args = []
    managed = sorted(set(a.split("=", 1)[0] for a in args) & set(MANAGED_FLAGS))
    if managed:
        errors.append("vllm_router_args sets %s, which the role sets itself (use the "
                      "vllm_router_* variables; an API key never goes on the command line)"
                      % ", ".join(managed))
    if errors:
        return out

    workers = [{"name": str(i["name"]), "url": str(i["url"]), "unit": str(i.get("unit") or "")}
               for i in behind]
    client_host = "127.0.0.1" if host in ("0.0.0.0", "::", "[::]") else host
    metrics_client = "127.0.0.1" if metrics_host in ("0.0.0.0", "::", "[::]") else metrics_host
    argv = ([str(settings.get("binary")), "--host", host, "--port", str(port), "--policy", policy,
             "--worker-urls"] + [w["url"] for w in workers]
            + ["--prometheus-host", metrics_host, "--prometheus-port", str(metrics_port),
               "--health-check-interval-secs", str(interval),
               "--worker-startup-timeout-secs", str(startup)] + list(args))
    out.update(workers=workers, model=models[0], argv=argv,
               url="http://%s:%d" % (client_host, port),
               metrics_url="http://%s:%d/metrics" % (metrics_client, metrics_port))
    return out


def rolling(transition, instances, plan, live_urls, host_ports=None):
    """Whether a transition of vllm_service rolls through the router, one instance at a time.

    transition: vllm_transition.plan's result; instances: the declared (resolved) instances;
    plan: router_plan's result (the router as declared); live_urls: the worker URLs the running
    router lists now (None: no router answers); host_ports: {name: port the instance runs on
    now}.

    Returns {'roll': [names in order], 'reason': why it rolls or why not}. It rolls when every
    instance that stops stands behind a running router that lists it, serves before, keeps its
    URL, and at least one other instance behind the router keeps serving meanwhile; a change
    that adds or removes instances goes the usual way (all at once).
    """
    transition = transition or {}
    stop = list(transition.get("stop") or [])
    if not stop:
        return {"roll": [], "reason": "no instance restarts"}
    if not (plan or {}).get("enabled") or (plan or {}).get("errors"):
        return {"roll": [], "reason": "no router in front of the instances"}
    workers = dict((w["name"], w["url"]) for w in plan.get("workers") or [])
    if transition.get("new") or transition.get("remove"):
        return {"roll": [], "reason": "instances are added or removed"}
    outside = [n for n in stop if n not in workers]
    if outside:
        return {"roll": [], "reason": "%s not behind the router" % ", ".join(outside)}
    if len(workers) < 2:
        return {"roll": [], "reason": "one instance behind the router: nothing serves while it restarts"}
    if live_urls is None:
        return {"roll": [], "reason": "the router is not running yet"}
    missing = [n for n in stop if workers[n] not in live_urls]
    if missing:
        return {"roll": [], "reason": "the running router does not list %s" % ", ".join(missing)}
    not_serving = [n for n in stop if n not in (transition.get("restore_start") or [])]
    if not_serving:
        return {"roll": [], "reason": "%s did not serve before" % ", ".join(not_serving)}
    ports = dict((str(i["name"]), int(i["port"])) for i in instances or [])
    moved = [n for n in stop if n in (host_ports or {}) and (host_ports or {})[n] is not None
             and int((host_ports or {})[n]) != ports.get(n)]
    if moved:
        return {"roll": [], "reason": "%s changes its port" % ", ".join(moved)}
    order = [n for n in workers if n in stop]
    return {"roll": order, "reason": "rolling through the router, one instance at a time: %s"
            % ", ".join(order)}


IN_FLIGHT = ("vllm:num_requests_running", "vllm:num_requests_waiting")


def requests_in_flight(metrics_text):
    """Requests an instance still holds, from its /metrics text: the sum of vLLM's
    num_requests_running and num_requests_waiting gauges (every engine, every model);
    None when the text has neither gauge."""
    total, seen = 0.0, False
    for line in str(metrics_text or "").splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in IN_FLIGHT:
            try:
                total += float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
            seen = True
    return int(round(total)) if seen else None
