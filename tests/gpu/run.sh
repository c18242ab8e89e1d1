#!/usr/bin/env bash
# The real-GPU check, run ON the GPU machine from the repository root.
#
#   tests/gpu/run.sh all [MACHINE_NAME]     everything below, in order
#   tests/gpu/run.sh stage N                copy build/gpu-wheels/partN into the wheelhouse
#   tests/gpu/run.sh facts [MACHINE_NAME]   raw nvidia-smi captures + gpu_facts via ansible
#   tests/gpu/run.sh prepare                join the cut wheels, check their sha256, put
#                                                   ansible's wheels aside, write the model
#   tests/gpu/run.sh install                the vllm_install role (wheelhouse source,
#                                                   --no-deps, the image's torch through
#                                                   vllm_install_site_dirs) via ansible; its venv
#                                                   serves every later step (fallback if it
#                                                   fails: pip --target, as the wheelhouse notes do)
#   tests/gpu/run.sh install-serve          prepare + install, then the TP=1 server and
#                                                   the capacity plan vs vLLM's log
#   tests/gpu/run.sh sweep TAG LEVELS [ansible|ansible-only]  bench_sweep_vs_vllm.py
#                                                   (ours vs `vllm bench serve`) at LEVELS; with
#                                                   `ansible` first the vllm_sweep module through
#                                                   ansible at LEVELS (`ansible-only`: only that)
#   tests/gpu/run.sh ttft TAG                TTFT of text prompts vs token-id prompts (C=1)
#   tests/gpu/run.sh ceiling                the client's ceiling against a local streaming stub
#                                                   (bench_client_ceiling.py, 1..8 processes;
#                                                   needs no GPU and no server)
#   tests/gpu/run.sh tp2-start              all-reduce smoke, then the server with TP=2
#   tests/gpu/run.sh stop                   stop the server
#
# The wheels come from tests/gpu/stage_wheels.py (run where PyPI is reachable); the device
# tool carries one build/gpu-wheels/partN per call. State lives in /tmp/gpu-check (survives between
# back-to-back calls on the same machine); results go to $OUT (the device tool's folder) or
# $GPU_CHECK_OUT. Environment knobs: GPU_CHECK_WHEELHOUSE (/tmp/wh), GPU_CHECK_PYTHON (python3,
# the image's python that holds torch 2.11.0), GPU_CHECK_PORT (8000), GPU_CHECK_SERVE_WAIT (420),
# GPU_CHECK_DURATION (8, seconds per level), GPU_CHECK_INPUT_LEN/OUTPUT_LEN (128/128), GPU_CHECK_REPS (3),
# GPU_CHECK_BENCH_BUDGET (500 s), GPU_CHECK_BENCH_ARGS (more bench_sweep_vs_vllm.py arguments),
# GPU_CHECK_SKIP_ROLE (install with pip --target instead of the role).
set -u
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
WH=${GPU_CHECK_WHEELHOUSE:-/tmp/wh}
ST=/tmp/gpu-check
OUTD=${OUT:-${GPU_CHECK_OUT:-$ST/out}}
PY=$(command -v "${GPU_CHECK_PYTHON:-python3}")
PORT=${GPU_CHECK_PORT:-8000}
NAME=llama-0.9b-dummy
MODEL=$ST/model
ILEN=${GPU_CHECK_INPUT_LEN:-128}
OLEN=${GPU_CHECK_OUTPUT_LEN:-128}
DUR=${GPU_CHECK_DURATION:-8}
export LC_ALL=C.UTF-8 PYTHONUNBUFFERED=1
# the machine's own NCCL/TORCH/CUDA variables, read before this script sets any (fixture env-nccl.txt)
MACHINE_ENV=$(env | grep -E '^(NCCL|TORCH|NVSHMEM|CUDA)_' | sort)
# never NVLink multicast on these machines (see the device notes); harmless with one GPU
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$ST" "$OUTD"
ANSIBLE_WHEELS="ansible_core- resolvelib- cryptography- cffi- pycparser-"
ANS_WH=$ST/ans-wh   # ansible's wheels, kept out of the vLLM wheelhouse (every wheel there is installed)
VENV_PY=$ST/role/current/bin/python

log() { echo "[$(date +%H:%M:%S)] $*"; }

ansible_env() {
  export PATH=$ST/ans/bin:$PATH
  export PYTHONPATH=$ST/ans
  export ANSIBLE_CONFIG=$ROOT/ansible.cfg ANSIBLE_COLLECTIONS_PATH=$ROOT/collections \
    ANSIBLE_HOME=$ST/ansible-home ANSIBLE_LOCAL_TEMP=$ST/ansible-tmp
}

install_ansible() {
  [ -x "$ST/ans/bin/ansible" ] && return 0
  local w=() p d=$WH
  [ -d "$ANS_WH" ] && d=$ANS_WH
  for p in $ANSIBLE_WHEELS; do w+=("$d/$p"*.whl); done
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$ST/ans" "${w[@]}"
}

adhoc_json() { # adhoc_json OUTFILE MODULE ARGS_JSON INTERPRETER: the module's result as JSON
  local tree=$ST/tree.$$ rc
  rm -rf "$tree"
  ansible localhost -i localhost, -c local -m "$2" -a "$3" --tree "$tree" \
    -e ansible_python_interpreter="$4" >"$1.log" 2>&1
  rc=$?
  cp "$tree/localhost" "$1" 2>/dev/null || echo '{"failed": true, "msg": "no result"}' >"$1"
  rm -rf "$tree"
  return $rc
}

vllm_wheels() { # every wheel except vLLM's, ansible's and uv
  local f skip p
  for f in "$WH"/*.whl; do
    skip=0
    for p in $ANSIBLE_WHEELS uv- vllm-; do case ${f##*/} in "$p"*) skip=1 ;; esac; done
    [ $skip = 0 ] && echo "$f"
  done
}

wait_health() { # wait_health SECONDS
  "$PY" - "$PORT" "$1" "$ST/serve.pid" <<'EOF'
import os, sys, time, urllib.request
port, limit, pidf = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
pid = int(open(pidf).read())
t0 = time.time()
while time.time() - t0 < limit:
    try:
        os.kill(pid, 0)
    except OSError:
        print("server process %d exited" % pid); sys.exit(1)
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=5) as r:
            if r.status == 200:
                print("healthy after %.0f s of waiting" % (time.time() - t0)); sys.exit(0)
    except OSError:
        pass
    time.sleep(2)
print("not healthy after %.0f s" % limit); sys.exit(2)
EOF
}

serve_python() { # the role's venv when its install passed, else the image python + --target dir
  if [ -f "$ST/role-ok" ]; then echo "$VENV_PY"; else echo "$PY"; fi
}

serve_env() { # PYTHONPATH for serve_python (empty for the role's venv)
  if [ -f "$ST/role-ok" ]; then echo "PYTHONPATH="; else echo "PYTHONPATH=$ST/vsite"; fi
}

start_server() { # start_server LOG [extra vLLM args...]
  local logf=$1; shift
  date +%s >"$ST/serve.start"
  setsid nohup env "$(serve_env)" "$(serve_python)" -m vllm.entrypoints.openai.api_server \
    --model "$MODEL" --served-model-name "$NAME" --load-format dummy \
    --host 127.0.0.1 --port "$PORT" --max-model-len 4096 --gpu-memory-utilization 0.9 \
    "$@" >"$logf" 2>&1 </dev/null &
  echo $! >"$ST/serve.pid"
  log "server pid $(cat "$ST/serve.pid"), log $logf, args: $*"
}

stop_server() {
  [ -f "$ST/serve.pid" ] || return 0
  local pid; pid=$(cat "$ST/serve.pid")
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  kill -KILL -- "-$pid" 2>/dev/null
  rm -f "$ST/serve.pid"
}

step_stage() {
  mkdir -p "$WH" && cp "build/gpu-wheels/part$1/"* "$WH/" && echo "part$1 copied: $(find "$WH" -mindepth 1 -maxdepth 1 | wc -l) files, $(du -sh "$WH" | cut -f1) in $WH"
}

step_facts() {
  local mach=${1:-h200}
  {
    "$PY" -c "import sys, torch; print('python', sys.version.split()[0], sys.executable); print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version(), 'gpus', torch.cuda.device_count())"
    echo "nproc $(nproc)"; free -g | head -2; uname -r; nvidia-smi -L
  } >"$OUTD/env.txt" 2>&1
  cat "$OUTD/env.txt"
  rm -rf "$ST/capture"
  sh tests/fixtures/nvidia-smi/capture.sh "$mach" "$ST/capture"
  "$PY" -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version(), torch.cuda.device_count(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())], torch.cuda.mem_get_info(0))" >"$ST/capture/$mach/torch.txt" 2>&1
  printf '%s\n' "$MACHINE_ENV" >"$ST/capture/$mach/env-nccl.txt"
  install_ansible || { echo "ansible install failed"; return 1; }
  ( ansible_env
    adhoc_json "$ST/gpu_facts.json" vllm_ops.deploy.gpu_facts '{"nccl_profile": "latency"}' "$PY"
    echo "ansible rc=$?" )
  "$PY" tests/gpu/check.py facts-compare "$ST/gpu_facts.json" "$ST/capture/$mach" \
    --json-out "$ST/facts-compare.json" | tee "$OUTD/facts-compare.txt"
  cp "$ST/gpu_facts.json" "$ST/gpu_facts.json.log" "$ST/facts-compare.json" "$ST/capture/" 2>/dev/null
  tar -C "$ST" -czf "$OUTD/facts.tar.gz" capture
}

step_prepare() {
  "$PY" tests/gpu/check.py join-wheels "$WH" | tee "$OUTD/install.txt" || return 1
  mkdir -p "$ANS_WH"
  local p
  for p in $ANSIBLE_WHEELS; do mv "$WH/$p"*.whl "$ANS_WH/" 2>/dev/null; done
  rm -f "$WH/manifest.json"
  echo "wheelhouse: $(find "$WH" -maxdepth 1 -name '*.whl' | wc -l) wheels; ansible's: $(find "$ANS_WH" -mindepth 1 -maxdepth 1 | wc -l)" | tee -a "$OUTD/install.txt"
  "$PY" tests/gpu/check.py make-model "$MODEL" | tee -a "$OUTD/install.txt"
}

step_install() {
  local torchsite
  torchsite=$("$PY" -c "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))")
  "$PY" -c 'import json, sys; json.dump(dict(zip(["gpu_check_wheelhouse", "gpu_check_root", "gpu_check_python", "gpu_check_torch_site"], sys.argv[2:6])), open(sys.argv[1], "w"))' \
    "$ST/role-vars.json" "$WH" "$ST/role" "$PY" "$torchsite"
  install_ansible || { echo "ansible install failed"; return 1; }
  rm -f "$ST/role-ok"
  local t1=$SECONDS rc=skipped
  if [ -z "${GPU_CHECK_SKIP_ROLE:-}" ]; then
    ( ansible_env
      ansible-playbook -i localhost, tests/gpu/install.yml -e "@$ST/role-vars.json" ) >"$ST/role.log" 2>&1
    rc=$?
  else
    echo "GPU_CHECK_SKIP_ROLE set: no role run" >"$ST/role.log"
  fi
  echo "role rc=$rc in $((SECONDS - t1)) s (site dir for torch: $torchsite)" | tee -a "$ST/role.log" "$OUTD/install.txt"
  grep -E "^(PLAY RECAP|localhost|TASK|fatal|FAILED)" "$ST/role.log" | tail -80 >"$OUTD/role-tasks.txt"
  tail -30 "$ST/role.log" >"$OUTD/role-tail.txt"
  if [ $rc = 0 ] && env PYTHONPATH= "$VENV_PY" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__, torch.__file__)" \
      >>"$OUTD/install.txt" 2>&1; then
    touch "$ST/role-ok"
    log "serving from the role's venv $(readlink -f "$ST/role/current")" | tee -a "$OUTD/install.txt"
  else
    log "role failed: falling back to pip --target" | tee -a "$OUTD/install.txt"
    local wheels
    mapfile -t wheels < <(vllm_wheels)
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$ST/vsite" \
      "${wheels[@]}" "$WH"/vllm-*.whl 2>&1 | tail -5
  fi
  local found
  mapfile -t found < <(cd "$ST" && ls role/role-result.json role/venvs/*/vllm-deploy.json 2>/dev/null)
  tar -C "$ST" -czf "$OUTD/install.tar.gz" role.log role-vars.json "${found[@]}"
}

step_install_serve() {
  step_prepare || return 1
  step_install
  start_server "$ST/serve-tp1.log"
  wait_health "${GPU_CHECK_SERVE_WAIT:-420}" | tee -a "$OUTD/install.txt"
  echo "server start to healthy: $(( $(date +%s) - $(cat "$ST/serve.start") )) s" | tee -a "$OUTD/install.txt"
  local mem
  mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 | tr -d ' ')
  "$PY" tests/gpu/check.py capacity "$MODEL" "$ST/serve-tp1.log" --gpu-memory-mib "$mem" \
    --json-out "$ST/capacity-tp1.json" | tee "$OUTD/capacity.txt"
  cp "$MODEL/config.json" "$ST/model-config.json"
  tar -C "$ST" -czf "$OUTD/serve-tp1.tar.gz" serve-tp1.log capacity-tp1.json model-config.json
}

step_sweep() { # step_sweep TAG LEVELS [ansible]
  local tag=$1 levels=$2 vpy
  vpy=$(serve_python)
  export "$(serve_env)"
  if [ "${3:-}" = ansible ] || [ "${3:-}" = ansible-only ]; then
    local lv t0=$SECONDS
    lv="[${levels}]"
    ( ansible_env
      adhoc_json "$ST/sweep-ansible-$tag.json" vllm_ops.deploy.vllm_sweep \
        "{\"base_url\": \"http://127.0.0.1:$PORT\", \"model\": \"$NAME\", \"levels\": $lv, \"input_len\": $ILEN, \"output_len\": $OLEN, \"duration_s\": $DUR, \"stop_on_saturation\": false}" \
        "$PY"
      echo "ansible vllm_sweep rc=$?" )
    log "ansible sweep took $((SECONDS - t0)) s"
    "$PY" - "$ST/sweep-ansible-$tag.json" <<'EOF' | tee "$OUTD/sweep-ansible-$tag.txt"
import json, sys
r = json.load(open(sys.argv[1]))
if r.get("failed"):
    print("FAILED:", r.get("msg")); sys.exit(1)
facts = r["sweep"] if "sweep" in r else r["ansible_facts"]["vllm_sweep"]
print("server:", json.dumps(facts.get("server")))
for lv in facts["levels"]:
    sc, cl = lv["server_check"], lv["client"]
    print("C=%-4d %9.1f tok/s  TTFT p50 %8.2f ms  TPOT p50 %7.3f ms  tokens %d/%d server  cpu %.1f ms/1k  limited=%s"
          % (lv["concurrency"], lv["output_tok_s"], lv["ttft_ms"]["p50"], lv["tpot_ms"]["p50"],
             sc["client_output_tokens"], sc["server_output_tokens"],
             cl["cpu_ms_per_1k_output_tokens"], cl["client_limited"]))
EOF
  fi
  [ "${3:-}" = ansible-only ] && { tar -C "$ST" -czf "$OUTD/sweep-$tag.tar.gz" "sweep-ansible-$tag.json" "sweep-ansible-$tag.json.log"; return; }
  local extra found
  read -r -a extra <<< "${GPU_CHECK_BENCH_ARGS:-}"  # more arguments, split on spaces
  timeout "${GPU_CHECK_BENCH_TIMEOUT:-560}" "$PY" tests/benchmarks/bench_sweep_vs_vllm.py --vllm-python "$vpy" \
    --model-dir "$MODEL" --model "$NAME" --base-url "http://127.0.0.1:$PORT" --levels "$levels" \
    --input-len "$ILEN" --output-len "$OLEN" --duration-s "$DUR" --vocab-size 2048 \
    --reps "${GPU_CHECK_REPS:-3}" --time-budget-s "${GPU_CHECK_BENCH_BUDGET:-500}" "${extra[@]}" \
    --json-out "$ST/bench-$tag.json" 2>&1 | tee "$OUTD/bench-$tag.txt"
  cp /tmp/bench-sweep-*/children.log "$ST/bench-children-$tag.log" 2>/dev/null
  mapfile -t found < <(cd "$ST" && ls "bench-$tag.json" "sweep-ansible-$tag.json" "sweep-ansible-$tag.json.log" "bench-children-$tag.log" 2>/dev/null)
  tar -C "$ST" -czf "$OUTD/sweep-$tag.tar.gz" "${found[@]}"
}

step_ceiling() { # the sweep client's tok/s per core and its scaling over processes
  "$PY" tests/benchmarks/bench_client_ceiling.py --processes "${GPU_CHECK_CEILING_PROCESSES:-1,2,4,8}" \
    --concurrency "${GPU_CHECK_CEILING_C:-256}" --server-processes "${GPU_CHECK_CEILING_SERVERS:-8}" \
    --duration-s "${GPU_CHECK_CEILING_DURATION:-10}" --output-len 256 \
    --json-out "$OUTD/ceiling.json" 2>&1 | tee "$OUTD/ceiling.txt"
}

step_ttft() { # step_ttft TAG: what tokenizing a text prompt adds to TTFT, on the running server
  "$PY" tests/gpu/ttft_text_vs_ids.py --base-url "http://127.0.0.1:$PORT" --model "$NAME" \
    --vocab-size 2048 --input-len "$ILEN" --pairs "${GPU_CHECK_TTFT_PAIRS:-40}" \
    --json-out "$OUTD/ttft-$1.json" 2>&1 | tee "$OUTD/ttft-$1.txt"
}

step_tp2_start() {
  stop_server
  ( ansible_env
    adhoc_json "$ST/gpu_facts-tp2.json" vllm_ops.deploy.gpu_facts '{"nccl_profile": "latency", "tensor_parallel": 2}' "$PY" )
  local envline nccl
  envline=$("$PY" - "$ST/gpu_facts-tp2.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
env = (r["ansible_facts"]["gpu_facts"].get("nccl") or {}).get("env") or {}
print(" ".join("%s=%s" % kv for kv in sorted(env.items())))
EOF
)
  read -r -a nccl <<< "$envline"  # NAME=value words (the derived values have no spaces)
  echo "derived env: $envline" | tee "$OUTD/tp2.txt"
  env "${nccl[@]}" NCCL_DEBUG=INFO "$PY" roles/gpu_host/files/allreduce_smoke.py --timeout 120 \
    >"$ST/smoke-tp2.txt" 2>&1
  echo "smoke rc=$?: $(tail -1 "$ST/smoke-tp2.txt")" | tee -a "$OUTD/tp2.txt"
  tail -1 "$ST/smoke-tp2.txt" | grep -q '"passed": true' || return 1
  export "${nccl[@]}"
  start_server "$ST/serve-tp2.log" --tensor-parallel-size 2
  wait_health "${GPU_CHECK_SERVE_WAIT:-420}" | tee -a "$OUTD/tp2.txt"
  local mem
  mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 | tr -d ' ')
  "$PY" tests/gpu/check.py capacity "$MODEL" "$ST/serve-tp2.log" --gpu-memory-mib "$mem" \
    --tensor-parallel 2 --json-out "$ST/capacity-tp2.json" | tee -a "$OUTD/tp2.txt"
  tar -C "$ST" -czf "$OUTD/tp2.tar.gz" serve-tp2.log smoke-tp2.txt gpu_facts-tp2.json gpu_facts-tp2.json.log capacity-tp2.json
}

case ${1:-} in
  stage) step_stage "$2" ;;
  facts) step_facts "${2:-h200}" ;;
  prepare) step_prepare ;;
  install) step_install ;;
  install-serve) step_install_serve ;;
  sweep) step_sweep "$2" "$3" "${4:-}" ;;
  ttft) step_ttft "${2:-tp1}" ;;
  ceiling) step_ceiling ;;
  tp2-start) step_tp2_start ;;
  stop) stop_server ;;
  all)
    step_facts "${2:-h200}"
    step_install_serve
    step_sweep tp1 1,2,4,8,16,32,64,128 ansible
    step_ttft tp1
    if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
      step_tp2_start && step_sweep tp2 1,2,4,8,16,32,64,128 ansible && step_ttft tp2
    fi
    stop_server ;;
  *) sed -n '2,24p' "$0"; exit 2 ;;
esac
