"""Placement: which chips each role gets on the TPU and GPU VMs docs/scaling.md documents, read from the
commands.sh that `DRY_RUN=1 bash launch.sh` writes; and the check that stops a role placed on an
accelerator when JAX finds only the CPU (no silent fallback).

Run: python -m pytest -q tests/test_placement.py        (a few seconds; no accelerator needed)

CHIPS and ACCELERATOR stand in for the machine, so every shape is checked on this CPU machine.
"""
import json
import os
import shlex
import subprocess
import sys
import time

import pytest

import devices
from conftest import ROOT


@pytest.fixture
def no_jax(tmp_path):
    """A PYTHONPATH entry whose `jax` package leaves a marker and fails: DRY_RUN must not import jax."""
    pkg = tmp_path / "fake_jax" / "jax"
    pkg.mkdir(parents=True)
    marker = tmp_path / "jax_imported"
    (pkg / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\nraise ImportError('no jax in a dry run')\n")
    return str(tmp_path / "fake_jax"), marker


def launch(tmp_path, no_jax=None, **settings):
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items()
           if k not in ("CUDA_VISIBLE_DEVICES", "XLA_CLIENT_MEM_FRACTION", "WORKERS")}
    env.update(RUN_DIR=str(run_dir), **{k: str(v) for k, v in settings.items()})
    if no_jax:
        env["PYTHONPATH"] = no_jax[0] + os.pathsep + env.get("PYTHONPATH", "")
    t0 = time.monotonic()
    proc = subprocess.run(["bash", "launch.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    return proc, run_dir, time.monotonic() - t0


def dry_run(tmp_path, no_jax, **settings) -> dict:
    """{role: (env dict, argv)} from commands.sh, after checking that nothing was started."""
    proc, run_dir, took = launch(tmp_path, no_jax, DRY_RUN=1, **settings)
    assert proc.returncode == 0, proc.stderr
    assert took < 15, f"DRY_RUN took {took:.1f}s"
    text = (run_dir / "commands.sh").read_text()
    assert proc.stdout == text  # printed as written
    assert sorted(os.listdir(run_dir)) == ["commands.sh"]  # no log, no pids/, no param server state
    assert not no_jax[1].exists(), "DRY_RUN imported jax"
    roles = {}
    for line in text.splitlines():
        if line.startswith(("#", "export ")):
            continue
        command, role = line.rsplit("  # ", 1)
        roles[role] = split_line(command)
    return roles


def split_line(command: str) -> tuple:
    """'VAR=value ... python3 script.py --flag ...' -> ({VAR: value}, [python3, script.py, --flag, ...])"""
    words = shlex.split(command)
    n_env = next(i for i, w in enumerate(words) if "=" not in w)
    return dict(w.split("=", 1) for w in words[:n_env]), words[n_env:]


def chips(env: dict, var: str) -> list:
    return [c for c in env.get(var, "").split(",") if c]


def flag(argv: list, name: str):
    return argv[argv.index(name) + 1] if name in argv else None


def assert_off_accelerator(roles):
    for role in ("param_server", "verifier"):
        env, _ = roles[role]
        assert env["JAX_PLATFORMS"] == "cpu"
        assert not chips(env, "CUDA_VISIBLE_DEVICES") and "TPU_VISIBLE_CHIPS" not in env
        assert "RLAX_ACCELERATOR" not in env


def test_cpu_default_is_unchanged(tmp_path, no_jax):
    """The README's first command on a CPU machine: the same roles and the same commands as always, each
    line only prefixed with JAX_PLATFORMS=cpu (what JAX picks on such a machine anyway)."""
    # ACCELERATOR=auto (the default) where this machine has no accelerator, as in CI
    on_cpu = {} if devices.detect()[0] == "cpu" else {"ACCELERATOR": "cpu"}
    roles = dry_run(tmp_path, no_jax, **on_cpu)
    run_dir = tmp_path / "run"
    assert list(roles) == ["param_server", "verifier", "worker-0", "worker-1", "trainer"]
    ps, va = "tcp://127.0.0.1:5555", "tcp://127.0.0.1:5557"
    expected = {
        "param_server": f"python3 param_server.py --bind {ps} --state-dir {run_dir}/param_server "
                        f"--verdict-key {run_dir}/verdict.key",
        "verifier": f"python3 verifier.py --bind {va} --executors 2 --verdict-key {run_dir}/verdict.key",
        "worker-0": f"python3 inference_worker.py --param-server {ps} --verifier {va} --model checkpoints/coldstart "
                    f"--name worker-0 --seed 0 --pull-every 1 --timeline {run_dir}/timeline/worker-0.jsonl --bf16-fix",
        "worker-1": f"python3 inference_worker.py --param-server {ps} --verifier {va} --model checkpoints/coldstart "
                    f"--name worker-1 --seed 1 --pull-every 1 --timeline {run_dir}/timeline/worker-1.jsonl --bf16-fix",
        "trainer": f"python3 trainer.py --run-dir {run_dir} --param-server {ps} --model checkpoints/coldstart --seed 0 "
                   f"--steps 250 --max-staleness 0 --timeline {run_dir}/timeline/trainer.jsonl --bf16-fix --kl-beta 0.2 --dynamic-sampling --lr 1e-4 "
                   f"--heldout 256 --eval-every 125"}
    for role, (env, argv) in roles.items():
        assert " ".join(argv) == expected[role]
        assert env == ({"JAX_PLATFORMS": "cpu"} if role in ("param_server", "verifier")
                       else {"JAX_PLATFORMS": "cpu", "RLAX_ACCELERATOR": "cpu"})
    # WORKERS still counts on the CPU (test_faults.py and test_preemption.py rely on it)
    assert [r for r in dry_run(tmp_path, no_jax, WORKERS=3, **on_cpu) if r.startswith("worker")] == \
        ["worker-0", "worker-1", "worker-2"]


@pytest.mark.parametrize("vm,n_chips", [("v4-8", 4), ("v5e-8", 8), ("v5p-8", 4)])
def test_tpu_vm(tmp_path, no_jax, vm, n_chips):
    roles = dry_run(tmp_path, no_jax, ACCELERATOR="tpu", CHIPS=n_chips)
    assert_off_accelerator(roles)
    jax_roles = {r: v for r, v in roles.items() if r not in ("param_server", "verifier")}
    # the trainer gets half the chips, one worker per chip left
    assert list(jax_roles) == [f"worker-{i}" for i in range(n_chips // 2)] + ["trainer"]
    assert chips(roles["trainer"][0], "TPU_VISIBLE_CHIPS") == [str(c) for c in range(n_chips // 2)]
    seen, ports = [], []
    for role, (env, argv) in jax_roles.items():
        got = chips(env, "TPU_VISIBLE_CHIPS")
        seen += got
        assert env["TPU_CHIPS_PER_PROCESS_BOUNDS"] == {1: "1,1,1", 2: "1,2,1", 4: "2,2,1"}[len(got)]
        assert env["TPU_PROCESS_BOUNDS"] == "1,1,1" and env["CLOUD_TPU_TASK_ID"] == "0"
        assert env["TPU_PROCESS_ADDRESSES"] == f"localhost:{env['TPU_PROCESS_PORT']}"
        assert env["ALLOW_MULTIPLE_LIBTPU_LOAD"] == "true"
        assert env["JAX_PLATFORMS"] == "tpu,cpu" and env["RLAX_ACCELERATOR"] == "tpu"
        assert env["RLAX_CHIPS"] == str(len(got))
        assert "--tensor-parallel" not in argv
        ports.append(env["TPU_PROCESS_PORT"])
    assert sorted(seen, key=int) == [str(c) for c in range(n_chips)]  # every chip once: disjoint, all used
    assert len(set(ports)) == len(ports)


def test_tpu_tensor_parallel_workers(tmp_path, no_jax):
    """v5e-8 with WORKER_CHIPS=2: the trainer on chips 0-3, two workers on 4,5 and 6,7, each a 1x2 block."""
    roles = dry_run(tmp_path, no_jax, ACCELERATOR="tpu", CHIPS=8, WORKER_CHIPS=2, TRAINER_TP=2)
    assert [r for r in roles if r.startswith("worker")] == ["worker-0", "worker-1"]
    for role, want in (("worker-0", ["4", "5"]), ("worker-1", ["6", "7"])):
        env, argv = roles[role]
        assert chips(env, "TPU_VISIBLE_CHIPS") == want and env["TPU_CHIPS_PER_PROCESS_BOUNDS"] == "1,2,1"
        assert flag(argv, "--tensor-parallel") == "2"
    env, argv = roles["trainer"]
    assert chips(env, "TPU_VISIBLE_CHIPS") == ["0", "1", "2", "3"] and env["TPU_CHIPS_PER_PROCESS_BOUNDS"] == "2,2,1"
    assert flag(argv, "--tensor-parallel") == "2"
    assert "# note" not in (tmp_path / "run" / "commands.sh").read_text()  # the same split on both sides


def test_one_gpu_is_shared(tmp_path, no_jax):
    """The most common rented GPU VM: the trainer and a worker on the one GPU, memory split to fit."""
    roles = dry_run(tmp_path, no_jax, ACCELERATOR="gpu", CHIPS=1)
    assert_off_accelerator(roles)
    assert list(roles) == ["param_server", "verifier", "worker-0", "trainer"]
    fractions = []
    for role in ("worker-0", "trainer"):
        env, argv = roles[role]
        assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["JAX_PLATFORMS"] == "cuda,cpu"
        assert env["RLAX_ACCELERATOR"] == "gpu" and env["RLAX_CHIPS"] == "1"
        fractions.append(float(env["XLA_PYTHON_CLIENT_MEM_FRACTION"]))
    assert sum(fractions) <= 1.0 and min(fractions) >= 0.2
    # more workers on the one GPU still fit
    roles = dry_run(tmp_path, no_jax, ACCELERATOR="gpu", CHIPS=1, WORKERS=3)
    fractions = [float(env["XLA_PYTHON_CLIENT_MEM_FRACTION"]) for r, (env, _) in roles.items()
                 if r not in ("param_server", "verifier")]
    assert len(fractions) == 4 and sum(fractions) <= 1.0


def test_eight_gpus(tmp_path, no_jax):
    roles = dry_run(tmp_path, no_jax, ACCELERATOR="gpu", CHIPS=8)
    assert_off_accelerator(roles)
    assert chips(roles["trainer"][0], "CUDA_VISIBLE_DEVICES") == ["0", "1", "2", "3"]
    workers = [r for r in roles if r.startswith("worker")]
    assert workers == ["worker-0", "worker-1", "worker-2", "worker-3"]
    seen = []
    for role in workers + ["trainer"]:
        env, argv = roles[role]
        seen += chips(env, "CUDA_VISIBLE_DEVICES")
        assert float(env["XLA_PYTHON_CLIENT_MEM_FRACTION"]) <= 1.0  # alone on its GPUs
    assert sorted(seen, key=int) == [str(c) for c in range(8)]
    # tensor-parallel workers: 2 GPUs each, the flag passed before WORKER_ARGS (so a user's own wins)
    roles = dry_run(tmp_path, no_jax, ACCELERATOR="gpu", CHIPS=8, WORKER_CHIPS=2, WORKER_ARGS="--lease-s 30")
    assert [chips(roles[r][0], "CUDA_VISIBLE_DEVICES") for r in roles if r.startswith("worker")] == \
        [["4", "5"], ["6", "7"]]
    argv = roles["worker-0"][1]
    assert flag(argv, "--tensor-parallel") == "2" and argv.index("--tensor-parallel") < argv.index("--lease-s")
    assert "--tensor-parallel" not in roles["trainer"][1]  # TRAINER_TP defaults to 1...
    assert "not bitwise equal (TRAINER_TP=2)" in (tmp_path / "run" / "commands.sh").read_text()  # ...said so


@pytest.mark.parametrize("settings,message", [
    (dict(ACCELERATOR="tpu", CHIPS=1), "no chip left for a worker"),
    (dict(ACCELERATOR="tpu", CHIPS=4, WORKERS=3), "WORKERS=3 does not fit"),
    (dict(ACCELERATOR="tpu", CHIPS=8, TRAINER_CHIPS=2, WORKER_CHIPS=4), "aligned"),
    (dict(ACCELERATOR="gpu", CHIPS=8, TRAINER_TP=3), "TRAINER_TP=3 must divide"),
    (dict(ACCELERATOR="cpu", CHIPS=4), "set ACCELERATOR=tpu or gpu"),
    (dict(ACCELERATOR="cpu", WORKER_CHIPS=2), "place roles on an accelerator"),
    (dict(ACCELERATOR="gpu", CHIPS=1, XLA_CLIENT_MEM_FRACTION=".5"), "JAX refuses both"),
    (dict(ACCELERATOR="npu"), "ACCELERATOR='npu'"),
])
def test_impossible_placements_stop_before_anything_starts(tmp_path, settings, message):
    proc, run_dir, _ = launch(tmp_path, DRY_RUN=1, **settings)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr
    assert not (run_dir / "commands.sh").exists()


def test_an_accelerator_not_found_is_said_so(tmp_path):
    proc, run_dir, _ = launch(tmp_path, DRY_RUN=1, ACCELERATOR="tpu")
    if devices.detect()[0] == "tpu":  # a TPU VM: placed on its chips
        assert proc.returncode == 0, proc.stderr
    else:
        assert proc.returncode == 2 and "no TPU was found" in proc.stderr and "set CHIPS" in proc.stderr


def test_launch_starts_exactly_the_lines_it_writes(tmp_path):
    """With a stand-in for python that records its argv and environment, every role started by launch.sh
    has exactly its commands.sh line: the same arguments and the same VAR=value assignments."""
    record = tmp_path / "started"
    record.mkdir()
    fake = tmp_path / "python"
    fake.write_text(f"""#!/usr/bin/env bash
case "$1" in
  devices.py|ports.py|attest.py) exec {sys.executable} "$@" ;;  # the placement, the ports' check, the verdict key
  -) cat > /dev/null; exit 0 ;;              # launch.sh's closing summary
esac
{sys.executable} -c 'import json, os, sys; json.dump({{"argv": sys.argv[1:], "env": dict(os.environ)}}, \
  open(os.path.join({json.dumps(str(record))}, str(os.getpid()) + ".json"), "w"))' "$@"
if [ "$1" = trainer.py ]; then   # the run "ends" once every other role has started
  for _ in $(seq 100); do [ "$(ls {record} | wc -l)" -ge 5 ] && exit 0; sleep 0.1; done; exit 1
fi
exec sleep 60
""")
    fake.chmod(0o755)
    proc, run_dir, _ = launch(tmp_path, PYTHON=str(fake), ACCELERATOR="gpu", CHIPS=8, WORKER_CHIPS=2, WORKERS=2,
                              PORT=7777)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    started = [json.loads(p.read_text()) for p in record.iterdir()]
    assert len(started) == 5
    by_line = {}
    for line in (run_dir / "commands.sh").read_text().splitlines():
        if not line.startswith(("#", "export ")):
            assigned, argv = split_line(line.rsplit("  # ", 1)[0])
            by_line[tuple(argv[1:])] = assigned  # argv[0] is the stand-in python
    for s in started:
        assigned = by_line.pop(tuple(s["argv"]))  # this role's line, argument for argument
        assert {k: s["env"].get(k) for k in assigned} == assigned
    assert not by_line
    assert json.loads((run_dir / "restarts.json").read_text()) == {r: 0 for r in
                                                                   ["param_server", "verifier", "worker-0",
                                                                    "worker-1", "trainer"]}


def test_benches_start_launch_with_their_own_interpreter(tmp_path, monkeypatch, capsys):
    """bench_e2e_trl.run_launch (bench_async and bench_breakdown start launch.sh through it; run_all runs
    them with its own interpreter) passes PYTHON=sys.executable: with another python3 first on PATH,
    one that fails, launch.sh alone cannot even place the roles, but the bench's DRY_RUN writes every
    role's line with the bench's interpreter. A launch.sh that fails has its log tail printed."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text("#!/bin/sh\necho 'not the bench interpreter' >&2\nexit 7\n")
    (bin_dir / "python3").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("PYTHON", raising=False)
    proc, _, _ = launch(tmp_path / "plain", DRY_RUN=1, ACCELERATOR="cpu")
    assert proc.returncode != 0 and "not the bench interpreter" in proc.stderr

    monkeypatch.syspath_prepend(os.path.join(ROOT, "bench"))
    import bench_e2e_trl
    run_dir = tmp_path / "bench"
    bench_e2e_trl.run_launch(str(run_dir), 1, {"DRY_RUN": "1", "ACCELERATOR": "cpu", "WORKERS": "2"}, timeout_s=60)
    lines = [line.rsplit("  # ", 1)[0] for line in (run_dir / "commands.sh").read_text().splitlines()
             if not line.startswith(("#", "export "))]
    assert len(lines) == 5 and {split_line(line)[1][0] for line in lines} == {sys.executable}

    capsys.readouterr()
    bench_e2e_trl.run_launch(str(tmp_path / "bad"), 1, {"DRY_RUN": "1", "ROLES": "trainer,gpu"}, timeout_s=60)
    out = capsys.readouterr().out
    assert "exited with status 2" in out and "unknown role 'gpu'" in out, out


# ----------------------------------------------------------------------------- the plan, directly

@pytest.mark.parametrize("n_gpus", [1, 2, 3, 8])
@pytest.mark.parametrize("workers", [-1, 1, 3, 7])
def test_gpu_memory_fractions_fit_on_every_gpu(n_gpus, workers):
    roles = devices.plan("gpu", list(range(n_gpus)), workers=workers)
    per_gpu = {}
    for r in roles:
        for c in r.chips:
            per_gpu[c] = per_gpu.get(c, 0) + float(r.env["XLA_PYTHON_CLIENT_MEM_FRACTION"])
    assert per_gpu and all(total <= 0.9 + 1e-9 for total in per_gpu.values())


# ----------------------------------------------------------------------------- no silent fallback

def check_in_subprocess(role, **env):
    full = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "CUDA_VISIBLE_DEVICES")}
    return subprocess.run([sys.executable, "-c", f"import devices; devices.check({role!r})"], cwd=ROOT,
                          env={**full, **env}, capture_output=True, text=True, timeout=120)


def test_a_role_placed_on_a_gpu_stops_when_jax_finds_only_the_cpu():
    proc = check_in_subprocess("worker-0", RLAX_ACCELERATOR="gpu", RLAX_CHIPS="1", CUDA_VISIBLE_DEVICES="0")
    assert proc.returncode == devices.EXIT_MISPLACED == 3  # launch.sh stops the run on it
    assert "worker-0: refusing to run: placed on gpu but JAX found only cpu devices" in proc.stderr
    for var in ("CUDA_VISIBLE_DEVICES='0'", "JAX_PLATFORMS unset", "RLAX_ACCELERATOR='gpu'", "requirements-gpu.txt"):
        assert var in proc.stderr
    assert "worker-0: jax " in proc.stdout and "cpu device(s)" in proc.stdout  # the devices it got, logged


def test_a_role_placed_on_a_tpu_stops_when_the_tpu_cannot_start():
    proc = check_in_subprocess("trainer", RLAX_ACCELERATOR="tpu", JAX_PLATFORMS="tpu,cpu", TPU_VISIBLE_CHIPS="0,1")
    assert proc.returncode == 3 and "trainer: refusing to run: placed on tpu" in proc.stderr
    assert "TPU_VISIBLE_CHIPS='0,1'" in proc.stderr and "JAX_PLATFORMS='tpu,cpu'" in proc.stderr


def test_a_role_on_the_cpu_logs_its_devices_and_runs():
    proc = check_in_subprocess("trainer", RLAX_ACCELERATOR="cpu", JAX_PLATFORMS="cpu")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("trainer: jax ") and "1 cpu device(s)" in proc.stdout


# ----------------------------------------------------------------------------- bench/accelerator_check.sh

def test_accelerator_check_parses_and_makes_its_model(tmp_path):
    script = os.path.join(ROOT, "bench", "accelerator_check.sh")
    assert subprocess.run(["bash", "-n", script]).returncode == 0
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "OUT": str(out), "CHECK_DIR": str(tmp_path / "check"), "CHECK_PARTS": "model",
           "CHECK_SHAPE": "tiny"}
    proc = subprocess.run(["bash", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "accelerator_check.json").read_text())
    assert report["parts"]["model"]["status"] == "ok"
    assert report["model"]["params"] > 0 and report["model"]["hidden_size"] == 64
    config = json.loads((tmp_path / "check" / "model" / "config.json").read_text())
    assert config["vocab_size"] == 259 and config["max_position_embeddings"] == 128
