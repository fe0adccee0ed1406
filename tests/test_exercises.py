"""The exercises of docs/walkthrough.md, each run briefly through launch.sh: the metric an exercise says
to watch moves the way it says.

Every exercise is its own `bash launch.sh` (ACCELERATOR=cpu, the embedded cold-start policy, which
earns real rewards: a random model's are all 0, and then no advantage and no loss would move), cut
down to one or three steps of 4 prompts, on its own ports. Most of a run's time is XLA compiling the
sampler and the update, so the runs share a JAX compilation cache (JAX_COMPILATION_CACHE_DIR, which
launch.sh passes to every role) and start when what they can reuse is compiled (SCHEDULE): baseline and
fix_off at once (fix_off's graphs are all its own); loss_agg once baseline has evaluated at step 0
(the sampler is compiled; its update graph is its own); rloo and staleness once baseline is done
(every graph they need is then in the cache: rloo's advantages are computed outside the update).
Runs that overlap share the 2 cores: faster than one after another (they overlap start-up and waits).
Same seed, one worker: step 1 of baseline, rloo and loss_agg trains on the very same rollouts (the
sampler's keys come from the seed, the item and the weight version), so the loss moves because of
the flag alone; the tests check that first (reward/mean and the sampler's entropy equal).
"""
import json
import os
import socket
import subprocess
import time

import pytest

from conftest import ROOT, free_port

SMALL = "--prompts-per-step 4 --rollout-timeout-s 120"
SCHEDULE = [  # (exercise, launch.sh settings, start when: None = at once, or (run, "evaluated" | "done"))
    ("baseline", {}, None),
    ("fix_off", {"BF16_FIX": "0"}, None),
    ("loss_agg", {"TRAINER_ARGS": f"{SMALL} --loss-agg seq_mean_token_mean"}, ("baseline", "evaluated")),
    ("rloo", {"TRAINER_ARGS": f"{SMALL} --advantage rloo"}, ("baseline", "done")),
    ("staleness", {"MAX_STALENESS": "2", "WORKERS": "2", "STEPS": "3"}, ("baseline", "done")),
    ("reward", {"DATA": "{root}/prompts.jsonl", "REWARD": "{root}/short.py:short"}, ("baseline", "done")),
    ("passk", {"TRAINER_ARGS": f"{SMALL} --advantage passk --pass-k 4"}, ("baseline", "done")),
]
SHORT = "def short(completion, row):\n    return 1.0 / (1 + len(completion.strip()))\n"  # exercise (v)
TIMEOUT_S = 300  # all runs together


TAKEN: set = set()  # ports handed to runs of this module (a run binds its ports seconds after launch)


def two_free_ports() -> int:
    """PORT such that PORT (param server) and PORT + 2 (verifier) are both free now, and not given before."""
    for _ in range(50):
        port = free_port()
        if {port, port + 2} & TAKEN:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 2))
            except OSError:
                continue
        TAKEN.update({port, port + 2})
        return port
    raise RuntimeError("no free pair of ports")


def launch(run_dir: str, settings: dict, cache: str) -> subprocess.Popen:
    root = os.path.dirname(run_dir)
    settings = {k: v.format(root=root) for k, v in settings.items()}
    env = {**os.environ, "RUN_DIR": run_dir, "ACCELERATOR": "cpu", "PORT": str(two_free_ports()),
           "JAX_COMPILATION_CACHE_DIR": cache, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
           "VERIFIER_EXECUTORS": "1", "STEPS": "1", "WORKERS": "1", "MAX_STALENESS": "0", "BF16_FIX": "1", "TRAINER_ARGS": SMALL,
           "EVAL": "--heldout 1 --eval-every 0 --eval-samples 8 --no-eval-greedy", **settings}
    for v in ("ROLES", "PARAM_SERVER", "VERIFIER", "BIND", "VERIFIERS", "MODEL", "DATA", "REWARD", "RECIPE", "RESUME",
              "RLAX_CURVE_KEY", "RLAX_CURVE_CLIENTS", "RLAX_CURVE_SERVER_KEY", "TRAINER_HOSTS", "TRAINER_COORDINATOR"):
        if v not in settings:
            env.pop(v, None)
    log = open(run_dir + ".log", "wb")
    return subprocess.Popen(["bash", "launch.sh"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{exercise: [metrics row of each training step]}, the runs started as SCHEDULE says."""
    root = tmp_path_factory.mktemp("exercises")
    cache, procs = str(root / "jax_cache"), {}
    import tasks  # exercise (v)'s files, as its commands make them
    (root / "prompts.jsonl").write_text("".join(json.dumps({"id": i, "prompt": p.prompt, "stop": ["\n"]}) + "\n"
                                                for i, p in enumerate(tasks.train_problems(0).batch(0, 500))))
    (root / "short.py").write_text(SHORT)

    def ready(when) -> bool:
        if when is None:
            return True
        run, what = when
        if run not in procs:
            return False
        if what == "evaluated":  # the step-0 row is written after the first evaluation
            path = root / run / "metrics.jsonl"
            return procs[run].poll() is not None or (path.exists() and path.stat().st_size > 0)
        return procs[run].poll() is not None

    deadline = time.monotonic() + TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            for name, settings, when in SCHEDULE:
                if name not in procs and ready(when):
                    procs[name] = launch(str(root / name), settings, cache)
            if len(procs) == len(SCHEDULE) and all(p.poll() is not None for p in procs.values()):
                break
            time.sleep(0.2)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, 15)
                proc.wait(timeout=30)
    out = {}
    for name, _, _ in SCHEDULE:
        assert name in procs, f"exercise run {name} never started within {TIMEOUT_S}s"
    for name, proc in procs.items():
        log = open(str(root / name) + ".log", errors="replace").read()
        assert proc.returncode == 0, f"exercise run {name} failed ({proc.returncode}):\n{log[-3000:]}"
        rows = [json.loads(line) for line in open(root / name / "metrics.jsonl")]
        out[name] = [r for r in rows if "reward/mean" in r]
        assert out[name], f"{name}: no training step in metrics.jsonl"
    return out


def same_rollouts(a: dict, b: dict) -> None:
    """Step 1 of both runs trained on the same sampled completions and rewards."""
    for key in ("reward/mean", "reward/std", "policy/entropy", "len/completion_mean"):
        assert a[key] == b[key], f"{key}: {a[key]} != {b[key]}: not the same rollouts"


def test_i_rloo_advantages_change_the_loss_on_the_same_rollouts(runs):
    base, rloo = runs["baseline"][0], runs["rloo"][0]
    same_rollouts(base, rloo)
    assert rloo["loss/pg"] != base["loss/pg"]
    assert rloo["policy/grad_norm"] != base["policy/grad_norm"]


def test_ii_fix_off_breaks_bitwise_parity_and_moves_the_ratio(runs):
    base, off = runs["baseline"][0], runs["fix_off"][0]
    assert base["mismatch/bitwise_frac"] == 1.0 and base["mismatch/max_abs_ratio_minus_1"] == 0.0
    assert base["policy/is_weight_mean"] == 1.0  # pi_old / pi_behav = 1 exactly: TIS does nothing
    assert off["mismatch/bitwise_frac"] < 1.0
    assert off["mismatch/max_abs_ratio_minus_1"] > 0.0 and off["mismatch/k3_kl"] > 0.0
    assert off["policy/is_weight_mean"] != 1.0


def test_iii_staleness_lets_older_rollouts_in(runs):
    assert all(r["staleness/max"] == 0 and "staleness/frac_1" not in r for r in runs["baseline"])
    steps = runs["staleness"]
    assert all(0 <= r["staleness/max"] <= 2 and "staleness/frac_2" in r for r in steps)
    assert max(r["staleness/max"] for r in steps) > 0, [r["staleness/max"] for r in steps]
    assert any(r["staleness/frac_0"] < 1.0 for r in steps)
    assert all(r["rollouts/dropped_stale"] >= 0 for r in steps)


def test_iv_loss_aggregation_mode_changes_the_loss_on_the_same_rollouts(runs):
    base, seq = runs["baseline"][0], runs["loss_agg"][0]
    same_rollouts(base, seq)
    # At step 1 (ratio 1, IS weight 1) a sequence's mean token loss is -A_i; GRPO's advantages sum to
    # zero in each group, so the mean over sequences is 0, while token_mean weighs A_i by length.
    assert abs(seq["loss/pg"]) < 1e-5 < abs(base["loss/pg"])
    assert seq["policy/grad_norm"] != base["policy/grad_norm"]


def test_v_a_reward_function_in_a_file_is_what_the_policy_is_paid(runs):
    """Exercise (v): the function's values (1 / (1 + length), never >= 1), not the sandbox's 0/1."""
    for r in runs["reward"]:
        assert 0 < r["reward/mean"] < 1 and r["reward/pass_frac"] == 0.0, r
        assert r["mismatch/bitwise_frac"] == 1.0


def test_vi_passk_advantages_penalise_wrong_answers_of_solved_groups_less(runs):
    """Exercise (vi): the same rollouts, smaller advantages on both sides (binary rewards, k = 4 of 8)."""
    base, passk = runs["baseline"][0], runs["passk"][0]
    same_rollouts(base, passk)
    assert base["adv/mean_wrong"] < passk["adv/mean_wrong"] <= 0.0, (base["adv/mean_wrong"], passk["adv/mean_wrong"])
    assert 0.0 < passk["adv/mean_right"] < base["adv/mean_right"]
    assert passk["loss/pg"] != base["loss/pg"]
