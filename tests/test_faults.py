"""Preemption and fault tolerance, proven by killing things (docs/preemption.md, "What survives what").

Run: python -m pytest -q tests/test_faults.py        (about 3-4 minutes on a 2-core CPU)

launch.sh is the supervisor here, exactly as a user runs it; the test plays the cluster that takes
chips back: it SIGKILLs roles at seeded random moments and checks what must survive. One test starts
the roles itself, with no supervisor: a param server that stalls during the trainer's weight push.
"""
import json
import os
import signal
import subprocess
import time

import numpy as np
import pytest
from safetensors.numpy import load_file

import lifecycle
import wire
from conftest import ROOT, free_port, wait_until
from test_system import XLA, tiny  # noqa: F401  (the module-scoped tiny model fixture)

TRAINER_ARGS = "--heldout 4 --eval-samples 8 --eval-every 0 --prompts-per-step 4 --checkpoint-every 2"


def launch(run_dir, model_path, steps, workers, worker_args="--lease-s 5", **settings):
    env = {**os.environ, "RUN_DIR": run_dir, "STEPS": str(steps), "WORKERS": str(workers),
           "MODEL": model_path, "PORT": str(free_port()), "TRAINER_ARGS": TRAINER_ARGS,
           "WORKER_ARGS": worker_args, "MAX_RESTARTS": "20",
           # The default recipe minus dynamic sampling: a random model earns reward 0 everywhere, so
           # every group would be filtered and each step would sample 4x more, for nothing tested here.
           "RECIPE": "--kl-beta 0.1", **settings}
    log = open(os.path.join(os.path.dirname(run_dir), os.path.basename(run_dir) + ".launch.log"), "ab")
    return subprocess.Popen(["bash", "launch.sh"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def kill_role(run_dir, role):
    with open(os.path.join(run_dir, "pids", role)) as f:
        pid = int(f.read())
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def steps_done(run_dir) -> int:
    try:
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            return max([json.loads(line)["step"] for line in f if line.strip()], default=0)
    except (OSError, ValueError):
        return 0


def finish(proc, run_dir, timeout_s):
    try:
        wait_until(lambda: proc.poll() is not None, timeout_s, "launch.sh to finish")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
    log = open(run_dir + ".launch.log", errors="replace").read()
    assert proc.returncode == 0, log[-3000:]
    return log


def final_master(run_dir, steps):
    return load_file(os.path.join(run_dir, "checkpoints", f"step_{steps:06d}", "state.safetensors"))


def assert_versions_per_token(rows, bound, measured=True):
    """In-flight weight updates: each step within the bound per token (staleness/max is the oldest
    token's age), the log-probs of the tokens the trainer's own version sampled from its own inputs
    bitwise the sampler's (measured: in at least half the steps), and rows sampled by two versions
    really occurred."""
    steps = [r for r in rows if "reward/mean" in r]
    assert all(r["staleness/max"] <= bound for r in steps), [r["staleness/max"] for r in steps]
    assert all(r["mismatch/bitwise_frac"] == 1.0 for r in steps if "mismatch/bitwise_frac" in r), \
        [r.get("mismatch/bitwise_frac") for r in steps]
    assert not measured or sum("mismatch/bitwise_frac" in r for r in steps) >= len(steps) // 2
    assert max(r["staleness/mixed_row_frac"] for r in steps) > 0, [r["staleness/mixed_row_frac"] for r in steps]


def test_inflight_recompute_with_launch_sh_is_bitwise_and_bounded(tmp_path, tiny):  # noqa: F811
    """INFLIGHT=recompute MAX_STALENESS=1: workers swap new weights into rows in progress (a token delay
    makes rows outlive a step); the run finishes, every step's current-version tokens are bitwise the
    trainer's, and no token older than one version is trained on."""
    run_dir = str(tmp_path / "run")
    proc = launch(run_dir, tiny, 6, workers=2, worker_args="--lease-s 5 --token-delay-s 0.05 --inflight-steps 2",
                  INFLIGHT="recompute", MAX_STALENESS="1")
    log = finish(proc, run_dir, timeout_s=300)
    assert "--inflight recompute" in open(os.path.join(run_dir, "commands.sh")).read()
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert max(r["step"] for r in rows) == 6, log[-2000:]
    assert_versions_per_token(rows, bound=1)


def test_any_role_killed_at_random_moments(tmp_path, tiny):  # noqa: F811
    """Every role SIGKILLed once at a random moment, with in-flight weight updates on (INFLIGHT=keep,
    MAX_STALENESS=1): the run finishes, every prompt has exactly one fate, the bound holds per token."""
    # 16 steps: the five kills land within ~11 s of step 1 (the seeded sleeps below), while even an
    # undisturbed run takes over 1 s a step; the trainer's kill alone costs a restart of several seconds.
    # So every kill lands, and the run goes on for steps after the last one.
    run_dir, steps = str(tmp_path / "run"), 16
    # Workers made a little slow (0.3 s per group, 30 ms per decode step) so that kills land mid-run
    # and new versions arrive while rows are in progress.
    proc = launch(run_dir, tiny, steps, workers=2, worker_args="--lease-s 5 --slow-s 0.3 --token-delay-s 0.03 --inflight-steps 4",
                  INFLIGHT="keep", MAX_STALENESS="1")
    rng = np.random.default_rng(2025)
    victims = list(rng.permutation(["worker-0", "worker-1", "verifier", "param_server", "trainer"]))
    wait_until(lambda: steps_done(run_dir) >= 1, 180, "the first step")
    for victim in victims:
        time.sleep(float(rng.uniform(1.0, 3.0)))
        if proc.poll() is not None or steps_done(run_dir) >= steps:
            break
        kill_role(run_dir, victim)
    finish(proc, run_dir, timeout_s=400)

    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert max(r["step"] for r in rows) == steps
    restarts = json.load(open(os.path.join(run_dir, "restarts.json")))
    assert sum(restarts.values()) >= 3, restarts
    assert "restarts/worker-0" in rows[-1]

    # No rollout used twice, no prompt lost: every training prompt the cursor handed out has exactly
    # one fate in the (resume-rewound) ledger, or is still in flight at the end.
    ledger = [json.loads(line) for line in open(os.path.join(run_dir, "ledger.jsonl"))]
    trained = [e["item_id"] for e in ledger if e["fate"] == "trained"]
    assert len(trained) == len(set(trained)) == rows[-1]["rollouts/trained"]
    meta = json.load(open(os.path.join(run_dir, "checkpoints", f"step_{steps:06d}", "meta.json")))
    fates = [e["item_id"] for e in ledger] + list(meta["in_flight"])
    assert len(fates) == len(set(fates))
    indices = sorted(int(i.split("|")[0].split("/")[1]) for i in fates)
    assert indices == list(range(meta["cursor"]))
    assert sum(rows[-1][f"rollouts/{fate}"] for fate in lifecycle.FATES) == len(ledger)
    # keep: a row that started with an older version keeps its cache, so only rows sampled wholly by
    # the trainer's version are comparable, and with the workers a version ahead those are rare
    assert_versions_per_token(rows, bound=1, measured=False)


def test_deterministic_mode_resume_is_bit_identical(tmp_path, tiny):  # noqa: F811
    """One worker, fixed seeds, on-policy: a run whose trainer is SIGKILLed and resumed ends with exactly
    the weights of a run that was never interrupted."""
    steps = 6
    # The two runs side by side (own RUN_DIRs, own free ports): each is deterministic whatever its pace,
    # which is what this test asserts, so running them together checks the same and waits half as long.
    clean, killed = str(tmp_path / "clean"), str(tmp_path / "killed")
    ports = (free_port(), free_port())
    while len({ports[0], ports[0] + 2, ports[1], ports[1] + 2}) < 4:  # PORT+2 is each run's verifier
        ports = (free_port(), free_port())
    clean_proc = launch(clean, tiny, steps, workers=1, PORT=str(ports[0]))
    try:
        proc = launch(killed, tiny, steps, workers=1, PORT=str(ports[1]))
        wait_until(lambda: steps_done(killed) >= 3, 240, "step 3")
        kill_role(killed, "trainer")                              # loses step 3 (checkpoint is at 2)
        log = finish(proc, killed, timeout_s=300)
    finally:
        finish(clean_proc, clean, timeout_s=300)
    assert "trainer exited (status -9); restart #1" in log or "restart #1" in log
    assert "resumed from step" in open(os.path.join(killed, "trainer.log")).read()

    a, b = final_master(clean, steps), final_master(killed, steps)
    assert a.keys() == b.keys()
    for name in a:
        assert np.array_equal(a[name], b[name]), name


def test_sigterm_checkpoints_and_a_corrupt_checkpoint_falls_back(tmp_path, tiny):  # noqa: F811
    run_dir = str(tmp_path / "run")
    proc = launch(run_dir, tiny, 40, workers=1)
    wait_until(lambda: steps_done(run_dir) >= 3, 240, "step 3")
    # Preemption notice: the trainer checkpoints the step it is in and exits within a bounded time.
    pid = int(open(os.path.join(run_dir, "pids", "trainer")).read())
    t0 = time.monotonic()
    os.kill(pid, signal.SIGTERM)
    wait_until(lambda: "stopped by SIGTERM after checkpointing" in open(os.path.join(run_dir, "trainer.log")).read(),
               60, "the SIGTERM checkpoint")
    assert time.monotonic() - t0 < 60
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(60)
    ckpts = sorted(d for d in os.listdir(os.path.join(run_dir, "checkpoints")) if not d.endswith(".tmp"))
    newest = os.path.join(run_dir, "checkpoints", ckpts[-1], "state.safetensors")
    with open(newest, "r+b") as f:                                 # truncate the newest checkpoint
        f.truncate(os.path.getsize(newest) // 2)
    import trainer, grpo
    cfg = trainer.Config(run_dir=run_dir, model=tiny, resume=True, param_server=f"tcp://127.0.0.1:{free_port()}")
    t = trainer.Trainer(cfg, grpo.GRPOConfig())
    assert t.step_n == int(ckpts[-2].split("_")[1])                # the previous good one


def test_a_resume_before_the_first_checkpoint_starts_the_ledger_afresh(tmp_path, tiny):  # noqa: F811
    """A trainer killed before its first checkpoint left fates for prompts that the resumed one, back
    at cursor 0, hands out again: they are cut, or those prompts would have two fates."""
    import grpo
    import trainer
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lines = [{"step": 1, "item_id": f"train/{i}|p", "fate": "trained"} for i in range(2)]
    (run_dir / "ledger.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    cfg = trainer.Config(run_dir=str(run_dir), model=tiny, resume=True, heldout=2,
                         param_server=f"tcp://127.0.0.1:{free_port()}")
    t = trainer.Trainer(cfg, grpo.GRPOConfig())
    assert (t.step_n, t.collector.cursor, t.ledger_lines) == (0, 0, 0)
    assert (run_dir / "ledger.jsonl").read_text() == ""


def test_a_crash_loop_stops_the_run_whatever_its_pace(tmp_path, tiny):  # noqa: F811
    """A worker that fails the same way at every start (here: asked for two devices on a one-device
    machine) is restarted with back-off, then the run stops naming it and showing its log, although
    its deaths are too far apart for the MAX_RESTARTS-in-RESTART_WINDOW rule (window 1 s)."""
    run_dir = str(tmp_path / "run")
    env = {**os.environ, "RUN_DIR": run_dir, "STEPS": "3", "WORKERS": "1", "MODEL": tiny,
           "PORT": str(free_port()), "TRAINER_ARGS": TRAINER_ARGS, "WORKER_ARGS": "--tensor-parallel 2",
           "RESTART_WINDOW": "1", "CRASH_BACKOFF": "0 2 3",
           # The trainer never gets a worker, so it is still in its step-0 evaluation when the run
           # stops, and an evaluation does not end on SIGTERM: launch.sh would wait out the whole
           # grace (30 s) for a checkpoint that this test does not look at.
           "STOP_GRACE_S": "1"}
    t0 = time.monotonic()
    proc = subprocess.run(["bash", "launch.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "worker-0 failed the same way 4 times in a row with no progress in between" in out, out[-3000:]
    assert "--tensor-parallel 2 needs that many devices" in out.split("failed the same way")[1]  # its log
    assert "restart #2 in 2s" in out and "restart #3 in 3s" in out        # backed off
    assert json.load(open(os.path.join(run_dir, "restarts.json")))["worker-0"] == 3
    assert json.load(open(os.path.join(run_dir, "restarts.json")))["trainer"] == 0
    assert time.monotonic() - t0 < 240


def test_a_push_the_param_server_stalls_is_retried_in_the_same_lineage(roles, tmp_path, tiny):  # noqa: F811
    """The param server is stopped (SIGSTOP) as soon as step 1's batch is collected, so the trainer's
    push of version 1 gets no receipt within its timeout (8 s here); once the trainer says so the server is
    continued. The trainer handles it like any param-server failure (Trainer.push_trained): it does
    not exit, the server never sees a new lineage (its queue is never reset), the run finishes, and
    every prompt the cursor handed out has one fate or is in flight. The trainer compiles its update
    afresh (a cache of its own), so the stop lands while it trains step 1, before the push."""
    run_dir, port, vport = str(tmp_path / "run"), free_port(), free_port()
    ps, va = f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{vport}"
    server = roles.start("param_server", "param_server.py", "--bind", ps, "--state-dir", f"{run_dir}/ps", env=XLA)
    roles.start("verifier", "verifier.py", "--bind", va, "--executors", "1", env=XLA)
    roles.start("worker0", "inference_worker.py", "--param-server", ps, "--verifier", va, "--model", tiny, env=XLA)
    timeline = os.path.join(run_dir, "timeline.jsonl")
    trainer = roles.start("trainer", "trainer.py", "--run-dir", run_dir, "--param-server", ps, "--model", tiny,
                          "--heldout", "2", "--eval-samples", "2", "--no-eval-greedy", "--eval-every", "0",
                          "--prompts-per-step", "2", "--steps", "3", "--timeline", timeline,
                          "--param-server-timeout-s", "8", env={**XLA, "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "trainer-jax-cache")})

    def collected(step):  # the trainer's "wait" span of a step ends when the step's batch is complete
        try:
            spans = [json.loads(line) for line in open(timeline) if line.strip()]
        except (OSError, ValueError):
            return False
        return any(span["span"] == "wait" and span.get("step") == step for span in spans)
    wait_until(lambda: collected(1) or trainer.poll() is not None, 300, "step 1's batch")
    os.killpg(server.pid, signal.SIGSTOP)
    try:
        wait_until(lambda: "while pushing version 1" in roles.log(trainer) or trainer.poll() is not None, 90,
                   "the push to time out")
    finally:
        os.killpg(server.pid, signal.SIGCONT)
    wait_until(lambda: trainer.poll() is not None, 300, "the trainer to finish")
    log = roles.log(trainer)
    assert trainer.returncode == 0, log[-3000:]
    assert "TimeoutError while pushing version 1" in log and "receipt of a weight chunk" in log
    stats = wire.Client("test", ps, timeout_s=10).call(wire.GetStats()).info
    assert stats.get("reset_items", 0) == 0, stats  # one lineage from start to end
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    steps = [r for r in rows if "wait/push_s" in r]
    assert [r["step"] for r in steps] == [1, 2, 3] and steps[0]["wait/push_s"] >= 8
    ledger = [json.loads(line) for line in open(os.path.join(run_dir, "ledger.jsonl"))]
    meta = json.load(open(os.path.join(run_dir, "checkpoints", "step_000003", "meta.json")))
    fates = [e["item_id"] for e in ledger] + list(meta["in_flight"])
    assert sorted(int(i.split("|")[0].split("/")[1]) for i in fates) == list(range(meta["cursor"]))
