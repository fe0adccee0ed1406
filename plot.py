"""Learning curves from a run's metrics.jsonl as one PNG (matplotlib is an optional extra).

    python plot.py runs/demo/metrics.jsonl            # writes runs/demo/curves.png
"""
import json
import os
import sys

PANELS = [("reward/mean", "training reward"), ("eval/pass@1", "held-out pass@1"),
          ("eval/pass@8", "held-out pass@8"), ("policy/entropy", "entropy (nats/token)"),
          ("mismatch/bitwise_frac", "sampler == trainer (fraction of tokens)"),
          ("staleness/max", "max staleness used")]


def main(path: str) -> str:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("plot.py needs matplotlib: pip install matplotlib")
    rows = [json.loads(line) for line in open(path)]
    fig, axes = plt.subplots(2, 3, figsize=(13, 7))
    for ax, (key, title) in zip(axes.flat, PANELS):
        points = [(r["step"], r[key]) for r in rows if key in r]
        if points:
            ax.plot(*zip(*points), marker="o" if key.startswith("eval/") else None)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out = os.path.join(os.path.dirname(path) or ".", "curves.png")
    fig.savefig(out, dpi=90)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    print(main(sys.argv[1]))
