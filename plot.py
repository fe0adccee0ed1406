"""Figures from the run dirs of `bash launch.sh` (matplotlib is an optional extra: pip install matplotlib).

    python plot.py RUN_DIR [RUN_DIR ...] [--out DIR] [--window 60] [--note "short runs"]

Each figure is drawn when the run dirs given allow it (the others are skipped, saying why):
  learning_curve.png  any run: training reward (per step, and its 5-step mean), held-out pass@1 and
                      pass@8 (metrics.jsonl) against the step
  mismatch.png        a run with BF16_FIX=1 and one with BF16_FIX=0: for every on-policy completion
                      token, |trainer log-prob - sampler log-prob| (mismatch.jsonl, summed over steps):
                      a bar for "exactly 0" (bitwise) against the histogram of log10 |difference|
  staleness.png       runs with different MAX_STALENESS: the share of trained rollouts that were 0, 1,
                      2, ... versions old when they entered a batch (staleness/frac_k of every step)
  timeline.png        runs with timeline/*.jsonl (one per MAX_STALENESS, at most 3): what each role
                      was doing (sampling, verifying, waiting, training, pushing, ...) during `--window`
                      seconds, from the start of the run's third training step (after compilation)
A run's settings come from the trainer's line in its commands.sh (--max-staleness, --[no-]bf16-fix,
--steps; the workers are the worker lines), else from metrics.jsonl (staleness/frac_k keys).
"""
from __future__ import annotations

import argparse
import json
import os
import re

import timeline

SPAN_COLORS = {"sample": "tab:blue", "verify": "tab:orange", "submit": "gold", "pull": "tab:purple",
               "wait": "lightgray", "train": "tab:red", "push": "tab:green", "eval": "tab:cyan",
               "checkpoint": "tab:brown"}


# ----------------------------------------------------------------------------- reading run dirs

def read_jsonl(path: str) -> list[dict]:
    rows = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    rows.append(json.loads(line))
                except ValueError:  # a torn last line of a run still going
                    continue
    return rows


def read_run(path: str) -> dict:
    """A run dir's settings and records; `path` may also be a run's metrics.jsonl."""
    run_dir = os.path.dirname(path) if path.endswith(".jsonl") else path
    metrics = read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
    if not metrics:
        raise SystemExit(f"plot.py: {run_dir} has no metrics.jsonl rows: not a run dir of launch.sh?")
    run = {"dir": run_dir, "name": os.path.basename(os.path.normpath(run_dir)), "metrics": metrics,
           "mismatch": read_jsonl(os.path.join(run_dir, "mismatch.jsonl")),
           "bf16_fix": None, "max_staleness": None, "workers": None,
           "steps": max(r["step"] for r in metrics)}
    commands = os.path.join(run_dir, "commands.sh")
    lines = open(commands).read().splitlines() if os.path.exists(commands) else []
    trainer = [line for line in lines if line.endswith("# trainer")]
    if trainer:  # the last occurrence of a flag wins, as in argparse (TRAINER_ARGS come last)
        fix = re.findall(r"--(no-)?bf16-fix\b", trainer[0])
        staleness = re.findall(r"--max-staleness[ =](\d+)", trainer[0])
        run["bf16_fix"] = (fix[-1] != "no-") if fix else None
        run["max_staleness"] = int(staleness[-1]) if staleness else None
        run["workers"] = sum(bool(re.search(r"# worker-\d+$", line)) for line in lines)
    if run["max_staleness"] is None:  # the trainer writes staleness/frac_0 .. frac_k every step
        ks = [int(k.rsplit("_", 1)[1]) for r in metrics for k in r if k.startswith("staleness/frac_")]
        run["max_staleness"] = max(ks) if ks else None
    return run


def label(run: dict) -> str:
    parts = [f"fix {'on' if run['bf16_fix'] else 'off'}" if run["bf16_fix"] is not None else "",
             f"max staleness {run['max_staleness']}" if run["max_staleness"] is not None else "",
             f"{run['workers']} workers" if run["workers"] else "", f"{run['steps']} steps"]
    return f"{run['name']} ({', '.join(p for p in parts if p)})"


def series(run: dict, key: str) -> tuple[list, list]:
    """(steps, values) of a metric; after a resume the last value written for a step wins."""
    by_step = {r["step"]: r[key] for r in run["metrics"] if isinstance(r.get(key), (int, float))}
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


# ----------------------------------------------------------------------------- the figures

def learning_curve(plt, runs: list) -> object:
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for i, run in enumerate(runs):
        color = f"C{i}"
        steps, reward = series(run, "reward/mean")
        if reward:
            axes[0].plot(steps, reward, color=color, alpha=0.3, lw=1)
            k = min(5, len(reward))
            mean = [sum(reward[max(0, j - k + 1):j + 1]) / len(reward[max(0, j - k + 1):j + 1]) for j in range(len(reward))]
            axes[0].plot(steps, mean, color=color, lw=2, label=label(run))
        for ax, key in zip(axes[1:], ("eval/pass@1", "eval/pass@8")):
            ax.plot(*series(run, key), color=color, marker="o", lw=2, label=label(run))
    titles = ("training reward (thin: per step; thick: 5-step mean)", "held-out pass@1", "held-out pass@8")
    for ax, title in zip(axes, titles):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step (policy version)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, loc="lower right")
    return fig


def mismatch(plt, runs: list) -> object:
    """One panel per run: the share of on-policy tokens with trainer == sampler exactly, and of the
    others by log10 |difference| (nats)."""
    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 2.6 * len(runs) + 0.6), sharex=True, squeeze=False)
    for ax, run in zip(axes[:, 0], runs):
        rows = run["mismatch"]
        edges = rows[0]["log10_edges"]
        tokens = sum(r["tokens"] for r in rows)
        zero = sum(r["zero"] for r in rows) / max(tokens, 1)
        counts = [sum(c) / max(tokens, 1) for c in zip(*(r["counts"] for r in rows))]
        width = edges[1] - edges[0]
        zero_x = edges[0] - 2 * width
        color = "tab:green" if run["bf16_fix"] else "tab:red"
        ax.bar([zero_x], [zero], width=1.6 * width, color=color, edgecolor="black")
        ax.bar(edges[:-1], counts, width=width, align="edge", color=color, alpha=0.6, edgecolor="black", lw=0.3)
        ax.text(zero_x, zero, f"{zero:.1%}", ha="center", va="bottom", fontsize=8)
        ax.set_ylim(0, 1.15)
        ax.set_ylabel("share of tokens")
        ax.set_title(f"{label(run)}: {tokens} on-policy tokens over {len(rows)} steps", fontsize=9)
        ax.grid(alpha=0.3, axis="y")
        ticks = [zero_x] + [e for e in edges if float(e).is_integer() and int(e) % 2 == 0]
        ax.set_xticks(ticks, ["exactly 0"] + [f"1e{int(e)}" for e in ticks[1:]])
    axes[-1, 0].set_xlabel("|trainer log-prob - sampler log-prob| of the same token, same weights (nats)")
    return fig


def staleness(plt, runs: list) -> object:
    """A bar group per run: the share of its trained rollouts at each staleness k."""
    K = max(run["max_staleness"] for run in runs)
    fig, ax = plt.subplots(figsize=(9, 3.8))
    width = 0.8 / (K + 1)
    for i, run in enumerate(runs):
        rows = [r for r in run["metrics"] if "staleness/max" in r]
        fracs = [sum(r.get(f"staleness/frac_{k}", 0.0) for r in rows) / max(len(rows), 1) for k in range(K + 1)]
        dropped = max([r.get("rollouts/dropped_stale", 0) for r in run["metrics"]], default=0)
        for k, frac in enumerate(fracs):
            x = i + (k - K / 2) * width
            ax.bar(x, frac, width=width, color=f"C{k}", label=f"staleness {k}" if i == 0 else None)
            if frac > 0:
                ax.text(x, frac, f"{frac:.0%}", ha="center", va="bottom", fontsize=7)
        ax.text(i, 1.1, f"{len(rows)} steps, {dropped} dropped stale", ha="center", fontsize=7)
    ax.set_xticks(range(len(runs)), [f"MAX_STALENESS={r['max_staleness']}\n{r['name']}" for r in runs], fontsize=8)
    ax.set_ylim(0, 1.2)
    ax.set_ylabel("share of trained rollouts")
    ax.set_title("versions between the weights that sampled a rollout and the update that used it", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.grid(alpha=0.3, axis="y")
    return fig


def timeline_figure(plt, runs: list, window_s: float) -> object:
    fig, axes = plt.subplots(len(runs), 1, figsize=(12, 0.5 + 0.45 * sum(r["n_roles"] for r in runs) + 0.6 * len(runs)),
                             squeeze=False)
    for ax, run in zip(axes[:, 0], runs):
        spans = run["spans"]
        trains = [s for s in spans if s["role"] == "trainer" and s["span"] == "train"]
        t0 = trains[min(2, len(trains) - 1)]["start"] if trains else spans[0]["start"]
        roles = sorted({s["role"] for s in spans}, key=lambda r: (r != "trainer", r))
        for row, role in enumerate(roles):
            for name, color in SPAN_COLORS.items():
                bars = [(s["start"] - t0, s["end"] - s["start"]) for s in spans if s["role"] == role and
                        s["span"] == name and s["end"] > t0 and s["start"] < t0 + window_s]
                if bars:
                    ax.broken_barh(bars, (row - 0.4, 0.8), facecolors=color)
        ax.set_yticks(range(len(roles)), roles)
        ax.set_ylim(len(roles) - 0.5, -0.5)
        ax.set_xlim(0, window_s)
        ax.set_title(label(run), fontsize=9)
        ax.grid(alpha=0.3, axis="x")
    axes[-1, 0].set_xlabel("seconds from the start of the third training step")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in SPAN_COLORS.values()]
    fig.legend(handles, list(SPAN_COLORS), loc="lower center", ncol=len(SPAN_COLORS), fontsize=8, frameon=False)
    return fig


# ----------------------------------------------------------------------------- which figures

def one_per(runs: list, key: str) -> list:
    """The first run for each distinct value of run[key] (None left out), in value order."""
    first = {}
    for run in runs:
        if run[key] is not None:
            first.setdefault(run[key], run)
    return [first[v] for v in sorted(first)]


def main(argv=None) -> list[str]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="run dirs of launch.sh (or their metrics.jsonl)")
    p.add_argument("--out", default="", help="where the PNGs go (default: RUN_DIR/figures of the first run)")
    p.add_argument("--window", type=float, default=60.0, help="seconds of the timeline figure")
    p.add_argument("--dpi", type=int, default=90)
    p.add_argument("--note", default="", help="appended to every figure's title, e.g. 'short runs, 2-core CPU'")
    args = p.parse_args(argv)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("plot.py needs matplotlib, an optional extra: pip install matplotlib")
    runs = [read_run(path) for path in args.runs]
    out = args.out or os.path.join(runs[0]["dir"], "figures")
    os.makedirs(out, exist_ok=True)

    figures = {"learning_curve": ("Learning curve", lambda: learning_curve(plt, runs))}
    fix = [r for r in one_per([r for r in runs if r["mismatch"]], "bf16_fix")][::-1]  # fix on first
    if len(fix) == 2:
        figures["mismatch"] = ("Sampler vs trainer log-prob of each sampled token, bf16 fix on and off",
                               lambda: mismatch(plt, fix))
    else:
        print("plot.py: no mismatch.png: needs a run with BF16_FIX=1 and one with BF16_FIX=0 (with mismatch.jsonl)")
    stale = one_per(runs, "max_staleness")
    if len(stale) >= 2:
        figures["staleness"] = ("Staleness of the rollouts trained on", lambda: staleness(plt, stale))
    else:
        print("plot.py: no staleness.png: needs runs with different MAX_STALENESS")
    for run in runs:
        run["spans"] = timeline.read(run["dir"])
        run["n_roles"] = len({s["role"] for s in run["spans"]})
    timed = one_per([r for r in runs if r["spans"]], "max_staleness")[:3] or [r for r in runs if r["spans"]][:1]
    if timed:
        figures["timeline"] = (f"What each role was doing, {args.window:.0f} s of each run",
                               lambda: timeline_figure(plt, timed, args.window))
    else:
        print("plot.py: no timeline.png: no run has timeline/*.jsonl")

    written = []
    for name, (title, draw) in figures.items():
        fig = draw()
        fig.suptitle(title + (f" ({args.note})" if args.note else ""), fontsize=11)
        fig.tight_layout(rect=(0, 0.05 if name == "timeline" else 0, 1, 1))  # the timeline's legend below
        path = os.path.join(out, f"{name}.png")
        fig.savefig(path, dpi=args.dpi)
        plt.close(fig)
        written.append(path)
        print(path)
    return written


if __name__ == "__main__":
    main()
