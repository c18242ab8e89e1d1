#!/usr/bin/env bash
# Where registries are reachable: download what the GPU test host needs besides the vLLM
# wheelhouse into build/gpu-extras/ (one carry, about 35 MiB):
#   debs/   the Debian bookworm packages of tests/gpu/debs.txt (systemd, sshd, dbus, git)
#   hub/    wheels of requirements/hub.txt for CPython 3.12 (olah and huggingface_hub, for
#           the Hub-compatible server and the model_weights downloader venv)
#   tune/   ansible-runner and rich for CPython 3.12 (requirements/tools.txt's pins): the
#           controller side of `vllm-deploy tune` (tests/gpu/host.sh tune)
#
#   tests/gpu/stage_extras.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-build/gpu-extras}
rm -rf "$out"
mkdir -p "$out/debs" "$out/hub" "$out/tune"
mapfile -t debs < <(grep -vE '^\s*(#|$)' tests/gpu/debs.txt)
(cd "$out/debs" && apt-get download "${debs[@]}" >/dev/null)
plat=()
for n in 17 24 26 27 28 31 34 35; do plat+=(--platform "manylinux_2_${n}_x86_64"); done
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  "${plat[@]}" --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any \
  -d "$out/hub" -r requirements/hub.txt
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  "${plat[@]}" --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any \
  -d "$out/tune" "$(grep -E '^ansible-runner==' requirements/tools.txt)" "$(grep -E '^rich==' requirements/tools.txt)"
du -sh "$out"/* "$out"
