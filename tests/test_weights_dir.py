"""The shared-directory weight transport (weights_fs.DirTransport): versions as files that a worker reads.

Run: python -m pytest -q tests/test_weights_dir.py      (the last test runs every role: about 2 minutes on 2 cores)

What must hold: a version read from the directory is bit for bit the one published; a half-written,
truncated or corrupt file is never offered (an error names it, the reader keeps what it has); an
adapter version comes with its base, also to a reader that never saw the base; old versions are
pruned but an adapter's base is kept; a param server started with --weights-dir publishes every
version it commits; and a whole run whose worker reads its weights from the directory stays bitwise
on-policy.
"""
import os

import ml_dtypes
import numpy as np

import versions
import weights_fs
import weights_zmq
import wire
from conftest import free_port
from test_system import XLA, finish, metrics, tiny  # noqa: F401 (tiny: the fixture)

LORA = {"rank": 2, "alpha": 4.0, "targets": ["q_proj", "v_proj"]}


def full(version, n=3000):
    return [("w.big", np.arange(n).astype(ml_dtypes.bfloat16) * (version + 1)),
            ("w.small", np.arange(7, dtype=np.float32) - version), ("w.ids", np.arange(5, dtype=np.int32))]


def adapter(version):
    return [("lora.layers.q_proj.A", np.full((1, 2, 8), version, np.float32)),
            ("lora.layers.q_proj.B", np.full((1, 8, 2), -version, np.float32))]


def version(number, lineage, named, base=None):
    """A complete Version as a store holds it (cut as the trainer cuts it); `base`: an adapter's Version."""
    chunks, tensors = versions.cut_all(iter(named), 4096)
    manifest = versions.Manifest(number, lineage, tensors, [[int(c.size), crc] for c, crc in chunks],
                                 base.manifest.version if base else None, LORA if base else None)
    return versions.Version(manifest, [c for c, _ in chunks], base)


def same(buf, named):
    got = buf.tensors()
    return list(got) == [n for n, _ in named] and all(
        got[n].dtype == a.dtype and got[n].shape == a.shape and got[n].tobytes() == a.tobytes() for n, a in named)


def test_a_version_read_from_the_directory_is_the_one_published_bit_for_bit(tmp_path):
    pub, reader = weights_fs.DirTransport(str(tmp_path), keep=2), weights_fs.DirTransport(str(tmp_path), log=print)
    assert reader.newest(0, "", 0.0) is None
    v1 = version(1, "L", full(1))
    pub.publish(v1)
    buf = reader.newest(0, "", 0.0)
    assert buf.key == (1, "L") and not buf.is_adapter and same(buf, full(1))
    assert buf.manifest.tensors == v1.manifest.tensors  # every tensor's CRC as the trainer computed it
    assert reader.newest(2, "L", 0.3) is None  # offered once; nothing newer yet
    for n in (2, 3, 4):
        pub.publish(version(n, "L", full(n)))
    assert sorted(os.listdir(tmp_path)) == ["v0000000003-L.safetensors", "v0000000004-L.safetensors"]  # keep=2
    buf = reader.newest(2, "L", 0.0)
    assert buf.key == (4, "L") and same(buf, full(4))


def test_a_half_written_or_corrupt_version_is_never_offered_and_the_error_names_the_file(tmp_path):
    logged = []
    pub, reader = weights_fs.DirTransport(str(tmp_path)), weights_fs.DirTransport(str(tmp_path), log=logged.append)
    pub.publish(version(1, "L", full(1)))
    assert reader.newest(0, "", 0.0).key == (1, "L")
    # A writer's temporary file (half written, not yet renamed) is not a version at all.
    good = (tmp_path / "v0000000001-L.safetensors").read_bytes()
    (tmp_path / ".v0000000002-L.safetensors.123.tmp").write_bytes(good[:len(good) // 2])
    assert reader.newest(2, "L", 0.3) is None and not logged
    # A torn file under a version's name (copied by hand, a crash without fsync): refused by name, once.
    torn = tmp_path / "v0000000002-L.safetensors"
    torn.write_bytes(good[:-100])
    assert reader.newest(2, "L", 0.3) is None
    assert len(logged) == 1 and str(torn) in logged[0] and "refused" in logged[0], logged
    # One flipped bit in the data: every byte is checked against the tensors' CRCs.
    flipped = bytearray((tmp_path / "v0000000001-L.safetensors").read_bytes())
    flipped[-3] ^= 1
    bad = tmp_path / "v0000000003-L.safetensors"
    bad.write_bytes(bytes(flipped))
    assert reader.newest(2, "L", 0.3) is None
    assert str(bad) in logged[-1] and "checksum mismatch" in logged[-1], logged
    # The next good version is offered as usual.
    pub.publish(version(4, "L", full(4)))
    buf = reader.newest(2, "L", 0.0)
    assert buf.key == (4, "L") and same(buf, full(4))


def test_adapter_versions_come_with_their_base_and_the_base_outlives_pruning(tmp_path):
    pub = weights_fs.DirTransport(str(tmp_path), keep=1)
    base = version(0, "L", full(0))
    pub.publish(base)
    early = weights_fs.DirTransport(str(tmp_path))
    assert early.newest(0, "", 0.0).key == (0, "L")  # it holds the base from now on
    for n in (1, 2, 3):
        pub.publish(version(n, "L", adapter(n), base=base))
    assert sorted(os.listdir(tmp_path)) == ["v0000000000-L.safetensors", "v0000000003-L.safetensors"]
    buf = early.newest(1, "L", 0.0)
    assert buf.key == (3, "L") and buf.is_adapter and buf.manifest.lora == LORA and same(buf, adapter(3))
    assert buf.base is early.base and buf.base.key == (0, "L")  # the one it already held, not read again
    late = weights_fs.DirTransport(str(tmp_path))  # a new (or restarted) worker: reads the base too
    buf = late.newest(0, "", 0.0)
    assert buf.key == (3, "L") and buf.base.key == (0, "L") and same(buf.base, full(0)) and same(buf, adapter(3))
    # An adapter whose base file is gone is refused by name; the reader keeps what it has.
    logged = []
    os.remove(tmp_path / "v0000000000-L.safetensors")
    orphan = weights_fs.DirTransport(str(tmp_path), log=logged.append)
    assert orphan.newest(0, "", 0.0) is None and "v0000000003-L.safetensors" in logged[0], logged


def test_a_new_lineage_replaces_the_old_ones_files_and_readers_follow_it(tmp_path):
    pub, reader = weights_fs.DirTransport(str(tmp_path)), weights_fs.DirTransport(str(tmp_path))
    pub.publish(version(5, "old", full(5)))
    assert reader.newest(0, "", 0.0).key == (5, "old")
    pub.publish(version(0, "new", full(0)))  # a restarted trainer: its versions start again from 0
    assert sorted(os.listdir(tmp_path)) == ["v0000000000-new.safetensors"]
    buf = reader.newest(6, "old", 0.0)
    assert buf.key == (0, "new") and same(buf, full(0))


def test_a_param_server_with_weights_dir_publishes_what_it_commits(roles, tmp_path):
    addr, folder = f"tcp://127.0.0.1:{free_port()}", str(tmp_path / "shared")

    def start():
        proc = roles.start("param_server", "param_server.py", "--bind", addr, "--state-dir", str(tmp_path / "ps"),
                           "--weights-dir", folder, "--keep-versions", "2")
        client = wire.Client("test", addr, timeout_s=10)
        client.call(wire.Ping(), timeout_s=30, what="param server start")
        return proc, client
    proc, client = start()
    reader = weights_fs.DirTransport(folder)
    weights_zmq.push_weights(client, 0, "L", full(0), chunk_bytes=4096)
    buf = reader.newest(0, "", 30.0)
    assert buf.key == (0, "L") and same(buf, full(0))
    weights_zmq.push_weights(client, 1, "L", adapter(1), chunk_bytes=4096, base=0, lora=LORA)
    buf = reader.newest(1, "L", 30.0)
    assert buf.key == (1, "L") and buf.is_adapter and same(buf, adapter(1)) and buf.base.key == (0, "L")
    # A restarted param server publishes what it restored from its state dir, base and adapter (its
    # persister writes the state dir first, so what the reader saw is there).
    roles.kill(proc)
    for name in os.listdir(folder):
        os.remove(os.path.join(folder, name))
    proc, client = start()
    buf = weights_fs.DirTransport(folder).newest(0, "", 30.0)
    assert buf.key == (1, "L") and same(buf, adapter(1)) and same(buf.base, full(0))


def test_a_run_whose_worker_reads_its_weights_from_the_directory_stays_bitwise(roles, tmp_path, tiny):  # noqa: F811
    run_dir, folder = str(tmp_path / "run"), str(tmp_path / "shared")
    ps, va = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    roles.start("param_server", "param_server.py", "--bind", ps, "--state-dir", f"{run_dir}/ps",
                "--weights-dir", folder, env=XLA)
    roles.start("verifier", "verifier.py", "--bind", va, "--executors", "1", env=XLA)
    worker = roles.start("worker0", "inference_worker.py", "--param-server", ps, "--verifier", va, "--model", tiny,
                         "--name", "worker-0", "--bf16-fix", "--weights-dir", folder, env=XLA)
    trainer = roles.start("trainer", "trainer.py", "--run-dir", run_dir, "--param-server", ps, "--model", tiny,
                          "--heldout", "4", "--eval-samples", "8", "--eval-every", "0", "--prompts-per-step", "4",
                          "--rollout-timeout-s", "120", "--bf16-fix", "--steps", "2", env=XLA)
    finish(roles, trainer)
    steps = [r for r in metrics(run_dir) if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert r["mismatch/bitwise_frac"] == 1.0 and r["mismatch/num_tokens"] > 0, r
    log = roles.log(worker)
    assert "weights v1 in" in log, log[-3000:]
    assert "fetched weights" not in log  # never the chunk fetcher: every version came through the directory


def test_launch_sh_weights_dir_goes_to_the_param_server_and_the_workers(tmp_path):
    from test_multihost import launch_text
    text = launch_text(tmp_path, ACCELERATOR="cpu", WORKERS=2, WEIGHTS_DIR="/shared/weights")
    lines = text.splitlines()
    assert any("param_server.py" in line and "--weights-dir /shared/weights" in line for line in lines), text
    workers = [line for line in lines if "inference_worker.py" in line]
    assert len(workers) == 2 and all("--weights-dir /shared/weights" in line for line in workers), text
    assert "--weights-dir" not in launch_text(tmp_path, ACCELERATOR="cpu", WORKERS=2)
