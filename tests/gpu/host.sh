#!/usr/bin/env bash
# The GPU test host: systemd as PID 1 and sshd on 127.0.0.1:2222, booted with systemd-nspawn
# over the lent GPU machine's own root (so the image's Python, torch, CUDA toolkit and the
# driver are there), and the real `ansible-playbook vllm_ops.deploy.deploy` run against it over
# SSH from the machine, like any GPU server. Run ON the GPU machine, from the repository root.
#
#   tests/gpu/host.sh extras DIR        copy build/gpu-extras (debs, hub wheels) into the state dir
#   tests/gpu/host.sh stage DIR         copy one wheel part (build/gpu-wheels/partN) into the wheelhouse
#   tests/gpu/host.sh boot              unpack systemd/sshd/dbus, boot the host, wait for SSH
#   tests/gpu/host.sh prepare           join the wheels (sha256 checked), ansible-core for the
#                                       controller, the Hub-compatible server (olah) with the
#                                       dummy Llama and the target architectures' repositories
#   tests/gpu/host.sh deploy TAG [MODEL] [ansible-playbook args...]
#                                       write the inventory for MODEL (llama | minimax | kimi),
#                                       run deploy.yml, keep the log and the recap in $OUT
#   tests/gpu/host.sh bench TAG LEVELS   our sweep vs `vllm bench serve` side by side against the
#                                       deployed llama (tests/benchmarks/bench_sweep_vs_vllm.py,
#                                       the host's own vLLM venv; GPU_HOST_BENCH_DURATION (15 s),
#                                       GPU_HOST_BENCH_REPS (3), GPU_HOST_BENCH_BUDGET (540 s);
#                                       GPU_HOST_BENCH_ARGS: more arguments of the benchmark,
#                                       split on spaces, e.g. "--prompt-format both")
#   tests/gpu/host.sh tune ARGS...      `vllm-deploy tune -i <the inventory> --host gpuhost ARGS`
#                                       from the machine (ansible-runner and rich from extras/tune)
#   tests/gpu/host.sh screen-grid ARGS...
#                                       the tuner's screen (GPU_HOST_SCREEN_MINUTES, 10), then the
#                                       grid over the same candidates resumed from the screen's
#                                       journal (GPU_HOST_GRID_MINUTES, 8); ARGS as for tune, less
#                                       --strategy, --rounds and --minutes
#   tests/gpu/host.sh sweep TAG ARGS... `vllm-deploy sweep -i <the inventory> -l gpuhost ARGS`: the
#                                       deployed endpoints measured again as a user does; the
#                                       console into $OUT/sweep-TAG.txt, the saved runs into
#                                       $OUT/sweep-TAG-reports.tar.gz
#   tests/gpu/host.sh gate accept|slow|dead
#                                       the upgrade gate as a user runs it (see step_gate)
#   tests/gpu/host.sh sleep             vLLM's sleep mode measured as the gate would use it
#   tests/gpu/host.sh sleep-bare        the same on a machine with the wheelhouse staged only
#   tests/gpu/host.sh stacks            where a start of the deployed unit spends its silent time:
#                                       every vLLM process's Python stacks, twice, after CUDA graph
#                                       capture and before the first /health 200 (into $OUT)
#   tests/gpu/host.sh kill9             kill -9 the unit's main PID: restart, readiness, no orphan
#                                       on the GPU (nvidia-smi), no leaked GPU memory
#   tests/gpu/host.sh bg NAME STEP ARGS...
#                                       run another step in a process session of its own, so it
#                                       outlives the device call (its output in $ST/bg-NAME/)
#   tests/gpu/host.sh wait NAME SECONDS  wait at most SECONDS for `bg NAME`, print its log's tail;
#                                       its whole console log, the tuner's journal and the GPU
#                                       record (smi) so far come into $OUT every time, and once
#                                       it ended, its files and exit status too
#   tests/gpu/host.sh smi               record the GPU's utilization, power, SM clock and memory
#                                       every 5 s into $ST/nvidia-smi.csv until the machine goes back
#   tests/gpu/host.sh acceptance        after `prepare`: deploy, re-run (changed=0), kill9, gate accept
#                                       and gate slow in auto mode, the tuner's screen; one verdict
#                                       row a step, the table into $OUT/acceptance.md (run it under bg);
#                                       GPU_HOST_ACCEPT_SKIP="sweep rerun kill9" leaves those steps
#                                       out (sweep: the first deploy's benchmark)
#   tests/gpu/host.sh collect           logs, journal, write-back, unit files into $OUT
#   tests/gpu/host.sh unitlog [INST]    the journal of vllm-INST.service (main), gzipped, into $OUT
#   tests/gpu/host.sh stop              stop the host
#   tests/gpu/host.sh caches-save       the service user's caches (vLLM compile, Inductor, Triton,
#                                       FlashInfer JIT) into $OUT as caches.tgz.partNN (15 MiB each)
#   tests/gpu/host.sh caches DIR        unpack DIR's caches.tgz.part* into the service user's home
#                                       (after a deploy made the user, before the engine's first start)
#
# State lives in /var/tmp/vd-gpu (not /tmp: the host gets a /tmp of its own); it survives between
# back-to-back calls on a warm machine. Results go to $OUT. Knobs: GPU_HOST_PYTHON (the image's
# interpreter, /opt/torch/.venv/bin/python3), GPU_HOST_DEPLOY_TIMEOUT (560 s).
set -u
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
ST=/var/tmp/vd-gpu
WH=$ST/wh
EXTRAS=$ST/extras
ANS=$ST/ans
HUBSITE=$ST/hub-site
HUBSTATE=$ST/hub
MODELS=$ST/models
KEY=$ST/ssh/id_ed25519
INV=$ST/inv
SSH_PORT=2222
HUB_PORT=8101
VLLM_PORT=8000
NAME=gpuhost
MNT=/mnt/vd-gpu-root
OUTD=${OUT:-$ST/out}
PY=${GPU_HOST_PYTHON:-/opt/torch/.venv/bin/python3}
ANSIBLE_WHEELS="ansible_core- resolvelib- cryptography- cffi- pycparser-"
export LC_ALL=C.UTF-8 PYTHONUNBUFFERED=1
# NVLink multicast stays off on these machines (harmless with one GPU), also in the units.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$ST" "$OUTD"

log() { echo "[$(date +%H:%M:%S)] $*"; }
ssh_host() { ssh -i "$KEY" -p "$SSH_PORT" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null \
  -o ConnectTimeout=5 -o LogLevel=ERROR root@127.0.0.1 "$@"; }

step_extras() { mkdir -p "$EXTRAS" && cp -r "$1"/. "$EXTRAS"/ && log "extras: $(find "$EXTRAS"/debs -mindepth 1 -maxdepth 1 | wc -l) debs, $(find "$EXTRAS"/hub -mindepth 1 -maxdepth 1 | wc -l) hub wheels"; }
step_stage() { mkdir -p "$WH" && cp "$1"/* "$WH"/ && log "$(basename "$1") staged: $(find "$WH" -mindepth 1 -maxdepth 1 | wc -l) files, $(du -sh "$WH" | cut -f1)"; }

have_lib() { ldconfig -p | grep -q "$1 "; }

step_boot() {
  local pid
  for pid in $(pgrep -f "systemd-nspawn --boot --register=no --keep-unit -D $MNT" 2>/dev/null); do
    log "stopping the host left by an earlier call (pid $pid)"; kill "$pid"
  done
  sleep 2; umount "$MNT" 2>/dev/null
  # Unpack each .deb into / (Ubuntu's /bin, /lib, /sbin are links into /usr: keep them), except
  # a library the image already has (never downgrade Ubuntu's libraries).
  local f base lib
  for f in "$EXTRAS"/debs/*.deb; do
    base=$(basename "$f")
    lib=""
    case $base in
      libbsd0_*) lib=libbsd.so.0 ;; libmd0_*) lib=libmd.so.0 ;; libedit2_*) lib=libedit.so.2 ;;
      libfido2-1_*) lib=libfido2.so.1 ;; libcbor0.8_*) lib=libcbor.so.0.8 ;; libexpat1_*) lib=libexpat.so.1 ;;
      libnsl2_*) lib=libnsl.so.2 ;; libbpf1_*) lib=libbpf.so.1 ;; libelf1_*) lib=libelf.so.1 ;;
      libmnl0_*) lib=libmnl.so.0 ;; libxtables12_*) lib=libxtables.so.12 ;; libdb5.3_*) lib=libdb-5.3.so ;;
      libtirpc3_*|libtirpc-common_*) lib=libtirpc.so.3 ;;
    esac
    [ -n "$lib" ] && have_lib "$lib" && continue
    dpkg-deb --fsys-tarfile "$f" | tar -C / --keep-directory-symlink -xf - || { echo "cannot unpack $base"; return 1; }
  done
  ldconfig
  getent passwd sshd >/dev/null || useradd -r -d /run/sshd -s /usr/sbin/nologin sshd
  getent passwd messagebus >/dev/null || useradd -r -d /nonexistent -s /usr/sbin/nologin messagebus
  getent group systemd-journal >/dev/null || groupadd -r systemd-journal
  ssh-keygen -A >/dev/null
  [ -f /etc/ssh/sshd_config ] || cp /usr/share/openssh/sshd_config /etc/ssh/sshd_config
  mkdir -p /etc/ssh/sshd_config.d /root/.ssh /run/sshd "$(dirname "$KEY")"
  printf 'Port %s\nListenAddress 127.0.0.1\nPermitRootLogin prohibit-password\nUsePAM no\n' "$SSH_PORT" \
    >/etc/ssh/sshd_config.d/vd-gpu-test.conf
  grep -q 'Include /etc/ssh/sshd_config.d' /etc/ssh/sshd_config || sed -i '1i Include /etc/ssh/sshd_config.d/*.conf' /etc/ssh/sshd_config
  [ -f "$KEY" ] || ssh-keygen -q -t ed25519 -N '' -f "$KEY"
  grep -qF "$(cat "$KEY.pub")" /root/.ssh/authorized_keys 2>/dev/null || cat "$KEY.pub" >>/root/.ssh/authorized_keys
  chmod 600 /root/.ssh/authorized_keys
  mkdir -p /etc/systemd/system/multi-user.target.wants
  ln -sf /lib/systemd/system/ssh.service /etc/systemd/system/multi-user.target.wants/ssh.service
  systemd-machine-id-setup >/dev/null 2>&1
  # A plain bind (not --rbind: nspawn refuses a pre-populated /dev) of the machine's root.
  mkdir -p "$MNT" && mount --bind / "$MNT" || return 1
  local binds=() d
  for d in /dev/nvidia0 /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools /dev/nvidia-caps; do
    [ -e "$d" ] && binds+=("--bind=$d")
  done
  # The container's systemd can give units no more open files than its own hard limit (the
  # machine's init leaves 20000): raise it where this machine allows.
  local rl=()
  prlimit --nofile=1048576:1048576 true 2>/dev/null && rl=(--rlimit=RLIMIT_NOFILE=1048576)
  local t0=$SECONDS
  setsid systemd-nspawn --boot --register=no --keep-unit -D "$MNT" -M "$NAME" "${binds[@]}" "${rl[@]}" \
    --bind-ro=/usr/local/nvidia >"$ST/nspawn.log" 2>&1 </dev/null &
  echo $! >"$ST/nspawn.pid"
  for _ in $(seq 60); do
    ssh_host true 2>/dev/null && break
    sleep 1
  done
  if ! ssh_host true; then tail -30 "$ST/nspawn.log"; return 1; fi
  log "host up after $((SECONDS - t0)) s: $(ssh_host "cat /proc/1/comm; systemctl is-system-running; PATH=\$PATH:/usr/local/nvidia/bin nvidia-smi -L" | tr '\n' ' ')"
}

install_ansible() {
  [ -x "$ANS/bin/ansible-playbook" ] && return 0
  local w=() p
  for p in $ANSIBLE_WHEELS; do w+=("$ST/ans-wh/$p"*.whl); done
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$ANS" "${w[@]}"
}

ansible_env() {
  export PATH=$ANS/bin:$PATH PYTHONPATH=$ANS ANSIBLE_CONFIG=$ROOT/ansible.cfg \
    ANSIBLE_HOME=$ST/ansible-home ANSIBLE_LOCAL_TEMP=$ST/ansible-tmp ANSIBLE_NOCOLOR=1
}

step_prepare() {
  "$PY" tests/gpu/check.py join-wheels "$WH" || return 1
  mkdir -p "$ST/ans-wh"
  local p
  for p in $ANSIBLE_WHEELS; do mv "$WH/$p"*.whl "$ST/ans-wh/" 2>/dev/null; done
  rm -f "$WH/manifest.json"
  install_ansible || { echo "ansible-core install failed"; return 1; }
  log "wheelhouse: $(find "$WH" -maxdepth 1 -name '*.whl' | wc -l) wheels; ansible-core $("$PY" -c 'import sys; sys.path.insert(0, "'"$ANS"'"); import ansible; print(ansible.__version__)')"
  # The Hub-compatible server (olah) and the model repositories it serves: config and tokenizer
  # only, the server runs with --load-format dummy.
  [ -d "$HUBSITE/olah" ] || "$PY" -m pip install -q --no-index --no-compile --find-links "$EXTRAS/hub" \
    --target "$HUBSITE" olah==0.5.4 || return 1
  "$PY" tests/gpu/check.py make-model "$MODELS/llama-0.9b-dummy" || return 1
  # GPU_HOST_MINIMAX_LAYERS: the MiniMax-M2.5 cut's depth (the fixture's 4 by default, about
  # 3.4 GiB of weights a layer: 24 layers are 84 GiB); a deeper cut puts more of each step on the GPU
  "$PY" tests/gpu/check.py make-arch tests/gpu/models/minimax-m2.5.json "$MODELS/minimax-m2.5-reduced" \
    ${GPU_HOST_MINIMAX_LAYERS:+--layers "$GPU_HOST_MINIMAX_LAYERS"} || return 1
  "$PY" tests/gpu/check.py make-arch tests/gpu/models/kimi-k2.5-text.json "$MODELS/kimi-k2.5-text-reduced" || return 1
  PYTHONPATH=$HUBSITE "$PY" tests/harness/hubserver.py stop --state-dir "$HUBSTATE" >/dev/null 2>&1
  rm -rf "$HUBSTATE"
  PYTHONPATH=$HUBSITE "$PY" tests/harness/hubserver.py start --state-dir "$HUBSTATE" --port "$HUB_PORT" \
    --olah-cli "$HUBSITE/bin/olah-cli" --model-dir "$MODELS/llama-0.9b-dummy" --repo gpu-check/llama-0.9b-dummy \
    --extra-repo "$MODELS/minimax-m2.5-reduced=gpu-check/minimax-m2.5-reduced" \
    --extra-repo "$MODELS/kimi-k2.5-text-reduced=gpu-check/kimi-k2.5-text-reduced" | tee "$ST/hub.json" || return 1
}

write_inventory() { # write_inventory MODEL
  local model=$1 torchsite sha repo profile served extra levels
  echo "$model" >"$ST/model"  # the gate's runs keep the model the host serves
  torchsite=$("$PY" -c "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))")
  case $model in
    llama) repo=gpu-check/llama-0.9b-dummy; profile=""; served=llama-0.9b-dummy
           levels="[1, 16, 128]"
           extra='vllm_service_args: [--load-format, dummy, --max-model-len, "4096"]' ;;
    minimax) repo=gpu-check/minimax-m2.5-reduced; profile=minimax-m2.5-tp4; served=minimax-m2.5-reduced
           levels="[1, 8, 32]"
           extra='vllm_service_profile_overrides: {parallel: {tensor: 1}, max_model_len: 8192}
vllm_service_extra_args: [--load-format, dummy]' ;;
    kimi) repo=gpu-check/kimi-k2.5-text-reduced; profile=kimi-k2.5-int4-tp8; served=kimi-k2.5-text-reduced
           levels="[1, 8, 32]"
           extra='vllm_service_profile_overrides: {parallel: {tensor: 1}, max_model_len: 8192}
vllm_service_extra_args: [--load-format, dummy]' ;;
    *) echo "unknown model $model"; return 2 ;;
  esac
  sha=$("$PY" -c "import json, sys; d = json.load(open('$ST/hub.json')); print(d['sha'] if d['repo'] == '$repo' else d['extra_repos']['$repo'])")
  mkdir -p "$INV/group_vars"
  cat >"$INV/hosts.yml" <<EOF
all:
  children:
    vllm_hosts:
      hosts:
        $NAME:
          ansible_host: 127.0.0.1
          ansible_port: $SSH_PORT
          ansible_user: root
          ansible_ssh_private_key_file: $KEY
          ansible_python_interpreter: /usr/bin/python3
          ansible_ssh_common_args: "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"
EOF
  cat >"$INV/group_vars/vllm_hosts.yml" <<EOF
# Written by tests/gpu/host.sh for model $model. Air-gapped: nothing is reachable from here.
# Every base package is on the image already (rsync and iproute2 are not, and are not needed).
host_prep_packages: [python3, python3-venv, ca-certificates, curl]
# The image's CUDA 13.0 toolkit (nvcc) at /usr/local/cuda; vLLM uses torch's bundled NCCL.
gpu_host_cuda_method: existing
gpu_host_cuda_existing_home: /usr/local/cuda
vllm_install_wheelhouse: $WH
vllm_install_wheelhouse_version: "0.25.0"
vllm_install_wheelhouse_no_deps: true
vllm_install_site_dirs: ["$torchsite"]
vllm_install_os_packages: []
vllm_install_python: $PY
vllm_install_flashinfer_extra_args: [--no-index, --find-links, $WH]
vllm_install_flashinfer_cubin_index_url: ""
vllm_install_flashinfer_jit_cache_index_url: ""
model_weights_source: hf
model_weights_endpoint: http://127.0.0.1:$HUB_PORT
model_weights_repo_id: $repo
model_weights_revision: "$sha"
model_weights_name: ${repo#*/}
model_weights_python: $PY
model_weights_downloader_pip_args: [--no-index, --find-links, $EXTRAS/hub]
vllm_service_profile: "$profile"
vllm_service_served_model_name: $served
vllm_service_host: 127.0.0.1
vllm_service_port: $VLLM_PORT
vllm_service_env: {NCCL_NVLS_ENABLE: "0", TORCH_SYMM_MEM_DISABLE_MULTICAST: "1", NVSHMEM_DISABLE_NVLS: "1"}
vllm_service_ready_timeout_s: 900
$extra
vllm_benchmark_levels: $levels
vllm_benchmark_duration_s: 8
vllm_benchmark_stop_on_saturation: false
vllm_benchmark_input_len: 128
vllm_benchmark_output_len: 128
vllm_benchmark_report_root: $ST/reports
EOF
}

step_deploy() { # step_deploy TAG [MODEL] [ansible-playbook args...]
  local tag=$1 model=${2:-llama} t0 rc
  shift 2 2>/dev/null || shift $#
  write_inventory "$model" || return 1
  ( ansible_env
    t0=$SECONDS
    timeout "${GPU_HOST_DEPLOY_TIMEOUT:-560}" ansible-playbook -i "$INV/hosts.yml" vllm_ops.deploy.deploy "$@" \
      >"$ST/deploy-$tag.log" 2>&1
    rc=$?
    echo "deploy $tag ($model) rc=$rc in $((SECONDS - t0)) s" | tee -a "$ST/deploy-$tag.log" "$OUTD/summary.txt" )
  grep -A3 'PLAY RECAP' "$ST/deploy-$tag.log" | tee -a "$OUTD/summary.txt"
  grep -E '^(fatal|failed):|FAILED!' -A12 "$ST/deploy-$tag.log" | head -60
  grep -E 'capacity plan|weights [0-9.]+ GiB per GPU|nvcc [0-9]|NCCL env|tools? .*found|dummy weights' "$ST/deploy-$tag.log" | head -8
  cp "$ST/deploy-$tag.log" "$OUTD/" 2>/dev/null
  tail -1 "$OUTD/summary.txt" | grep -q 'rc=0'
}

step_bench() { # step_bench TAG LEVELS: against the deployed llama (deploy TAG llama first)
  local tag=$1 levels=$2 vpy=/opt/vllm-deploy/current/bin/python extra=()
  read -r -a extra <<<"${GPU_HOST_BENCH_ARGS:-}"  # more arguments, split on spaces
  timeout "${GPU_HOST_BENCH_TIMEOUT:-580}" "$PY" tests/benchmarks/bench_sweep_vs_vllm.py --vllm-python "$vpy" \
    --model-dir "$MODELS/llama-0.9b-dummy" --model llama-0.9b-dummy --base-url "http://127.0.0.1:$VLLM_PORT" \
    --levels "$levels" --input-len 128 --output-len 128 --duration-s "${GPU_HOST_BENCH_DURATION:-15}" \
    --vocab-size 2048 --reps "${GPU_HOST_BENCH_REPS:-3}" --time-budget-s "${GPU_HOST_BENCH_BUDGET:-540}" \
    --json-out "$OUTD/bench-$tag.json" "${extra[@]}" 2>&1 | tee "$OUTD/bench-$tag.txt"
  cp /tmp/bench-sweep-*/children.log "$OUTD/bench-children-$tag.log" 2>/dev/null
  return 0
}

tune_site() { # the controller side of the vllm_deploy CLI: ansible-runner and rich from extras/tune
  [ -d "$ST/tune-site/ansible_runner" ] ||
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$ST/tune-site" "$EXTRAS"/tune/*.whl
}

step_sweep() { # step_sweep TAG ARGS...: `vllm-deploy sweep` over the inventory `deploy` wrote
  local tag=$1 rc
  shift
  tune_site || return 1
  ( ansible_env
    export PYTHONPATH=$ROOT:$ANS:$ST/tune-site PYTHONUNBUFFERED=1
    "$PY" -m vllm_deploy sweep -i "$INV/hosts.yml" -l "$NAME" "$@" 2>&1 | tee "$OUTD/sweep-$tag.txt"
    exit "${PIPESTATUS[0]}" )
  rc=$?
  [ -d "$INV/.reports/$NAME" ] && tar -C "$INV/.reports" -czf "$OUTD/sweep-$tag-reports.tar.gz" "$NAME"
  return $rc
}

step_tune() { # step_tune ARGS...: the tuner over the inventory `deploy` wrote
  tune_site || return 1
  local rc
  ( ansible_env
    export PYTHONPATH=$ROOT:$ANS:$ST/tune-site
    "$PY" -m vllm_deploy tune -i "$INV/hosts.yml" --host "$NAME" "$@" 2>&1 | tee "$OUTD/tune.txt"
    exit "${PIPESTATUS[0]}" )
  rc=$?
  cp "$INV/host_vars/$NAME/vllm_tune.yml" "$OUTD/" 2>/dev/null
  [ -d "$INV/.reports/$NAME/tune" ] && tar -C "$INV/.reports/$NAME" -czf "$OUTD/tune-reports.tar.gz" tune
  return $rc
}

step_screen_grid() { # step_screen_grid ARGS...: the tuner's screen, then the grid over the same
  # candidates resumed from the screen's journal (both one round, so their windows match). The
  # screen leaves its last candidate serving, so the grid starts at once; the grid serves the
  # default again (its anchor), what the screen did not serve, and the default last. Each run's
  # console, write-back and reports go into $OUT as tune-screen* and tune-grid*.
  local rc=0 j
  step_tune --strategy screen --rounds 1 --minutes "${GPU_HOST_SCREEN_MINUTES:-10}" --no-restore "$@" || rc=$?
  keep_tune_outputs screen $rc
  j=$(ls -td "$INV/.reports/$NAME/tune"/*/ 2>/dev/null | head -n 1)
  [ -s "$j/measurements.jsonl" ] || { log "screen-grid: the screen left no journal"; return 1; }
  step_tune --strategy grid --rounds 1 --minutes "${GPU_HOST_GRID_MINUTES:-8}" --resume "$j" "$@" || rc=$?
  keep_tune_outputs grid $rc
  return $rc
}
keep_tune_outputs() { # keep_tune_outputs RUN RC: step_tune's fixed file names, renamed for RUN
  mv "$OUTD/tune.txt" "$OUTD/tune-$1.txt" 2>/dev/null
  mv "$OUTD/vllm_tune.yml" "$OUTD/vllm_tune-$1.yml" 2>/dev/null
  mv "$OUTD/tune-reports.tar.gz" "$OUTD/tune-$1-reports.tar.gz" 2>/dev/null
  log "screen-grid: the $1 ended, rc $2"
}

step_kill9() {
  "$PY" - "$KEY" "$SSH_PORT" "$VLLM_PORT" <<'EOF' | tee -a "$OUTD/summary.txt"
import json, subprocess, sys, time, urllib.request
key, port, vport = sys.argv[1:4]
def sh(cmd):
    return subprocess.run(["ssh", "-i", key, "-p", port, "-o", "StrictHostKeyChecking=no",
                           "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
                           "root@127.0.0.1", cmd], capture_output=True, text=True).stdout.strip()
def show():
    out = dict(l.split("=", 1) for l in sh("systemctl show -p MainPID,NRestarts,ActiveState,ControlGroup vllm-main.service").splitlines())
    pids = sh("cat /sys/fs/cgroup%s/cgroup.procs 2>/dev/null | sort -n" % out["ControlGroup"]).split()
    return out, pids
def gpu():
    q = sh("/usr/local/nvidia/bin/nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits")
    apps = [tuple(int(x) for x in l.split(",")) for l in q.splitlines() if l.strip()]
    used = int(sh("/usr/local/nvidia/bin/nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0"))
    return apps, used
def healthy():
    try:
        with urllib.request.urlopen("http://127.0.0.1:%s/health" % vport, timeout=3) as r:
            return r.status == 200
    except OSError:
        return False
before, old_pids = show()
apps0, used0 = gpu()
print("before: MainPID %s NRestarts %s, %d processes in the unit's cgroup, GPU apps %s, GPU memory used %d MiB"
      % (before["MainPID"], before["NRestarts"], len(old_pids), apps0, used0))
t0 = time.time()
sh("kill -9 %s" % before["MainPID"])
down = None
while time.time() - t0 < 600:
    st, pids = show()
    if st["MainPID"] not in ("0", before["MainPID"]) and st["ActiveState"] == "active" and healthy():
        break
    time.sleep(1)
ready = time.time() - t0
st, new_pids = show()
left = sorted(set(old_pids) - set(new_pids) & set(sh("ls /proc").split()))
apps1, used1 = gpu()
orphans = [a for a in apps1 if str(a[0]) not in new_pids]
print("after: MainPID %s NRestarts %s, healthy again %.0f s after kill -9; old processes left: %s; "
      "GPU apps %s, of them outside the unit: %s; GPU memory used %d MiB (before %d)"
      % (st["MainPID"], st["NRestarts"], ready, left or "none", apps1, orphans or "none", used1, used0))
ok = (int(st["NRestarts"]) == int(before["NRestarts"]) + 1 and healthy() and not left and not orphans
      and used1 <= used0 * 1.05 + 512)
print("kill9 %s" % ("PASSED" if ok else "FAILED"))
sys.exit(0 if ok else 1)
EOF
}

# The upgrade gate on the GPU (after `deploy first llama`), with the defaults: one GPU, all in
# use by the serving instance (no GPU set declared), so auto must pick the maintenance window.
# `gate accept`: a real pin change from the same wheelhouse (one more, empty, site directory
# makes a new pin and venv) that the gate must accept, with the window's downtime.
# `gate slow`: molecule/install's injected regression (every engine step 50 ms slower) in the
# previous venv, and the pin switched back to it: the gate must reject, print the table, and
# the accepted version serve again.
# `gate dead`: a pin change of its own (another empty site directory), vllm_install_gate_mode forced to beside:
# the candidate cannot get the GPU and dies at start; the wait must end within seconds with
# vLLM's error line, the gate reject, and the serving version never stop.
step_gate() { # step_gate accept|slow|dead
  local what=$1 prev cur site t0
  write_inventory "$(cat "$ST/model" 2>/dev/null || echo llama)" || return 1
  mkdir -p "$ST/gate-site"
  site=$("$PY" -c "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))")
  cat >>"$INV/group_vars/vllm_hosts.yml" <<EOF
vllm_install_gate_levels: [1, 16]
vllm_install_gate_duration_s: 8
vllm_install_gate_history_path: $ST/vllm_upgrades.yml
EOF
  case $what in
    accept) echo "vllm_install_site_dirs: [\"$site\", \"$ST/gate-site\"]" >>"$INV/group_vars/vllm_hosts.yml" ;;
    dead) mkdir -p "$ST/gate-dead-site"
      printf 'vllm_install_gate_mode: beside\nvllm_install_site_dirs: ["%s", "%s"]\n' "$site" "$ST/gate-dead-site" \
        >>"$INV/group_vars/vllm_hosts.yml" ;;
    slow)
      cur=$(ssh_host readlink -f /opt/vllm-deploy/current)
      prev=$(ssh_host "ls -d /opt/vllm-deploy/venvs/*" | grep -vx "$cur" | head -1)
      ssh_host "cat >$prev/lib/python3.12/site-packages/vd_gate_regression.py" <"$ROOT/molecule/install/files/vd_gate_regression.py"
      echo 'import vd_gate_regression; vd_gate_regression.install("slow")' |
        ssh_host "cat >$prev/lib/python3.12/site-packages/vd_gate_regression.pth" ;;
  esac
  ssh_host "systemctl show -p MainPID,NRestarts vllm-main.service" >"$ST/gate-$what.before"
  t0=$SECONDS
  ( ansible_env
    timeout "${GPU_HOST_DEPLOY_TIMEOUT:-560}" ansible-playbook -i "$INV/hosts.yml" vllm_ops.deploy.deploy \
      >"$ST/gate-$what.log" 2>&1
    echo "gate $what rc=$? in $((SECONDS - t0)) s" | tee -a "$ST/gate-$what.log" "$OUTD/summary.txt" )
  grep -E 'Upgrade gate|[|] conc [|]|^[|] [0-9]|correctness [(]greedy|verdict:|down [0-9]+ s|is gone|waited [0-9]+ s|interrupted upgrade gate' "$ST/gate-$what.log" | cut -c1-600 | head -30
  echo "serving unit before: $(tr '\n' ' ' <"$ST/gate-$what.before"); after: $(ssh_host "systemctl show -p MainPID,NRestarts vllm-main.service" | tr '\n' ' ')" | tee -a "$OUTD/summary.txt"
  ssh_host "ls /run/vllm-gate-* 2>&1; systemctl list-units --all --plain --no-legend 'vllm-gate-*'" | sed 's/^/leftovers: /' | tee -a "$OUTD/summary.txt"
  cp "$ST/gate-$what.log" "$ST/vllm_upgrades.yml" "$OUTD/" 2>/dev/null
  if [ "$what" = slow ]; then ssh_host "rm -f $prev/lib/python3.12/site-packages/vd_gate_regression.p*"; fi
  return 0
}

# vLLM's sleep mode measured as the gate would use it (tests/gpu/sleep_mode.py): the deployed
# unit is stopped for it and started again after.
step_sleep() {
  local vpy=/opt/vllm-deploy/current/bin/python
  ssh_host "systemctl stop vllm-main.service"
  timeout "${GPU_HOST_SLEEP_TIMEOUT:-540}" "$vpy" tests/gpu/sleep_mode.py --python "$vpy" \
    --model-dir "$MODELS/llama-0.9b-dummy" --levels "${GPU_HOST_SLEEP_LEVELS:-1,16}" \
    --duration-s "${GPU_HOST_SLEEP_DURATION:-6}" --json-out "$OUTD/sleep.json" 2>&1 | tee "$OUTD/sleep.txt"
  ssh_host "systemctl start vllm-main.service"
  return 0
}

# vLLM's sleep mode on a bare machine (no test host, no deploy): the staged wheelhouse
# installed with --no-deps into a site directory over the image's torch, the dummy Llama, then
# tests/gpu/sleep_mode.py. For a lease too short for the deploy sequence.
step_sleep_bare() {
  local site=$ST/bare-site
  "$PY" tests/gpu/check.py join-wheels "$WH" || return 1
  if [ ! -d "$site/vllm" ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$site" \
      $(ls "$WH"/*.whl | grep -vE '/(ansible_core|resolvelib|cryptography|cffi|pycparser|torch)-') || return 1
  fi
  "$PY" tests/gpu/check.py make-model "$MODELS/llama-0.9b-dummy" >/dev/null || return 1
  # Server A (a cold start: no compile or JIT cache yet) dumps its Python stacks every
  # GPU_HOST_SLEEP_STACKS_S seconds into its log: where a cold start's quiet stretch goes
  # (sitecustomize: a .pth is not read from a PYTHONPATH directory).
  printf 'import os, faulthandler\nif os.environ.get("VD_DUMP_STACKS_EVERY_S"):\n    faulthandler.dump_traceback_later(float(os.environ["VD_DUMP_STACKS_EVERY_S"]), repeat=True)\n' \
    >"$site/sitecustomize.py"
  touch "$ST/sleep-bare.start"
  PATH=$site/bin:$PATH PYTHONPATH=$site timeout "${GPU_HOST_SLEEP_TIMEOUT:-560}" "$PY" tests/gpu/sleep_mode.py \
    --python "$PY" --model-dir "$MODELS/llama-0.9b-dummy" --levels "${GPU_HOST_SLEEP_LEVELS:-1,16}" \
    --duration-s "${GPU_HOST_SLEEP_DURATION:-6}" --start-timeout-s "${GPU_HOST_SLEEP_START_TIMEOUT:-300}" \
    --stacks-every-s "${GPU_HOST_SLEEP_STACKS_S:-30}" --json-out "$OUTD/sleep.json" 2>&1 | tee "$OUTD/sleep.txt"
  # what the cold start wrote into the caches (compile, flashinfer JIT), by size
  find /root/.cache -mindepth 1 -maxdepth 3 -newer "$ST/sleep-bare.start" -type d -exec du -sh {} + 2>/dev/null |
    sort -h | tail -20 | tee "$OUTD/caches.txt"
  return 0
}

# Every start on the H200 logs nothing for about 80 s between "Graph capturing finished" and
# the first /health 200. A .pth in the serving venv registers faulthandler on SIGUSR2 (stacks of
# every thread to stderr, so into the journal); the unit restarts, and 15 s and 45 s after the
# capture every Python process of its cgroup gets SIGUSR2. The .pth is removed afterwards.
step_stacks() {
  local cur sp t0 n pids
  cur=$(ssh_host readlink -f /opt/vllm-deploy/current)
  sp=$cur/lib/python3.12/site-packages
  echo 'import faulthandler, signal; faulthandler.register(signal.SIGUSR2, all_threads=True)' |
    ssh_host "cat >$sp/vd_stacks.pth"
  t0=$(ssh_host date +%s)
  ssh_host "systemctl restart vllm-main.service"
  for n in $(seq 1 300); do
    ssh_host "journalctl -u vllm-main.service --since @$t0 --no-pager -o cat | grep -q 'Graph capturing finished'" && break
    sleep 1
  done
  log "graph capture seen after $(( $(ssh_host date +%s) - t0 )) s"
  for n in 15 30; do
    sleep "$n"
    pids=$(ssh_host "for p in \$(cat /sys/fs/cgroup/system.slice/vllm-main.service/cgroup.procs); do
      readlink /proc/\$p/exe | grep -q python && echo \$p; done" | tr '\n' ' ')
    log "SIGUSR2 to $pids ($(( $(ssh_host date +%s) - t0 )) s after the restart)"
    ssh_host "kill -USR2 $pids"
  done
  for n in $(seq 1 300); do
    ssh_host "curl -sf -o /dev/null http://127.0.0.1:$VLLM_PORT/health" && break
    sleep 1
  done
  log "healthy $(( $(ssh_host date +%s) - t0 )) s after the restart"
  ssh_host "rm -f $sp/vd_stacks.pth"
  ssh_host "journalctl -u vllm-main.service --since @$t0 --no-pager -o short-iso" >"$OUTD/stacks.txt"
  grep -E 'File "|Thread 0x|Current thread|Graph capturing|init engine|Starting vLLM|startup complete' "$OUTD/stacks.txt" |
    grep -vE 'threading.py|concurrent/futures' | cut -c1-220 | head -120
  return 0
}

# One acceptance sequence, after staging and `prepare`, as a user runs the features on one GPU
# with the defaults (one instance, no GPU set declared, `vllm_install_gate_mode` auto): a bare
# host to serving, the re-run (changed=0), kill -9 recovery, the upgrade gate accepting a good
# pin and rejecting a slow one, then the tuner's screen on the MiniMax-M2.5 cut within what is
# left of GPU_HOST_ACCEPT_BUDGET_S (1,380 s from its start; the grid is a step of its own). Each
# step's verdict is checked here and printed as a table row as it ends (the console log comes
# back with every `wait`), and the table is written to $OUT/acceptance.md. Exit 0 only when every
# step that ran passed.
step_acceptance() {
  local t0=$SECONDS t rep=$OUTD/acceptance.md failed=0 cur before left mins
  accept_row() { # accept_row STEP VERDICT DETAIL SECONDS
    printf '| %s | %s | %s | %s |\n' "$1" "$2" "$3" "$4" | tee -a "$rep"
    [ "$2" = PASS ] || [ "$2" = "not run" ] || failed=1
  }
  printf '| step | verdict | what was checked | s |\n| --- | --- | --- | ---: |\n' | tee "$rep"
  step_smi >/dev/null
  t=$SECONDS
  local first_args=()
  skipped sweep && first_args=(--skip-tags vllm_benchmark)
  if step_deploy first llama "${first_args[@]}" >/dev/null; then
    accept_row "bare host to serving (deploy first llama)" PASS "rc=0, $(recap first)" $((SECONDS - t))
  else
    accept_row "bare host to serving (deploy first llama)" FAIL "$(recap first); see deploy-first.log" $((SECONDS - t))
    return 1
  fi
  t=$SECONDS
  if skipped rerun; then
    accept_row "re-run (deploy second llama)" "not run" "left out by GPU_HOST_ACCEPT_SKIP" 0
  # the re-run leaves out what the first run left out: a sweep it never ran is new work, not drift
  elif step_deploy second llama "${first_args[@]}" >/dev/null && recap second | grep -q ' changed=0 '; then
    accept_row "re-run (deploy second llama)" PASS "rc=0, changed=0: $(recap second)" $((SECONDS - t))
  else
    accept_row "re-run (deploy second llama)" FAIL "$(recap second)" $((SECONDS - t))
  fi
  t=$SECONDS
  if skipped kill9; then
    accept_row "kill -9 recovery (kill9)" "not run" "left out by GPU_HOST_ACCEPT_SKIP" 0
  elif step_kill9 >"$ST/kill9.txt" 2>&1; then
    accept_row "kill -9 recovery (kill9)" PASS "$(grep -o 'healthy again [0-9]* s after kill -9; old processes left: [a-z]*' "$ST/kill9.txt"), no GPU process outside the unit" $((SECONDS - t))
  else
    accept_row "kill -9 recovery (kill9)" FAIL "$(tail -2 "$ST/kill9.txt" | tr '\n' ' ')" $((SECONDS - t))
  fi
  cp "$ST/kill9.txt" "$OUTD/" 2>/dev/null
  t=$SECONDS
  step_gate accept >/dev/null
  if grep -q 'Upgrade gate, window mode (' "$ST/gate-accept.log" && grep -q 'Upgrade gate accepted' "$ST/gate-accept.log" \
      && grep -q 'gate accept rc=0' "$ST/gate-accept.log" && ! gate_leftovers && ssh_host "curl -sf -o /dev/null http://127.0.0.1:$VLLM_PORT/health"; then
    accept_row "gate, a good pin (gate accept, auto)" PASS "auto chose window; ACCEPT; $(gate_facts accept)" $((SECONDS - t))
  else
    accept_row "gate, a good pin (gate accept, auto)" FAIL "$(gate_facts accept); see gate-accept.log" $((SECONDS - t))
  fi
  before=$(ssh_host readlink -f /opt/vllm-deploy/current)
  t=$SECONDS
  if ! grep -q 'Upgrade gate accepted' "$ST/gate-accept.log"; then
    # the slow pin is the accepted pin's predecessor: without an accepted pin it is no pin change
    accept_row "gate, a slow pin (gate slow, auto)" "not run" "the good pin was not accepted, so switching back to the first venv is no pin change" 0
  else
    step_gate slow >/dev/null
    cur=$(ssh_host readlink -f /opt/vllm-deploy/current)
    if grep -q 'Upgrade gate, window mode (' "$ST/gate-slow.log" && grep -q 'Upgrade gate REJECTED' "$ST/gate-slow.log" \
        && [ "$cur" = "$before" ] && ! gate_leftovers && ssh_host "curl -sf -o /dev/null http://127.0.0.1:$VLLM_PORT/health"; then
      accept_row "gate, a slow pin (gate slow, auto)" PASS "auto chose window; REJECT; the accepted venv serves again; $(gate_facts slow)" $((SECONDS - t))
    else
      accept_row "gate, a slow pin (gate slow, auto)" FAIL "current $cur (before $before); $(gate_facts slow); see gate-slow.log" $((SECONDS - t))
    fi
  fi
  # The tuner gets what is left of the budget, less the MiniMax deploy (280 s on 2026-12-04) and the restore.
  left=$(( ${GPU_HOST_ACCEPT_BUDGET_S:-1380} - (SECONDS - t0) ))
  mins=$(( (left - 300 - 120) / 60 ))
  if [ "$mins" -lt 3 ]; then
    accept_row "tuner (screen, MiniMax-M2.5 cut)" "not run" "${left} s of the budget left, less than the deploy, 3 minutes of search and the restore" 0
  else
    t=$SECONDS
    if ! GPU_HOST_DEPLOY_TIMEOUT=400 step_deploy tune minimax --skip-tags vllm_benchmark >/dev/null; then
      accept_row "tuner (screen, MiniMax-M2.5 cut)" FAIL "the MiniMax deploy failed: $(recap tune)" $((SECONDS - t))
    else
      local td=$((SECONDS - t))
      t=$SECONDS
      if step_tune --profile minimax-m2.5-tp4 --profile-overrides '{"parallel": {"tensor": 1}, "max_model_len": 8192}' \
          --extra-args "--load-format dummy" --gpus 1 --gpu-memory-mib "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0)" \
          --model-config "$MODELS/minimax-m2.5-reduced/config.json" --slo mlperf-interactive --also-slo mlperf-server --params-b 229 \
          --strategy screen --minutes "$mins" --candidates 8 --levels 1,64 --window 6 --rounds 2 --input-len 256 --output-len 128 \
          --ep false,true --knob max-num-seqs=default,512 --knob kv-cache-dtype=default,fp8 >"$ST/tune-accept.txt" 2>&1; then
        accept_row "tuner (screen, MiniMax-M2.5 cut)" PASS "deploy ${td} s; $(grep -A1 -m1 '^winner:' "$OUTD/tune.txt" | tr '\n' ' ' | cut -c1-240)" $((SECONDS - t))
      else
        accept_row "tuner (screen, MiniMax-M2.5 cut)" FAIL "$(tail -3 "$OUTD/tune.txt" | tr '\n' ' ' | cut -c1-300)" $((SECONDS - t))
      fi
    fi
  fi
  echo "acceptance: $([ $failed = 0 ] && echo PASSED || echo FAILED) in $((SECONDS - t0)) s" | tee -a "$rep"
  return $failed
}
# GPU_HOST_ACCEPT_SKIP: steps left out of the sequence when a lease is short ("sweep rerun kill9";
# sweep is the first deploy's benchmark); each other shows as "not run" in the table
skipped() { case " ${GPU_HOST_ACCEPT_SKIP:-} " in *" $1 "*) return 0 ;; esac; return 1; }
recap() { grep -A1 'PLAY RECAP' "$ST/deploy-$1.log" 2>/dev/null | tail -1 | sed 's/^[^:]*: *//; s/  */ /g'; }
gate_leftovers() { ssh_host "ls /run/vllm-gate-* 2>/dev/null; systemctl list-units --all --plain --no-legend 'vllm-gate-*'" | grep -q .; }
gate_facts() { # the gate's verdict line, its downtime and its rc, from its log
  { grep -o 'verdict: [A-Z]*' "$ST/gate-$1.log" | tail -1; grep -oE 'down [0-9]+ s' "$ST/gate-$1.log" | tail -1
    grep -o "gate $1 rc=[0-9]* in [0-9]* s" "$ST/gate-$1.log"; } | tr '\n' ';' | sed 's/;$//; s/;/; /g'
}

step_collect() {
  # vLLM's own account of each start: weights, KV cache, graphs, compile, limits, warnings
  ssh_host "journalctl -u vllm-main.service --no-pager -o short-iso | grep -E 'Model loading took|Available KV cache|GPU KV cache size|Maximum concurrency|Graph capturing|torch.compile took|ulimit|Using .*backend|JIT|WARNING|ERROR|Started|Stopped|Main process exited'" \
    >"$ST/journal-key.txt" 2>&1
  ssh_host 'journalctl -u vllm-main.service --no-pager -o short-iso | gzip' >"$ST/journal.txt.gz" 2>/dev/null
  ssh_host 'cat /etc/systemd/system/vllm-main.service; systemctl show vllm-main.service -p Environment,MainPID,NRestarts' >"$ST/unit.txt" 2>&1
  local found
  mapfile -t found < <(cd "$ST" && ls -d deploy-*.log reports 2>/dev/null)
  tar -C "$ST" -czf "$OUTD/gpu-host.tar.gz" --ignore-failed-read journal-key.txt journal.txt.gz unit.txt \
    inv hub.json "${found[@]}" 2>/dev/null
  cp "$ST/journal-key.txt" "$OUTD/" 2>/dev/null
  log "collected: $(find "$OUTD" -mindepth 1 -maxdepth 1 -printf '%f ')"
}

step_bg() { # step_bg NAME STEP ARGS...: a step that outlives this call (one device call is
  # at most 10 minutes; the tuner's screen and grid take longer)
  local name=$1 dir
  shift
  dir=$ST/bg-$name
  rm -rf "$dir" && mkdir -p "$dir/out" || return 1
  OUT=$dir/out setsid bash -c 'd=$1; shift; "$0" "$@" >"$d/log" 2>&1; echo $? >"$d/rc"' \
    "$ROOT/tests/gpu/host.sh" "$dir" "$@" </dev/null >/dev/null 2>&1 &
  log "bg $name: started '$*' (pid $!)"
}

step_wait() { # step_wait NAME SECONDS
  local name=$1 limit=$2 dir t0=$SECONDS
  dir=$ST/bg-$name
  [ -d "$dir" ] || { log "wait $name: no such background step"; return 2; }
  while [ ! -s "$dir/rc" ] && [ $((SECONDS - t0)) -lt "$limit" ]; do sleep 5; done
  tail -n 40 "$dir/log" 2>/dev/null
  # what the step printed and the GPU did so far, in case no later call reaches this machine
  cp "$dir/log" "$OUTD/bg-$name.log" 2>/dev/null
  [ -s "$ST/nvidia-smi.csv" ] && cp "$ST/nvidia-smi.csv" "$OUTD/nvidia-smi.csv"
  if [ -s "$dir/rc" ]; then
    cp -r "$dir/out/." "$OUTD/" 2>/dev/null
    log "wait $name: ended, rc $(cat "$dir/rc"), after $((SECONDS - t0)) s of waiting"
    return "$(cat "$dir/rc")"
  fi
  # what the tuner measured so far (its journal), in case no later call sees the step end
  local j
  j=$(ls -t "$INV"/.reports/*/tune/*/measurements.jsonl 2>/dev/null | head -n 1)
  [ -n "$j" ] && cp "$j" "$OUTD/bg-$name-measurements.jsonl"
  log "wait $name: still running after $((SECONDS - t0)) s of waiting"
  return 124
}

step_smi() { # step_smi: nvidia-smi every 5 s into $ST/nvidia-smi.csv, in a session of its own
  pgrep -f "nvidia-smi --query-gpu=timestamp" >/dev/null && { log "smi: already recording"; return 0; }
  setsid nvidia-smi --query-gpu=timestamp,utilization.gpu,power.draw,clocks.sm,memory.used \
    --format=csv -l 5 >"$ST/nvidia-smi.csv" 2>&1 </dev/null &
  log "smi: recording into $ST/nvidia-smi.csv (pid $!)"
}

step_unitlog() { # step_unitlog [INSTANCE]: the instance's journal, times to the microsecond
  local u=vllm-${1:-main}.service
  ssh_host journalctl -u "$u" --no-pager -o short-iso-precise | gzip > "$OUTD/unit-${1:-main}.log.gz"
  log "unitlog: $u, $(zcat "$OUTD/unit-${1:-main}.log.gz" | wc -l) lines"
}

# The service user's caches that a cold start fills (vLLM's torch.compile cache, Inductor,
# Triton, FlashInfer's JIT builds): kept from one lease (caches-save, at most 45 MiB) and
# unpacked into the next lease's host after the deploy made the user and before the engine's
# first start (caches DIR), so that start does not build them again. H100 and H200 are both
# sm_90: what one builds the other loads.
CACHE_DIRS=".cache/vllm .cache/torchinductor .cache/triton .cache/flashinfer"
service_home() { ssh_host "getent passwd ${GPU_HOST_SERVICE_USER:-vllm} | cut -d: -f6"; }

step_caches_save() { # step_caches_save: the caches into $OUT as caches.tgz.partNN, 15 MiB each
  local home
  home=$(service_home)
  [ -n "$home" ] || { log "caches-save: no service user on the host"; return 1; }
  [ -n "$(ssh_host "cd '$home' && ls -d $CACHE_DIRS 2>/dev/null")" ] ||
    { log "caches-save: none of $CACHE_DIRS in $home (no engine started yet)"; return 1; }
  ssh_host "cd '$home' && du -sh $CACHE_DIRS >&2 2>/dev/null; tar -czf - \$(ls -d $CACHE_DIRS 2>/dev/null)" \
    >"$ST/caches.tgz" 2>"$ST/caches.du" || { cat "$ST/caches.du"; return 1; }
  cat "$ST/caches.du"
  if [ "$(stat -c %s "$ST/caches.tgz")" -gt $((45 * 1024 * 1024)) ]; then
    log "caches-save: $(du -h "$ST/caches.tgz" | cut -f1) compressed, over the 45 MiB that come back"
    return 1
  fi
  rm -f "$OUTD"/caches.tgz.part*
  split -b 15m -d -a 2 "$ST/caches.tgz" "$OUTD/caches.tgz.part"
  log "caches-save: $(du -h "$ST/caches.tgz" | cut -f1) in $(ls "$OUTD"/caches.tgz.part* | wc -l) parts ($(sha256sum "$ST/caches.tgz" | cut -c1-16))"
}

step_caches() { # step_caches DIR: DIR's caches.tgz.part* into the service user's home
  local home
  home=$(service_home)
  [ -n "$home" ] || { log "caches: no service user on the host yet (deploy first)"; return 1; }
  ls "$1"/caches.tgz.part* >/dev/null 2>&1 || { log "caches: no caches.tgz.part* in $1"; return 1; }
  cat "$1"/caches.tgz.part* | ssh_host "cd '$home' && tar -xzf - && chown -R ${GPU_HOST_SERVICE_USER:-vllm}: .cache && du -sh $CACHE_DIRS 2>/dev/null" \
    && log "caches: unpacked into $home ($(cat "$1"/caches.tgz.part* | sha256sum | cut -c1-16))"
}

step_stop() {
  local pid
  for pid in $(pgrep -f "systemd-nspawn --boot --register=no --keep-unit -D $MNT" 2>/dev/null); do kill "$pid"; done
}

case ${1:-} in
  extras) step_extras "$2" ;;
  stage) step_stage "$2" ;;
  boot) step_boot ;;
  prepare) step_prepare ;;
  deploy) shift; step_deploy "$@" ;;
  bench) step_bench "$2" "$3" ;;
  tune) shift; step_tune "$@" ;;
  screen-grid) shift; step_screen_grid "$@" ;;
  sweep) shift; step_sweep "$@" ;;
  kill9) step_kill9 ;;
  stacks) step_stacks ;;
  gate) step_gate "$2" ;;
  sleep) step_sleep ;;
  sleep-bare) step_sleep_bare ;;
  acceptance) step_acceptance ;;
  collect) step_collect ;;
  unitlog) step_unitlog "${2:-}" ;;
  smi) step_smi ;;
  stop) step_stop ;;
  caches-save) step_caches_save ;;
  caches) step_caches "$2" ;;
  bg) shift; step_bg "$@" ;;
  wait) step_wait "$2" "$3" ;;
  *) sed -n '2,/^# State lives/p' "$0" | sed '$d'; exit 2 ;;
esac
