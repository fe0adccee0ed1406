#!/usr/bin/env bash
# RLAX-style GRPO on one machine: a parameter server, a verifier, N inference workers and a trainer,
# each its own process on loopback ZeroMQ sockets.
#
# Hardware: the defaults are sized for a 2-core CPU with no accelerator; they train the embedded
# 0.8M-parameter cold-start policy (checkpoints/coldstart) on the built-in function-synthesis task.
# Wall time and the expected result on such a machine are in docs/results.md. On a TPU or GPU VM
# (pip install -r requirements-tpu.txt or requirements-gpu.txt) the chips are found and split: the
# trainer gets half of them, each worker one of the rest (or WORKER_CHIPS), the parameter server and
# the verifier stay on the CPU (devices.py says how, and why).
#
#   bash launch.sh                                    # the default run, no downloads
#   MAX_STALENESS=2 WORKERS=2 STEPS=100 bash launch.sh   # asynchronous, off-policy by up to 2 versions
#   BF16_FIX=0 bash launch.sh                         # reproduce RLAX's bf16 sampler/trainer mismatch
#   MODEL=/path/to/hf_checkpoint DATA=problems.jsonl bash launch.sh   # a real model on real problems
#   DRY_RUN=1 ACCELERATOR=tpu CHIPS=8 bash launch.sh  # print where each role would run, start nothing
#   STAGES=r1 bash launch.sh                          # the R1 recipe: cold start, GRPO, rejection sampling, SFT, GRPO
#
# Several machines (docs/multihost.md): run this script on each host with ROLES naming the roles that
# host runs, PARAM_SERVER / VERIFIER the addresses of those on other hosts, BIND the address its own
# servers listen on; any address off loopback needs CURVE keys (RLAX_CURVE_KEY, wire.py).
#   ROLES=trainer,param_server,verifier BIND=0.0.0.0 RLAX_CURVE_KEY=keys/curve.key bash launch.sh    # host A
#   ROLES=workers PARAM_SERVER=tcp://hostA:5555 VERIFIER=tcp://hostA:5557 RLAX_CURVE_KEY=keys/curve.key bash launch.sh
# A trainer over several hosts' chips: TRAINER_HOSTS=2 TRAINER_COORDINATOR=hostA:8470 on host A as well, and
#   ROLES=trainer TRAINER_HOSTS=2 TRAINER_HOST_ID=1 TRAINER_COORDINATOR=hostA:8470 bash launch.sh          # host C
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
MAX_STALENESS=${MAX_STALENESS:-0}   # 0 = strict on-policy; k = rollouts up to k versions old are used;
                                    # auto = the bound sets itself each step, in [0, STALENESS_CEILING],
                                    # keeping offpolicy/k3_kl under STALENESS_TARGET (trainer --staleness-target)
STALENESS_CEILING=${STALENESS_CEILING:-4}
STALENESS_TARGET=${STALENESS_TARGET:-0.01}
PULL_EVERY=${PULL_EVERY:-1}         # workers check for new weights every this many batches
INFLIGHT=${INFLIGHT:-off}           # keep | recompute: workers swap in new weights between decode steps,
                                    # rows in progress keep their KV cache or have it recomputed; off: between batches
SAMPLER_QUANT=${SAMPLER_QUANT:-none}  # int8: workers sample with 8-bit weights (quant.py; the trainer stays
                                    # bf16, mismatch/* measures the difference); fp8: e4m3, on a GPU that has it
LORA_RANK=${LORA_RANK:-0}           # r > 0: train a rank-r LoRA adapter on the frozen base (lora.py, docs/lora.md);
                                    # weight versions after the first carry the adapter alone. 0 = full fine-tuning
LORA_ALPHA=${LORA_ALPHA:-32}        # scale = alpha / rank, alpha fixed across ranks ("LoRA Without Regret")
LORA_TARGETS=${LORA_TARGETS:-}      # comma list of projections (q_proj,...,down_proj); empty = all seven
LORA_LR=${LORA_LR:-1e-3}            # LoRA's learning rate (after RECIPE's): 10x the full fine-tuning one, as
                                    # "LoRA Without Regret" finds optimal; TRAINER_ARGS' --lr still wins
MODEL=${MODEL:-checkpoints/coldstart}
DATA=${DATA:-}                      # JSONL problems (code, GSM8K/MATH-style math); empty = the embedded task
ENV=${ENV:-}                        # a multi-turn environment of envs.ENVS (chat format; --max-turns 3):
                                    # python_tool (the model's ```python blocks run in the sandbox, their output
                                    # comes back), fix_tests (a failing program's test failure comes back once)
REWARD=${REWARD:-}                  # path/to/file.py:function scoring DATA's rows (prompt or messages, any
                                    # fields): function(completion, row) -> float, run by the verifiers (scorers.py)
SEED=${SEED:-0}
BF16_FIX=${BF16_FIX:-1}             # 1 = the RLAX fix on (bitwise on-policy log-probs); 0 = plain bf16
DTYPE=${DTYPE:-bfloat16}            # what the model computes in, whatever the checkpoint stores: bfloat16
                                    # (bitwise), float32 (not bitwise on XLA:CPU), checkpoint (as stored)
PORT_GIVEN=${PORT:+1}
PORT=${PORT:-5555}                  # param server; the verifiers use PORT+2, PORT+3, ... Unset on one host
                                    # (loopback): the first free block from 5555; given: refused if taken
RUN_ID=${RUN_ID:-}                  # this run's identity (wire.py: a server refuses a role of another run);
                                    # default: $RUN_DIR/run_id, made on the first start, kept across restarts
VERDICT_KEY=${VERDICT_KEY:-}        # the verdict key (attest.py): the verifier seals each reward, the param server
                                    # refuses a rollout whose rewards it did not seal; the workers never see it.
                                    # Default: $RUN_DIR/verdict.key on the one-host run; on several hosts, name one
                                    # file on the param server's and every verifier's (made if missing; copy it
                                    # to the others); none = rewards unchecked
# Which roles run on this host, and where the others are (docs/multihost.md). The default is every
# role here, on loopback: the single-machine run.
ROLES=${ROLES:-trainer,param_server,verifier,workers}   # comma-separated subset of these four
PARAM_SERVER=${PARAM_SERVER:-}      # tcp://host:port of the param server when ROLES has no param_server
VERIFIER=${VERIFIER:-}              # tcp://host:port[,tcp://host2:port...]: verifiers on other hosts (the
                                    # workers spread their batches over these and this host's own)
BIND=${BIND:-127.0.0.1}             # the address this host's servers listen on (0.0.0.0: every interface)
VERIFIERS=${VERIFIERS:-1}           # verifier processes on this host (ROLES has verifier), on PORT+2, PORT+3, ...
VERIFIER_EXECUTORS=${VERIFIER_EXECUTORS:-2}   # sandbox executors per verifier process (programs run at once)
WORKER_BASE=${WORKER_BASE:-0}       # this host's workers are worker-(WORKER_BASE+i) to the param server (names
                                    # and seeds): give each worker host its own range, names must be unique
END_AFTER_S=${END_AFTER_S:-120}     # a host with neither trainer nor param server stops this long after
                                    # PARAM_SERVER stopped answering (the run is over); 0 = run until stopped
WEIGHTS_DIR=${WEIGHTS_DIR:-}        # a directory every host sees (weights_fs.py): the param server publishes
                                    # each weight version there, this host's workers read it from there
# One trainer over the chips of several hosts (multihost.py, jax.distributed): run launch.sh with
# ROLES including trainer on each trainer host, the same TRAINER_HOSTS and TRAINER_COORDINATOR, and
# TRAINER_HOST_ID 0, 1, ...; host 0's trainer is the one the other roles talk to and writes the run's files.
TRAINER_HOSTS=${TRAINER_HOSTS:-1}   # trainer processes (hosts) in the trainer's mesh
TRAINER_HOST_ID=${TRAINER_HOST_ID:-0}   # this host's trainer process
TRAINER_COORDINATOR=${TRAINER_COORDINATOR:-}   # host:port on trainer host 0 for jax.distributed ("auto" on a
                                    # Cloud TPU slice: JAX reads the slice from the VMs)
PYTHON=${PYTHON:-python3}           # the interpreter of every role (and of devices.py here): give a venv's
                                    # python when it is not the first python3 on PATH
# The GRPO recipe of the default run: grpo.py's defaults (GRPO advantages, token-mean loss, TIS) plus
# a k3 KL term (beta 0.2) to the cold-start policy and DAPO dynamic sampling. The KL term is what keeps
# held-out pass@8: measured, beta 0.05 lost 7.8 points of it, 0.1 up to 4.7, 0.2 gained 2.4-4.7 (docs/results.md,
# "The KL coefficient and the cold start"). About 9 minutes on a 2-core CPU.
RECIPE=${RECIPE:-"--kl-beta 0.2 --dynamic-sampling --lr 1e-4"}
# Evaluation: pass@1/pass@8 from 8 samples and greedy pass@1, on 256 held-out problems at steps
# 0, 125 and 250 (at 128 problems two evaluations of the same policy differed by 5 points of pass@8).
EVAL=${EVAL:-"--heldout 256 --eval-every 125"}
PROMPT_FORMAT=${PROMPT_FORMAT:-}    # chat or completion (prompts.py); empty = chat if MODEL has a chat template
TRAINER_ARGS=${TRAINER_ARGS:-}      # any extra trainer.py flags (they come after RECIPE, so they win)
WORKER_ARGS=${WORKER_ARGS:-}        # any extra inference_worker.py flags, e.g. "--lease-s 30"
WORKER0_ARGS=${WORKER0_ARGS:-}      # and flags for worker-0 alone (after WORKER_ARGS): a straggler, e.g. "--slow-s 3"
VERIFIER_ARGS=${VERIFIER_ARGS:-}    # any extra verifier.py flags, e.g. "--isolation rlimits" where namespaces are missing
# The R1 recipe (recipe.py, docs/algorithm.md): STAGES=r1, or a prefix of coldstart,grpo,rejection,sft,grpo_final,
# runs those stages one after another, each in $RUN_DIR/<stage>/ (a GRPO stage is this script again, with
# every variable above), skips the stages already done and prints one table. STAGE_ARGS: recipe.py's
# flags, e.g. "--sft-from base" or "--grpo-steps 250" (with STAGES=coldstart,grpo: plain GRPO, evaluated alike).
STAGES=${STAGES:-}
STAGE_ARGS=${STAGE_ARGS:-}
if [ -n "$STAGES" ]; then
  # shellcheck disable=SC2086  # STAGE_ARGS is a list of flags
  exec $PYTHON recipe.py --stages "$STAGES" --run-dir "$RUN_DIR" --model "$MODEL" --data "$DATA" --seed "$SEED" \
    --prompt-format "$PROMPT_FORMAT" $STAGE_ARGS
fi
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
# needs the same compiler settings on both sides (docs/numerics.md). Measured: the
# precision policy is bitwise with XLA's defaults, but NOT with --xla_cpu_multi_thread_eigen=false,
# which changes the summation order of small matmuls; so do not add such flags to one role only.
# Where JAX has CUDA, model.py adds --xla_gpu_enable_triton_gemm=false to every role (PRECISION
# POLICY (h)).
export XLA_FLAGS=${XLA_FLAGS:-}
export PYTHONUNBUFFERED=1
# JAX's persistent compilation cache, shared by every role and every run on this machine: a role that
# starts again (restarted after a preemption, or the next run) loads its programs instead of compiling
# them (measured 2026-12-01: the trainer's first step 6.2 s -> 1.7 s on the embedded model). A hit is the same
# executable, so no number changes. JAX_CACHE= (empty) turns it off; a JAX_COMPILATION_CACHE_DIR you
# set is used as it is.
JAX_CACHE=${JAX_CACHE-${XDG_CACHE_HOME:-$HOME/.cache}/rlax/jax}
if [ -z "${JAX_COMPILATION_CACHE_DIR:-}" ] && [ -n "$JAX_CACHE" ]; then
  export JAX_COMPILATION_CACHE_DIR=$JAX_CACHE
  export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=${JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS:-0}
fi

# ---------------------------------------------------------------------------------------------------
# This host's roles and the addresses they use. Everything is checked before anything is written or
# started, so a refused setting leaves no run dir behind.
refuse() { echo "launch.sh: refusing to start: $*" >&2; exit 2; }
declare -A HERE
for r in ${ROLES//,/ }; do
  case $r in trainer|param_server|verifier|workers) HERE[$r]=1 ;;
    *) refuse "ROLES=$ROLES: unknown role '$r' (roles: trainer, param_server, verifier, workers)" ;; esac
done
[ "${#HERE[@]}" -gt 0 ] || refuse "ROLES is empty (roles: trainer, param_server, verifier, workers)"
[[ $VERIFIERS =~ ^[1-9][0-9]*$ ]] || refuse "VERIFIERS=$VERIFIERS: must be a count >= 1"
[[ $VERIFIER_EXECUTORS =~ ^[1-9][0-9]*$ ]] || refuse "VERIFIER_EXECUTORS=$VERIFIER_EXECUTORS: must be a count >= 1"
[[ $END_AFTER_S =~ ^[0-9]+$ ]] || refuse "END_AFTER_S=$END_AFTER_S: must be seconds >= 0"
[[ $WORKER_BASE =~ ^[0-9]+$ ]] || refuse "WORKER_BASE=$WORKER_BASE: must be a number >= 0"
[[ $TRAINER_HOSTS =~ ^[1-9][0-9]*$ ]] || refuse "TRAINER_HOSTS=$TRAINER_HOSTS: must be a count >= 1"
[[ $TRAINER_HOST_ID =~ ^[0-9]+$ ]] && [ "$TRAINER_HOST_ID" -lt "$TRAINER_HOSTS" ] \
  || refuse "TRAINER_HOST_ID=$TRAINER_HOST_ID: must be in 0 .. TRAINER_HOSTS-1 ($((TRAINER_HOSTS - 1)))"
trainer_follows=""   # this host's trainer process only follows trainer host 0 (no sockets, no files)
multihost_trainer="" # the trainer is one process of several hosts': across TPU hosts it gets every chip
                     # of this host and none of devices.py's one-process libtpu variables (the slice's own)
if [ "$TRAINER_HOSTS" -gt 1 ] || [ "$TRAINER_COORDINATOR" = auto ]; then
  multihost_trainer=1
  [ -n "${HERE[trainer]:-}" ] || refuse "TRAINER_HOSTS=$TRAINER_HOSTS but ROLES=$ROLES has no trainer"
  [ "$TRAINER_COORDINATOR" = auto ] || [[ $TRAINER_COORDINATOR =~ ^[A-Za-z0-9._-]+:[0-9]+$ ]] \
    || refuse "TRAINER_HOSTS=$TRAINER_HOSTS needs TRAINER_COORDINATOR=host:port (trainer host 0's address and a free port) or auto"
  [ "$TRAINER_HOST_ID" = 0 ] || trainer_follows=1
fi
# IPv4 addresses and host names (wire.py's sockets do not enable IPv6)
is_addr() { [[ $1 =~ ^tcp://[A-Za-z0-9._-]+:[0-9]+$ ]]; }
host_of() { local h=${1#tcp://}; echo "${h%:*}"; }
is_loopback() { case $1 in 127.0.0.1|localhost) return 0 ;; *) return 1 ;; esac; }  # as wire.is_loopback
[[ $BIND =~ ^[A-Za-z0-9._-]+$ ]] || refuse "BIND=$BIND: an IPv4 address to listen on, e.g. 0.0.0.0 or 10.0.0.2"
# Roles on this host reach this host's servers on loopback when the servers listen there (or on every
# interface), else on BIND itself.
case $BIND in 0.0.0.0|127.0.0.1|localhost) local_host=127.0.0.1 ;; *) local_host=$BIND ;; esac
# The ports this host's servers bind: never another run's. A second run on one host with PORT unset
# takes the next free block; with PORT given (or off loopback, where other hosts must know it) a port
# that is taken stops the start, naming its holder. DRY_RUN probes nothing (its lines stay the same).
port_offsets=(); [ -z "${HERE[param_server]:-}" ] || port_offsets+=(0)
if [ -n "${HERE[verifier]:-}" ]; then for ((k = 0; k < VERIFIERS; k++)); do port_offsets+=($((2 + k))); done; fi
if [ "${#port_offsets[@]}" -gt 0 ] && [ "$DRY_RUN" != 1 ]; then
  if [ -z "$PORT_GIVEN" ] && is_loopback "$BIND"; then
    PORT=$($PYTHON ports.py free-base "$BIND" 5555 "${port_offsets[@]}") || refuse "no free ports for this host's servers"
  else
    taken=(); for o in "${port_offsets[@]}"; do taken+=($((PORT + o))); done
    if ! held=$($PYTHON ports.py check "$BIND" "${taken[@]}"); then
      refuse "${held//$'\n'/; } (another run on this host?): pick other ports with PORT=... (this host's servers use PORT, PORT+2 ... PORT+$((1 + VERIFIERS))), or leave PORT unset on one host to have free ones picked"
    fi
  fi
fi
if [ -n "${HERE[param_server]:-}" ]; then
  [ -z "$PARAM_SERVER" ] || refuse "PARAM_SERVER=$PARAM_SERVER names a param server on another host, but ROLES runs one here: set one of them"
  ps_bind="tcp://$BIND:$PORT"; ps_addr="tcp://$local_host:$PORT"
else
  ps_addr=$PARAM_SERVER
  if [ -z "$ps_addr" ] && [ -z "$trainer_follows" ] && { [ -n "${HERE[trainer]:-}" ] || [ -n "${HERE[workers]:-}" ]; }; then
    refuse "ROLES=$ROLES has no param_server: set PARAM_SERVER=tcp://host:port (the host that runs it)"
  fi
  [ -z "$ps_addr" ] || is_addr "$ps_addr" || refuse "PARAM_SERVER=$ps_addr: expected tcp://host:port"
fi
verifier_binds=(); verifier_addrs=()   # this host's verifiers, then VERIFIER's
if [ -n "${HERE[verifier]:-}" ]; then
  for ((k = 0; k < VERIFIERS; k++)); do
    verifier_binds+=("tcp://$BIND:$((PORT + 2 + k))"); verifier_addrs+=("tcp://$local_host:$((PORT + 2 + k))")
  done
fi
for a in ${VERIFIER//,/ }; do
  is_addr "$a" || refuse "VERIFIER=$VERIFIER: expected tcp://host:port[,tcp://host2:port...]"
  verifier_addrs+=("$a")
done
if [ -n "${HERE[workers]:-}" ] && [ "${#verifier_addrs[@]}" = 0 ]; then
  refuse "ROLES=$ROLES runs workers but no verifier: add verifier to ROLES or set VERIFIER=tcp://host:port"
fi
verifier_addr=$(IFS=,; echo "${verifier_addrs[*]}")
# CURVE (wire.py): traffic that may leave this machine is encrypted and only holders of the keys are
# served. Required, not optional: a param server open on the network would take weights and work items
# from anyone; a verifier would run anyone's code.
off_loopback=""
if [ -n "${HERE[param_server]:-}${HERE[verifier]:-}" ] && ! is_loopback "$BIND"; then off_loopback="BIND=$BIND"; fi
for a in $ps_addr "${verifier_addrs[@]}"; do
  is_loopback "$(host_of "$a")" || off_loopback="${off_loopback:+$off_loopback, }$a"
done
if [ -n "$off_loopback" ]; then
  [ -n "${RLAX_CURVE_KEY:-}" ] || refuse "not loopback: $off_loopback; traffic between hosts must be \
encrypted and authenticated: create a key pair with \`$PYTHON curve.py keygen keys\`, copy keys/curve.key to \
every host and set RLAX_CURVE_KEY=keys/curve.key on each (or per-role keys: \`$PYTHON curve.py keygen --help\`; \
docs/multihost.md)"
fi
# Relay broadcast (inference_worker --relay): each worker serves the chunks it holds to the workers
# below it in the param server's relay tree, so its chunk server must listen where they can reach it.
# On one machine that is loopback; across hosts HOST_ADDR (this host's address as the others see it)
# must be given, or this host's workers pull every chunk from the param server (--no-relay).
# With WEIGHTS_DIR they read each version from that shared directory instead (no chunks, no relay).
if [ -n "$WEIGHTS_DIR" ]; then relay_flag="--weights-dir $WEIGHTS_DIR"
elif [ -n "${HOST_ADDR:-}" ]; then relay_flag="--relay-bind tcp://$HOST_ADDR:*"
elif [ -n "$off_loopback" ]; then relay_flag="--no-relay"
else relay_flag=""; fi
for v in RLAX_CURVE_KEY RLAX_CURVE_CLIENTS RLAX_CURVE_SERVER_KEY; do
  if [ -n "${!v:-}" ] && [ ! -r "${!v}" ]; then refuse "$v=${!v}: no such readable file or directory"; fi
done

case $ENV in */*) ENV="" ;; esac   # a path: the shell's own ENV (POSIX sh's startup file), not ours
if [ -n "$ENV" ]; then   # a name in the registry, envs.ENVS (envs/__init__.py), the one the trainer checks
  env_names=$($PYTHON -c 'import envs; print(*envs.ENVS)') || refuse "ENV=$ENV: $PYTHON could not read envs.ENVS"
  [[ " $env_names " == *" $ENV "* ]] || refuse "ENV=$ENV: expected one of: $env_names (or nothing: one turn)"
fi
if [ -n "$REWARD" ]; then
  if [ ! -r "${REWARD%:*}" ] || [ "${REWARD%:*}" = "$REWARD" ]; then refuse "REWARD=$REWARD: expected a readable path/to/file.py:function"; fi
  [ -n "$DATA" ] || refuse "REWARD=$REWARD scores the rows of a DATA file: set DATA too"
  reward_flag="--reward $REWARD"
else reward_flag=""; fi
fix_flag=$([ "$BF16_FIX" = 1 ] && echo --bf16-fix || echo --no-bf16-fix)
if [ "$MAX_STALENESS" = auto ]; then staleness_flags="--max-staleness $STALENESS_CEILING --staleness-target $STALENESS_TARGET"
elif [[ $MAX_STALENESS =~ ^[0-9]+$ ]]; then staleness_flags="--max-staleness $MAX_STALENESS"
else refuse "MAX_STALENESS=$MAX_STALENESS: expected a number of versions or auto"; fi
case $DTYPE in bfloat16) ;;   # the roles' default: no flag
  float32|checkpoint) fix_flag+=" --dtype $DTYPE" ;;
  *) refuse "DTYPE=$DTYPE: expected bfloat16, float32 or checkpoint" ;; esac
case $INFLIGHT in off) inflight_flag="" ;;   # the worker's default: no flag
  keep|recompute) inflight_flag="--inflight $INFLIGHT" ;;
  *) refuse "INFLIGHT=$INFLIGHT: expected off, keep or recompute" ;; esac
[[ $LORA_RANK =~ ^[0-9]+$ ]] || refuse "LORA_RANK=$LORA_RANK: expected a rank (0 = off)"
if [ "$LORA_RANK" != 0 ]; then  # the workers learn the LoRA config from each version's manifest: no worker flag
  lora_flags="--lora-rank $LORA_RANK --lora-alpha $LORA_ALPHA${LORA_TARGETS:+ --lora-targets $LORA_TARGETS} --lr $LORA_LR"
else lora_flags=""; fi
case $SAMPLER_QUANT in none) quant_flag="" ;;   # the worker's default: no flag
  int8|fp8) quant_flag="--sampler-quant $SAMPLER_QUANT"  # their log-probs are near ours, not ours: audit.py's bound
    TRAINER_ARGS="--audit-logp-tol 0.1 $TRAINER_ARGS" ;;
  *) refuse "SAMPLER_QUANT=$SAMPLER_QUANT: expected none, int8 or fp8" ;; esac
reserved="$PORT"; for ((k = 0; k < VERIFIERS; k++)); do reserved+=",$((PORT + 2 + k))"; done
jax_roles=""; for r in trainer workers; do [ -z "${HERE[$r]:-}" ] || jax_roles+="${jax_roles:+,}$r"; done

# Each role's line is built once, device variables first, and both written to commands.sh and
# started from the same string (start_role), so a line run by hand gets the same chips.
placement=$($PYTHON devices.py --accelerator "$ACCELERATOR" --chips "$CHIPS" --trainer-chips "$TRAINER_CHIPS" \
  --trainer-tp "$TRAINER_TP" --worker-chips "$WORKER_CHIPS" --workers "$WORKERS" \
  --tpu-port-base "$TPU_PORT_BASE" --gpu-mem-budget "$GPU_MEM_BUDGET" --reserved-ports "$reserved" \
  --roles "$jax_roles" ${multihost_trainer:+--multihost-trainer}) || exit 2
mkdir -p "$RUN_DIR"
# One run, one identity: every role names it to every server (RLAX_RUN_ID, wire.py), so a role of
# another run reaching this run's ports by mistake is refused, never served. Made once per RUN_DIR,
# so restarts and resumes keep it; hosts of one multi-host run share the lead's (RUN_ID=...).
if [ -z "$RUN_ID" ]; then
  RUN_ID=$(cat "$RUN_DIR/run_id" 2>/dev/null || true)
  if [ -z "$RUN_ID" ]; then
    if [ -n "${HERE[param_server]:-}" ] || [ "${#HERE[@]}" = 4 ]; then
      RUN_ID=run-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')
    fi   # a host without the param server learns nothing by itself: RUN_ID names the lead's run
  fi
fi
[[ -z $RUN_ID || $RUN_ID =~ ^[A-Za-z0-9._-]{1,64}$ ]] || refuse "RUN_ID=$RUN_ID: letters, digits, . _ - (at most 64)"
if [ -n "$RUN_ID" ] && [ "$DRY_RUN" != 1 ]; then echo "$RUN_ID" > "$RUN_DIR/run_id"; fi
export RLAX_RUN_ID=$RUN_ID
if [ -z "$VERDICT_KEY" ]; then  # made here only for the one-host run: every verifier and the param server are here
  if [ "${#HERE[@]}" = 4 ] && [ -z "$VERIFIER" ]; then VERDICT_KEY=$RUN_DIR/verdict.key; else VERDICT_KEY=none; fi
fi
key_flag=""
if [ "$VERDICT_KEY" != none ] && { [ -n "${HERE[param_server]:-}" ] || [ -n "${HERE[verifier]:-}" ]; }; then
  key_flag="--verdict-key $VERDICT_KEY"
  if [ "$DRY_RUN" != 1 ]; then $PYTHON attest.py keygen "$VERDICT_KEY" > /dev/null || refuse "cannot write VERDICT_KEY=$VERDICT_KEY"; fi
fi
declare -A CMD ENVS FLAGS
ORDER=(); summary=""
while IFS='|' read -r role envs flags; do   # "# placement: ..." then "role|VAR=value ...|flags", in start order
  if [ "${role:0:1}" = "#" ]; then summary+="$role"$'\n'; continue; fi
  case $role in
    param_server) [ -n "${HERE[param_server]:-}" ] || continue ;;
    verifier) [ -n "${HERE[verifier]:-}" ] || continue
      if [ "$VERIFIERS" -gt 1 ]; then  # verifier-0, verifier-1, ... on consecutive ports
        for ((k = 0; k < VERIFIERS; k++)); do ORDER+=("verifier-$k"); ENVS[verifier-$k]=$envs; FLAGS[verifier-$k]=$flags; done
        continue
      fi ;;
  esac   # devices.py placed workers and the trainer only where ROLES has them (--roles)
  ORDER+=("$role"); ENVS[$role]=$envs; FLAGS[$role]=$flags
done <<< "$placement"
squeeze() {  # one line, words separated by single spaces (a line of commands.sh is a line)
  local s=" ${*//[$'\t\n']/ } "
  while [[ $s == *"  "* ]]; do s=${s//  / }; done
  s=${s# }; printf '%s\n' "${s% }"
}
for role in "${ORDER[@]}"; do
  case $role in
    param_server) cmd="$PYTHON param_server.py --bind $ps_bind --state-dir $RUN_DIR/param_server${WEIGHTS_DIR:+ --weights-dir $WEIGHTS_DIR}${key_flag:+ $key_flag}" ;;
    verifier|verifier-*) k=${role#verifier}; k=${k#-}
      cmd="$PYTHON verifier.py --bind ${verifier_binds[${k:-0}]} --executors $VERIFIER_EXECUTORS${reward_flag:+ $reward_flag}${key_flag:+ $key_flag} $VERIFIER_ARGS" ;;
    worker-*) i=$(( ${role#worker-} + WORKER_BASE ))
      cmd="$PYTHON inference_worker.py --param-server $ps_addr --verifier $verifier_addr --model $MODEL --name worker-$i --seed $((SEED * 1000 + i)) --pull-every $PULL_EVERY --timeline $RUN_DIR/timeline/worker-$i.jsonl $fix_flag${relay_flag:+ $relay_flag}${inflight_flag:+ $inflight_flag}${quant_flag:+ $quant_flag} ${FLAGS[$role]} $WORKER_ARGS"
      if [ "$i" = 0 ] && [ -n "$WORKER0_ARGS" ]; then cmd+=" $WORKER0_ARGS"; fi ;;
    trainer) cmd="$PYTHON trainer.py --run-dir $RUN_DIR ${ps_addr:+--param-server $ps_addr} --model $MODEL ${DATA:+--data $DATA}${reward_flag:+ $reward_flag}${ENV:+ --env $ENV} ${PROMPT_FORMAT:+--prompt-format $PROMPT_FORMAT} --seed $SEED --steps $STEPS $staleness_flags --timeline $RUN_DIR/timeline/trainer.jsonl $fix_flag $RECIPE${lora_flags:+ $lora_flags} $EVAL ${FLAGS[$role]} $TRAINER_ARGS"
      if [ -n "$TRAINER_COORDINATOR" ]; then
        cmd+=" --coordinator $TRAINER_COORDINATOR --num-processes $TRAINER_HOSTS --process-id $TRAINER_HOST_ID"
      fi ;;
    *) echo "launch.sh: devices.py placed an unknown role: $role" >&2; exit 2 ;;
  esac
  CMD[$role]=$(squeeze "${ENVS[$role]} $cmd")
done

{ echo "# Started $(date -Is) by launch.sh; run any line to restart that role by hand, on the same chips."
  printf '%s' "$summary"
  if [ "${#HERE[@]}" != 4 ]; then   # one host of several
    echo "# this host: ROLES=$ROLES; param server ${ps_addr:-none}; verifiers ${verifier_addr:-none}"
  fi
  echo "export XLA_FLAGS=\"$XLA_FLAGS\""
  [ -z "$RUN_ID" ] || echo "export RLAX_RUN_ID=\"\$(cat $RUN_DIR/run_id)\""
  for v in RLAX_CURVE_KEY RLAX_CURVE_CLIENTS RLAX_CURVE_SERVER_KEY; do   # paths only, never a key
    if [ -n "${!v:-}" ]; then echo "export $v=\"${!v}\""; fi
  done
  for role in "${ORDER[@]}"; do echo "${CMD[$role]}  # $role"; done; } > "$RUN_DIR/commands.sh"
if [ "$DRY_RUN" = 1 ]; then cat "$RUN_DIR/commands.sh"; exit 0; fi

# ---------------------------------------------------------------------------------------------------
# Supervision, as a cluster scheduler would do it on many machines: a role that dies (preempted,
# killed, crashed) is restarted, the trainer with --resume. Exit 143 (SIGTERM: a preemption notice,
# after which the trainer checkpoints) is not a crash. Two rules stop the run, naming the role and
# showing its log: a crash loop (the same failure, i.e. the same exit status and last log line, again
# with no progress of the run in between: the restarts back off by CRASH_BACKOFF seconds, and the
# next such death stops the run, whatever the pace), and a role dying MAX_RESTARTS times within
# RESTART_WINDOW seconds. Progress is the ledger or the metrics growing (on a host without the trainer
# there is none: there the crash-loop rule sees every death as "no progress"). Supervision is per host:
# each host's launch.sh restarts its own roles only.
# When the run ends, per host: a host with the trainer ends when the trainer exits 0 (its param server
# and verifiers stop with it). A host with neither trainer nor param server ends (exit 0) once the
# param server it uses (PARAM_SERVER) has answered at least once and then not answered for END_AFTER_S
# seconds: the trainer's host stopped it, the run is over (the param server itself cannot say so; a
# restarted one answers again within seconds, well inside END_AFTER_S). A host with the param server
# but no trainer, or END_AFTER_S=0, runs until stopped (Ctrl-C, SIGTERM).
MAX_RESTARTS=${MAX_RESTARTS:-5}
RESTART_WINDOW=${RESTART_WINDOW:-120}
CRASH_BACKOFF=${CRASH_BACKOFF:-"0 10 30"}   # delays before the 1st, 2nd, ... restart after the same failure
STOP_GRACE_S=${STOP_GRACE_S:-30}   # on Ctrl-C / SIGTERM: how long the trainer may take to checkpoint and exit
read -r -a BACKOFF <<< "$CRASH_BACKOFF"
declare -A PID DEATHS RESTARTS SAME LAST_FAILURE DUE
mkdir -p "$RUN_DIR/pids"

start_role() {  # start_role ROLE [EXTRA FLAGS]: its commands.sh line (VAR=value ... command, run by env),
  local argv    # in its own session, so the whole process group can be killed; split into words, no globbing
  read -r -a argv <<< "${CMD[$1]} ${2:-}"
  setsid env "${argv[@]}" >> "$RUN_DIR/$1.log" 2>&1 &
  PID[$1]=$!
  echo "${PID[$1]}" > "$RUN_DIR/pids/$1"
}
stop_all() {
  local r t
  trap - EXIT INT TERM
  # The trainer first: SIGTERM is its preemption notice, on which it checkpoints (the half-collected
  # batch included) before it exits; give it STOP_GRACE_S while the param server it may still talk to
  # is up, so Ctrl-C loses no step. Then every other role.
  if [ -n "${PID[trainer]:-}" ] && kill -0 "${PID[trainer]}" 2>/dev/null; then
    kill -TERM -- "-${PID[trainer]}" 2>/dev/null || true
    for ((t = 0; t < STOP_GRACE_S * 10; t++)); do kill -0 "${PID[trainer]}" 2>/dev/null || break; sleep 0.1; done
  fi
  for r in "${!PID[@]}"; do kill -TERM -- "-${PID[$r]}" 2>/dev/null || true; done
  # Up to 1 s for every role's process group to go after SIGTERM (checked every 0.1 s, so a run
  # whose roles exit at once ends at once), then SIGKILL to whatever is left. A zombie (exited, not
  # yet reaped by init) is gone.
  for ((t = 0; t < 10; t++)); do
    ps -e -o pgid=,stat= | awk -v groups=" ${PID[*]} " '$2 !~ /^Z/ && index(groups, " " $1 " ") { left = 1 }
      END { exit !left }' || break
    sleep 0.1
  done
  for r in "${!PID[@]}"; do kill -KILL -- "-${PID[$r]}" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
write_restarts() {
  local r sep=""
  { echo "{"; for r in "${ORDER[@]}"; do echo "$sep\"$r\": ${RESTARTS[$r]:-0}"; sep=","; done
    echo "}"; } > "$RUN_DIR/restarts.json.tmp" && mv "$RUN_DIR/restarts.json.tmp" "$RUN_DIR/restarts.json"
}
progress() { { cat "$RUN_DIR/ledger.jsonl" "$RUN_DIR/metrics.jsonl" 2>/dev/null || true; } | wc -c; }
stop_run() {  # stop_run ROLE MESSAGE: say why, show the role's last log lines, stop every role
  echo "launch.sh: $2; stopping the run. Last lines of $RUN_DIR/$1.log:"
  tail -n 20 "$RUN_DIR/$1.log"; exit 1
}
trap stop_all EXIT
# The end of the run on a host with neither trainer nor param server (see above): probe PARAM_SERVER
# every 5 s with a wire.Ping (under this host's CURVE keys, as its roles connect).
probe_ps() {
  $PYTHON - "$ps_addr" > /dev/null 2>&1 <<'EOF'
import sys
import wire
try:
    wire.Client("launch.sh-probe", sys.argv[1], timeout_s=3.0).call(wire.Ping(), what="liveness")
except Exception:
    sys.exit(1)
EOF
}
watch_ps=""; ENDED=""; ps_seen=0; ps_ok=0; next_probe=0
if [ -z "${HERE[trainer]:-}" ] && [ -z "${HERE[param_server]:-}" ] && [ -n "$ps_addr" ] && [ "$END_AFTER_S" -gt 0 ]; then
  watch_ps=1
fi
trap 'echo; echo "launch.sh: interrupted, stopping every role"; exit 130' INT TERM

for role in "${ORDER[@]}"; do start_role "$role" "$([ "$role" = trainer ] && [ "${RESUME:-0}" = 1 ] && echo --resume)"; done
write_restarts
echo "launch.sh: run dir $RUN_DIR; roles: ${ORDER[*]}; logs in $RUN_DIR/<role>.log"

shown=0
while true; do
  for role in "${ORDER[@]}"; do
    if [ -n "${DUE[$role]:-}" ]; then  # a restart backing off after a repeated failure
      if [ "$(date +%s)" -ge "${DUE[$role]}" ]; then
        unset "DUE[$role]"; start_role "$role" "$([ "$role" = trainer ] && echo --resume)"
      fi
      continue
    fi
    kill -0 "${PID[$role]}" 2>/dev/null && continue
    status=0; wait "${PID[$role]}" 2>/dev/null || status=$?
    if [ "$role" = trainer ] && [ "$status" = 0 ]; then break 2; fi   # the run is complete
    # trainer.EXIT_STOP_RUN or devices.EXIT_MISPLACED (3) from any role, or a verifier that refuses
    # weaker isolation than asked (2): restarting cannot help, so stop the run and say why.
    if [ "$status" = 3 ] || { [ "${role%%-*}" = verifier ] && [ "$status" = 2 ]; }; then
      stop_run "$role" "$role stopped the run (exit status $status)"
    fi
    delay=0
    if [ "$status" != 143 ]; then
      now=$(date +%s)
      recent=""; for t in ${DEATHS[$role]:-}; do [ $((now - t)) -lt "$RESTART_WINDOW" ] && recent="$recent $t"; done
      DEATHS[$role]="$recent $now"
      if [ "$(echo ${DEATHS[$role]} | wc -w)" -gt "$MAX_RESTARTS" ]; then
        stop_run "$role" "$role died $MAX_RESTARTS+ times within ${RESTART_WINDOW}s (last status $status)"
      fi
      # the failure: exit status, last log line without its digits (times, pids), and the run's progress
      failure="$status|$( { tail -n 1 "$RUN_DIR/$role.log" 2>/dev/null || true; } | tr -d '0-9')|$(progress)"
      if [ "$failure" = "${LAST_FAILURE[$role]:-}" ]; then SAME[$role]=$(( ${SAME[$role]:-0} + 1 )); else SAME[$role]=0; fi
      LAST_FAILURE[$role]=$failure
      if [ "${SAME[$role]}" -ge "${#BACKOFF[@]}" ]; then
        stop_run "$role" "$role failed the same way $(( SAME[$role] + 1 )) times in a row with no progress in between (exit status $status)"
      fi
      delay=${BACKOFF[${SAME[$role]}]}
    fi
    RESTARTS[$role]=$(( ${RESTARTS[$role]:-0} + 1 ))
    write_restarts
    if [ "$delay" -gt 0 ]; then
      echo "launch.sh: $role exited (status $status) as before, with no progress; restart #${RESTARTS[$role]} in ${delay}s"
      DUE[$role]=$(( $(date +%s) + delay ))
    else
      echo "launch.sh: $role exited (status $status); restart #${RESTARTS[$role]}"
      start_role "$role" "$([ "$role" = trainer ] && echo --resume)"
    fi
  done
  if [ -n "$watch_ps" ] && [ "$(date +%s)" -ge "$next_probe" ]; then
    if probe_ps; then ps_seen=1; ps_ok=$(date +%s)
    elif [ "$ps_seen" = 1 ] && [ $(( $(date +%s) - ps_ok )) -ge "$END_AFTER_S" ]; then
      echo "launch.sh: the param server $ps_addr has not answered for ${END_AFTER_S}s: the run is over (or its host is gone); stopping this host's roles"
      ENDED=1; break
    fi
    next_probe=$(( $(date +%s) + 5 ))
  fi
  lines=$( { wc -l < "$RUN_DIR/trainer.log"; } 2>/dev/null || echo 0)
  if [ "$lines" -gt "$shown" ]; then sed -n "$((shown + 1)),${lines}p" "$RUN_DIR/trainer.log" | grep -E "step|eval|resumed|checkpoint|error|Error" || true; shown=$lines; fi
  sleep 1
done
[ -z "$ENDED" ] || exit 0   # a host without the trainer: none of the run's results are here
[ -z "$trainer_follows" ] || { echo "launch.sh: the run is complete; its files are on trainer host 0"; exit 0; }
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
