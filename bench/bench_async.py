"""Asynchrony: steps per minute, the trainer's busy share and held-out pass@1 / pass@8 after the same
wall time, per asynchrony mode. Two benchmarks in one script:

--latency-bound (what bench/run_all.py runs): sampling made latency-bound on this CPU the way it is on
    a real cluster, and five modes compared with everything else the same:

      mode       launch.sh environment
      k0         MAX_STALENESS=0                      strict on-policy: the workers wait for each version
      k1         MAX_STALENESS=1                      workers sample the next batch with the previous version
      keep       MAX_STALENESS=1 INFLIGHT=keep        ... and swap new weights in between decode steps,
                                                      rows in progress keep their KV cache
      recompute  MAX_STALENESS=1 INFLIGHT=recompute   ... rows in progress get their KV cache recomputed
      auto       MAX_STALENESS=auto                   the bound sets itself (0..STALENESS_CEILING=4), INFLIGHT off

    In every mode: WORKERS=2 (batch of 2 items x G=8 = 16 rows per lease), each worker decodes with
    continuous batching (--slots 16) and the same long-tailed per-row token budgets (--length-tail 0.5:
    budget = 16 x min(1, 0.1 / (1 - u)^2), u drawn from the item id, so the same draw in every mode; a
    third of the rows get the whole budget, the median 6 tokens), and sleeps --token-delay-s (0.03 s)
    per decode step: a sampler whose time goes to per-token latency, as a big model's decode does, not
    to this machine's 2 cores, which the trainer needs (measured: a worker used 5-10 CPU-seconds per
    minute). worker-0 is the straggler: it sleeps --slow-factor (2) x that delay (WORKER0_ARGS). The
    delay is chosen so that sampling a step's 128 rollouts with weights fixed (k0's wait for rollouts)
    takes about as long as the trainer's update (time/train_s), the regime where overlapping them pays:
    at 0.03 s measured 2.7 s of sampling against 1.2-3.8 s of update, which moves with the machine's
    load (README has the calibration). --inflight-steps 4 (decode steps per device call in keep/recompute):
    with the worker's default 16, equal to --max-new-tokens, every call runs all its rows to their end
    before the worker looks for weights or work, so no row is ever in progress at a swap and the
    in-flight modes sample exactly like k1 (measured: 110 swaps, 0 with a row in progress); off-mode
    workers ignore it.
    The trainer: launch.sh's default recipe WITHOUT DAPO dynamic sampling (k3 KL beta 0.2, lr 1e-4;
    --dynamic-sampling puts it back): the tail's cuts fail many rows, so 54-74% of the groups had zero
    variance, and the trainer keeps only (k + 1) x B prompts without a fate in flight (filtered ones
    included), so at k = 1 the workers could sample at most B prompts ahead of a step needing 2-4 B:
    measured recompute 1.09x k0 with it, the asynchrony capped by the feed rule rather than measured.
    B=16 prompts x G=8, --max-new-tokens 16 (the cold-start checkpoint has 88 positions and prompts are
    up to 66 tokens, so at most 22 fit; its completions end by themselves after 5-14 tokens, so the
    tail's cuts are what makes lengths long-tailed), no periodic checkpoints (--checkpoint-every 1000:
    the SIGTERM one only), a tiny start-of-run evaluation (8 problems, 1 sample; not used).

    Figures per mode, from the run dir:
      steps_per_min      steady state: steps completed in the window / window minutes x 60, where the
                         window runs from the end of step 1's push (step 1 compiles; startup excluded) to
                         the end of the trainer's last wait/train/push span before its SIGTERM checkpoint
                         (timeline/trainer.jsonl). steps_per_min_wall: all steps / the whole run's wall
                         time (startup and compilation included), as the default benchmark counts.
                         steps_per_min_median: 60 / the median of time/step_s over steps 2.. (a step's
                         time runs from the end of the previous push to the end of its own, so this is
                         the typical step rate, robust to a burst of other load on a shared machine).
      trainer_busy_frac  the share of that window the trainer spent in its work spans: every trainer span
                         but "wait" (bench_breakdown.py's rule; inside the window these are "train", the
                         update, and "push", the weight push), clipped to the window, summed, / window
                         length. 1 - it is the time it waited for rollouts (or did bookkeeping).
      staleness_mean     token-weighted mean of staleness/mean over the steps (each step's own mean is
                         token-weighted; steps weighted by their tokens, throughput/tokens_per_s x time/step_s)
      bitwise_frac       mean over steps of mismatch/bitwise_frac: the share of the exactly-comparable tokens
                         (sampled by the trainer's current weights from inputs they computed) whose
                         sampler log-prob is bitwise the trainer's: 1.0 expected in every mode
      limit_min/max      auto: the range of staleness/limit over the steps
      mixed_row_frac     mean over steps of staleness/mixed_row_frac: rows with tokens of 2+ versions
      swaps_live         the workers' in-flight weight swaps (timeline "swap" spans) with rows in progress
      fates              ledger.jsonl: trained, dropped_stale, filtered_zero_var, ... per mode
      pass1, pass8       the newest checkpoint evaluated here, the same way for every mode (evaluate():
                         --heldout held-out problems x 8 samples at temperature 1, sampler.generate with 16
                         new tokens and no length tail, the same random keys for every mode, programs run by
                         verifier.verify_batch; pass@k by objectives.pass_at_k_array). pass1_diff_se: the standard
                         error of (this mode's pass@1 - k0's) over the problems, paired (the same problems and
                         keys): the evaluation's own noise, a lower bound of run-to-run noise (which also has
                         the training's).

    Prints `RESULT name=asynchrony mode=M steps_per_min=S trainer_busy_frac=F pass1=P pass8=Q ...` per mode
    (extra key=value fields after those) and a line per mode with staleness, bitwise share and fates.
    Goals (bench/run_all.py marks them): keep or recompute >= 1.5x k0's steps/min with pass@1 no worse
    than k0's within noise; auto within 10% of the better of k0 and k1.

default (no --latency-bound): launch.sh's default run (2 workers, no delays, no tail) for MAX_STALENESS
    0, 1, 2 and auto; prints `RESULT name=asynchrony staleness=k steps=.. wall_s=.. steps_per_min=..
    pass1=.. pass8=..` (steps/min there = all steps / wall minutes, startup included).

Run:  python bench/bench_async.py --latency-bound                       # 5 modes x 150 s + evaluations (~19 min)
      python bench/bench_async.py --latency-bound --modes k0 keep --seconds 60 --keep-dir /tmp/bench-async-x
      python bench/bench_async.py --seconds 120                         # the default-run sweep (~11 min)

Each run: bash launch.sh (bench_e2e_trl.run_launch: its own free ports) with STEPS large (10000), stopped
after --seconds of wall time: SIGTERM to the trainer (it finishes its step, checkpoints and exits),
then to launch.sh's process group. A mode whose worker crashed is reported (its traceback from
worker-*.log) and the other modes go on. The runs are much shorter than a real run (250 steps): SHORT.
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import timeline  # noqa: E402
from bench_e2e_trl import log_tail, metrics, run_launch  # noqa: E402

RECIPE = "--kl-beta 0.2 --dynamic-sampling --lr 1e-4"  # launch.sh's default recipe
LB_RECIPE = "--kl-beta 0.2 --lr 1e-4"  # --latency-bound: the default recipe without dynamic sampling (docstring)
MODES = {  # mode -> launch.sh environment
    "k0": {"MAX_STALENESS": "0"},
    "k1": {"MAX_STALENESS": "1"},
    "keep": {"MAX_STALENESS": "1", "INFLIGHT": "keep"},
    "recompute": {"MAX_STALENESS": "1", "INFLIGHT": "recompute"},
    "auto": {"MAX_STALENESS": "auto"},
}


def load_policy(run_dir: str | None):
    """(cfg, params) of a run's newest checkpoint, or of the cold start (run_dir None)."""
    import hf_io
    import checkpointing
    import update
    cfg, params = hf_io.load_hf(os.path.join(ROOT, "checkpoints/coldstart"))
    if run_dir is None:
        return cfg, params
    master = update.cast_params(params, "float32")
    tensors, meta = checkpointing.read_checkpoint(run_dir, master)
    flat = {k[len("master/"):]: v for k, v in tensors.items() if k.startswith("master/")}
    return cfg, update.cast_params(checkpointing._unflat(master, flat), cfg.jdtype)


def evaluate(cfg, params, n_problems: int, n_samples: int = 8, seed: int = 0) -> dict:
    import jax
    import numpy as np
    import hf_io
    import objectives
    import prompts
    import tasks
    import verifier
    tok = hf_io.ByteTokenizer()
    probs = tasks.heldout_problems(n_problems)
    L = 16
    ids = [tok.encode(prompts.model_prompt(p, "completion")) for p in probs]
    T = 1 << (max(map(len, ids)) + L - 1).bit_length()
    T = min(max(T, 64), cfg.max_seq_len)
    rows = [(j, i) for j, i in enumerate(ids) for _ in range(n_samples)]
    prompt_RT = np.full((len(rows), T), tok.pad_id, np.int32)
    plen = np.zeros(len(rows), np.int32)
    for r, (_, i) in enumerate(rows):
        prompt_RT[r, :len(i)], plen[r] = i, len(i)
    out = {}
    for lo in range(0, len(rows), 256):
        o = __import__("model").generate(params, cfg, prompt_RT[lo:lo + 256], plen[lo:lo + 256],
                                         jax.random.key(seed + lo), max_new_tokens=L, eos_id=10, pad_id=tok.pad_id)
        for k, v in o.items():
            out.setdefault(k, []).append(v)
    out = {k: np.concatenate(v) for k, v in out.items()}
    jobs = []
    for r, (j, _) in enumerate(rows):
        p = probs[j]
        comp = out["tokens_RT"][r][plen[r]:plen[r] + int(out["completion_len_R"][r])]
        text = tok.decode(comp)
        jobs.append({"kind": "assert", "program": prompts.assemble_program(
            "completion", prompts.program_prefix(p, "completion"), text, tuple(prompts.stop_strings(p, "completion"))),
            "tests": p.tests, "timeout_s": 5.0})
    verdicts = verifier.verify_batch(jobs, workers=2)
    correct = np.array([sum(verdicts[j * n_samples + s].reward >= 1.0 for s in range(n_samples))
                        for j in range(len(probs))])
    n = np.full_like(correct, n_samples)
    return {"pass1": float(objectives.pass_at_k_array(n, correct, 1).mean()),
            "pass8": float(objectives.pass_at_k_array(n, correct, 8).mean()),
            "per_problem_pass1": (correct / n_samples).tolist()}


def evaluate_run(run_dir: str, heldout: int, what: str) -> dict:
    try:
        return evaluate(*load_policy(run_dir), heldout)
    except (FileNotFoundError, ValueError, KeyError) as e:
        print(f"{what}: no checkpoint to evaluate ({type(e).__name__}: {e})", flush=True)
        return {"pass1": float("nan"), "pass8": float("nan"), "per_problem_pass1": []}


# ----------------------------------------------------------------------------- the default-run sweep

def staleness_sweep(args, keep: str) -> None:
    t0 = time.monotonic()
    start = evaluate(*load_policy(None), args.heldout)
    print(f"cold start: held-out pass@1 {start['pass1']:.3f} pass@8 {start['pass8']:.3f} "
          f"({args.heldout} problems x 8 samples; {time.monotonic() - t0:.0f} s)", flush=True)
    for k in args.staleness:
        run_dir = os.path.join(keep, f"staleness-{k}")
        shutil.rmtree(run_dir, ignore_errors=True)
        wall = run_launch(run_dir, 10000, {"MAX_STALENESS": str(k), "EVAL": "--heldout 8 --eval-every 0",
                                           "RECIPE": RECIPE,
                                           "TRAINER_ARGS": "--eval-samples 1 --no-eval-greedy"},
                          timeout_s=args.seconds + 120, stop_after_s=args.seconds)
        rows = [r for r in metrics(run_dir) if r.get("step", 0) > 0]
        steps = max((r["step"] for r in rows), default=0)
        ev = evaluate_run(run_dir, args.heldout, f"staleness {k}")
        stale = [r.get("staleness/mean", 0.0) for r in rows]
        limits = [r["staleness/limit"] for r in rows if "staleness/limit" in r]
        print(f"staleness {k}: {steps} steps in {wall:.0f} s; held-out pass@1 {ev['pass1']:.3f} pass@8 {ev['pass8']:.3f}",
              flush=True)
        print(f"RESULT name=asynchrony staleness={k} steps={steps} wall_s={wall:.1f} "
              f"steps_per_min={steps / wall * 60:.2f} pass1={ev['pass1']:.4f} pass8={ev['pass8']:.4f} "
              f"pass1_start={start['pass1']:.4f} pass8_start={start['pass8']:.4f} heldout={args.heldout} "
              f"mean_staleness={(sum(stale) / len(stale) if stale else 0):.3f} "
              f"max_limit={max(limits, default=0)} run_dir={run_dir}", flush=True)


# ----------------------------------------------------------------------------- the latency-bound modes

def trainer_window(run_dir: str) -> dict:
    """The steady-state window of a run from the trainer's timeline (see the module docstring): its
    start and end, the steps completed in it and the trainer's busy seconds in it."""
    spans = [s for s in timeline.read(run_dir) if s["role"] == "trainer"]
    step1_push = [s for s in spans if s["span"] == "push" and s.get("step") == 1]
    # spans of the training loop, not the SIGTERM checkpoint or an evaluation
    loop = [s for s in spans if s["span"] in ("wait", "train", "push")]
    if not step1_push or not loop:
        return {}
    lo, hi = step1_push[0]["end"], max(s["end"] for s in loop)
    if hi <= lo:
        return {}
    busy = sum(max(0.0, min(s["end"], hi) - max(s["start"], lo)) for s in spans if s["span"] != "wait")
    steps = sum(1 for s in spans if s["span"] == "push" and lo < s["end"] <= hi)
    sample, swaps, swaps_live = {}, 0, 0  # worker role -> seconds in "sample" spans inside the window
    for s in timeline.read(run_dir):
        if s["role"].startswith("worker") and s["span"] == "sample":
            sample[s["role"]] = sample.get(s["role"], 0.0) + max(0.0, min(s["end"], hi) - max(s["start"], lo))
        if s["role"].startswith("worker") and s["span"] == "swap":  # in-flight weight swaps (rows: in progress)
            swaps, swaps_live = swaps + 1, swaps_live + (s.get("rows", 0) > 0)
    return {"lo": lo, "hi": hi, "window_s": hi - lo, "busy_s": busy, "steps": steps, "swaps": swaps,
            "swaps_live": swaps_live, "worker_sample_frac": {r: v / (hi - lo) for r, v in sorted(sample.items())}}


def fates(run_dir: str) -> dict:
    out = {}
    try:
        with open(os.path.join(run_dir, "ledger.jsonl")) as f:
            for line in f:
                try:
                    fate = json.loads(line)["fate"]
                except (ValueError, KeyError):
                    continue
                out[fate] = out.get(fate, 0) + 1
    except OSError:
        pass
    return out


def worker_crashes(run_dir: str) -> list:
    """(log, traceback text) of every worker log with a Python traceback in it, and the restarts."""
    found = []
    for name in sorted(os.listdir(run_dir)) if os.path.isdir(run_dir) else []:
        if not (name.startswith("worker-") and name.endswith(".log")):
            continue
        with open(os.path.join(run_dir, name), errors="replace") as f:
            text = f.read()
        if "Traceback" in text:
            i = text.index("Traceback")
            found.append((name, "\n".join(text[i:].splitlines()[:40])))
    return found


def mode_figures(run_dir: str, wall: float) -> dict:
    rows = [r for r in metrics(run_dir) if r.get("step", 0) > 0 and "time/step_s" in r]
    win = trainer_window(run_dir)
    out = {"steps": max((r["step"] for r in rows), default=0), "wall_s": wall}
    out["steps_per_min_wall"] = out["steps"] / wall * 60 if wall else 0.0
    if win:
        out.update(steps_per_min=win["steps"] / win["window_s"] * 60, trainer_busy_frac=win["busy_s"] / win["window_s"],
                   window_s=win["window_s"], window_steps=win["steps"], worker_sample_frac=win["worker_sample_frac"],
                   swaps=win["swaps"], swaps_live=win["swaps_live"])
    else:
        out.update(steps_per_min=0.0, trainer_busy_frac=0.0, window_s=0.0, window_steps=0, worker_sample_frac={},
                   swaps=0, swaps_live=0)
    tok = [(r.get("staleness/mean", 0.0), r.get("throughput/tokens_per_s", 0.0) * r["time/step_s"]) for r in rows]
    wsum = sum(w for _, w in tok)
    out["staleness_mean"] = sum(m * w for m, w in tok) / wsum if wsum else float("nan")
    out["staleness_max"] = max((r.get("staleness/max", 0) for r in rows), default=0)
    bw = [r["mismatch/bitwise_frac"] for r in rows if "mismatch/bitwise_frac" in r]
    out["bitwise_frac"] = sum(bw) / len(bw) if bw else float("nan")
    out["bitwise_steps"] = len(bw)
    lim = [r["staleness/limit"] for r in rows if "staleness/limit" in r]
    out["limit_min"], out["limit_max"] = (min(lim), max(lim)) if lim else (0, 0)
    late = [r for r in rows if r["step"] >= 2]
    med = lambda k: statistics.median(r.get(k, 0.0) for r in late) if late else float("nan")  # noqa: E731
    out["train_s"], out["wait_s"], out["step_s"] = med("time/train_s"), med("wait/rollouts_s"), med("time/step_s")
    out["steps_per_min_median"] = 60 / out["step_s"] if late and out["step_s"] > 0 else 0.0
    mixed = [r["staleness/mixed_row_frac"] for r in rows if "staleness/mixed_row_frac" in r]
    out["mixed_row_frac"] = sum(mixed) / len(mixed) if mixed else 0.0
    out["completion_mean"] = sum(r.get("len/completion_mean", 0.0) for r in rows) / len(rows) if rows else 0.0
    kl = [r["offpolicy/k3_kl"] for r in rows if "offpolicy/k3_kl" in r]
    out["offpolicy_k3_kl"] = sum(kl) / len(kl) if kl else 0.0
    out["fates"] = fates(run_dir)
    try:
        with open(os.path.join(run_dir, "restarts.json")) as f:
            out["restarts"] = {k: v for k, v in json.load(f).items() if v}
    except (OSError, ValueError):
        out["restarts"] = {}
    return out


def latency_bound(args, keep: str) -> None:
    delay0 = args.token_delay_s * args.slow_factor
    recipe = RECIPE if args.dynamic_sampling else LB_RECIPE
    worker_args = (f"--slots {args.slots} --length-tail {args.length_tail} --token-delay-s {args.token_delay_s} "
                   f"--inflight-steps {args.inflight_steps}")
    print(f"latency-bound: WORKERS=2, worker flags '{worker_args}', worker-0 '--token-delay-s {delay0:g}' "
          f"({args.slow_factor:g}x); trainer --max-new-tokens {args.max_new_tokens}, B=16 x G=8, recipe '{recipe}'; "
          f"{args.seconds:.0f} s per mode; run dirs in {keep}", flush=True)
    t0 = time.monotonic()
    start = evaluate(*load_policy(None), args.heldout)
    print(f"cold start: held-out pass@1 {start['pass1']:.3f} pass@8 {start['pass8']:.3f} "
          f"({args.heldout} problems x 8 samples; {time.monotonic() - t0:.0f} s)", flush=True)
    import numpy as np
    done = {}
    for mode in args.modes:
        run_dir = os.path.join(keep, f"mode-{mode}")
        shutil.rmtree(run_dir, ignore_errors=True)
        env = {**MODES[mode], "WORKERS": "2", "WORKER_ARGS": worker_args,
               "WORKER0_ARGS": f"--token-delay-s {delay0:g}", "EVAL": "--heldout 8 --eval-every 0",
               "RECIPE": recipe,
               "TRAINER_ARGS": f"--eval-samples 1 --no-eval-greedy --checkpoint-every 1000 "
                               f"--max-new-tokens {args.max_new_tokens}"}
        env.setdefault("INFLIGHT", "off")
        wall = run_launch(run_dir, 10000, env, timeout_s=args.seconds + 180, stop_after_s=args.seconds)
        load = os.getloadavg()  # the machine's load over the run (this run's own roles included: ~2-3)
        fig = mode_figures(run_dir, wall)
        for log, tb in worker_crashes(run_dir):
            print(f"mode {mode}: {log} has a traceback:\n" + "\n".join(f"  | {x}" for x in tb.splitlines()), flush=True)
        if fig["restarts"]:
            print(f"mode {mode}: roles restarted by launch.sh: {fig['restarts']}", flush=True)
        if not fig["steps"]:
            print(f"mode {mode}: no step completed; the end of {run_dir}.log:\n{log_tail(run_dir + '.log')}\n"
                  f"the end of trainer.log:\n{log_tail(os.path.join(run_dir, 'trainer.log'))}", flush=True)
        ev = evaluate_run(run_dir, args.heldout, f"mode {mode}")
        done[mode] = (fig, ev)
        extra = ""
        if "k0" in done:
            k0fig, k0ev = done["k0"]
            if k0fig["steps_per_min"] > 0:
                extra += f" vs_k0={fig['steps_per_min'] / k0fig['steps_per_min']:.3f}"
            if k0ev["per_problem_pass1"] and ev["per_problem_pass1"]:
                d = np.array(ev["per_problem_pass1"]) - np.array(k0ev["per_problem_pass1"])
                extra += f" pass1_diff_se={d.std(ddof=1) / np.sqrt(d.size) if d.size > 1 else 0.0:.4f}"
        fixed = [done[m][0]["steps_per_min"] for m in ("k0", "k1") if m in done]
        if mode == "auto" and fixed and max(fixed) > 0:
            extra += f" vs_best_k={fig['steps_per_min'] / max(fixed):.3f}"
        f = fig["fates"]
        print(f"mode {mode}: {fig['steps']} steps in {wall:.0f} s ({fig['window_steps']} in the {fig['window_s']:.0f} s "
              f"steady window); trainer busy {fig['trainer_busy_frac']:.2f}; median step {fig['step_s']:.2f} s = wait "
              f"{fig['wait_s']:.2f} + train {fig['train_s']:.2f} (+ push); workers sampling "
              + ", ".join(f"{r} {v:.2f}" for r, v in fig["worker_sample_frac"].items())
              + f" of the window; staleness mean {fig['staleness_mean']:.3f} (token-weighted) max {fig['staleness_max']}; "
              f"bitwise_frac {fig['bitwise_frac']:.4f} over {fig['bitwise_steps']} steps; offpolicy k3_kl "
              f"{fig['offpolicy_k3_kl']:.2e}"
              + (f"; staleness/limit {fig['limit_min']}..{fig['limit_max']}" if mode == "auto" else "")
              + f"; rows with tokens of 2+ versions {fig['mixed_row_frac']:.3f}; in-flight swaps {fig['swaps']} "
              f"({fig['swaps_live']} with rows in progress); mean completion {fig['completion_mean']:.1f} tokens"
              + f"; fates {json.dumps(f, sort_keys=True)}; held-out pass@1 {ev['pass1']:.3f} pass@8 {ev['pass8']:.3f}",
              flush=True)
        print(f"RESULT name=asynchrony mode={mode} steps_per_min={fig['steps_per_min']:.2f} "
              f"trainer_busy_frac={fig['trainer_busy_frac']:.3f} pass1={ev['pass1']:.4f} pass8={ev['pass8']:.4f} "
              f"steps={fig['steps']} wall_s={wall:.1f} steps_per_min_wall={fig['steps_per_min_wall']:.2f} "
              f"steps_per_min_median={fig['steps_per_min_median']:.2f} "
              f"window_s={fig['window_s']:.1f} train_s={fig['train_s']:.3f} wait_s={fig['wait_s']:.3f} "
              f"staleness_mean={fig['staleness_mean']:.3f} bitwise_frac={fig['bitwise_frac']:.4f} "
              f"mixed_row_frac={fig['mixed_row_frac']:.3f} swaps_live={fig['swaps_live']} "
              f"limit_min={fig['limit_min']} limit_max={fig['limit_max']} "
              f"trained={f.get('trained', 0)} dropped_stale={f.get('dropped_stale', 0)} "
              f"filtered_zero_var={f.get('filtered_zero_var', 0)} pass1_start={start['pass1']:.4f} "
              f"pass8_start={start['pass8']:.4f} heldout={args.heldout} token_delay_s={args.token_delay_s:g} "
              f"slow_factor={args.slow_factor:g} length_tail={args.length_tail:g} slots={args.slots} "
              f"inflight_steps={args.inflight_steps} load1={load[0]:.2f} load5={load[1]:.2f} "
              f"max_new_tokens={args.max_new_tokens} dynamic_sampling={int(args.dynamic_sampling)} crashed={len(worker_crashes(run_dir))}{extra} run_dir={run_dir}",
              flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--latency-bound", action="store_true",
                    help="the five-mode comparison with latency-bound sampling (module docstring)")
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES), help="--latency-bound: modes to run")
    ap.add_argument("--token-delay-s", type=float, default=0.03,
                    help="--latency-bound: each worker sleeps this long per decode step (README: calibration)")
    ap.add_argument("--slow-factor", type=float, default=2.0, help="--latency-bound: worker-0's delay is this x the others'")
    ap.add_argument("--length-tail", type=float, default=0.5, help="--latency-bound: the workers' --length-tail")
    ap.add_argument("--slots", type=int, default=16, help="--latency-bound: the workers' --slots")
    ap.add_argument("--inflight-steps", type=int, default=4,
                    help="--latency-bound: the workers' --inflight-steps (decode steps per device call in keep / "
                         "recompute; below --max-new-tokens, or no row is ever in progress at a swap: docstring)")
    ap.add_argument("--max-new-tokens", type=int, default=16,
                    help="--latency-bound: the trainer's --max-new-tokens (at most 22 with the cold-start model)")
    ap.add_argument("--dynamic-sampling", action="store_true",
                    help="--latency-bound: keep DAPO dynamic sampling in the recipe (off by default: docstring)")
    ap.add_argument("--staleness", nargs="+", default=["0", "1", "2", "auto"],
                    help="without --latency-bound: MAX_STALENESS values: numbers of versions, or auto")
    ap.add_argument("--seconds", type=float, default=None,
                    help="wall time of each run (default 150 with --latency-bound, else 120)")
    ap.add_argument("--heldout", type=int, default=64, help="held-out problems per evaluation")
    ap.add_argument("--keep-dir", default="", help="keep the run dirs here (mode-<m> or staleness-<k>)")
    args = ap.parse_args()
    if args.seconds is None:
        args.seconds = 150.0 if args.latency_bound else 120.0
    keep = args.keep_dir or tempfile.mkdtemp(prefix="bench-async-")
    os.makedirs(keep, exist_ok=True)
    if args.latency_bound:
        latency_bound(args, keep)
    else:
        staleness_sweep(args, keep)


if __name__ == "__main__":
    main()
