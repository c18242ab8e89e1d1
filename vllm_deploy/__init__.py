"""Python API over ansible-runner for the vllm-deploy playbooks.

    import vllm_deploy
    result = vllm_deploy.deploy("inventory/prod/hosts.yml", limit="gpu-01")
    for host, r in result.hosts.items():
        print(host, r.stats.changed, r.endpoint.url if r.endpoint else None, r.versions)
    print(vllm_deploy.status("inventory/prod/hosts.yml").status_by_host)
    print(vllm_deploy.verify("inventory/prod/hosts.yml").weights_by_host)  # hash + repair
"""
from .api import deploy, saved_sweeps, status, sweep, verify
from .tune import TuneResult, tune
from .errors import (AnsibleNotAvailable, InventoryNotFound, PlaybookFailed, UnknownProfile,
                     UnknownTag, UsageError, VllmDeployError)
from .results import (DeployResult, Endpoint, HostFailure, HostResult, HostStats, HostStatus,
                      InstalledVersions, InstanceStatus, RunResult, StatusResult, SweepLevel,
                      SweepResult, SweepSummary, VerifyResult, WeightsCheck)

__all__ = [
    "deploy", "sweep", "status", "verify", "saved_sweeps", "tune", "TuneResult",
    "VllmDeployError", "UsageError", "InventoryNotFound", "UnknownTag", "UnknownProfile",
    "AnsibleNotAvailable", "PlaybookFailed",
    "RunResult", "DeployResult", "SweepResult", "StatusResult", "HostResult", "HostStats",
    "HostFailure", "HostStatus", "InstanceStatus", "InstalledVersions", "Endpoint",
    "SweepSummary", "SweepLevel", "VerifyResult", "WeightsCheck",
]
