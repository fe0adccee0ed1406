"""plot.py draws each figure from small synthetic run dirs, and only the figures the run dirs allow."""
import json
import os

import pytest

pytest.importorskip("matplotlib")
import plot  # noqa: E402

EDGES = [-10.0 + 0.5 * i for i in range(23)]


def make_run(root, name, fix=True, staleness=0, steps=6, timeline=True, commands=True):
    """A run dir as launch.sh leaves it: commands.sh, metrics.jsonl, mismatch.jsonl, timeline/."""
    d = os.path.join(root, name)
    os.makedirs(os.path.join(d, "timeline"))
    if commands:
        with open(os.path.join(d, "commands.sh"), "w") as f:
            f.write("# Started by launch.sh\nexport XLA_FLAGS=\"\"\n")
            f.write(f"python3 inference_worker.py --name worker-0 {'--bf16-fix' if fix else '--no-bf16-fix'}  # worker-0\n")
            f.write("python3 inference_worker.py --name worker-1  # worker-1\n")
            f.write(f"python3 trainer.py --run-dir {d} --steps {steps} --max-staleness {staleness} "
                    f"{'--bf16-fix' if fix else '--no-bf16-fix'} --kl-beta 0.2  # trainer\n")
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        f.write(json.dumps({"step": 0, "eval/pass@1": 0.2, "eval/pass@8": 0.7}) + "\n")
        for s in range(1, steps + 1):
            fr = {f"staleness/frac_{k}": (1.0 if k == 0 else 0.0) if staleness == 0 else 1 / (staleness + 1)
                  for k in range(staleness + 1)}
            row = {"step": s, "reward/mean": 0.2 + 0.01 * s, "staleness/max": staleness, **fr,
                   "rollouts/dropped_stale": s * staleness}
            if s == steps:
                row.update({"eval/pass@1": 0.25, "eval/pass@8": 0.75})
            f.write(json.dumps(row) + "\n")
        f.write('{"step": 99, "torn')  # a run still writing: the torn last line is skipped
    with open(os.path.join(d, "mismatch.jsonl"), "w") as f:
        for s in range(1, steps + 1):
            counts = [0] * 22 if fix else [0] * 8 + [5, 20, 40, 20, 5] + [0] * 9
            f.write(json.dumps({"step": s, "tokens": 100, "zero": 100 - sum(counts), "log10_edges": EDGES,
                                "counts": counts}) + "\n")
    if timeline:
        spans = []
        for s in range(steps):
            t = 100.0 + 10 * s
            spans += [{"role": "trainer", "span": "wait", "start": t, "end": t + 4},
                      {"role": "trainer", "span": "train", "start": t + 4, "end": t + 9},
                      {"role": "trainer", "span": "push", "start": t + 9, "end": t + 9.5},
                      {"role": "worker-0", "span": "sample", "start": t + 0.5, "end": t + 2},
                      {"role": "worker-0", "span": "verify", "start": t + 2, "end": t + 3}]
        with open(os.path.join(d, "timeline", "trainer.jsonl"), "w") as f:
            f.writelines(json.dumps(x) + "\n" for x in spans if x["role"] == "trainer")
        with open(os.path.join(d, "timeline", "worker-0.jsonl"), "w") as f:
            f.writelines(json.dumps(x) + "\n" for x in spans if x["role"] == "worker-0")
    return d


def test_read_run_settings(tmp_path):
    run = plot.read_run(make_run(str(tmp_path), "off2", fix=False, staleness=2))
    assert (run["bf16_fix"], run["max_staleness"], run["workers"], run["steps"]) == (False, 2, 2, 6)
    # without commands.sh: the staleness from the metrics' staleness/frac_k keys, the fix unknown
    run = plot.read_run(os.path.join(make_run(str(tmp_path), "bare", staleness=1, commands=False), "metrics.jsonl"))
    assert (run["bf16_fix"], run["max_staleness"]) == (None, 1)


def test_draws_every_figure_the_runs_allow(tmp_path, capsys):
    runs = [make_run(str(tmp_path), "fix"), make_run(str(tmp_path), "nofix", fix=False),
            make_run(str(tmp_path), "stale1", staleness=1), make_run(str(tmp_path), "stale2", staleness=2)]
    out = str(tmp_path / "figs")
    written = plot.main([*runs, "--out", out, "--window", "30", "--dpi", "40"])
    names = sorted(os.path.basename(p) for p in written)
    assert names == ["learning_curve.png", "mismatch.png", "staleness.png", "timeline.png"]
    for p in written:
        assert open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n" and os.path.getsize(p) > 1000


def test_one_run_draws_what_it_can_and_says_why_not(tmp_path, capsys):
    written = plot.main([make_run(str(tmp_path), "only", timeline=False), "--dpi", "40"])
    assert [os.path.basename(p) for p in written] == ["learning_curve.png"]
    assert os.path.dirname(written[0]) == str(tmp_path / "only" / "figures")
    said = capsys.readouterr().out
    assert "no mismatch.png" in said and "no staleness.png" in said and "no timeline.png" in said
