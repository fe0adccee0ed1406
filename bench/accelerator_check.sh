#!/usr/bin/env bash
# Is this TPU or GPU VM ready for launch.sh, and how fast is it? One script that never installs
# anything (it uses the jax it finds and prints its version) and ends within CHECK_BUDGET_S (285 s),
# so it fits in 5 minutes of a one-GPU machine.
#
#   bash bench/accelerator_check.sh                  # writes accelerator_check.json (path printed at the end)
#   OUT=/some/dir bash bench/accelerator_check.sh    # ... as $OUT/accelerator_check.json, logs beside it
#
# Parts, each time-boxed with `timeout` (one that fails or runs out of time is recorded, the rest go on,
# and the JSON is written whatever happened):
#   placement  DRY_RUN=1 bash launch.sh: which chips each role would get here
#   devices    the jax version, its backend and jax.devices()
#   model      a randomly initialised ~0.5B Qwen2-shaped model (hidden 896, 24 layers, 14 heads, 2 KV
#              heads, intermediate 4864; byte-level tokenizer, vocab 259: the checkpoint of
#              tests/test_system.py's tiny model at Qwen2.5-0.5B's shape), made on the CPU with
#              model.init_params + hf_io.save_hf while the parity part has the accelerator
#   parity     bench/bench_parity.py: sampler vs trainer log-probs, bitwise fraction per batch shape
#   launch     launch.sh for CHECK_STEPS steps with that model on the embedded task, seq_len 128
# The JSON: each part's status and seconds, the devices, the parity cells, and from the run's
# metrics.jsonl and worker logs: step time, tokens/s per role, mismatch/bitwise_frac per step.
#
# Settings: CHECK_DIR (work dir, default a new temp dir), CHECK_PARTS (default
# placement,devices,model,parity,launch), CHECK_SHAPE (0.5b, or tiny for a quick try on a CPU),
# CHECK_STEPS (3), CHECK_BUDGET_S (285: the launch part gets what is left of it), PYTHON.
set -uo pipefail   # not -e: a failed part is recorded and the next one runs
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
CHECK_DIR=${CHECK_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/accelerator_check.XXXXXX")}
CHECK_PARTS=${CHECK_PARTS:-placement,devices,model,parity,launch}
CHECK_SHAPE=${CHECK_SHAPE:-0.5b}
CHECK_STEPS=${CHECK_STEPS:-3}
CHECK_BUDGET_S=${CHECK_BUDGET_S:-285}
JSON=${OUT:+$OUT/accelerator_check.json}
JSON=${JSON:-$CHECK_DIR/accelerator_check.json}
mkdir -p "$CHECK_DIR" "$(dirname "$JSON")"
: > "$CHECK_DIR/parts.tsv"
T0=$(date +%s)
echo "accelerator_check: work dir $CHECK_DIR, report $JSON"

wanted() { case ",$CHECK_PARTS," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
part() {  # part NAME SECONDS COMMAND...: time-boxed; output to the screen and CHECK_DIR/NAME.log
  local name=$1 limit=$2 t0 status
  shift 2
  wanted "$name" || return 0
  echo "== $name (at most ${limit}s)"
  t0=$(date +%s)
  timeout -k 10 "$limit" "$@" 2>&1 | tee "$CHECK_DIR/$name.log"
  status=${PIPESTATUS[0]}
  printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$(($(date +%s) - t0))" "$limit" >> "$CHECK_DIR/parts.tsv"
  return "$status"
}

write_report() {  # always, on any exit: whatever the parts left behind, as one JSON file
  local run=$CHECK_DIR/run
  local f pid
  for f in "$run"/pids/*; do   # a role of our run that launch.sh could not stop (it was killed itself)
    pid=$(cat "$f" 2>/dev/null) || continue
    grep -qa "RUN_DIR=$run" "/proc/$pid/environ" 2>/dev/null && kill -KILL -- "-$pid" 2>/dev/null
  done
  if ! "$PYTHON" - "$CHECK_DIR" "$JSON" "$SECONDS" <<'EOF'
import glob, json, os, re, statistics, sys

d, out, wall = sys.argv[1], sys.argv[2], int(sys.argv[3])

def load(path, default=None):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default

def lines(path):
    try:
        with open(path, errors="replace") as f:
            return f.read().splitlines()
    except OSError:
        return []

def median(xs):
    return statistics.median(xs) if xs else None

report = {"wall_s": wall, "work_dir": d, "parts": {}}
for row in lines(os.path.join(d, "parts.tsv")):
    name, rc, secs, limit = row.split("\t")
    rc = int(rc)
    report["parts"][name] = {"status": "ok" if rc == 0 else "timed out" if rc in (124, 137) else f"failed (exit {rc})",
                             "seconds": int(secs), "limit_s": int(limit)}
report["placement"] = [l for l in lines(os.path.join(d, "placement", "commands.sh"))
                       if l and not l.startswith("export")]
report["devices"] = load(os.path.join(d, "devices.json"))
report["model"] = load(os.path.join(d, "model.json"))

cells = [json.loads(l) for l in lines(os.path.join(d, "parity.jsonl")) if l.strip()]
report["parity"] = {
    "cells": [{k: c.get(k) for k in ("bf16_fix", "decode_rows", "score_batch", "num_tokens", "bitwise_frac",
                                     "max_abs_logp_diff")} for c in cells],
    "bitwise_frac_min": min((c["bitwise_frac"] for c in cells), default=None),
    "all_bitwise": bool(cells) and all(c["bitwise_frac"] == 1.0 for c in cells),
    "xla_flags": cells[0].get("xla_flags") if cells else None}

run = os.path.join(d, "run")
rows = []
for l in lines(os.path.join(run, "metrics.jsonl")):
    try:
        rows.append(json.loads(l))
    except ValueError:
        pass
steps = [r for r in rows if "time/step_s" in r]
later = steps[1:] or steps  # the first step includes compiling the update
train_tps = [r["mismatch/num_tokens"] / r["time/train_s"] for r in later
             if r.get("time/train_s") and r.get("mismatch/num_tokens")]
launch = {
    "env": load(os.path.join(d, "launch_env.json")),
    "steps_done": max((r["step"] for r in steps), default=0),
    "step_time_s": [round(r["time/step_s"], 3) for r in steps],
    "step_time_s_median_after_first": median([r["time/step_s"] for r in later]),
    "train_time_s": [round(r.get("time/train_s", 0.0), 3) for r in steps],
    "bitwise_frac": [r.get("mismatch/bitwise_frac") for r in steps],
    "bitwise_frac_min": min((r["mismatch/bitwise_frac"] for r in steps if "mismatch/bitwise_frac" in r), default=None),
    "tokens_per_s": {"trainer": {
        "sampled_tokens_used_per_step_s": median([r["throughput/tokens_per_s"] for r in later
                                                   if "throughput/tokens_per_s" in r]),
        "scored_tokens_per_train_s": median(train_tps)}},
    "restarts": load(os.path.join(run, "restarts.json")),
    "device_lines": {},
}
batch = re.compile(r"(\d+) tokens in ([\d.]+)s \((\d+) tok/s\)")
for log in sorted(glob.glob(os.path.join(run, "*.log"))):
    role = os.path.basename(log)[:-4]
    text = lines(log)
    if first := [l for l in text if l.startswith(f"{role}: jax ") or "refusing to run" in l]:
        launch["device_lines"][role] = first[:3]
    if role.startswith("worker"):
        tps = [int(m.group(3)) for l in text if (m := batch.search(l))]
        launch["tokens_per_s"][role] = {"batches": len(tps), "first_batch": tps[0] if tps else None,
                                        "median_after_first": median(tps[1:] or tps), "max": max(tps, default=None)}
launch["launch_log_tail"] = lines(os.path.join(d, "launch.log"))[-15:]
report["launch"] = launch
with open(out + ".tmp", "w") as f:
    json.dump(report, f, indent=1)
os.replace(out + ".tmp", out)
print(json.dumps({"parts": report["parts"], "bitwise_frac_min": launch["bitwise_frac_min"],
                  "parity_all_bitwise": report["parity"]["all_bitwise"],
                  "step_time_s_median_after_first": launch["step_time_s_median_after_first"],
                  "tokens_per_s": launch["tokens_per_s"]}, indent=1))
EOF
  then
    printf '{"error": "the report could not be assembled; logs in %s"}\n' "$CHECK_DIR" > "$JSON"
  fi
  if [ -n "${OUT:-}" ]; then   # the logs beside the report, cut to their last 200 kB
    mkdir -p "$OUT/accelerator_check_logs/run"
    for f in "$CHECK_DIR"/*.log "$CHECK_DIR"/run/*.log "$CHECK_DIR"/run/metrics.jsonl "$CHECK_DIR"/run/commands.sh; do
      [ -f "$f" ] && tail -c 200000 "$f" > "$OUT/accelerator_check_logs/${f#"$CHECK_DIR"/}"
    done
  fi
  echo "accelerator_check: report in $JSON ($((SECONDS))s)"
}
trap write_report EXIT

# ---------------------------------------------------------------------------------------------------
part placement 20 env DRY_RUN=1 RUN_DIR="$CHECK_DIR/placement" bash launch.sh

part devices 60 "$PYTHON" - "$CHECK_DIR/devices.json" <<'EOF'
import json, os, sys
import jax
devs = jax.devices()
from importlib.metadata import version
info = {"jax": jax.__version__, "jaxlib": version("jaxlib"), "backend": jax.default_backend(), "count": len(devs),
        "platform": devs[0].platform, "kinds": sorted({d.device_kind for d in devs}),
        "devices": [str(d) for d in devs], "XLA_FLAGS": os.environ.get("XLA_FLAGS", "")}
print(json.dumps(info, indent=1))
json.dump(info, open(sys.argv[1], "w"))
EOF

# The model, on the CPU in the background while the parity part has the accelerator.
part model 200 env JAX_PLATFORMS=cpu "$PYTHON" - "$CHECK_DIR/model" "$CHECK_SHAPE" "$CHECK_DIR/model.json" <<'EOF' &
import json, sys, time
import jax
import hf_io, model
path, shape, info_path = sys.argv[1:4]
SHAPES = {  # Qwen2.5-0.5B's shape with the byte-level vocabulary; "tiny" = tests/test_system.py's model
    "0.5b": dict(hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2, head_dim=64, intermediate_size=4864),
    "tiny": dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=192),
}
t0 = time.perf_counter()
cfg = model.ModelConfig(vocab_size=259, **SHAPES[shape], max_seq_len=128, rope_theta=1e6, rms_norm_eps=1e-6,
                        qkv_bias=True, tie_embeddings=True)
params = model.init_params(cfg, jax.random.PRNGKey(0))
n = sum(x.size for x in jax.tree_util.tree_leaves(params))
hf_io.save_hf(path, cfg, params)
info = {"shape": shape, "params": int(n), "path": path, "seconds": round(time.perf_counter() - t0, 1),
        **{k: getattr(cfg, k) for k in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                                        "intermediate_size", "max_seq_len")}}
json.dump(info, open(info_path, "w"))
print(f"model: {n / 1e6:.1f}M parameters ({shape}) in {path}, {info['seconds']}s")
EOF
model_pid=$!

part parity 100 "$PYTHON" bench/bench_parity.py --fix on --rows 1 16 64 --score-batches 1 8 32 \
  --json "$CHECK_DIR/parity.jsonl"
wait "$model_pid"

if wanted launch; then
  platform=$("$PYTHON" -c "import json,sys; print(json.load(open(sys.argv[1]))['platform'])" \
             "$CHECK_DIR/devices.json" 2>/dev/null || echo auto)
  case $platform in gpu|tpu) ;; *) platform=auto ;; esac
  env_for_launch=(ACCELERATOR="$platform")
  # launch.sh finds the chips itself (nvidia-smi -L, /dev/accel*, /dev/vfio/*); where it cannot, the
  # count jax sees is passed as CHIPS, and the report says so.
  if ! DRY_RUN=1 RUN_DIR="$CHECK_DIR/probe" ACCELERATOR="$platform" bash launch.sh > /dev/null 2>&1; then
    env_for_launch+=(CHIPS="$("$PYTHON" -c "import json,sys; print(json.load(open(sys.argv[1]))['count'])" \
                              "$CHECK_DIR/devices.json" 2>/dev/null || echo 0)")
  fi
  port=$("$PYTHON" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
  env_for_launch+=(RUN_DIR="$CHECK_DIR/run" MODEL="$CHECK_DIR/model" STEPS="$CHECK_STEPS" PORT="$port"
    MAX_RESTARTS=2
    RECIPE="--lr 1e-5"   # no dynamic sampling: a random model earns reward 0, every group would be filtered
    EVAL="--heldout 2 --eval-samples 8 --eval-every 0 --no-eval-greedy"
    TRAINER_ARGS="--prompts-per-step 8 --seq-len 128 --max-new-tokens 32 --rollout-timeout-s 150"
    WORKER_ARGS="--batch-items 8")
  "$PYTHON" -c "import json, sys; json.dump(dict(a.split('=', 1) for a in sys.argv[2:]), open(sys.argv[1], 'w'))" \
    "$CHECK_DIR/launch_env.json" "${env_for_launch[@]}"
  left=$((CHECK_BUDGET_S - ($(date +%s) - T0) - 15))
  [ "$left" -lt 30 ] && left=30
  part launch "$left" env "${env_for_launch[@]}" bash launch.sh
fi
