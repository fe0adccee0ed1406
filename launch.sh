#!/usr/bin/env bash
# RLAX-style GRPO on one machine: a parameter server, a verifier, N inference workers and a trainer,
# each its own process on loopback ZeroMQ sockets.
#
# Hardware: the defaults are sized for a 2-core CPU with no accelerator; they train the embedded
# 0.8M-parameter cold-start policy (checkpoints/coldstart) on the built-in function-synthesis task.
# Wall time and the expected result on such a machine are in README.md ("Results").
#
#   bash launch.sh                                    # the default run, no downloads
#   MAX_STALENESS=2 WORKERS=2 STEPS=100 bash launch.sh   # asynchronous, off-policy by up to 2 versions
#   BF16_FIX=0 bash launch.sh                         # reproduce RLAX's bf16 sampler/trainer mismatch
#   MODEL=/path/to/hf_checkpoint DATA=problems.jsonl bash launch.sh   # a real model on real problems
#
# Everything lands in $RUN_DIR: one log per role, commands.sh (the exact command of every role, so any
# of them can be restarted by hand), metrics.jsonl and the trainer's checkpoints. Ctrl-C, the end of the
# run, or the death of any role stops every process this script started.
set -euo pipefail
cd "$(dirname "$0")"

RUN_DIR=${RUN_DIR:-runs/$(date +%Y%m%d-%H%M%S)}
STEPS=${STEPS:-40}                  # optimizer steps
WORKERS=${WORKERS:-2}               # inference workers
MAX_STALENESS=${MAX_STALENESS:-0}   # 0 = strict on-policy; k = rollouts up to k versions old are used
PULL_EVERY=${PULL_EVERY:-1}         # workers check for new weights every this many batches
MODEL=${MODEL:-checkpoints/coldstart}
DATA=${DATA:-}                      # JSONL problems; empty = the embedded task
SEED=${SEED:-0}
BF16_FIX=${BF16_FIX:-1}             # 1 = the RLAX fix on (bitwise on-policy log-probs); 0 = plain bf16
PORT=${PORT:-5555}                  # param server; the verifier uses PORT+2
PYTHON=${PYTHON:-python3}
TRAINER_ARGS=${TRAINER_ARGS:-}      # any extra trainer.py flags, e.g. "--kl-beta 0.01 --lr 1e-4"

# Every role inherits the same XLA_FLAGS (none by default): bitwise parity of sampler and trainer
# needs the same compiler settings on both sides (NUMERICS.md). Measured: the precision policy is
# bitwise with XLA's defaults, but NOT with --xla_cpu_multi_thread_eigen=false, which changes the
# summation order of small matmuls; so do not add such flags to one role only.
export XLA_FLAGS=${XLA_FLAGS:-}
export PYTHONUNBUFFERED=1

mkdir -p "$RUN_DIR"
fix_flag=$([ "$BF16_FIX" = 1 ] && echo --bf16-fix || echo --no-bf16-fix)
ps_addr="tcp://127.0.0.1:$PORT"
verifier_addr="tcp://127.0.0.1:$((PORT + 2))"

declare -A CMD
CMD[param_server]="$PYTHON param_server.py --bind $ps_addr --state-dir $RUN_DIR/param_server"
CMD[verifier]="$PYTHON verifier.py --bind $verifier_addr --executors 2"
for i in $(seq 0 $((WORKERS - 1))); do
  CMD[worker-$i]="$PYTHON inference_worker.py --param-server $ps_addr --verifier $verifier_addr --model $MODEL --name worker-$i --seed $((SEED * 1000 + i)) --pull-every $PULL_EVERY $fix_flag"
done
CMD[trainer]="$PYTHON trainer.py --run-dir $RUN_DIR --param-server $ps_addr --model $MODEL ${DATA:+--data $DATA} --seed $SEED --steps $STEPS --max-staleness $MAX_STALENESS $fix_flag $TRAINER_ARGS"
ORDER=(param_server verifier $(for i in $(seq 0 $((WORKERS - 1))); do echo worker-$i; done) trainer)

{ echo "# Started $(date -Is) by launch.sh; run any line to restart that role by hand."
  echo "export XLA_FLAGS=\"$XLA_FLAGS\""
  for role in "${ORDER[@]}"; do echo "${CMD[$role]}  # $role"; done; } > "$RUN_DIR/commands.sh"

declare -A PID
stop_all() {
  trap - EXIT INT TERM
  for role in "${!PID[@]}"; do kill -TERM -- "-${PID[$role]}" 2>/dev/null || true; done
  sleep 1
  for role in "${!PID[@]}"; do kill -KILL -- "-${PID[$role]}" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap stop_all EXIT
trap 'echo; echo "launch.sh: interrupted, stopping every role"; exit 130' INT TERM

for role in "${ORDER[@]}"; do
  setsid ${CMD[$role]} > "$RUN_DIR/$role.log" 2>&1 &
  PID[$role]=$!
done
echo "launch.sh: run dir $RUN_DIR; roles: ${ORDER[*]}; logs in $RUN_DIR/<role>.log"

# Progress: the trainer's step lines as they come; stop when the trainer ends or any role dies.
shown=0
while kill -0 "${PID[trainer]}" 2>/dev/null; do
  for role in "${ORDER[@]}"; do
    if ! kill -0 "${PID[$role]}" 2>/dev/null && [ "$role" != trainer ]; then
      echo "launch.sh: $role died; last lines of $RUN_DIR/$role.log:"; tail -n 20 "$RUN_DIR/$role.log"
      exit 1
    fi
  done
  lines=$( { wc -l < "$RUN_DIR/trainer.log"; } 2>/dev/null || echo 0)
  if [ "$lines" -gt "$shown" ]; then sed -n "$((shown + 1)),${lines}p" "$RUN_DIR/trainer.log"; shown=$lines; fi
  sleep 1
done
sed -n "$((shown + 1)),\$p" "$RUN_DIR/trainer.log"
status=0; wait "${PID[trainer]}" || status=$?
[ "$status" = 0 ] || { echo "launch.sh: trainer exited with status $status"; exit "$status"; }
$PYTHON - "$RUN_DIR/metrics.jsonl" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
evals = [r for r in rows if "eval/pass@1" in r]
if len(evals) >= 2:
    a, b = evals[0], evals[-1]
    print(f"launch.sh: held-out pass@1 {a['eval/pass@1']:.3f} -> {b['eval/pass@1']:.3f}, "
          f"pass@8 {a.get('eval/pass@8', float('nan')):.3f} -> {b.get('eval/pass@8', float('nan')):.3f} "
          f"after {b['step']} steps in {b['time_s']:.0f}s")
EOF
