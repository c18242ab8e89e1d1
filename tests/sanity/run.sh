#!/usr/bin/env bash
# ansible-test sanity of the collection as it ships: the tarball `ansible-galaxy collection
# build` makes (galaxy.yml's build_ignore applied), unpacked under
# <tmp>/ansible_collections/vllm_ops/deploy (ansible-test needs that path), Python 3.11, each
# test's requirements in ansible-test's own virtualenvs (--requirements; pinned by ansible-test,
# from PyPI). Ignores: tests/sanity/ignore-2.19.txt. Extra arguments go to ansible-test, e.g.
#   tests/sanity/run.sh --test validate-modules
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BIN=${BIN:-$ROOT/.venv/bin}
work=$(mktemp -d /tmp/vllm-deploy-sanity.XXXXXX)
trap 'rm -rf "$work"' EXIT

"$BIN/ansible-galaxy" collection build --output-path "$work" >/dev/null
dest=$work/ansible_collections/vllm_ops/deploy
mkdir -p "$dest"
tar -xzf "$work"/vllm_ops-deploy-*.tar.gz -C "$dest"

# ansible-test bootstraps pip in each of its virtualenvs with a script it downloads from
# ci-files.testing.ansible.com (not reachable from this machine) unless a copy is cached. The
# stand-in below does the same job: pip from the interpreter's ensurepip, then pip installs
# what ansible-test asks for (pip itself at its pinned version) from the configured index.
pip_version=$("$BIN/python" - <<'PY'
import re, ansible_test, os
src = open(os.path.join(os.path.dirname(ansible_test.__file__), "_internal", "python_requirements.py")).read()
print(re.search(r"pip='([0-9.]+)'", src).group(1))
PY
)
cache=$HOME/.ansible/test/cache/get_pip_${pip_version//./_}.py
if [ ! -f "$cache" ]; then
  mkdir -p "$(dirname "$cache")"
  cat > "$cache" <<'PY'
"""Stand-in for ansible-test's pip bootstrap script (written by vllm-deploy's tests/sanity/run.sh):
pip from ensurepip, then `pip install` of the arguments ansible-test passes."""
import ensurepip
import os
import subprocess
import sys

env = dict(os.environ)  # ensurepip points PIP_CONFIG_FILE at /dev/null for itself only
ensurepip.bootstrap(upgrade=True)
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
sys.exit(subprocess.call([sys.executable, "-m", "pip", "install"] + args, env=env))
PY
fi

start=$(date +%s)
cd "$dest"
status=0
PATH="$BIN:$PATH" ansible-test sanity --python 3.11 --requirements --color no "$@" || status=$?
echo "sanity: ansible-test exited $status after $(( $(date +%s) - start )) s"
exit "$status"
