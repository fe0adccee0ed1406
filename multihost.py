"""multihost.py: the trainer across hosts, on JAX's own engine (jax.distributed).

A multi-host TPU slice (a v5p-16 is two VMs of four chips) is one JAX program run by one process per
VM: `jax.distributed.initialize` joins them, `jax.devices()` then lists every chip of every process,
and a mesh over them (sharding.role_mesh) makes one FSDP trainer of the whole slice. Every process
must run the same device computations in the same order, each with the same inputs.

How the trainer keeps them in step (`collective`, with trainer.Trainer.commands): process 0, the LEADER, is the
trainer the rest of the system sees: it alone talks to the parameter server, keeps the books, and
writes metrics, the ledger, checkpoints and the final policy. The other processes, FOLLOWERS, hold
their shards of the state and wait in `follow` for the leader's next command (update with this
batch, push, checkpoint, restore, export, stop), which `broadcast` sends over the same collectives the
training step uses. A value a follower needs (the batch, a checkpoint's tensors) travels as raw bytes,
so it arrives bit for bit; a value only the leader needs (a tensor to push or write) is gathered with
`to_host`, which every process calls.

On the CPU (the tests: several processes on loopback acting as hosts) the collectives are gloo's.
"""
from __future__ import annotations

import msgpack
import numpy as np

import jax
from jax.experimental import multihost_utils


def initialize(coordinator: str, num_processes: int, process_id: int) -> None:
    """Join the trainer's processes (before anything touches a JAX device). coordinator: "host:port"
    of process 0 (it listens there), or "auto" on a Cloud TPU slice, where JAX reads all three from
    the VM's metadata. Nothing to do for one process."""
    if coordinator == "auto":
        jax.distributed.initialize()
        return
    if num_processes <= 1:
        return
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU devices across processes
    jax.distributed.initialize(coordinator, num_processes=num_processes, process_id=process_id)


def is_leader() -> bool:
    return jax.process_index() == 0


def to_host(x) -> np.ndarray:
    """A (possibly sharded) jax.Array as one numpy array on this host. When its shards live in other
    processes too, this is a collective (an all-gather): every process must call it, in the same order."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))


def _pack(obj) -> bytes:
    def default(value):
        if isinstance(value, np.ndarray):
            return {"__nd__": np.ascontiguousarray(value).tobytes(), "dtype": value.dtype.str, "shape": value.shape}
        if isinstance(value, np.generic):
            return value.item()
        raise TypeError(f"cannot broadcast a {type(value).__name__}")
    return msgpack.packb(obj, default=default, use_bin_type=True)


def _unpack(data: bytes):
    def hook(d):
        if "__nd__" in d:
            return np.frombuffer(d["__nd__"], np.dtype(d["dtype"])).reshape(d["shape"]).copy()
        return d
    return msgpack.unpackb(data, object_hook=hook, raw=False, strict_map_key=False)


def _broadcast_bytes(data: bytes | None) -> bytes:
    """The leader's bytes on every process: their length first (followers do not know it), then the
    bytes as uint8 (a sum with the followers' zeros, exact for bytes)."""
    n = np.array([len(data) if is_leader() else 0], np.int64)
    n = int(multihost_utils.broadcast_one_to_all(n)[0])
    buf = np.frombuffer(data, np.uint8) if is_leader() else np.zeros(n, np.uint8)
    return multihost_utils.broadcast_one_to_all(buf).tobytes()


def broadcast(obj=None):
    """The leader's `obj` (msgpack types and numpy arrays, nested) on every process; followers pass
    nothing. With one process, `obj` itself."""
    if jax.process_count() == 1:
        return obj
    return _unpack(_broadcast_bytes(_pack(obj) if is_leader() else None))


def collective(commands: dict, command: str, payload=None):
    """The leader runs commands[command](payload) on every process, itself included; `commands` is a
    fixed table of what a leader may ask (an unknown command fails here, before any process is told)."""
    run = commands[command]
    broadcast([command, payload])
    return run(payload)


def follow(commands: dict) -> int:
    """A follower's life: run the leader's commands (from the same table) until it says stop; returns
    the exit status the leader sent with its stop (`release`)."""
    while True:
        command, payload = broadcast()
        if command == "stop":
            return payload
        commands[command](payload)


def release(status: int) -> None:
    """The leader's last word: the followers leave `follow` with its exit status."""
    if jax.process_count() > 1:
        broadcast(["stop", status])


def broadcast_array(x: np.ndarray | None, shape, dtype) -> np.ndarray:
    """The leader's array (followers pass None) on every process, bit for bit (sent as raw bytes:
    -0.0 and NaN payloads arrive unchanged)."""
    if jax.process_count() == 1:
        return x
    dtype = np.dtype(dtype)
    data = np.ascontiguousarray(x, dtype).tobytes() if is_leader() else None
    return np.frombuffer(_broadcast_bytes(data), dtype).reshape(shape).copy()
