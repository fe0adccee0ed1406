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
    worker.install(0, "L", pushed)
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
    worker.install(1, "L", v1.manifest.tensor_views(v1.stream), v1)
    assert worker.base_params is not None and worker.version == 1   # LoRA: the base is needed from now on
    want = quant.quantise_params(lora.merge(jax.device_put(hf_io.from_hf_tensors(pushed, TINY)),
                                            lora.adapter_from_tensors(dict(named), TINY, lcfg), TINY, lcfg), "int8")
    same = jax.tree_util.tree_map(lambda a, b: np.array_equal(np.asarray(a), np.asarray(b)), worker.params, want)
    assert all(jax.tree_util.tree_leaves(same))
