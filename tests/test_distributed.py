"""The trainer across hosts (multihost.py): two trainer processes on loopback, each with one simulated
CPU device, joined by jax.distributed (gloo collectives), run the same step as one process with two
devices, i.e. the same (data=2) mesh.

Run: python -m pytest -q tests/test_distributed.py      (about a minute on a 2-core CPU)

What must hold (tests/dist_step.py runs the commands: an update of two minibatches over two epochs, checkpoint,
restore, checkpoint):
  - the update's log-probs are bitwise the single process's: each row is still computed whole on one
    device, so the sampler/trainer parity of a data-parallel trainer survives the move across hosts;
  - the new master weights and Adam moments equal it to float32 rounding: the gradients' sum over the
    data axis runs in gloo's order instead of XLA's in-process order (measured: at most 1.3e-7 apart);
  - only the leader writes, one checkpoint in the one-process format, and a restore sends it back to
    every process bit for bit (the checkpoint written after the restore equals the one before).
"""
import json
import os
import subprocess
import sys

import numpy as np
from safetensors.numpy import load_file

from conftest import ROOT, free_port
from test_system import tiny  # noqa: F401  (the module-scoped tiny model fixture)

SCRIPT = os.path.join(ROOT, "tests", "dist_step.py")


def run_all(*commands, timeout_s=300):
    procs = [subprocess.Popen([sys.executable, SCRIPT, *map(str, c)], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for c in commands]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=timeout_s)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-3000:]
    return outs


def state(run_dir, step):
    return load_file(os.path.join(run_dir, "checkpoints", f"step_{step:06d}", "state.safetensors"))


def test_two_processes_make_the_one_process_step(tmp_path, tiny):  # noqa: F811
    one, two = tmp_path / "one", tmp_path / "two"
    coordinator = f"127.0.0.1:{free_port()}"
    outs = run_all((tiny, one, 2), (tiny, two, 1, coordinator, 2, 0), (tiny, two, 1, coordinator, 2, 1))
    assert "process 0 of 1, mesh {'data': 2, 'tensor': 1}: done" in outs[0]
    assert "process 0 of 2, mesh {'data': 2, 'tensor': 1}: done" in outs[1]
    assert "process 1 of 2: following the leader" in outs[2]

    a, b = np.load(one / "result.npz"), np.load(two / "result.npz")
    assert int(b["processes"]) == 2 and int(a["devices"]) == int(b["devices"]) == 2
    assert a["logp_RT"].shape == (16, 96) and np.array_equal(a["logp_RT"], b["logp_RT"])  # bitwise
    for k in (k for k in a.files if k.startswith("aux/")):
        np.testing.assert_allclose(b[k], a[k], rtol=1e-5, atol=1e-7, err_msg=k)

    sa, sb = state(one / "run", 1), state(two / "run", 1)
    assert sorted(sa) == sorted(sb) and any(k.startswith("opt/") for k in sa)
    for k in sa:
        np.testing.assert_allclose(sb[k], sa[k], rtol=1e-5, atol=1e-6, err_msg=k)
    start = load_file(os.path.join(tiny, "model.safetensors"))  # the update did move the weights
    assert not np.array_equal(sb["master/['embed']"], start["model.embed_tokens.weight"].astype(np.float32))

    # the restore sent every tensor back bit for bit; the meta is the leader's
    again = state(two / "run", 2)
    assert all(np.array_equal(sb[k], again[k]) for k in sb)
    meta = json.load(open(two / "run" / "checkpoints" / "step_000002" / "meta.json"))
    assert meta["step"] == 2 and meta["cursor"] == 0

    # one set of files, written by the leader; the follower wrote none of its own
    assert sorted(os.listdir(two / "run" / "checkpoints")) == ["step_000001", "step_000002"]
    assert sorted(os.listdir(two)) == ["result.npz", "run"]
