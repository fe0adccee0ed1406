"""Training stall after an inference worker is SIGKILLed: how long the step it dies in takes.

    python bench/bench_preemption.py                    # 30 steps, 2 kills, checkpoints/coldstart
    python bench/bench_preemption.py --steps 40 --kills 3 --model checkpoints/coldstart

What runs: `bash launch.sh` exactly as a user runs it, with MAX_STALENESS=0 (strict on-policy: a step
cannot finish without every prompt it enqueued), WORKERS=2, the default recipe, and
EVAL="--heldout 16 --eval-every 0" (held-out evaluation at the start and the end only, on 16 problems).
WORKER_ARGS is passed through as given (default: none), so the workers run with inference_worker.py's
own lease length: this measures the system as it is, not a tuned lease.

`--kills` times, at evenly spread steps, the bench waits for a step's metrics line and then for
worker-0 to report its first batch of the next step (so it holds a fresh lease), and SIGKILLs worker-0's
whole process group; launch.sh restarts it. The items the dead worker had leased are not sampled
until the param server gives them back; at staleness 0 the trainer cannot finish that step without
them. From metrics.jsonl it reports, for each kill, the duration (time/step_s) of the step during which
the kill happened against the median of its neighbours (up to 3 steps on each side; not step 1, which
compiles, nor another kill's step), and the time from the kill to that step's metrics line.

Last line: `RESULT name=worker_kill_stall step_s=<x> median_neighbour_step_s=<y> ratio=<x/y>` for the
worst kill (largest step_s). Wall time: the run's own (30 steps of the default recipe) plus each kill's
stall; measured 2026-12-01 on a 2-core CPU shared with other test runs (load ~6): steps of ~9 s, two
stalls of ~140 s, 11 min in all. Fewer with --kills 1 or --steps 16.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER_BATCH = re.compile(r"\bv\d+: \d+ items")  # inference_worker's line after it submitted a batch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def step_rows(run_dir: str) -> list:
    """Training-step rows of metrics.jsonl (evaluation-only rows, such as step 0's, left out)."""
    rows = []
    for line in read(os.path.join(run_dir, "metrics.jsonl")).splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if "time/step_s" in row:
            rows.append(row)
    return rows


def wait_for(predicate, timeout_s: float, what: str, proc, poll_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc.poll() is not None:
            raise RuntimeError(f"launch.sh exited ({proc.returncode}) while waiting for {what}")
        time.sleep(poll_s)
    raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def neighbours(step_s: dict, step: int, exclude: set, width: int = 3) -> list:
    """time/step_s of up to `width` steps each side of `step`, without step 1 (compilation) and the
    excluded steps (other kills)."""
    out = []
    for s in list(range(step - width, step)) + list(range(step + 1, step + width + 1)):
        if s > 1 and s in step_s and s not in exclude:
            out.append(step_s[s])
    return out


def lease_setting(worker_args: str) -> str:
    m = re.search(r"--lease-s[= ](\S+)", worker_args)
    if m:
        return f"--lease-s {m.group(1)} (from WORKER_ARGS)"
    m = re.search(r"lease_s: float = ([0-9.]+)", read(os.path.join(ROOT, "inference_worker.py")))
    return f"inference_worker.py default ({m.group(1)} s)" if m else "inference_worker.py default"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=30, help="optimizer steps of the run")
    ap.add_argument("--kills", type=int, default=2, help="SIGKILLs of worker-0, at evenly spread steps")
    ap.add_argument("--model", default="checkpoints/coldstart", help="HF folder the run starts from")
    ap.add_argument("--worker-args", default=os.environ.get("WORKER_ARGS", ""),
                    help="WORKER_ARGS for launch.sh (default: $WORKER_ARGS or none)")
    ap.add_argument("--run-dir", default="", help="where launch.sh writes (default: a new temp dir)")
    ap.add_argument("--timeout-s", type=float, default=900.0, help="give up on the run after this long")
    args = ap.parse_args(argv)
    if args.kills < 1 or args.steps < 4 * (args.kills + 1):
        ap.error("need --kills >= 1 and --steps >= 4 x (kills + 1), so that every kill has neighbours")

    run_dir = os.path.abspath(args.run_dir or tempfile.mkdtemp(prefix="bench_preemption_"))
    if args.run_dir:
        os.makedirs(os.path.dirname(run_dir), exist_ok=True)
    # PYTHON: every role runs with this interpreter (launch.sh's default is the first python3 on PATH)
    env = {**os.environ, "PYTHON": sys.executable, "RUN_DIR": run_dir, "STEPS": str(args.steps), "WORKERS": "2", "MAX_STALENESS": "0",
           "MODEL": args.model, "PORT": str(free_port()), "EVAL": "--heldout 16 --eval-every 0",
           "WORKER_ARGS": args.worker_args, "MAX_RESTARTS": "20"}
    command = "python bench/bench_preemption.py " + " ".join(argv if argv is not None else sys.argv[1:])
    started = datetime.datetime.now().astimezone()
    print(f"bench_preemption: {started:%Y-%m-%d %H:%M:%S %Z}, {os.cpu_count()} cpus; run dir {run_dir}", flush=True)
    print(f"  MAX_STALENESS=0 WORKERS=2 STEPS={args.steps} MODEL={args.model} EVAL='{env['EVAL']}' "
          f"WORKER_ARGS='{args.worker_args}'; worker lease: {lease_setting(args.worker_args)}", flush=True)

    t_start = time.monotonic()
    log = open(run_dir + ".launch.log", "ab")
    proc = subprocess.Popen(["bash", "launch.sh"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    kill_after = [round(args.steps * (i + 1) / (args.kills + 1)) for i in range(args.kills)]
    kills = []  # {"step": in progress when worker-0 died, "to_line_s": from the kill to that step's metrics line}
    worker_log = os.path.join(run_dir, "worker-0.log")
    try:
        for after in kill_after:
            rows = wait_for(lambda: (r := step_rows(run_dir)) and r[-1]["step"] >= after and r,
                            args.timeout_s - (time.monotonic() - t_start), f"step {after}", proc)
            if rows[-1]["step"] >= args.steps - 1:
                break
            # worker-0 holds a lease of the next step once it reported a batch after this line.
            batches0 = len(WORKER_BATCH.findall(read(worker_log)))
            try:
                wait_for(lambda: len(WORKER_BATCH.findall(read(worker_log))) > batches0, 30,
                         "worker-0's next batch", proc, poll_s=0.01)
            except TimeoutError:
                pass  # the log format changed: kill anyway, the step is under way
            pid = int(read(os.path.join(run_dir, "pids", "worker-0")).strip())
            step = step_rows(run_dir)[-1]["step"] + 1
            os.killpg(pid, signal.SIGKILL)  # the whole group: the worker is gone, as on a lost machine
            t_kill = time.monotonic()
            print(f"[{t_kill - t_start:6.1f}s] SIGKILL worker-0 (pid {pid}) during step {step}", flush=True)
            wait_for(lambda: step_rows(run_dir)[-1]["step"] >= step, args.timeout_s - (time.monotonic() - t_start),
                     f"step {step} to finish", proc)
            kills.append({"step": step, "pid": pid, "to_line_s": time.monotonic() - t_kill})
            print(f"[{time.monotonic() - t_start:6.1f}s] step {step} done, {kills[-1]['to_line_s']:.1f} s after the kill",
                  flush=True)
        wait_for(lambda: proc.poll() is not None and proc, args.timeout_s - (time.monotonic() - t_start),
                 "launch.sh to finish", proc)
    except (RuntimeError, TimeoutError) as e:
        print(f"bench_preemption: {e}\n{read(run_dir + '.launch.log')[-3000:]}", file=sys.stderr)
        return 1
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(60)
    wall_s = time.monotonic() - t_start
    if proc.returncode != 0:
        print(f"bench_preemption: launch.sh exited {proc.returncode}\n{read(run_dir + '.launch.log')[-3000:]}",
              file=sys.stderr)
        return 1

    rows = step_rows(run_dir)
    step_s = {r["step"]: r["time/step_s"] for r in rows}  # a resumed step would overwrite: none here
    restarts = json.loads(read(os.path.join(run_dir, "restarts.json")) or "{}")
    kill_steps = {k["step"] for k in kills}
    results = []
    print(f"\nworker_kill_stall: {len(kills)} kills of worker-0, run of {args.steps} steps, {wall_s:.0f} s wall; "
          f"restarts {restarts}")
    print(f"{'kill':>4} {'step':>5} {'step_s':>9} {'median_nb_s':>12} {'ratio':>7} {'kill->line_s':>12}  "
          f"neighbours' step_s")
    for i, k in enumerate(kills):
        nb = neighbours(step_s, k["step"], kill_steps)
        x = step_s.get(k["step"], float("nan"))
        y = float(np.median(nb)) if nb else float("nan")
        results.append((x, y))
        print(f"{i + 1:>4} {k['step']:>5} {x:>9.2f} {y:>12.2f} {x / y:>7.1f} {k['to_line_s']:>12.1f}  "
              f"{', '.join(f'{v:.2f}' for v in nb)}")
    others = [v for s, v in step_s.items() if s > 1 and s not in kill_steps]
    print(f"all other steps (2..{args.steps}, kills excluded): median {np.median(others):.2f} s, "
          f"max {np.max(others):.2f} s")
    print(f"command: {command}")
    x, y = max(results, key=lambda r: r[0])
    print(f"RESULT name=worker_kill_stall step_s={x:.2f} median_neighbour_step_s={y:.2f} ratio={x / y:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
