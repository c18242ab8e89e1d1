"""The package's exception types.

    VllmDeployError
    ├── UsageError               bad input, found before anything runs (CLI exit code 2)
    │   ├── InventoryNotFound
    │   ├── UnknownTag
    │   └── UnknownProfile
    ├── AnsibleNotAvailable      ansible-runner / ansible-playbook missing on the controller
    └── PlaybookFailed           a host failed or was unreachable (CLI exit code 1);
                                 .failures names each host and task, .result holds everything
"""
from __future__ import annotations

from typing import TYPE_CHECKING, List

if TYPE_CHECKING:  # pragma: no cover
    from .results import HostFailure, RunResult


class VllmDeployError(Exception):
    """Base class of every error this package raises on purpose."""


class UsageError(VllmDeployError, ValueError):
    """Bad input to the API or the CLI, detected before Ansible starts."""


class InventoryNotFound(UsageError):
    def __init__(self, path: str):
        self.path = path
        super().__init__("inventory not found: %s (pass an inventory file or directory)" % path)


class UnknownTag(UsageError):
    def __init__(self, tags: List[str], known: List[str], playbook: str):
        self.tags = list(tags)
        self.known = list(known)
        self.playbook = playbook
        super().__init__("unknown tag%s %s for %s; known tags: %s" % (
            "s" if len(tags) > 1 else "", ", ".join(tags), playbook, ", ".join(known)))


class UnknownProfile(UsageError):
    def __init__(self, profile: str, known: List[str]):
        self.profile = profile
        self.known = list(known)
        super().__init__("unknown vllm_service_profile %r; known profiles: %s"
                         % (profile, ", ".join(known)))


class AnsibleNotAvailable(VllmDeployError):
    """The controller lacks ansible-runner or ansible-playbook."""


class PlaybookFailed(VllmDeployError):
    """The run finished with failed or unreachable hosts (or did not finish)."""

    def __init__(self, result: "RunResult"):
        self.result = result
        self.failures: List["HostFailure"] = list(result.failures)
        if self.failures:
            lines = [f.describe() for f in self.failures]
        else:
            lines = ["ansible-playbook ended with status %s, rc %s" % (result.status, result.rc)]
        super().__init__("%s failed on %d host(s):\n  %s" % (
            result.playbook, len({f.host for f in self.failures}) or 0, "\n  ".join(lines)))

    @property
    def hosts(self) -> List[str]:
        return sorted({f.host for f in self.failures})
