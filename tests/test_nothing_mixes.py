"""Nothing of one job, run or process outlives what it belongs to: a verdict leaves the pool only
once every process of its job is gone.

Run: python -m pytest -q tests/test_nothing_mixes.py
"""
import os
import subprocess
import sys
import textwrap
import time

import isolation
import verifier
from test_system import tiny  # noqa: F401  (the module-scoped tiny model fixture)


def _processes_of(uids: set) -> list:
    """(pid, state, uids) of every process whose real, effective, saved or filesystem uid is in uids,
    zombies included."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                lines = f.read().splitlines()
        except OSError:
            continue  # gone while we looked
        ids = next((set(map(int, line.split()[1:])) for line in lines if line.startswith("Uid:")), set())
        if ids & uids:
            found.append((name, next(line for line in lines if line.startswith("State:")), sorted(ids)))
    return found


FORKER = textwrap.dedent('''
    import os, subprocess, threading, time
    def f(x):
        for _ in range(3):
            if os.fork() == 0:
                if os.fork() == 0:
                    time.sleep(30)      # double-forked: reparented to the launcher
                os._exit(0)
        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
        subprocess.Popen(["sleep", "30"])
        return x
    ''')
IO_FORKER = "import os, time\nif os.fork() == 0:\n    time.sleep(30)\nprint(input())\n"
LOOPER = "def f(x):\n    while True:\n        pass\n"


def test_a_verdict_arrives_only_once_every_process_of_its_job_is_gone():
    """On a loaded machine (CPU hogs beside a 2-executor pool), jobs that fork, double-fork, start
    threads and commands or loop past their limit: the moment each verdict is set, no process of any
    executor's candidate or judge uid exists, not even a zombie."""
    pool = verifier.ExecutorPool(2)
    hogs = [subprocess.Popen([sys.executable, "-S", "-c", "while True: pass"]) for _ in range(2)]
    try:
        uids = {u for pid in pool.executor_pids() for u in isolation.role_uids(pid)[:2]}
        jobs = [{"kind": "assert", "program": FORKER, "tests": "assert f(1) == 1\n", "timeout_s": 10.0},
                {"kind": "io", "program": IO_FORKER, "cases": [["a\n", "a"], ["b\n", "b"]], "timeout_s": 5.0},
                {"kind": "assert", "program": LOOPER, "tests": "assert f(1)\n", "timeout_s": 0.5}]
        statuses = []
        for job in jobs * 2:
            seen: list = []
            future = pool.submit(job)
            future.add_done_callback(lambda f: seen.append(_processes_of(uids)))   # as the verdict is set
            statuses.append(future.result(timeout=120).status)
            while not seen:
                time.sleep(0.001)
            assert seen[0] == [], (job["kind"], statuses[-1], seen[0])
        assert statuses == ["passed", "passed", "timeout"] * 2, statuses
        assert pool.executor_pids() and all(u for u in uids)   # the same executors throughout
    finally:
        pool.close()
        for h in hogs:
            h.kill()
            h.wait()


# ----------------------------------------------------------------------------- int8 workers keep what they need

def _int8_worker(mcfg):
    import types
    import inference_worker
    worker = inference_worker.Worker.__new__(inference_worker.Worker)  # install alone, no sockets
    worker.cfg = inference_worker.Config(verifier="tcp://127.0.0.1:1", sampler_quant="int8", name="w")
    worker.mcfg, worker.mesh, worker.version, worker.lineage = mcfg, None, -1, ""
    worker.base_key = worker.base_params = None
    worker.fetcher = types.SimpleNamespace(done=lambda buf: None)
    return worker


def test_an_int8_worker_holds_only_its_quantised_weights_and_a_lora_base_only_for_lora():
    """After a full version an int8 worker's device holds the quantised weights and nothing of the
    pushed bf16 (measured: every live array of this process); an adapter version brings back the
    full-precision base it must merge onto, and the policy is quantise(merge(base, adapter))."""
    import gc
    import jax
    import numpy as np
    import hf_io
    import lora
    import quant
    from random_weights import random_params
    from test_weights_lora import TINY, buffer
    pushed = hf_io.to_hf_tensors(random_params(TINY), TINY)
    full_bytes = sum(np.asarray(a).nbytes for a in pushed.values())
    worker = _int8_worker(TINY)
    gc.collect()
    before = sum(a.nbytes for a in jax.live_arrays())
    worker.install(buffer(0, "L", list(pushed.items())))
    gc.collect()
    held = sum(a.nbytes for a in jax.live_arrays()) - before
    q = quant.params_bytes(worker.params)
    assert worker.base_params is None and held == q and q < full_bytes, (held, q, full_bytes)

    lcfg = lora.LoraConfig(rank=2, alpha=4.0, targets=("q_proj", "down_proj"))
    rng = np.random.default_rng(1)
    named = [(f"{lora.PREFIX}{t}.{m}", 0.1 * rng.standard_normal(shape, np.float32))
             for t, ms in lora.adapter_shapes(TINY, lcfg).items() for m, shape in ms.items()]
    v1 = buffer(1, "L", named, 0, lcfg.to_dict())
    v1.base = buffer(0, "L", list(pushed.items()))
    worker.install(v1)
    assert worker.base_params is not None and worker.version == 1   # LoRA: the base is needed from now on
    want = quant.quantise_params(lora.merge(jax.device_put(hf_io.from_hf_tensors(pushed, TINY)),
                                            lora.adapter_from_tensors(dict(named), TINY, lcfg), TINY, lcfg), "int8")
    same = jax.tree_util.tree_map(lambda a, b: np.array_equal(np.asarray(a), np.asarray(b)), worker.params, want)
    assert all(jax.tree_util.tree_leaves(same))


# ----------------------------------------------------------------------------- one run, one identity

def test_a_server_refuses_a_client_of_another_run():
    """wire.py: a request names its run (RLAX_RUN_ID); a server of another run refuses it, naming both
    runs and what to do; the same run, and a client that names none (a tool), are served."""
    import threading
    import pytest
    import wire
    from conftest import free_port
    addr = f"tcp://127.0.0.1:{free_port()}"
    server = wire.Server("param_server", addr, run_id="run-aaa")
    server.on(wire.GetStats, lambda m, p: wire.Ok({"served": 1}))
    stop = threading.Event()
    thread = threading.Thread(target=server.serve, args=(stop,), daemon=True)
    thread.start()
    try:
        for run, served in (("run-aaa", True), ("", True), ("run-bbb", False)):
            client = wire.Client("trainer", addr, timeout_s=10, run_id=run)
            if served:
                assert client.call(wire.GetStats()).info == {"served": 1}
            else:
                with pytest.raises(wire.RemoteError, match="belongs to run run-aaa, not to run run-bbb"):
                    client.call(wire.GetStats())
                assert isinstance(client.call(wire.Ping()), wire.Pong)   # liveness is not the run's
            client.close()
        assert server.other_runs == 1
    finally:
        stop.set()
        thread.join(5)
        server.close()


def _launch(run_dir, model_path, **env):
    """One launch.sh run of 2 steps with the tiny model; PORT is left unset unless given."""
    from conftest import ROOT
    env = {**{k: v for k, v in os.environ.items() if k not in ("PORT", "RUN_ID", "RLAX_RUN_ID")},
           "RUN_DIR": run_dir, "STEPS": "2", "WORKERS": "1", "MODEL": model_path, "VERIFIER_EXECUTORS": "1",
           "WORKER_ARGS": "--lease-s 10",
           "TRAINER_ARGS": "--heldout 1 --eval-samples 2 --eval-every 0 --prompts-per-step 4", **env}
    return subprocess.Popen(["bash", "launch.sh"], cwd=ROOT, env=env, stdout=open(run_dir + ".log", "wb"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def test_two_runs_on_one_host_each_finish_on_their_own_weights(tmp_path, tiny):  # noqa: F811
    """Two launch.sh runs at once with default settings: the second finds the first's ports taken and
    takes the next free ones, each run has its own identity, both finish bitwise on-policy, and each
    param server only ever saw its own trainer. A third with the first's PORT given refuses at start,
    naming the process that holds it."""
    import json
    import re
    import signal
    from conftest import wait_until
    a, b, c = (str(tmp_path / n) for n in ("a", "b", "c"))
    first = _launch(a, tiny)
    second = None
    try:
        wait_until(lambda: os.path.exists(os.path.join(a, "param_server.log")) and "serving" in open(
            os.path.join(a, "param_server.log")).read(), 120, "the first run's param server")
        second = _launch(b, tiny)
        port_a = int(re.search(r"param_server.py --bind tcp://127.0.0.1:(\d+)", open(a + "/commands.sh").read())[1])
        third = subprocess.run(["bash", "launch.sh"], cwd=os.path.dirname(os.path.dirname(__file__)),
                               env={**os.environ, "RUN_DIR": c, "PORT": str(port_a), "MODEL": tiny},
                               capture_output=True, text=True, timeout=120)
        assert third.returncode == 2 and f"port {port_a} is taken by pid" in third.stderr, third.stderr
        assert "param_server.py" in third.stderr and "PORT=" in third.stderr, third.stderr
        for proc, run_dir in ((first, a), (second, b)):
            assert proc.wait(600) == 0, open(run_dir + ".log").read()[-3000:]
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(60)
    port_b = int(re.search(r"param_server.py --bind tcp://127.0.0.1:(\d+)", open(b + "/commands.sh").read())[1])
    assert port_a != port_b
    assert open(a + "/run_id").read() != open(b + "/run_id").read()
    for run_dir in (a, b):
        steps = [json.loads(line) for line in open(run_dir + "/metrics.jsonl") if "reward/mean" in line]
        assert [r["step"] for r in steps] == [1, 2] and all(r["mismatch/bitwise_frac"] == 1.0 for r in steps)
        log = open(run_dir + "/param_server.log").read()
        assert log.count("new trainer lineage") <= 1 and "refused" not in log.lower(), log[-2000:]
        assert os.path.isdir(run_dir + "/final")
