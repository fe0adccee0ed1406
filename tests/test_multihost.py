"""Past one machine: launch.sh per host (ROLES, PARAM_SERVER, VERIFIER, BIND, CURVE keys required off
loopback) and the verifier fleet (VERIFIERS, a worker spreading its batches and surviving a dead one).

Run: python -m pytest -q tests/test_multihost.py      (about 1 minute on an idle 2-core CPU)

No test sends traffic off this machine: the "hosts" are launch.sh processes with their own RUN_DIRs
on loopback. The refusal tests name non-loopback addresses but stop before anything starts.
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import ROOT, free_port, wait_until
from test_placement import dry_run, no_jax  # noqa: F401  (no_jax: the fixture)
from test_system import tiny  # noqa: F401  (the module-scoped tiny model fixture)

TRAINER_ARGS = "--heldout 4 --eval-samples 8 --eval-every 0 --prompts-per-step 4 --checkpoint-every 2"
CURVE_VARS = ("RLAX_CURVE_KEY", "RLAX_CURVE_CLIENTS", "RLAX_CURVE_SERVER_KEY")


@pytest.fixture(autouse=True)
def no_curve_env(monkeypatch):
    """The tests decide about CURVE keys themselves, whatever the environment that runs them says."""
    for v in CURVE_VARS + ("ROLES", "PARAM_SERVER", "VERIFIER", "BIND", "VERIFIERS", "WORKERS"):
        monkeypatch.delenv(v, raising=False)


@pytest.fixture(scope="module")
def curve_key(tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys")
    subprocess.run([sys.executable, "curve.py", "keygen", str(keys)], cwd=ROOT, check=True, capture_output=True)
    return str(keys / "curve.key")


def launch_text(tmp_path, **settings):
    """commands.sh of a DRY_RUN, without its first line (the date)."""
    run_dir = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
    env = {**os.environ, "RUN_DIR": str(run_dir), "DRY_RUN": "1", **{k: str(v) for k, v in settings.items()}}
    proc = subprocess.run(["bash", "launch.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return (run_dir / "commands.sh").read_text().split("\n", 1)[1].replace(str(run_dir), "RUN")


def refused(tmp_path, **settings) -> str:
    run_dir = tmp_path / "refused"
    env = {**os.environ, "RUN_DIR": str(run_dir), "DRY_RUN": "1", **{k: str(v) for k, v in settings.items()}}
    proc = subprocess.run(["bash", "launch.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert not run_dir.exists()  # refused before anything was written or started
    return proc.stderr


# ----------------------------------------------------------------------------- (a) per-host commands

def test_default_roles_are_the_single_machine_run(tmp_path):
    """ROLES unset, or naming all four roles in any order: today's commands.sh, byte for byte."""
    today = """\
# placement: cpu (ACCELERATOR): every role on the CPU
export XLA_FLAGS=""
export RLAX_RUN_ID="$(cat RUN/run_id)"
JAX_PLATFORMS=cpu python3 param_server.py --bind tcp://127.0.0.1:5555 --state-dir RUN/param_server --verdict-key RUN/verdict.key  # param_server
JAX_PLATFORMS=cpu python3 verifier.py --bind tcp://127.0.0.1:5557 --executors 2 --verdict-key RUN/verdict.key  # verifier
JAX_PLATFORMS=cpu RLAX_ACCELERATOR=cpu python3 inference_worker.py --param-server tcp://127.0.0.1:5555 \
--verifier tcp://127.0.0.1:5557 --model checkpoints/coldstart --name worker-0 --seed 0 --pull-every 1 --timeline RUN/timeline/worker-0.jsonl --bf16-fix  # worker-0
JAX_PLATFORMS=cpu RLAX_ACCELERATOR=cpu python3 inference_worker.py --param-server tcp://127.0.0.1:5555 \
--verifier tcp://127.0.0.1:5557 --model checkpoints/coldstart --name worker-1 --seed 1 --pull-every 1 --timeline RUN/timeline/worker-1.jsonl --bf16-fix  # worker-1
JAX_PLATFORMS=cpu RLAX_ACCELERATOR=cpu python3 trainer.py --run-dir RUN --param-server tcp://127.0.0.1:5555 \
--model checkpoints/coldstart --seed 0 --steps 250 --max-staleness 0 --timeline RUN/timeline/trainer.jsonl --bf16-fix \
--kl-beta 0.2 --dynamic-sampling \
--lr 1e-4 --heldout 256 --eval-every 125  # trainer
"""
    assert launch_text(tmp_path, ACCELERATOR="cpu") == today
    assert launch_text(tmp_path, ACCELERATOR="cpu", ROLES="workers,verifier,trainer,param_server") == today


def test_server_host_and_worker_host_lines(tmp_path, no_jax):  # noqa: F811
    servers = dry_run(tmp_path / "a", no_jax, ACCELERATOR="cpu", ROLES="param_server,verifier", PORT=7000,
                      VERIFIERS=2, VERIFIER_EXECUTORS=3)
    assert list(servers) == ["param_server", "verifier-0", "verifier-1"]
    assert servers["param_server"][1][1:] == ["param_server.py", "--bind", "tcp://127.0.0.1:7000", "--state-dir",
                                             str(tmp_path / "a" / "run" / "param_server")]
    for k, port in enumerate((7002, 7003)):
        env, argv = servers[f"verifier-{k}"]
        assert argv[1:] == ["verifier.py", "--bind", f"tcp://127.0.0.1:{port}", "--executors", "3"]
        assert env == {"JAX_PLATFORMS": "cpu"}

    ps, va, vb = "tcp://127.0.0.1:7000", "tcp://127.0.0.1:7002", "tcp://127.0.0.1:7003"
    workers = dry_run(tmp_path / "b", no_jax, ACCELERATOR="cpu", ROLES="workers", WORKERS=2, WORKER_BASE=2,
                      PARAM_SERVER=ps, VERIFIER=f"{va},{vb}")
    assert list(workers) == ["worker-0", "worker-1"]
    for k, (env, argv) in enumerate(workers.values()):
        assert argv[1:] == ["inference_worker.py", "--param-server", ps, "--verifier", f"{va},{vb}", "--model",
                            "checkpoints/coldstart", "--name", f"worker-{2 + k}", "--seed", str(2 + k),
                            "--pull-every", "1", "--timeline", str(tmp_path / "b" / "run" / "timeline" / f"worker-{2 + k}.jsonl"),
                            "--bf16-fix"]
    text = (tmp_path / "b" / "run" / "commands.sh").read_text()
    assert f"# this host: ROLES=workers; param server {ps}; verifiers {va},{vb}" in text

    # a host with workers and a verifier of its own, plus one elsewhere: its own first
    both = dry_run(tmp_path / "c", no_jax, ACCELERATOR="cpu", ROLES="workers,verifier", WORKERS=1, PORT=8000,
                   PARAM_SERVER=ps, VERIFIER=va)
    assert list(both) == ["verifier", "worker-0"]
    assert "tcp://127.0.0.1:8002," + va in both["worker-0"][1]


def test_v5p_16_two_hosts_split_their_chips(tmp_path, no_jax):  # noqa: F811
    """docs/multihost.md's v5p-16: 4 chips per VM; the trainer VM gives all 4 to the trainer, the other
    VM one worker per chip (libtpu ports as on one host: trainer 8476, worker i 8477+i)."""
    a = dry_run(tmp_path / "a", no_jax, ACCELERATOR="tpu", CHIPS=4, ROLES="trainer,param_server,verifier")
    assert list(a) == ["param_server", "verifier", "trainer"]
    assert a["trainer"][0]["TPU_VISIBLE_CHIPS"] == "0,1,2,3" and a["trainer"][0]["TPU_CHIPS_PER_PROCESS_BOUNDS"] == "2,2,1"
    b = dry_run(tmp_path / "b", no_jax, ACCELERATOR="tpu", CHIPS=4, ROLES="workers",
                PARAM_SERVER="tcp://127.0.0.1:5555", VERIFIER="tcp://127.0.0.1:5557")
    assert list(b) == [f"worker-{i}" for i in range(4)]
    assert [b[f"worker-{i}"][0]["TPU_VISIBLE_CHIPS"] for i in range(4)] == ["0", "1", "2", "3"]
    assert [b[f"worker-{i}"][0]["TPU_PROCESS_PORT"] for i in range(4)] == ["8477", "8478", "8479", "8480"]


def test_trainer_hosts_lines(tmp_path):
    """docs/multihost.md's trainer over two hosts: each host's trainer line names the coordinator, the
    process count and its own index; the following host needs no PARAM_SERVER (it talks to no role)."""
    both = dict(ACCELERATOR="cpu", TRAINER_HOSTS=2, TRAINER_COORDINATOR="10.0.0.2:8470")
    lead = launch_text(tmp_path, ROLES="trainer,param_server,verifier", **both)
    follow = launch_text(tmp_path, ROLES="trainer", TRAINER_HOST_ID=1, **both)
    assert "--param-server tcp://127.0.0.1:5555" in lead and "--param-server" not in follow
    assert "--coordinator 10.0.0.2:8470 --num-processes 2 --process-id 0  # trainer" in lead
    assert "--coordinator 10.0.0.2:8470 --num-processes 2 --process-id 1  # trainer" in follow
    assert "--coordinator" not in launch_text(tmp_path, ACCELERATOR="cpu")  # one host: one process


ONE_PROCESS_TPU = ("TPU_VISIBLE_CHIPS", "TPU_CHIPS_PER_PROCESS_BOUNDS", "TPU_PROCESS_BOUNDS", "TPU_PROCESS_PORT",
                   "TPU_PROCESS_ADDRESSES", "CLOUD_TPU_TASK_ID", "ALLOW_MULTIPLE_LIBTPU_LOAD")


@pytest.mark.parametrize("hosts,coordinator", [(2, "10.130.0.2:8470"), (2, "auto"), (1, "auto")])
def test_a_trainer_across_tpu_hosts_gets_none_of_the_one_process_variables(tmp_path, no_jax, hosts, coordinator):  # noqa: F811
    """devices.py makes each TPU role a one-process libtpu cluster on its chips; a trainer whose
    processes span hosts (TRAINER_HOSTS > 1, whatever the coordinator, or auto: the slice decides) must
    get none of those variables on any host, or libtpu cannot form one slice of every host's chips.
    It takes all of its host's chips, so workers on a trainer host of the slice are refused."""
    for host_id, roles in [(0, "trainer,param_server,verifier")] + [(hosts - 1, "trainer")] * (hosts > 1):
        got = dry_run(tmp_path / f"host{host_id}-{roles}", no_jax, ACCELERATOR="tpu", CHIPS=4, ROLES=roles,
                      TRAINER_HOSTS=hosts, TRAINER_HOST_ID=host_id, TRAINER_COORDINATOR=coordinator)
        env, argv = got["trainer"]
        assert not set(ONE_PROCESS_TPU) & set(env), env
        assert env == {"JAX_PLATFORMS": "tpu,cpu", "RLAX_ACCELERATOR": "tpu", "RLAX_CHIPS": "4"}
        assert argv[-6:] == ["--coordinator", coordinator, "--num-processes", str(hosts), "--process-id", str(host_id)]
    err = refused(tmp_path, ACCELERATOR="tpu", CHIPS=4, TRAINER_HOSTS=hosts, TRAINER_COORDINATOR=coordinator)
    assert "a trainer across TPU hosts takes every chip of its host" in err, err
    # One host, even with a coordinator of its own: the one-process cluster on the trainer's chips.
    env, _ = dry_run(tmp_path / "one", no_jax, ACCELERATOR="tpu", CHIPS=4,
                     TRAINER_COORDINATOR="10.130.0.2:8470")["trainer"]
    assert env["TPU_VISIBLE_CHIPS"] == "0,1" and env["TPU_PROCESS_BOUNDS"] == "1,1,1"


def test_off_loopback_needs_curve_keys(tmp_path, curve_key):
    remote = dict(ACCELERATOR="cpu", ROLES="workers", PARAM_SERVER="tcp://10.1.2.3:5555",
                  VERIFIER="tcp://10.1.2.3:5557")
    err = refused(tmp_path, **remote)
    assert "not loopback: tcp://10.1.2.3:5555, tcp://10.1.2.3:5557" in err and "curve.py keygen" in err
    assert "RLAX_CURVE_KEY" in err
    err = refused(tmp_path, ACCELERATOR="cpu", ROLES="param_server,verifier", BIND="0.0.0.0")
    assert "not loopback: BIND=0.0.0.0" in err
    assert "RLAX_CURVE_KEY=/nowhere" in refused(tmp_path, RLAX_CURVE_KEY="/nowhere", **remote)

    text = launch_text(tmp_path, RLAX_CURVE_KEY=curve_key, **remote)
    assert f'export RLAX_CURVE_KEY="{curve_key}"' in text
    assert "--param-server tcp://10.1.2.3:5555 --verifier tcp://10.1.2.3:5557" in text
    # relay across hosts only where the workers' chunk servers can be reached: HOST_ADDR
    assert "--no-relay" in text and "--relay-bind" not in text
    text = launch_text(tmp_path, RLAX_CURVE_KEY=curve_key, HOST_ADDR="10.1.2.4", **remote)
    assert "--relay-bind tcp://10.1.2.4:*" in text and "--no-relay" not in text
    text = launch_text(tmp_path, ACCELERATOR="cpu", ROLES="param_server,verifier", BIND="0.0.0.0",
                       RLAX_CURVE_KEY=curve_key)
    assert "--bind tcp://0.0.0.0:5555" in text and "--bind tcp://0.0.0.0:5557" in text


@pytest.mark.parametrize("settings,message", [
    (dict(ROLES="workers"), "set PARAM_SERVER=tcp://host:port"),
    (dict(ROLES="workers", PARAM_SERVER="tcp://127.0.0.1:5555"), "no verifier"),
    (dict(ROLES="param_server,trainer", PARAM_SERVER="tcp://127.0.0.1:5555"), "set one of them"),
    (dict(ROLES="workers,gpu"), "unknown role 'gpu'"),
    (dict(ROLES="workers", PARAM_SERVER="127.0.0.1:5555", VERIFIER="tcp://127.0.0.1:5557"), "expected tcp://host:port"),
    (dict(VERIFIERS="0"), "VERIFIERS=0"),
    (dict(ROLES="workers", TRAINER_CHIPS=2, ACCELERATOR="tpu", CHIPS=4, PARAM_SERVER="tcp://127.0.0.1:5555",
          VERIFIER="tcp://127.0.0.1:5557"), "runs no trainer"),
    (dict(TRAINER_HOSTS=2), "needs TRAINER_COORDINATOR=host:port"),
    (dict(TRAINER_HOSTS=2, TRAINER_HOST_ID=2, TRAINER_COORDINATOR="127.0.0.1:8470"), "must be in 0 .. TRAINER_HOSTS-1 (1)"),
    (dict(ROLES="param_server", TRAINER_HOSTS=2, TRAINER_COORDINATOR="127.0.0.1:8470"), "has no trainer"),
])
def test_incomplete_host_settings_are_refused(tmp_path, settings, message):
    proc = subprocess.run(["bash", "launch.sh"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "RUN_DIR": str(tmp_path / "run"), "DRY_RUN": "1", "ACCELERATOR": "cpu",
                               **{k: str(v) for k, v in settings.items()}})
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "run" / "commands.sh").exists()


# ----------------------------------------------------------------------------- the fleet, in one process

GOOD = {"kind": "assert", "program": "def f(x):\n    return x * 2\n",
        "tests": "def check(c):\n    assert c(21) == 42\n", "entry_point": "f"}


def test_worker_spreads_batches_and_skips_a_dead_verifier(capsys):
    """The worker's verifier_client.VerifierFleet against two verifiers: batches alternate between them; with one closed,
    every batch still passes (the dead one found by a missing pong in about 3 x --verifier-ping-s, then
    skipped); with both closed, infra_error for every job, after one short try of each."""
    import inference_worker
    import verifier

    services, stops, threads = [], [], []
    for _ in range(2):
        svc = verifier.VerifierService(verifier.VerifierConfig(bind=f"tcp://127.0.0.1:{free_port()}", executors=1))
        stop = threading.Event()
        thread = threading.Thread(target=svc.serve, args=(stop,), daemon=True)
        thread.start()
        services.append(svc), stops.append(stop), threads.append(thread)
    a, b = (svc.cfg.bind for svc in services)

    def close(k):
        stops[k].set()
        threads[k].join(10)
        services[k].close()

    fleet = inference_worker.verifier_fleet(  # the worker's verifier client alone: no model, no sampler
        inference_worker.Config(verifier=f"{a},{b}", name="w", verifier_ping_s=0.3, verify_timeout_s=60))
    try:
        for _ in range(4):
            assert [v.status for v in fleet.verify([GOOD, GOOD])] == ["passed", "passed"]
        assert [svc.batches for svc in services] == [2, 2]  # round robin

        close(0)
        t0 = time.monotonic()
        for _ in range(4):
            assert [v.status for v in fleet.verify([GOOD])] == ["passed"]
        assert time.monotonic() - t0 < 10  # one short wait for the pong, then skipped
        assert services[1].batches == 6
        out = capsys.readouterr().out
        assert out.count(f"skipping {a} for 30s") == 1 and "no pong within 0.6s" in out

        close(1)
        t0 = time.monotonic()
        verdicts = fleet.verify([GOOD, GOOD])
        assert [v.status for v in verdicts] == ["infra_error", "infra_error"]
        assert time.monotonic() - t0 < 10 and "no pong" in verdicts[0].detail
    finally:
        for k in range(2):
            if not stops[k].is_set():
                close(k)
        fleet.close()


# ----------------------------------------------------------------------------- (b) two hosts on loopback

def host(run_dir, log_name, **settings):
    env = {**os.environ, "RUN_DIR": str(run_dir), "ACCELERATOR": "cpu", "MAX_RESTARTS": "20",
           "TRAINER_ARGS": TRAINER_ARGS, "RECIPE": "--kl-beta 0.1", "WORKER_ARGS": "--lease-s 5",
           **{k: str(v) for k, v in settings.items()}}
    log = open(str(run_dir) + f".{log_name}.log", "ab")
    proc = subprocess.Popen(["bash", "launch.sh"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    proc.log_path = log.name
    return proc


def stop(*procs):
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(30)


def kill_host(proc, run_dir):
    """A host lost: its launch.sh (so nothing restarts) and then every role it started, SIGKILLed."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    for name in os.listdir(os.path.join(run_dir, "pids")):
        try:
            os.killpg(int(open(os.path.join(run_dir, "pids", name)).read()), signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_hosts_on_loopback_and_a_verifier_host_lost(tmp_path, tiny, curve_key):  # noqa: F811
    """Four "hosts", each a launch.sh with its own RUN_DIR, with CURVE keys (the setup across
    machines, here on loopback): A runs the param server, a verifier and trainer process 0; D trainer
    process 1 (one trainer over both hosts' devices, multihost.py); C one verifier; B one worker that
    uses both verifiers. After the first step host C is SIGKILLed (launch.sh and verifier): the worker
    skips C's verifier (found dead by a missing pong, not after verify_timeout_s), sends its batches to
    A's, and no program gets infra_error. The run finishes on A and D; B notices that the param server
    is gone and ends too. The two-process trainer's log-probs stay bitwise the sampler's."""
    port, c_port, steps = free_port(), free_port(), 3
    a_dir, b_dir, c_dir, d_dir = tmp_path / "hostA", tmp_path / "hostB", tmp_path / "hostC", tmp_path / "hostD"
    ps, va, vc = f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port + 2}", f"tcp://127.0.0.1:{c_port + 2}"
    trainer_hosts = dict(TRAINER_HOSTS=2, TRAINER_COORDINATOR=f"127.0.0.1:{free_port()}")
    a = host(a_dir, "launch", ROLES="param_server,verifier,trainer", PORT=port, STEPS=steps, MODEL=tiny,
             RLAX_CURVE_KEY=curve_key, TRAINER_ARGS=TRAINER_ARGS + " --log-to tensorboard", **trainer_hosts)
    d = host(d_dir, "launch", ROLES="trainer", TRAINER_HOST_ID=1, MODEL=tiny, **trainer_hosts)
    c = host(c_dir, "launch", ROLES="verifier", PORT=c_port, PARAM_SERVER=ps, RLAX_CURVE_KEY=curve_key)
    b = host(b_dir, "launch", ROLES="workers", WORKERS=1, MODEL=tiny, RLAX_CURVE_KEY=curve_key,
             PARAM_SERVER=ps, VERIFIER=f"{va},{vc}", END_AFTER_S=4)
    metrics = a_dir / "metrics.jsonl"
    try:
        wait_until(lambda: metrics.exists() and metrics.stat().st_size > 0, 240, "the first step", poll_s=0.2)
        assert "verifier: serving" in open(c_dir / "verifier.log").read()
        kill_host(c, c_dir)
        wait_until(lambda: a.poll() is not None, 240, "host A's run to finish", poll_s=0.5)
        assert a.returncode == 0, open(a.log_path, errors="replace").read()[-3000:]
        wait_until(lambda: d.poll() is not None, 30, "host D's trainer process to finish", poll_s=0.5)
        assert d.returncode == 0, open(d.log_path, errors="replace").read()[-3000:]
        wait_until(lambda: b.poll() is not None, 40, "host B to notice the end of the run", poll_s=0.5)
    finally:
        stop(a, b, c, d)
    b_log = open(b.log_path, errors="replace").read()
    assert b.returncode == 0, b_log[-3000:]
    assert "has not answered for 4s: the run is over" in b_log
    rows = [json.loads(line) for line in open(metrics)]
    assert max(r["step"] for r in rows) == steps and rows[-1]["rollouts/verifier_failed"] == 0
    assert all(r.get("verifier/infra_error_frac", 0) == 0 for r in rows)
    # the trainer's mesh spanned A and D (data = 2, one device each), rows whole per device: bitwise
    bitwise = [r["mismatch/bitwise_frac"] for r in rows if "mismatch/bitwise_frac" in r]
    assert bitwise and all(b == 1.0 for b in bitwise)
    assert "process 1 of 2: following the leader" in open(d_dir / "trainer.log").read()
    assert "its files are on trainer host 0" in open(d.log_path).read()
    assert sorted(os.listdir(d_dir)) == ["commands.sh", "pids", "restarts.json", "trainer.log"]  # no timeline
    assert os.path.isdir(a_dir / "final") and os.listdir(a_dir / "checkpoints")
    # --log-to tensorboard: the leader's metrics copied to event files (tests/test_loggers.py reads them)
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(a_dir / "tensorboard"))
    # each host's roles kept their own timeline (timeline.py): the trainer's on A, the worker's on B
    import timeline
    assert {"wait", "train", "push", "eval"} <= {s["span"] for s in timeline.read(str(a_dir))}
    assert {"pull", "sample", "verify", "submit"} <= {s["span"] for s in timeline.read(str(b_dir))}
    assert sorted(p for p in os.listdir(a_dir) if p.endswith(".log")) == ["param_server.log", "trainer.log",
                                                                          "verifier.log"]
    assert sorted(p for p in os.listdir(b_dir) if p.endswith(".log")) == ["worker-0.log"]
    worker_log = open(b_dir / "worker-0.log").read()
    assert f"param server {ps}, verifiers {va},{vc}" in worker_log
    # C's loss was seen from a missing pong (seconds), not after verify_timeout_s (120 s)...
    assert f"from {vc} and no pong within 4.0s after 6.0s; skipping {vc} for 30s" in worker_log, worker_log[-3000:]
    assert "verifier failures" not in worker_log  # ...and cost no program
