"""Every role as a real process on loopback: a few GRPO steps end to end.

Run: python -m pytest -q tests/test_system.py      (about 2-3 minutes on a 2-core CPU)

These tests use a tiny randomly initialised model (rewards are mostly 0; learning is shown by
`bash launch.sh`, see docs/results.md); what they check is the machinery: the staleness bound,
the on-policy bitwise parity with the fix on and its absence with the fix off, resume, bad input.
"""
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy

import hf_io
import wire
from conftest import ROOT, free_port, wait_until

XLA = {"XLA_FLAGS": ""}  # the same (default) compiler flags in every role, as launch.sh does


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    """A 2-layer byte-level Qwen2 with sharpened random weights (so sampling is not uniform noise):
    conftest.tiny_model_dir, written once per session for every module that imports this fixture."""
    return tiny_model_dir


def start_system(roles, run_dir, model_path, workers=({},), trainer_args=(), fix=True, ps_args=()):
    """Param server, verifier, workers (each a dict of extra flags) and a trainer; returns the trainer."""
    port, vport = free_port(), free_port()
    ps, va = f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{vport}"
    fix_flag = "--bf16-fix" if fix else "--no-bf16-fix"
    roles.start("param_server", "param_server.py", "--bind", ps, "--state-dir", f"{run_dir}/ps", *ps_args, env=XLA)
    roles.start("verifier", "verifier.py", "--bind", va, "--executors", "1", env=XLA)
    for i, extra in enumerate(workers):
        args = [f"--{k.replace('_', '-')}={v}" for k, v in extra.items()]
        roles.start(f"worker{i}", "inference_worker.py", "--param-server", ps, "--verifier", va,
                    "--model", model_path, "--name", f"worker-{i}", fix_flag, *args, env=XLA)
    return roles.start("trainer", "trainer.py", "--run-dir", run_dir, "--param-server", ps,
                       "--model", model_path, "--heldout", "4", "--eval-samples", "8", "--eval-every", "0",
                       "--prompts-per-step", "4", "--rollout-timeout-s", "120", "--audit-frac", "1", fix_flag,
                       *trainer_args, env=XLA), ps


def finish(roles, trainer, timeout_s=240):
    wait_until(lambda: trainer.poll() is not None, timeout_s, "the trainer to finish")
    assert trainer.returncode == 0, roles.log(trainer)[-3000:]


def metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def assert_exported_policy(run_dir, last_checkpoint, init_path) -> dict:
    """$RUN_DIR/final is the trained policy in Hugging Face layout: the bf16 cast of the last
    checkpoint's master weights, loadable like any model folder. Returns how far each tensor moved."""
    final_cfg, final = hf_io.load_hf(os.path.join(run_dir, "final"))
    init_cfg, init = hf_io.load_hf(init_path)
    state = safetensors.numpy.load_file(os.path.join(run_dir, "checkpoints", last_checkpoint, "state.safetensors"))
    master = {k.split("/", 1)[1]: v for k, v in state.items() if k.startswith("master/")}
    flat = {jax.tree_util.keystr(p): np.asarray(v) for p, v in jax.tree_util.tree_flatten_with_path(final)[0]}
    init32 = {jax.tree_util.keystr(p): np.asarray(v, np.float32) for p, v in jax.tree_util.tree_flatten_with_path(init)[0]}
    assert final_cfg == init_cfg and set(flat) == set(master) == set(init32) and master
    for name, w in master.items():
        assert np.array_equal(flat[name].astype(np.float32),
                              np.asarray(jnp.asarray(w).astype(final_cfg.jdtype)).astype(np.float32)), name
    return {k: float(np.abs(master[k] - init32[k]).max()) for k in master}


def test_on_policy_run_is_bitwise_and_resumes(roles, tmp_path, tiny):
    run_dir = str(tmp_path / "run")
    # Every version after the first reaches the worker as a delta (the server waits for each delta however
    # long its encoding takes), and the sampler still holds the trainer's policy bit for bit.
    trainer, ps = start_system(roles, run_dir, tiny, trainer_args=["--steps", "3", "--checkpoint-every", "2"],
                               ps_args=["--delta-wait-s", "60"])
    finish(roles, trainer)
    rows = metrics(run_dir)
    steps = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    # (the tiny random policy's rewards are all equal, so its advantages and steps may be zero: a delta
    # of no bytes at all is a delta too)
    assert steps[-1]["weights/pushed_mib"] > 0 and 0 <= steps[-1]["weights/delta_frac"] < 0.5
    assert "weights/changed_frac/mlp" in steps[-1] and steps[-1]["weights/sync_s"] >= 0
    worker_log = open(os.path.join(roles.log_dir, "worker0.log")).read()
    assert "as a delta from v1" in worker_log and "as a delta from v2" in worker_log
    assert {"eval/pass@1", "eval/pass@8"} <= set(rows[0]) and {"eval/pass@1", "eval/pass@8"} <= set(rows[-1])
    for r in steps:
        # Invariant 2: with the fix on, at staleness 0 the trainer's log-probs at its gradient step
        # are the sampler's, bit for bit, for every completion token.
        assert r["staleness/max"] == 0
        assert r["mismatch/bitwise_frac"] == 1.0 and r["mismatch/max_abs_logp_diff"] == 0.0, r
        assert r["mismatch/num_tokens"] > 0
        for key in ("time_s", "reward/mean", "rollouts/dropped_stale", "mismatch/k3_kl", "policy/entropy",
                    "throughput/tokens_per_s", "wait/rollouts_s"):
            assert key in r
    assert sorted(os.listdir(os.path.join(run_dir, "checkpoints"))) == ["step_000002", "step_000003"]
    assert_exported_policy(run_dir, "step_000003", tiny)

    # Resume: continues from step 3 with the same data cursor, two more steps.
    meta = json.load(open(os.path.join(run_dir, "checkpoints", "step_000003", "meta.json")))
    trainer2 = roles.start("trainer2", "trainer.py", "--run-dir", run_dir, "--param-server", ps,
                           "--model", tiny, "--heldout", "4", "--eval-every", "0", "--prompts-per-step", "4",
                           "--steps", "5", "--resume", env=XLA)
    finish(roles, trainer2)
    assert f"resumed from step 3 (cursor {meta['cursor']}" in roles.log(trainer2)
    assert [r["step"] for r in metrics(run_dir) if "reward/mean" in r] == [1, 2, 3, 4, 5]


def test_fix_off_shows_the_mismatch(roles, tmp_path, tiny):
    run_dir = str(tmp_path / "run")
    # (With DAPO dynamic sampling on, which must keep refilling while it filters uniform groups.) One
    # step: the mismatch is there from the first batch, sampled and scored with the same weights.
    trainer, _ = start_system(roles, run_dir, tiny, trainer_args=["--steps", "1", "--dynamic-sampling"], fix=False)
    finish(roles, trainer)
    steps = [r for r in metrics(run_dir) if "reward/mean" in r]
    assert steps[-1]["rollouts/filtered_zero_var"] > 0
    # Negative control: plain bf16 without remat, same weights, staleness 0, and still not equal.
    assert all(r["staleness/max"] == 0 for r in steps)
    assert min(r["mismatch/bitwise_frac"] for r in steps) < 1.0
    assert max(r["mismatch/max_abs_logp_diff"] for r in steps) > 0.0


def test_staleness_bound_with_a_slow_and_a_fast_worker(roles, tmp_path, tiny):
    run_dir = str(tmp_path / "run")
    # The slow worker holds each lease for more than three times its length: its heartbeats keep it.
    # 15 steps: lag-1 rollouts are trained from step 2 on and the slow worker's first late ones are
    # dropped within the first 5 or so (every ~3 steps after that).
    trainer, ps = start_system(roles, run_dir, tiny, workers=({"batch_items": 1}, {"slow_s": 2, "lease_s": 0.6}),
                               trainer_args=["--steps", "15", "--max-staleness", "1"])
    finish(roles, trainer, timeout_s=300)
    stats = wire.Client("test", ps, timeout_s=10).call(wire.GetStats()).info
    assert stats.get("lease_expired", 0) == 0 and stats.get("reissued", 0) == 0 and stats["renewed"] > 0, stats
    steps = [r for r in metrics(run_dir) if "reward/mean" in r]
    assert len(steps) == 15
    # Invariant 1: nothing staler than k=1 is ever trained on ...
    assert max(r["staleness/max"] for r in steps) <= 1
    # ... while the bound is really exercised: some lag-1 rollouts were used, the slow worker's
    # late ones were dropped and counted.
    assert max(r["staleness/max"] for r in steps) == 1
    assert max(r["rollouts/dropped_stale"] for r in metrics(run_dir)) > 0


def test_a_bound_that_sets_itself_loosens_while_the_trainer_starves(roles, tmp_path, tiny):
    """MAX_STALENESS=auto (--staleness-target): the bound starts at 0, is logged every step
    (staleness/limit), every batch stays within the bound it was admitted under, and with a slow worker
    keeping the trainer waiting the bound rises (it never passes the ceiling, 3); stale rows' policy
    drift is measured (offpolicy/k3_kl)."""
    run_dir = str(tmp_path / "run")
    # 10 steps: the bound rises from the second step on and meets the ceiling within the first five.
    trainer, _ = start_system(roles, run_dir, tiny, workers=({"batch_items": 1}, {"slow_s": 1, "lease_s": 0.6}),
                              trainer_args=["--steps", "10", "--max-staleness", "3", "--staleness-target", "0.01"])
    finish(roles, trainer, timeout_s=300)
    steps = [r for r in metrics(run_dir) if "reward/mean" in r]
    limits = [r["staleness/limit"] for r in steps]
    assert len(steps) == 10 and limits[0] == 0 and max(limits) >= 1 and max(limits) <= 3, limits
    assert all(r["staleness/max"] <= r["staleness/limit"] for r in steps), [(r["staleness/max"], r["staleness/limit"]) for r in steps]
    for a, b in zip(limits, limits[1:]):
        assert abs(a - b) <= 1  # one version at a time
    stale = [r for r in steps if r["staleness/max"] > 0]
    assert stale and all(r["offpolicy/k3_kl"] >= 0 and r["offpolicy/num_tokens"] > 0 for r in stale)


def test_greedy_evaluation_is_the_mode_of_the_same_weights_and_mixed_leases_do_not_stall(roles, tmp_path):
    """eval/greedy_pass@1, decoded by the workers, equals greedy decoding of the same weights in this
    process; and the workers' leases, which mix sampled and greedy evaluation items, are sampled group
    by group (none is left to expire and be reissued)."""
    import tasks
    import warmup
    ckpt, run_dir = os.path.join(ROOT, "checkpoints", "coldstart"), str(tmp_path / "run")
    trainer, ps = start_system(roles, run_dir, ckpt, trainer_args=["--steps", "1", "--heldout", "25"])
    finish(roles, trainer)
    first = metrics(run_dir)[0]
    mcfg, params = hf_io.load_hf(ckpt)
    problems = tasks.heldout_problems(25)  # odd: a lease of 2 items holds the last sampled and the first greedy
    completions = warmup.sample(params, mcfg, hf_io.ByteTokenizer(), problems, jax.random.PRNGKey(0), n=1,
                                prompt_len=72, max_new_tokens=16, temperature=0.0)
    expected = float(np.sum(warmup.score(problems, completions))) / len(problems)  # solved / problems
    assert expected > 0  # the cold start solves some of them, so the equality below says something
    assert first["eval/greedy_pass@1"] == expected
    assert first["eval/pass@1"] != expected  # sampled at temperature 1: a different estimate
    stats = wire.Client("test", ps, timeout_s=10).call(wire.GetStats()).info
    assert stats.get("lease_expired", 0) == 0 and stats.get("reissued", 0) == 0, stats
    # The cold start solves some training problems, so its one GRPO step moved the weights, and the
    # exported policy is the moved one.
    assert max(assert_exported_policy(run_dir, "step_000001", ckpt).values()) > 0


def test_a_broken_verifier_stops_the_run_and_broken_programs_do_not(roles, tmp_path, tiny):
    """Finding 4: verifier failures are not wrong answers. The tiny random model writes nothing but
    broken code, and the runs above finish; here the workers' verifier does not answer, every verdict
    is infra_error, no group is trained on, and the trainer stops the run (exit 3, launch.sh then
    stops every role) within a few steps' worth of groups, naming the status and the verifier's log."""
    run_dir = str(tmp_path / "run")
    port, vport = free_port(), free_port()
    ps = f"tcp://127.0.0.1:{port}"
    roles.start("param_server", "param_server.py", "--bind", ps, "--state-dir", f"{run_dir}/ps", env=XLA)
    roles.start("worker0", "inference_worker.py", "--param-server", ps, "--verifier", f"tcp://127.0.0.1:{vport}",
                "--model", tiny, "--verify-timeout-s", "0.5", env=XLA)   # nothing listens there
    trainer = roles.start("trainer", "trainer.py", "--run-dir", run_dir, "--param-server", ps, "--model", tiny,
                          "--heldout", "1", "--eval-samples", "1", "--no-eval-greedy", "--prompts-per-step", "2",
                          "--steps", "5", env=XLA)
    wait_until(lambda: trainer.poll() is not None, 240, "the trainer to stop the run")
    log = roles.log(trainer)
    assert trainer.returncode == 3, log[-3000:]
    assert "infra_error" in log and "verifier's log" in log
    ledger = [json.loads(line) for line in open(os.path.join(run_dir, "ledger.jsonl"))]
    assert len(ledger) >= 6 and {e["fate"] for e in ledger} == {"verifier_failed"}
    rows = metrics(run_dir)
    assert rows[0]["eval/problems"] == 0 and rows[0]["eval/verifier_failed"] == 1


def test_checkpoint_folder_that_does_not_match_the_model_is_a_clear_error(roles, tmp_path, tiny):
    bad = tmp_path / "bad"
    bad.mkdir()
    cfg = json.load(open(os.path.join(tiny, "config.json")))
    cfg["hidden_size"] = 32                                   # tensors on disk are 64 wide
    json.dump(cfg, open(bad / "config.json", "w"))
    os.link(os.path.join(tiny, "model.safetensors"), bad / "model.safetensors")
    proc = roles.start("trainer", "trainer.py", "--run-dir", str(tmp_path / "run"), "--model", str(bad),
                       "--param-server", f"tcp://127.0.0.1:{free_port()}")
    proc.wait(timeout=120)
    log = roles.log(proc)
    assert proc.returncode != 0 and "trainer: cannot start:" in log and "shape" in log
    assert "Traceback" not in log


def test_worker_jobs_reward_a_right_completion_and_not_a_wrong_one():
    """The worker's verifier jobs for an embedded-task item: the reference answer earns 1, others 0."""
    import envs
    import tasks
    import trainer
    import workitems
    import verifier
    problem = tasks.heldout_problems(1)[0]
    item = workitems.problem_item(problem, "x", trainer.Config(), 3, 64, 0)
    texts = [problem.solution, "0\n", "__import__('os')._exit(0)\n"]
    verdicts = verifier.verify_batch(envs.score_jobs([item], texts), workers=1)
    assert [v.reward for v in verdicts] == [1.0, 0.0, 0.0], verdicts


def test_evaluation_rows_use_common_random_numbers_and_training_rows_do_not():
    """sampler.row_keys: an evaluation item's row keys (it carries a crn_key) are the same at
    every weight version, on every worker, in any lease position and next to any other items, so two
    evaluations of a run draw the same random numbers; a training item's keys change with the version
    and the worker's seed; a non-string
    crn_key is refused by the wire check."""
    import sampler
    import wire

    def item(item_id, G, crn=""):
        return wire.WorkItem(item_id=item_id, prompt="p", group_size=G, seq_len=8, max_new_tokens=2,
                             min_version=0, crn_key=crn)

    ev = item("eval/0/3|p", 4, crn="eval/3|p")
    ev_later = item("eval/150/3|p", 4, crn="eval/3|p")  # the next evaluation of the same problem
    train = item("train/7|q", 4)
    a = np.asarray(sampler.row_keys(0, [ev, train], version=0, rows=16))
    b = np.asarray(sampler.row_keys(0, [train, item("train/9|r", 2), ev_later], version=150, rows=16))
    assert a.shape == b.shape == (16, 2)
    assert np.array_equal(a[:4], b[6:10])          # same evaluation rows: same keys
    assert not np.array_equal(a[4:8], b[:4])       # the training item at another version: new keys
    assert len({k.tobytes() for k in a}) == 16     # every row its own key
    c = np.asarray(sampler.row_keys(1, [ev, train], version=0, rows=16))
    assert np.array_equal(a[:4], c[:4])            # another worker (seed) draws the same evaluation rows
    assert not np.array_equal(a[4:8], c[4:8])      # but its own training rows
    d = np.asarray(sampler.row_keys(0, [item("eval/0/3|p", 4, crn="seed1/eval/3|p")], 0, rows=16))
    assert not np.array_equal(a[:4], d[:4])        # another crn_key (a run with another seed): another draw
    with pytest.raises(wire.WireError, match="crn_key"):
        wire.WorkItem.from_dict({"item_id": "x", "prompt": "p", "group_size": 1, "seq_len": 8, "max_new_tokens": 2,
                                 "min_version": 0, "crn_key": 5})


def test_curation_keeps_the_keep_list_passes_over_uniform_problems_and_resumes(roles, tmp_path, tiny):
    """--curated (offline, curate.py's keep list) and --skip-uniform (online) in a real run: every
    prompt trained is on the list; problems whose last group was all-equal (the random model fails
    nearly everything) are passed over; the order's state survives a resume; a list naming no
    training problem is refused at start."""
    import tasks
    keep = sorted({tasks.problem_key(tasks.train_problems(0)[i]) for i in range(12)})[:6]
    keep_path = tmp_path / "keep.txt"
    keep_path.write_text("# 6 problems\n" + "\n".join(keep) + "\n")
    run_dir = str(tmp_path / "run")
    args = ["--curated", str(keep_path), "--skip-uniform", "1", "--skip-prob", "0.5", "--checkpoint-every", "2"]
    trainer, ps = start_system(roles, run_dir, tiny, trainer_args=["--steps", "3", *args])
    finish(roles, trainer)
    steps = [r for r in metrics(run_dir) if "reward/mean" in r]
    assert steps[-1]["curation/passed_over_not_kept"] > 0
    assert steps[-1]["curation/passed_over_uniform"] > 0, steps[-1]
    meta = json.load(open(os.path.join(run_dir, "checkpoints", "step_000003", "meta.json")))
    assert meta["train_order"]["streak"] and set(meta["train_order"]["streak"]) <= set(keep)
    trainer2 = roles.start("trainer2", "trainer.py", "--run-dir", run_dir, "--param-server", ps, "--model", tiny,
                           "--heldout", "4", "--eval-every", "0", "--prompts-per-step", "4", "--steps", "5",
                           "--resume", *args, env=XLA)
    finish(roles, trainer2)
    rows = [r for r in metrics(run_dir) if "reward/mean" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    # the restored order went on counting from the checkpoint's (a fresh one would restart at 0)
    assert rows[-1]["curation/passed_over_uniform"] >= meta["train_order"]["passed_over"]["uniform"]
    assert rows[-1]["curation/passed_over_not_kept"] > meta["train_order"]["passed_over"]["not_kept"]
    ledger = [json.loads(line) for line in open(os.path.join(run_dir, "ledger.jsonl"))]
    assert ledger and all(tasks.key_of_id(e["item_id"]) in keep for e in ledger)
    bad = tmp_path / "bad.txt"
    bad.write_text("linear:a=99,b=99\n")
    trainer3 = roles.start("trainer3", "trainer.py", "--run-dir", str(tmp_path / "run3"), "--param-server", ps,
                           "--model", tiny, "--curated", str(bad), env=XLA)
    wait_until(lambda: trainer3.poll() is not None, 120, "the trainer to refuse the keep list")
    assert trainer3.returncode != 0 and "none of its 1 keys is a training problem" in roles.log(trainer3)
