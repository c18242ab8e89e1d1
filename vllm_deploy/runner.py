"""Running the repo's playbooks through ansible-runner: preflight checks, environment, events.

ansible-runner's behaviour this module relies on or works around: the event handler returns
True (else runner keeps no events and ``stats`` comes back empty); runner forces its own stdout
callback and a JSON fact cache; its working directory is ``project_dir``; an ``inventory/``
inside ``private_data_dir`` would be picked up silently (ours is a fresh temporary directory
without one, and the caller's inventory is passed in place with ``-i``); it sets no collections
path, so the repository's ansible.cfg and collections path (where this checkout is the
collection vllm_ops.deploy) go through ``envvars``. Runner puts a dict of extravars on the
command line (argv, visible in ``ps``): we write them to ``env/extravars`` (0600) in the
temporary directory instead, which runner passes as ``-e @file``.
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

import yaml

from .collection import plugin_module, project_root
from .errors import AnsibleNotAvailable, InventoryNotFound, UnknownProfile, UnknownTag, UsageError
from .events import EventCollector

SPECIAL_TAGS = ("all", "always", "never", "tagged", "untagged")
COLLECTION = "vllm_ops.deploy"  # this checkout, through collections/ansible_collections/
EventCallback = Callable[[Dict[str, Any]], None]


def envvars(root: str) -> Dict[str, str]:
    """Ansible settings for a run, as absolute paths: the repository's ansible.cfg and its
    collections path, through which the checkout is the collection vllm_ops.deploy."""
    env = {
        "ANSIBLE_CONFIG": os.path.join(root, "ansible.cfg"),
        "ANSIBLE_COLLECTIONS_PATH": os.path.join(root, "collections"),
        "ANSIBLE_FORCE_COLOR": "false",
        "ANSIBLE_NOCOLOR": "true",
    }
    return env


def find_ansible_playbook() -> str:
    """ansible-playbook of this interpreter's environment (its bin/), else on PATH."""
    here = os.path.dirname(sys.executable)
    found = shutil.which("ansible-playbook", path=here + os.pathsep + os.environ.get("PATH", ""))
    if not found:
        raise AnsibleNotAvailable(
            "ansible-playbook is not installed in this environment (looked in %s and PATH); "
            "install the controller tools (`make setup`, or pip install -r "
            "requirements/tools.txt)" % here)
    return found


def import_runner():
    try:
        import ansible_runner  # noqa: WPS433
    except ImportError as exc:
        raise AnsibleNotAvailable(
            "the Python package ansible-runner is not installed in %s (%s); install the "
            "controller tools (`make setup`, or pip install -r requirements/tools.txt)"
            % (sys.executable, exc)) from None
    return ansible_runner


def check_inventory(inventory) -> List[str]:
    """Absolute paths of the inventory sources (a path or a list of paths); all must exist."""
    items = [inventory] if isinstance(inventory, (str, os.PathLike)) else list(inventory or [])
    if not items:
        raise UsageError("an inventory is required")
    out = []
    for item in items:
        path = os.path.abspath(os.fspath(item))
        if not os.path.exists(path):
            raise InventoryNotFound(os.fspath(item))
        out.append(path)
    return out


def inventory_dirs(inventory) -> List[str]:
    """Where Ansible looks for host_vars/ of each source (``inventory_dir``)."""
    return [p if os.path.isdir(p) else os.path.dirname(p) for p in check_inventory(inventory)]


def collection_profiles(root: str):
    """The collection's profile loader (plugins/plugin_utils/service/profiles.py)."""
    return plugin_module("plugin_utils.service.profiles", root)


def known_profiles(root: str, dirs: Optional[Sequence[str]] = None) -> List[str]:
    """Profile names: the collection's profiles/ and the given vllm_deploy_profile_dirs."""
    return sorted(collection_profiles(root).known_profiles(list(dirs or [])))


def check_profile(root: str, extravars: Optional[Dict[str, Any]]) -> None:
    """An unknown vllm_service_profile in extravars is refused before Ansible runs (profiles
    of directories set in the inventory's vllm_deploy_profile_dirs are checked by the play)."""
    extravars = extravars or {}
    profile = extravars.get("vllm_service_profile")
    if profile:
        known = known_profiles(root, extravars.get("vllm_deploy_profile_dirs"))
        if profile not in known:
            raise UnknownProfile(profile, known)


def _tags_in(node, out: set) -> None:
    if isinstance(node, dict):
        tags = node.get("tags")
        if isinstance(tags, str):
            out.update(t.strip() for t in tags.split(",") if t.strip())
        elif isinstance(tags, list):
            out.update(str(t) for t in tags)
        for value in node.values():
            _tags_in(value, out)
    elif isinstance(node, list):
        for value in node:
            _tags_in(value, out)


def _own(name: Optional[str]) -> Optional[str]:
    """The short name of one of this collection's roles or playbooks given by FQCN (any
    other name, e.g. another collection's, is None)."""
    prefix = COLLECTION + "."
    if isinstance(name, str) and name.startswith(prefix):
        return name[len(prefix):]
    return None


def playbook_path(root: str, name: str) -> str:
    """playbooks/<name>.yml of the collection for an FQCN (vllm_ops.deploy.deploy) or a short
    name (deploy, deploy.yml)."""
    short = _own(name) or name
    if short.endswith((".yml", ".yaml")):
        short = short.rsplit(".", 1)[0]
    return os.path.join(root, "playbooks", short + ".yml")


def _role_names(node, out: set) -> None:
    if isinstance(node, dict):
        for key in ("roles",):
            for role in node.get(key) or []:
                out.add(_own(role if isinstance(role, str) else role.get("role") or role.get("name")))
        for key in ("ansible.builtin.include_role", "ansible.builtin.import_role",
                    "include_role", "import_role"):
            if isinstance(node.get(key), dict) and isinstance(node[key].get("name"), str):
                out.add(_own(node[key]["name"]))
        for value in node.values():
            _role_names(value, out)
    elif isinstance(node, list):
        for value in node:
            _role_names(value, out)


def known_tags(root: str, playbook: str) -> List[str]:
    """Tags a playbook knows: its plays' and roles' tags, and the tags in those roles' tasks
    (static read of the YAML; roles and imported playbooks by their FQCN in this collection;
    templated role names, e.g. a looped include_role, are covered by also reading every role
    in roles/)."""
    tags: set = set()
    seen: set = set()
    roles: set = set()

    def read_playbook(path):
        if path in seen or not os.path.isfile(path):
            return
        seen.add(path)
        with open(path) as f:
            doc = yaml.safe_load(f) or []
        _tags_in(doc, tags)
        _role_names(doc, roles)
        for play in doc if isinstance(doc, list) else []:
            for key in ("ansible.builtin.import_playbook", "import_playbook"):
                if isinstance(play, dict) and isinstance(play.get(key), str):
                    target = play[key]
                    read_playbook(playbook_path(root, target) if _own(target)
                                  else os.path.join(os.path.dirname(path), target))

    read_playbook(playbook)
    role_dirs = {r for r in roles if r and "{{" not in r}
    if any(r and "{{" in r for r in roles):
        role_dirs |= {os.path.basename(p) for p in glob.glob(os.path.join(root, "roles", "*"))}
    for role in role_dirs:
        for path in glob.glob(os.path.join(root, "roles", role, "tasks", "*.yml")):
            with open(path) as f:
                _tags_in(yaml.safe_load(f), tags)
    return sorted(tags | set(SPECIAL_TAGS))


def check_tags(root: str, playbook: str, tags: Optional[Sequence[str]]) -> Optional[str]:
    if not tags:
        return None
    if isinstance(tags, str):
        tags = [t.strip() for t in tags.split(",") if t.strip()]
    known = known_tags(root, playbook)
    unknown = [t for t in tags if t not in known]
    if unknown:
        raise UnknownTag(unknown, [t for t in known if t not in SPECIAL_TAGS], playbook)
    return ",".join(tags)


def run_playbook(playbook: str, inventory, *, limit: Optional[str] = None,
                 extravars: Optional[Dict[str, Any]] = None, tags: Optional[Iterable[str]] = None,
                 on_event: Optional[EventCallback] = None, timeout: Optional[int] = None,
                 keep_artifacts: bool = False, verbosity: int = 0):
    """Run the collection's playbook ``playbook`` (vllm_ops.deploy.<name>, from playbooks/)
    on the caller's inventory; returns (runner, collector, info)."""
    root = project_root()
    path = playbook_path(root, playbook)
    if not os.path.isfile(path):
        raise UsageError("no playbook %s in %s" % (playbook, root))
    fqcn = "%s.%s" % (COLLECTION, os.path.basename(path)[:-4])
    sources = check_inventory(inventory)
    tag_arg = check_tags(root, path, list(tags) if tags is not None and not isinstance(tags, str)
                         else tags)
    check_profile(root, extravars)
    if limit is not None and not str(limit).strip():
        raise UsageError("limit must be a non-empty host pattern")
    ansible_runner = import_runner()
    binary = find_ansible_playbook()

    collector = EventCollector()
    callback_error: List[BaseException] = []

    def handler(event):
        collector.add(event)
        if on_event is not None and not callback_error:
            try:
                on_event(event)
            except Exception as exc:  # stop the run, re-raise after runner returns
                callback_error.append(exc)
        return True  # keep the event (else runner's stats come back empty)

    pdd = tempfile.mkdtemp(prefix="vllm-deploy-")  # 0700
    env = envvars(root)
    env["PATH"] = os.path.dirname(binary) + os.pathsep + os.environ.get("PATH", "")
    started = time.time()
    try:
        if extravars:
            os.makedirs(os.path.join(pdd, "env"), mode=0o700)
            fd = os.open(os.path.join(pdd, "env", "extravars"),
                         os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(extravars, f)
        runner = ansible_runner.run(
            private_data_dir=pdd, project_dir=root, playbook=fqcn,
            inventory=sources if len(sources) > 1 else sources[0],
            limit=limit, tags=tag_arg, envvars=env, quiet=True,
            event_handler=handler, cancel_callback=lambda: bool(callback_error),
            timeout=timeout, verbosity=verbosity or None, suppress_env_files=True)
    finally:
        if not keep_artifacts:
            shutil.rmtree(pdd, ignore_errors=True)
    if callback_error:
        raise callback_error[0]
    info = {"playbook": fqcn, "duration_s": round(time.time() - started, 1),
            "private_data_dir": pdd if keep_artifacts else None}
    return runner, collector, info
