#!/usr/bin/env bash
# The checks Galaxy and the Ansible docs tooling run on the collection, against the tarball
# `ansible-galaxy collection build` makes (galaxy.yml's build_ignore applied):
#   1. galaxy-importer (the importer Galaxy runs on upload; its ansible-lint pass left to
#      `make lint`): fails on any import error;
#   2. antsibull-docs lint-collection-docs --plugin-docs on the tarball installed into an
#      empty collections directory (every module, plugin and role argument spec);
#   3. antsibull-changelog lint of changelogs/ (the fragments and changelog.yaml).
# CHECKS_VENV: the virtualenv of requirements/collection-checks.txt; BIN: the tools venv's bin.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BIN=${BIN:-$ROOT/.venv/bin}
CHECKS_VENV=${CHECKS_VENV:?the collection-checks virtualenv (make collection-checks sets it)}
work=$(mktemp -d /tmp/vllm-deploy-collection-checks.XXXXXX)
trap 'rm -rf "$work"' EXIT
export PATH="$CHECKS_VENV/bin:$PATH"

# Outside the checkout: its ansible.cfg would point Ansible at collections/.
(cd "$work" && "$BIN/ansible-galaxy" collection build --output-path "$work/build" "$ROOT" >/dev/null)
tarball=$(ls "$work"/build/vllm_ops-deploy-*.tar.gz)
echo "collection-checks: $(basename "$tarball") ($(du -k "$tarball" | cut -f1) KiB)"

status=0
echo "collection-checks: galaxy-importer $("$CHECKS_VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("galaxy-importer"))')"
# The importer's own ansible-lint pass only logs warnings on Galaxy (it never fails an import)
# and has a fixed 180 s limit that a loaded 2-core machine exceeds; `make lint` runs
# ansible-lint on the whole repository with the stricter production profile instead.
(cd "$work" && env ANSIBLE_LOCAL_TEMP="$work/ansible-tmp" GALAXY_IMPORTER_RUN_ANSIBLE_LINT=false \
    "$CHECKS_VENV/bin/python" -m galaxy_importer.main "$tarball") >"$work/importer.log" 2>&1 \
  || status=$?
grep -E '^(WARNING|ERROR)' "$work/importer.log" || true
tail -n 1 "$work/importer.log"
if [ "$status" -ne 0 ] || grep -q '^ERROR' "$work/importer.log"; then
  echo "collection-checks: galaxy-importer failed (exit $status)"; status=1
fi

(cd "$work" && "$BIN/ansible-galaxy" collection install --offline -p "$work/collections" \
    "$tarball" >/dev/null 2>&1)
echo "collection-checks: antsibull-docs lint-collection-docs --plugin-docs"
(cd "$work/collections/ansible_collections/vllm_ops/deploy" \
  && ANSIBLE_COLLECTIONS_PATH="$work/collections" antsibull-docs lint-collection-docs \
       --plugin-docs .) || { echo "collection-checks: antsibull-docs lint failed"; status=1; }

echo "collection-checks: antsibull-changelog lint"
antsibull-changelog lint || { echo "collection-checks: antsibull-changelog lint failed"; status=1; }

echo "collection-checks: exit $status"
exit "$status"
