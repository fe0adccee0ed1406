"""Where a step's time goes, per role, and how step time grows with group size, batch and generation length.

Run:  python bench/bench_breakdown.py --runs RUN_DIR          # breakdown of a run + the grid (~4 min)
      python bench/bench_breakdown.py --runs RUN_DIR --no-grid

1. Breakdown of RUN_DIR (default in bench/run_all.py: the asynchrony part's k0 run, latency-bound), from its
   timeline/*.jsonl (timeline.read, timeline.totals: every role's spans of work) and metrics.jsonl:
   per role kind (trainer; worker, summed over the workers), seconds in each span (trainer: wait for
   rollouts, train, push, eval, checkpoint; worker: pull, sample, verify, submit) and the fraction of the
   role's wall time (first span start to last span end, per process) that was busy; plus the trainer's
   mean step time split as metrics.jsonl reports it (wait/rollouts_s, time/train_s, wait/push_s).
2. Grid: very short launch.sh runs (STEPS=4, tiny evaluation, no dynamic sampling, so a step is one
   batch) at a base point (B=8, G=4, L=16) and with one knob changed by 2x each: group size G (8),
   prompts per step B (16), generation length L (8: 32 would not fit the cold-start model's 88 positions). Step time = median of time/step_s over steps 2..4 (step 1 compiles). The slope
   is (step time at 2x - base) / (2x - x) per unit of the knob. A SHORT grid: 3 steps per point,
   4 points, one repetition; each point is one run (noise on a shared machine is not averaged out).

Prints `RESULT name=breakdown_role role=.. busy_frac=.. spans=..` and
`RESULT name=breakdown_slope knob=.. slope_ms=.. points=..`.
"""
import argparse
import os
import statistics
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import timeline  # noqa: E402
from bench_e2e_trl import log_tail, metrics, run_launch  # noqa: E402


def breakdown(run_dir: str) -> None:
    spans = timeline.read(run_dir)
    if not spans:
        print(f"no timeline in {run_dir}")
        print(f"RESULT name=breakdown_role role=none busy_frac=0 spans=no_timeline_in_{run_dir.replace(' ', '_')}")
        return
    tot = timeline.totals(spans)
    walls = {}
    for s in spans:  # per process: first start .. last end
        lo, hi = walls.get(s["role"], (s["start"], s["end"]))
        walls[s["role"]] = (min(lo, s["start"]), max(hi, s["end"]))
    kinds = sorted({k for k, _ in tot})
    print(f"\nbreakdown of {run_dir}: seconds per role kind and span (timeline.totals)")
    for kind in kinds:
        wall = sum(hi - lo for r, (lo, hi) in walls.items() if r.split("-")[0] == kind)
        mine = {span: v for (k, span), v in tot.items() if k == kind}
        # the trainer's "wait" span is waiting, not work
        busy = sum(v for span, v in mine.items() if not (kind == "trainer" and span == "wait"))
        parts = ",".join(f"{span}:{v:.1f}s({v / wall * 100:.0f}%)" for span, v in sorted(mine.items(), key=lambda x: -x[1]))
        print(f"  {kind:8s} wall {wall:7.1f} s  " + "  ".join(f"{span} {v:.1f} s" for span, v in mine.items()))
        print(f"RESULT name=breakdown_role role={kind} wall_s={wall:.1f} busy_frac={busy / wall:.3f} spans={parts}",
              flush=True)
    rows = [r for r in metrics(run_dir) if r.get("step", 0) > 1 and "time/step_s" in r]
    if rows:
        med = {k: statistics.median(r.get(k, 0.0) for r in rows)
               for k in ("time/step_s", "wait/rollouts_s", "time/train_s", "wait/push_s")}
        print(f"  trainer step (median over steps 2..{rows[-1]['step']}): {med['time/step_s']:.2f} s = wait for rollouts "
              f"{med['wait/rollouts_s']:.2f} + train {med['time/train_s']:.2f} + push {med['wait/push_s']:.2f} (+ bookkeeping)")
        print(f"RESULT name=breakdown_role role=trainer_step busy_frac={(med['time/train_s'] + med['wait/push_s']) / med['time/step_s']:.3f} "
              f"spans=step:{med['time/step_s']:.2f}s,wait:{med['wait/rollouts_s']:.2f}s,train:{med['time/train_s']:.2f}s,"
              f"push:{med['wait/push_s']:.2f}s", flush=True)


def grid(steps: int) -> None:
    base = {"B": 8, "G": 4, "L": 16}
    points = [("base", dict(base)), ("G", {**base, "G": 8}), ("B", {**base, "B": 16}), ("L", {**base, "L": 8})]
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, p in points:
            run_dir = os.path.join(tmp, name)
            wall = run_launch(run_dir, steps, {
                "RECIPE": f"--kl-beta 0.2 --lr 1e-4 --group-size {p['G']}",
                "TRAINER_ARGS": f"--eval-samples 1 --no-eval-greedy --prompts-per-step {p['B']} "
                                f"--max-new-tokens {p['L']} --checkpoint-every 1000"}, timeout_s=400)
            rows = [r for r in metrics(run_dir) if r.get("step", 0) >= 2 and "time/step_s" in r]
            if not rows:
                print(f"grid point {name} {p}: no steps after step 1; the end of {run_dir}.log:\n"
                      f"{log_tail(run_dir + '.log')}", flush=True)
                continue
            res[name] = statistics.median(r["time/step_s"] for r in rows)
            print(f"grid {name:4s} B={p['B']:2d} G={p['G']} L={p['L']}: step {res[name]:.2f} s "
                  f"(median of steps 2..{rows[-1]['step']}; run {wall:.0f} s)", flush=True)
    # L is halved, not doubled: the cold-start model has 88 positions, and a ~65-token prompt + 32 new
    # tokens does not fit (such prompts are skipped, and the step waits for others: measured 32.5 s/step)
    for knob, (x0, x1) in (("G", (4, 8)), ("B", (8, 16)), ("L", (8, 16))):
        if "base" in res and knob in res:
            lo, hi = (res[knob], res["base"]) if knob == "L" else (res["base"], res[knob])
            slope = (hi - lo) / (x1 - x0)
            label = {"G": "group_size", "B": "prompts_per_step", "L": "max_new_tokens"}[knob]
            print(f"RESULT name=breakdown_slope knob={label} slope_ms={slope * 1000:.1f} "
                  f"points={knob}{x0}:{lo:.2f}s,{knob}{x1}:{hi:.2f}s rel={hi / lo:.3f}",
                  flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", default="", help="run dir to break down")
    ap.add_argument("--no-grid", action="store_true")
    ap.add_argument("--steps", type=int, default=4, help="steps per grid run")
    args = ap.parse_args()
    if args.runs:
        if os.path.isdir(args.runs):
            breakdown(args.runs)
        else:
            print(f"RESULT name=breakdown_role role=none busy_frac=0 spans=no_run_dir_{args.runs}")
    if not args.no_grid:
        grid(args.steps)


if __name__ == "__main__":
    main()
