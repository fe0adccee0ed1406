"""Soak benchmark: the whole system on loopback for a long stretch, with periodic SIGKILLs, and the
memory of every role over time. A benchmark (it prints figures), not a test.

    python bench/bench_soak.py --minutes 10            # default: 10 min, seed 0
    python bench/bench_soak.py --minutes 5 --seed 1 --model checkpoints/coldstart

What runs: param_server.py, verifier.py (1 executor), 2 inference_worker.py, trainer.py, started with the
flags tests/test_system.py uses. Every 30-60 s (seeded) a random worker or the verifier is SIGKILLed
(its whole process group: the verifier's executors too) and restarted; the trainer is SIGKILLed and
restarted with --resume `--trainer-kills` times, evenly spread. A role that dies on its own is
restarted too and counted apart. Every `--sample-s` seconds the resident memory (VmRSS from
/proc/PID/status, summed over the role's process and its descendants, so the verifier's executors and
their candidates count) of every role is recorded.

It prints: peak RSS per role per minute, final RSS, the RSS trend per role (least-squares slope over
its longest-lived incarnation after a warm-up, MiB/min: a role whose memory grows without bound shows a
steady positive slope), steps reached, restarts done, and the trainer's rollouts/* counters from
metrics.jsonl. psutil is not used (not installed); /proc is read directly (Linux only).

Without --model it builds a tiny random model (as tests/test_system.py's `tiny` fixture does), or uses
checkpoints/coldstart when that folder exists.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
XLA = {"XLA_FLAGS": ""}  # the same (default) compiler flags in every role, as launch.sh and the tests do


# ============================================================================ /proc readers (pure)

def children_map() -> dict[int, list[int]]:
    """ppid -> child pids, from /proc/*/stat (field 4; the command name in field 2 may hold spaces)."""
    out: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:  # exited between listdir and open
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        out[ppid].append(int(entry))
    return out


def rss_kib(pid: int) -> int:
    """VmRSS of one process in KiB; 0 if it is gone or a zombie (no VmRSS line)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_rss_kib(pid: int, children: dict[int, list[int]]) -> int:
    """RSS of a process and all its descendants (shared pages counted in each: an upper bound)."""
    total, stack, seen = 0, [pid], set()
    while stack:
        p = stack.pop()
        if p in seen:
            continue
        seen.add(p)
        total += rss_kib(p)
        stack.extend(children.get(p, []))
    return total


def slope_mib_per_min(t_s: list[float], rss_kib_: list[int]) -> float:
    """Least-squares slope of RSS over time, MiB per minute."""
    if len(t_s) < 3 or max(t_s) - min(t_s) < 30:
        return float("nan")
    return float(np.polyfit(np.asarray(t_s) / 60.0, np.asarray(rss_kib_) / 1024.0, 1)[0])


# ============================================================================ plumbing: roles


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Role:
    name: str
    args: list
    proc: subprocess.Popen | None = None
    started: float = 0.0
    kills: int = 0          # SIGKILLs we injected
    crashes: int = 0        # exits we did not cause
    incarnation: int = 0
    samples: list = field(default_factory=list)   # (t_s, incarnation, rss_kib)


class System:
    def __init__(self, run_dir: str, model: str, workers: int, steps: int, checkpoint_every: int):
        self.run_dir, self.t0 = run_dir, time.monotonic()
        os.makedirs(os.path.join(run_dir, "logs"), exist_ok=True)
        ps, va = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
        self.roles = [Role("param_server", ["param_server.py", "--bind", ps, "--state-dir", f"{run_dir}/ps"]),
                      Role("verifier", ["verifier.py", "--bind", va, "--executors", "1"])]
        for i in range(workers):
            # A short lease: a killed worker's items come back after 20 s, not the default 120 s.
            self.roles.append(Role(f"worker{i}", ["inference_worker.py", "--param-server", ps, "--verifier", va,
                                                  "--model", model, "--name", f"worker-{i}", "--lease-s", "20"]))
        self.trainer_args = ["trainer.py", "--run-dir", run_dir, "--param-server", ps, "--model", model,
                             "--heldout", "4", "--eval-samples", "8", "--eval-every", "0", "--prompts-per-step", "4",
                             "--rollout-timeout-s", "120", "--steps", str(steps),
                             "--checkpoint-every", str(checkpoint_every)]
        self.roles.append(Role("trainer", list(self.trainer_args)))
        self.by_name = {r.name: r for r in self.roles}
        self.progress: list = []   # (t_s, step rows in metrics.jsonl) whenever that count changed

    def now(self) -> float:
        return time.monotonic() - self.t0

    def start(self, role: Role, resume: bool = False) -> None:
        args = role.args + (["--resume"] if resume and "--resume" not in role.args else [])
        role.args = args
        log = open(os.path.join(self.run_dir, "logs", f"{role.name}.log"), "ab")
        log.write(f"\n===== soak: start {role.name} incarnation {role.incarnation + 1} at "
                  f"{self.now():.0f}s: {' '.join(args)}\n".encode())
        log.flush()
        role.proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **XLA}, start_new_session=True)
        log.close()
        role.incarnation += 1
        role.started = self.now()

    def kill(self, role: Role) -> None:
        """SIGKILL the role's whole process group (its executors, candidates and judges too)."""
        if role.proc is not None and role.proc.poll() is None:
            try:
                os.killpg(role.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            role.proc.wait(timeout=30)

    def sample(self) -> None:
        children, t = children_map(), self.now()
        for role in self.roles:
            if role.proc is not None and role.proc.poll() is None:
                role.samples.append((t, role.incarnation, tree_rss_kib(role.proc.pid, children)))
        rows = sum("reward/mean" in r for r in metrics_rows(self.run_dir))
        if not self.progress or rows != self.progress[-1][1]:
            self.progress.append((t, rows))

    def stop(self) -> None:
        for role in self.roles:
            self.kill(role)


# ============================================================================ report


def metrics_rows(run_dir: str) -> list[dict]:
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    rows = []
    with open(path) as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by a SIGKILL mid-write
                pass
    return rows


def report(system: System, minutes: float, warmup_s: float, events: list) -> str:
    roles = system.roles
    n_min = max(1, int(np.ceil(system.now() / 60.0)))
    lines = [f"peak RSS (MiB) per minute, role = process + descendants; {len(events)} injected kills", ""]
    lines.append("minute  " + "".join(f"{r.name:>14}" for r in roles))
    for m in range(n_min):
        cells = []
        for r in roles:
            vals = [kib for t, _, kib in r.samples if m * 60 <= t < (m + 1) * 60]
            cells.append(f"{max(vals) / 1024:14.0f}" if vals else f"{'-':>14}")
        lines.append(f"{m + 1:>6}  " + "".join(cells))
    lines.append("peak    " + "".join(f"{max((k for *_, k in r.samples), default=0) / 1024:14.0f}" for r in roles))
    lines.append("final   " + "".join(f"{(r.samples[-1][2] / 1024 if r.samples else 0):14.0f}" for r in roles))
    lines.append("")
    lines.append(f"RSS trend per role (least-squares slope after {warmup_s:.0f} s of warm-up, in the incarnation "
                 "with the longest post-warm-up span; MiB/min):")
    for r in roles:
        by_inc = collections.defaultdict(list)
        for t, inc, kib in r.samples:
            by_inc[inc].append((t, kib))
        spans = {inc: [(t, k) for t, k in pts if t >= pts[0][0] + warmup_s] for inc, pts in by_inc.items()}
        spans = {inc: pts for inc, pts in spans.items() if len(pts) >= 2}
        if not spans:
            lines.append(f"  {r.name:<13} no incarnation lived past the warm-up")
            continue
        inc, pts = max(spans.items(), key=lambda kv: kv[1][-1][0] - kv[1][0][0])
        slope = slope_mib_per_min([t for t, _ in pts], [k for _, k in pts])
        lines.append(f"  {r.name:<13} incarnation {inc}: {slope:+7.2f} MiB/min over "
                     f"{(pts[-1][0] - pts[0][0]) / 60:4.1f} min ({pts[0][1] / 1024:.0f} -> {pts[-1][1] / 1024:.0f} MiB)")
    lines.append("")
    lines.append("restarts: " + ", ".join(f"{r.name} {r.kills} killed + {r.crashes} crashed" for r in roles))
    rows = metrics_rows(system.run_dir)
    steps = [r["step"] for r in rows if "reward/mean" in r]
    lines.append(f"steps reached: {max(steps) if steps else 0} ({len(steps)} step rows in metrics.jsonl, "
                 f"repeats after a resume included) in {system.now() / 60:.1f} min")
    if len(system.progress) >= 2:
        times = [t for t, _ in system.progress] + [system.now()]
        gap, at = max((b - a, a) for a, b in zip(times, times[1:]))
        lines.append(f"longest stretch without a new step row: {gap:.0f} s (from {at:.0f} s)")
    counters = next((r for r in reversed(rows) if any(k.startswith("rollouts/") for k in r)), {})
    if counters:
        lines.append("trainer rollouts/* at the last step row: " +
                     ", ".join(f"{k}={v}" for k, v in sorted(counters.items()) if k.startswith("rollouts/")))
    lines.append("events: " + "; ".join(f"{t:.0f}s {what}" for t, what in events))
    return "\n".join(lines)


def tiny_model(path: str) -> str:
    """The 2-layer random Qwen2 of tests/test_system.py's `tiny` fixture."""
    sys.path.insert(0, ROOT)
    import jax
    import hf_io
    import model
    cfg = model.ModelConfig(vocab_size=259, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                            head_dim=16, intermediate_size=192, max_seq_len=96, rope_theta=1e4,
                            rms_norm_eps=1e-6, qkv_bias=True, tie_embeddings=True)
    params = model.init_params(cfg, jax.random.PRNGKey(0))
    params = jax.tree_util.tree_map(lambda x: (x * 4).astype(x.dtype) if x.ndim > 1 else x, params)
    hf_io.save_hf(path, cfg, params)
    return path


# ============================================================================ main


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0, help="how long the system runs")
    parser.add_argument("--seed", type=int, default=0, help="seeds the kill schedule")
    parser.add_argument("--kill-min-s", type=float, default=30.0, help="shortest gap between injected kills")
    parser.add_argument("--kill-max-s", type=float, default=60.0, help="longest gap between injected kills")
    parser.add_argument("--trainer-kills", type=int, default=2, help="SIGKILL + --resume of the trainer, spread evenly")
    parser.add_argument("--sample-s", type=float, default=3.0, help="seconds between RSS samples")
    parser.add_argument("--warmup-s", type=float, default=60.0, help="skipped per incarnation in the RSS trend")
    parser.add_argument("--workers", type=int, default=2, help="inference workers")
    parser.add_argument("--checkpoint-every", type=int, default=5, help="trainer checkpoint interval (steps)")
    parser.add_argument("--model", default="", help="HF folder; default checkpoints/coldstart or a tiny random model")
    parser.add_argument("--run-dir", default="", help="where logs, checkpoints and metrics go (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.minutes <= 0 or not 0 < args.kill_min_s <= args.kill_max_s or args.sample_s <= 0 or args.workers < 1:
        parser.error("need minutes > 0, 0 < kill-min-s <= kill-max-s, sample-s > 0, workers >= 1")

    run_dir = args.run_dir or tempfile.mkdtemp(prefix="soak_")
    model_path = args.model or (os.path.join(ROOT, "checkpoints", "coldstart")
                                if os.path.isdir(os.path.join(ROOT, "checkpoints", "coldstart"))
                                else tiny_model(os.path.join(run_dir, "tiny_model")))
    rng = np.random.default_rng(args.seed)
    duration = args.minutes * 60.0
    system = System(run_dir, model_path, args.workers, steps=1_000_000, checkpoint_every=args.checkpoint_every)
    trainer_kills = [duration * (i + 1) / (args.trainer_kills + 1) for i in range(args.trainer_kills)]
    next_kill = float(rng.uniform(args.kill_min_s, args.kill_max_s))
    victims = ["verifier"] + [f"worker{i}" for i in range(args.workers)]
    events: list = []
    print(f"soak: {args.minutes:g} min, run dir {run_dir}, model {model_path}", flush=True)
    for role in system.roles:
        system.start(role)
    try:
        next_sample = 0.0
        while (now := system.now()) < duration:
            for role in system.roles:  # restart roles that died without our help
                if role.proc.poll() is not None:
                    role.crashes += 1
                    events.append((now, f"{role.name} exited by itself ({role.proc.returncode}), restarted"))
                    print(f"[{now:5.0f}s] {role.name} exited with {role.proc.returncode}; restarting", flush=True)
                    system.start(role, resume=role.name == "trainer")
            if trainer_kills and now >= trainer_kills[0]:
                trainer_kills.pop(0)
                role = system.by_name["trainer"]
                system.kill(role)
                role.kills += 1
                events.append((now, "trainer SIGKILL, restarted --resume"))
                print(f"[{now:5.0f}s] SIGKILL trainer; restarting with --resume", flush=True)
                system.start(role, resume=True)
            if now >= next_kill:
                role = system.by_name[str(rng.choice(victims))]
                system.kill(role)
                role.kills += 1
                events.append((now, f"{role.name} SIGKILL, restarted"))
                print(f"[{now:5.0f}s] SIGKILL {role.name}; restarting", flush=True)
                system.start(role)
                next_kill = now + float(rng.uniform(args.kill_min_s, args.kill_max_s))
            if now >= next_sample:
                system.sample()
                next_sample = now + args.sample_s
            time.sleep(0.2)
        system.sample()
    finally:
        system.stop()
    print()
    print(f"command: python bench/bench_soak.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    print(report(system, args.minutes, args.warmup_s, events))
    print(f"logs: {run_dir}/logs")


if __name__ == "__main__":
    main()
