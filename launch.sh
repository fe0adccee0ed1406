#!/usr/bin/env bash
# RLAX-style GRPO on one machine: a parameter server, a verifier, N inference workers and a trainer,
# each its own process on loopback ZeroMQ sockets.
#
# Hardware: the defaults are sized for a 2-core CPU with no accelerator; they train the embedded
# 0.8M-parameter cold-start policy (checkpoints/coldstart) on the built-in function-synthesis task.
# Wall time and the expected result on such a machine are in README.md ("Results"). On a TPU or GPU VM
# (pip install -r requirements-tpu.txt or requirements-gpu.txt) the chips are found and split: the
# trainer gets half of them, each worker one of the rest (or WORKER_CHIPS), the parameter server and
# the verifier stay on the CPU (devices.py says how, and why).
#
#   bash launch.sh                                    # the default run, no downloads
#   MAX_STALENESS=2 WORKERS=2 STEPS=100 bash launch.sh   # asynchronous, off-policy by up to 2 versions
#   BF16_FIX=0 bash launch.sh                         # reproduce RLAX's bf16 sampler/trainer mismatch
#   MODEL=/path/to/hf_checkpoint DATA=problems.jsonl bash launch.sh   # a real model on real problems
#   DRY_RUN=1 ACCELERATOR=tpu CHIPS=8 bash launch.sh  # print where each role would run, start nothing
#
# Everything lands in $RUN_DIR: one log per role, commands.sh (every role's exact line, its device
# variables included: run a line to restart that role by hand on the same chips), pids/<role>,
# restarts.json, metrics.jsonl, ledger.jsonl, the trainer's checkpoints and, at the end, final/ (the
# trained policy in Hugging Face layout). A role that dies is restarted (the trainer with --resume);
# Ctrl-C, the end of the run, or a role that keeps dying stops every process this script started.
# RESUME=1 continues a run dir from its last checkpoint.
set -euo pipefail
cd "$(dirname "$0")"

RUN_DIR=${RUN_DIR:-runs/$(date +%Y%m%d-%H%M%S)}
STEPS=${STEPS:-250}                 # optimizer steps
WORKERS=${WORKERS:--1}              # inference workers; -1 = 2 on the CPU, else one per WORKER_CHIPS left
MAX_STALENESS=${MAX_STALENESS:-0}   # 0 = strict on-policy; k = rollouts up to k versions old are used
PULL_EVERY=${PULL_EVERY:-1}         # workers check for new weights every this many batches
MODEL=${MODEL:-checkpoints/coldstart}
DATA=${DATA:-}                      # JSONL problems; empty = the embedded task
SEED=${SEED:-0}
BF16_FIX=${BF16_FIX:-1}             # 1 = the RLAX fix on (bitwise on-policy log-probs); 0 = plain bf16
PORT=${PORT:-5555}                  # param server; the verifier uses PORT+2
PYTHON=${PYTHON:-python3}
# The GRPO recipe of the default run: grpo.py's defaults (GRPO advantages, token-mean loss, TIS) plus
# a k3 KL term (beta 0.2) to the cold-start policy and DAPO dynamic sampling. The KL term is what keeps
# held-out pass@8: measured, beta 0.05 lost 7.8 points of it, 0.1 up to 4.7, 0.2 gained 2.4-4.7 (README
# "Results"). About 9 minutes on a 2-core CPU.
RECIPE=${RECIPE:-"--kl-beta 0.2 --dynamic-sampling --lr 1e-4"}
# Evaluation: pass@1/pass@8 from 8 samples and greedy pass@1, on 256 held-out problems at steps
# 0, 125 and 250 (at 128 problems two evaluations of the same policy differed by 5 points of pass@8).
EVAL=${EVAL:-"--heldout 256 --eval-every 125"}
TRAINER_ARGS=${TRAINER_ARGS:-}      # any extra trainer.py flags (they come after RECIPE, so they win)
WORKER_ARGS=${WORKER_ARGS:-}        # any extra inference_worker.py flags, e.g. "--lease-s 30"
VERIFIER_ARGS=${VERIFIER_ARGS:-}    # any extra verifier.py flags, e.g. "--isolation rlimits" where namespaces are missing
# Placement (devices.py): which chips each role gets; each role checks at start that it got them.
# A TPU role is a one-process libtpu cluster on its chips (TPU_VISIBLE_CHIPS,
# TPU_CHIPS_PER_PROCESS_BOUNDS, TPU_PROCESS_BOUNDS=1,1,1, its own TPU_PROCESS_PORT/ADDRESSES,
# CLOUD_TPU_TASK_ID=0: the JAX team's recipe, gist.github.com/skye/f82ba45d2445bb19d53545538754f9a3);
# GPU roles sharing a GPU get memory fractions that fit together (docs.jax.dev "GPU memory
# allocation"). devices.py lists the sources.
ACCELERATOR=${ACCELERATOR:-auto}    # auto (nvidia-smi -L, /dev/accel*, /dev/vfio/*), cpu, tpu or gpu
CHIPS=${CHIPS:-0}                   # chips to split, overriding detection (0 = detect)
TRAINER_CHIPS=${TRAINER_CHIPS:-0}   # the trainer's chips (0 = half); its FSDP mesh is data x TRAINER_TP
TRAINER_TP=${TRAINER_TP:-1}         # the trainer mesh's tensor axis (--tensor-parallel when > 1)
WORKER_CHIPS=${WORKER_CHIPS:-1}     # chips per worker; > 1 = tensor-parallel workers (--tensor-parallel)
TPU_PORT_BASE=${TPU_PORT_BASE:-8476}   # libtpu port of the trainer; worker i gets TPU_PORT_BASE+1+i
GPU_MEM_BUDGET=${GPU_MEM_BUDGET:-0.9}  # share of each GPU that the roles on it preallocate together
DRY_RUN=${DRY_RUN:-0}               # 1 = write and print $RUN_DIR/commands.sh, start nothing

# Every role inherits the same XLA_FLAGS (none by default): bitwise parity of sampler and trainer
# needs the same compiler settings on both sides (README "The bf16 fix, measured"). Measured: the
# precision policy is bitwise with XLA's defaults, but NOT with --xla_cpu_multi_thread_eigen=false,
# which changes the summation order of small matmuls; so do not add such flags to one role only.
# Where JAX has CUDA, model.py adds --xla_gpu_enable_triton_gemm=false to every role (PRECISION
# POLICY (h)).
export XLA_FLAGS=${XLA_FLAGS:-}
export PYTHONUNBUFFERED=1

mkdir -p "$RUN_DIR"
fix_flag=$([ "$BF16_FIX" = 1 ] && echo --bf16-fix || echo --no-bf16-fix)
ps_addr="tcp://127.0.0.1:$PORT"
verifier_addr="tcp://127.0.0.1:$((PORT + 2))"

# Each role's line is built once, device variables first, and both written to commands.sh and
# started from the same string (start_role), so a line run by hand gets the same chips.
placement=$($PYTHON devices.py --accelerator "$ACCELERATOR" --chips "$CHIPS" --trainer-chips "$TRAINER_CHIPS" \
  --trainer-tp "$TRAINER_TP" --worker-chips "$WORKER_CHIPS" --workers "$WORKERS" \
  --tpu-port-base "$TPU_PORT_BASE" --gpu-mem-budget "$GPU_MEM_BUDGET" --reserved-ports "$PORT,$((PORT + 2))") || exit 2
declare -A CMD ENVS FLAGS
ORDER=(); summary=""
while IFS='|' read -r role envs flags; do   # "# placement: ..." then "role|VAR=value ...|flags", in start order
  if [ "${role:0:1}" = "#" ]; then summary+="$role"$'\n'; continue; fi
  ORDER+=("$role"); ENVS[$role]=$envs; FLAGS[$role]=$flags
done <<< "$placement"
squeeze() {  # one line, words separated by single spaces (a line of commands.sh is a line)
  local s=" ${*//[$'\t\n']/ } "
  while [[ $s == *"  "* ]]; do s=${s//  / }; done
  s=${s# }; printf '%s\n' "${s% }"
}
for role in "${ORDER[@]}"; do
  case $role in
    param_server) cmd="$PYTHON param_server.py --bind $ps_addr --state-dir $RUN_DIR/param_server" ;;
    verifier) cmd="$PYTHON verifier.py --bind $verifier_addr --executors 2 $VERIFIER_ARGS" ;;
    worker-*) i=${role#worker-}
      cmd="$PYTHON inference_worker.py --param-server $ps_addr --verifier $verifier_addr --model $MODEL --name $role --seed $((SEED * 1000 + i)) --pull-every $PULL_EVERY $fix_flag ${FLAGS[$role]} $WORKER_ARGS" ;;
    trainer) cmd="$PYTHON trainer.py --run-dir $RUN_DIR --param-server $ps_addr --model $MODEL ${DATA:+--data $DATA} --seed $SEED --steps $STEPS --max-staleness $MAX_STALENESS $fix_flag $RECIPE $EVAL ${FLAGS[$role]} $TRAINER_ARGS" ;;
    *) echo "launch.sh: devices.py placed an unknown role: $role" >&2; exit 2 ;;
  esac
  CMD[$role]=$(squeeze "${ENVS[$role]} $cmd")
done

{ echo "# Started $(date -Is) by launch.sh; run any line to restart that role by hand, on the same chips."
  printf '%s' "$summary"
  echo "export XLA_FLAGS=\"$XLA_FLAGS\""
  for role in "${ORDER[@]}"; do echo "${CMD[$role]}  # $role"; done; } > "$RUN_DIR/commands.sh"
if [ "$DRY_RUN" = 1 ]; then cat "$RUN_DIR/commands.sh"; exit 0; fi

# ---------------------------------------------------------------------------------------------------
# Supervision, as a cluster scheduler would do it on many machines: a role that dies (preempted,
# killed, crashed) is restarted, the trainer with --resume; a role that dies MAX_RESTARTS times within
# RESTART_WINDOW seconds stops the run, naming it and its log. The run ends when the trainer exits 0.
MAX_RESTARTS=${MAX_RESTARTS:-5}
RESTART_WINDOW=${RESTART_WINDOW:-120}
declare -A PID DEATHS RESTARTS
mkdir -p "$RUN_DIR/pids"

start_role() {  # start_role ROLE [EXTRA FLAGS]: its commands.sh line (VAR=value ... command, run by env),
  local argv    # in its own session, so the whole process group can be killed; split into words, no globbing
  read -r -a argv <<< "${CMD[$1]} ${2:-}"
  setsid env "${argv[@]}" >> "$RUN_DIR/$1.log" 2>&1 &
  PID[$1]=$!
  echo "${PID[$1]}" > "$RUN_DIR/pids/$1"
}
stop_all() {
  local r
  trap - EXIT INT TERM
  for r in "${!PID[@]}"; do kill -TERM -- "-${PID[$r]}" 2>/dev/null || true; done
  sleep 1
  for r in "${!PID[@]}"; do kill -KILL -- "-${PID[$r]}" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
write_restarts() {
  local r sep=""
  { echo "{"; for r in "${ORDER[@]}"; do echo "$sep\"$r\": ${RESTARTS[$r]:-0}"; sep=","; done
    echo "}"; } > "$RUN_DIR/restarts.json.tmp" && mv "$RUN_DIR/restarts.json.tmp" "$RUN_DIR/restarts.json"
}
trap stop_all EXIT
trap 'echo; echo "launch.sh: interrupted, stopping every role"; exit 130' INT TERM

for role in "${ORDER[@]}"; do start_role "$role" "$([ "$role" = trainer ] && [ "${RESUME:-0}" = 1 ] && echo --resume)"; done
write_restarts
echo "launch.sh: run dir $RUN_DIR; roles: ${ORDER[*]}; logs in $RUN_DIR/<role>.log"

shown=0
while true; do
  for role in "${ORDER[@]}"; do
    kill -0 "${PID[$role]}" 2>/dev/null && continue
    status=0; wait "${PID[$role]}" 2>/dev/null || status=$?
    if [ "$role" = trainer ] && [ "$status" = 0 ]; then break 2; fi   # the run is complete
    # trainer.EXIT_STOP_RUN or devices.EXIT_MISPLACED (3) from any role, or a verifier that refuses
    # weaker isolation than asked (2): restarting cannot help, so stop the run and say why.
    if [ "$status" = 3 ] || { [ "$role" = verifier ] && [ "$status" = 2 ]; }; then
      echo "launch.sh: $role stopped the run (exit status $status); last lines of $RUN_DIR/$role.log:"
      tail -n 5 "$RUN_DIR/$role.log"; exit 1
    fi
    now=$(date +%s)
    recent=""; for t in ${DEATHS[$role]:-}; do [ $((now - t)) -lt "$RESTART_WINDOW" ] && recent="$recent $t"; done
    DEATHS[$role]="$recent $now"
    if [ "$(echo ${DEATHS[$role]} | wc -w)" -gt "$MAX_RESTARTS" ]; then
      echo "launch.sh: $role died $MAX_RESTARTS+ times within ${RESTART_WINDOW}s (last status $status); stopping the run."
      echo "launch.sh: last lines of $RUN_DIR/$role.log:"; tail -n 20 "$RUN_DIR/$role.log"
      exit 1
    fi
    RESTARTS[$role]=$(( ${RESTARTS[$role]:-0} + 1 ))
    write_restarts
    echo "launch.sh: $role exited (status $status); restart #${RESTARTS[$role]}"
    start_role "$role" "$([ "$role" = trainer ] && echo --resume)"
  done
  lines=$( { wc -l < "$RUN_DIR/trainer.log"; } 2>/dev/null || echo 0)
  if [ "$lines" -gt "$shown" ]; then sed -n "$((shown + 1)),${lines}p" "$RUN_DIR/trainer.log" | grep -E "step|eval|resumed|checkpoint|error|Error" || true; shown=$lines; fi
  sleep 1
done
sed -n "$((shown + 1)),\$p" "$RUN_DIR/trainer.log" | grep -E "step|eval|resumed|checkpoint" || true
$PYTHON - "$RUN_DIR/metrics.jsonl" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
evals = [r for r in rows if "eval/pass@1" in r]
if len(evals) >= 2:
    a, b = evals[0], evals[-1]
    print(f"launch.sh: held-out pass@1 {a['eval/pass@1']:.3f} -> {b['eval/pass@1']:.3f}, "
          f"pass@8 {a.get('eval/pass@8', float('nan')):.3f} -> {b.get('eval/pass@8', float('nan')):.3f}, "
          f"greedy pass@1 {a.get('eval/greedy_pass@1', float('nan')):.3f} -> {b.get('eval/greedy_pass@1', float('nan')):.3f} "
          f"after {b['step']} steps in {b['time_s']:.0f}s")
EOF
