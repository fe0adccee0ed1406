"""The wire: every message the roles exchange, defined once, and the two socket shapes that carry them.

Every role imports this module; no role defines a message of its own. A message is a dataclass
registered under a type name. On the wire it is a ZeroMQ multipart message:

    frame 0     msgpack map {"type": <name>, "v": PROTOCOL_VERSION, "rid": <request id>, "body": {...}}
    frame 1..n  raw bytes of each numpy array in the body, in order of appearance

Arrays in the body are replaced by a small map {"__nd__": i, "dtype": "bfloat16", "shape": [...]}
that names their frame, so a 200 MB weight push is sent straight from the arrays' buffers (no pickle,
no base64, no extra copy). ZeroMQ delivers a multipart message whole or not at all.

Sockets: servers bind a ROUTER, clients connect a DEALER. A client tags each request with a fresh
request id and discards replies with another id, so a reply that arrives after its request timed out
can never be mistaken for the answer to the next one. Servers reply to a malformed message with an
`Error` and carry on; a handler may also defer its reply (long polls, batches that run in the
background) and send it later with `Server.reply`.

Security: servers bind to loopback by default. Binding any other address requires CURVE keys
(see `python wire.py keygen`), and a client without the server's public key cannot connect.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import os
import threading
import time
import traceback
import typing
from dataclasses import dataclass, field
from typing import Any, Callable

import ml_dtypes
import msgpack
import numpy as np
import zmq

PROTOCOL_VERSION = 1
MAX_MESSAGE_BYTES = 1 << 30  # 1 GiB: enough for a ~500M-parameter bf16 model in one push
_DTYPES = {name: np.dtype(name) for name in
           ("bool", "int8", "uint8", "int16", "int32", "int64", "uint32", "float16", "float32", "float64")}
_DTYPES["bfloat16"] = np.dtype(ml_dtypes.bfloat16)


class WireError(ValueError):
    """A message that does not decode or does not match its schema."""


class RemoteError(RuntimeError):
    """The server answered a request with an `Error`."""


# ----------------------------------------------------------------------------- message registry

MESSAGES: dict[str, type] = {}


def message(name: str):
    """Register a dataclass as the wire message `name`."""
    def register(cls):
        cls = dataclass(cls)
        cls.TYPE = name
        MESSAGES[name] = cls
        return cls
    return register


@message("error")
class Error:
    """Reply to a request that could not be served; `error` says why in words."""
    error: str


@message("ok")
class Ok:
    """Plain acknowledgement, with optional named counters."""
    info: dict = field(default_factory=dict)


@message("ping")
class Ping:
    """Liveness check; any server answers with `Pong`."""


@message("pong")
class Pong:
    server: str
    instance: str  # random per process start: a change tells clients the server restarted
    info: dict = field(default_factory=dict)


# --- parameter server: weights -----------------------------------------------------------------

@message("push_weights")
class PushWeights:
    """Trainer -> param server: a complete set of weights for one policy version.
    `checksums[i]` is the CRC32 of `arrays[i]`'s bytes; the server verifies all before swapping in."""
    version: int
    names: list
    arrays: list
    checksums: list
    lineage: str = ""  # random per trainer start: "version 7" of a dead trainer is not ours


@message("get_weights")
class GetWeights:
    """Worker -> param server: the newest weights with version >= min_version, unless the newest is
    `have_version` (then `WeightsUnchanged`). Waits up to wait_s for min_version to appear."""
    have_version: int = -1
    min_version: int = 0
    wait_s: float = 0.0
    have_lineage: str = ""


@message("weights")
class Weights:
    version: int
    names: list
    arrays: list
    checksums: list
    lineage: str = ""


@message("weights_unchanged")
class WeightsUnchanged:
    version: int  # the newest version the server has (-1: none yet)
    lineage: str = ""


# --- parameter server: work queue and rollouts -------------------------------------------------

@message("enqueue_work")
class EnqueueWork:
    """Trainer -> param server: work items, each a dict {item_id, prompt, tests, group_size, ...}.
    Idempotent per item_id; `requeue=True` also re-issues items already delivered (trainer resume)."""
    items: list
    requeue: bool = False


@message("lease_work")
class LeaseWork:
    """Worker -> param server: lease up to max_items items for lease_s seconds."""
    worker: str
    max_items: int = 1
    lease_s: float = 60.0
    wait_s: float = 0.0  # long poll: wait up to this long for an item when the queue is empty


@message("work")
class Work:
    items: list  # the leased item dicts, each with its "lease" id added


@message("submit_rollout")
class SubmitRollout:
    """Worker -> param server: the finished group for one item. `rollout` is a dict of named fields
    (see inference_worker.py) whose arrays travel as frames. A second submit of the same item is a
    duplicate: acknowledged, counted, dropped."""
    worker: str
    item_id: str
    lease: str
    rollout: dict


@message("get_rollouts")
class GetRollouts:
    """Trainer -> param server: up to max_items finished rollouts, waiting up to wait_s for one."""
    max_items: int
    wait_s: float = 0.0


@message("rollouts")
class Rollouts:
    rollouts: list
    info: dict = field(default_factory=dict)


@message("get_stats")
class GetStats:
    """Anyone -> param server: counters for progress display and tests."""


# --- verifier ------------------------------------------------------------------------------------

@message("verify_batch")
class VerifyBatch:
    """Worker -> verifier: jobs, each a dict {"kind": "assert"|"io", "program", ...} (see verifier.py)."""
    jobs: list


@message("verdicts")
class Verdicts:
    """Verifier -> worker: one dict {passed, reward, status, detail, fraction} per job, in order."""
    verdicts: list


# --- records carried inside messages ------------------------------------------------------------
# Work items and rollouts are plain dicts (so a researcher can add a field without a protocol bump);
# these checks run wherever one enters a role, so a malformed one is an error reply, not a crash later.

ITEM_FIELDS = {"item_id": str, "prompt": str, "group_size": int, "seq_len": int,
               "max_new_tokens": int, "min_version": int}
ROLLOUT_FIELDS = {"item_id": str, "version": int, "worker": str, "prompt_len": int,
                  "tokens_GT": np.ndarray, "logp_GT": np.ndarray, "mask_GT": np.ndarray,
                  "rewards_G": np.ndarray}


def check_record(kind: str, record, fields: dict) -> dict:
    if not isinstance(record, dict):
        raise WireError(f"{kind} must be a map, got {type(record).__name__}")
    for name, typ in fields.items():
        if name not in record:
            raise WireError(f"{kind} lacks field {name!r}")
        value = record[name]
        if typ is int and isinstance(value, bool) or not isinstance(value, typ):
            raise WireError(f"{kind}.{name} must be {typ.__name__}, got {type(value).__name__}")
    return record


def check_item(item) -> dict:
    check_record("work item", item, ITEM_FIELDS)
    if item["group_size"] < 1 or item["max_new_tokens"] < 1 or item["seq_len"] < 2:
        raise WireError(f"work item {item['item_id']}: group_size, max_new_tokens and seq_len must be positive")
    if not isinstance(item.get("crn_key", ""), str):
        raise WireError(f"work item {item['item_id']}: crn_key must be a string")
    return item


def check_rollout(rollout) -> dict:
    check_record("rollout", rollout, ROLLOUT_FIELDS)
    G, T = rollout["tokens_GT"].shape if rollout["tokens_GT"].ndim == 2 else (-1, -1)
    if G < 1 or rollout["tokens_GT"].dtype != np.int32:
        raise WireError("rollout.tokens_GT must be a non-empty int32 [G, T] array")
    for name in ("logp_GT", "mask_GT"):
        if rollout[name].shape != (G, T) or rollout[name].dtype != np.float32:
            raise WireError(f"rollout.{name} must be float32 of shape {(G, T)}")
    if rollout["rewards_G"].shape != (G,) or not np.all(np.isfinite(rollout["rewards_G"])):
        raise WireError(f"rollout.rewards_G must be {G} finite values")
    if not 0 < rollout["prompt_len"] < T:
        raise WireError(f"rollout.prompt_len {rollout['prompt_len']} outside (0, {T})")
    return rollout


# ----------------------------------------------------------------------------- encoding

def _pack_value(value, arrays: list):
    if isinstance(value, np.ndarray) or type(value).__module__.startswith("jax"):
        array = np.ascontiguousarray(np.asarray(value))
        if array.dtype.name not in _DTYPES:
            raise WireError(f"arrays of dtype {array.dtype} cannot travel on the wire")
        arrays.append(array)
        return {"__nd__": len(arrays) - 1, "dtype": array.dtype.name, "shape": list(array.shape)}
    if isinstance(value, dict):
        return {str(k): _pack_value(v, arrays) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_pack_value(v, arrays) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def encode(msg, rid: int = 0) -> list:
    """Message -> list of frames (header bytes, then array buffers)."""
    if type(msg).__name__ not in {c.__name__ for c in MESSAGES.values()} or not hasattr(msg, "TYPE"):
        raise WireError(f"{type(msg).__name__} is not a registered wire message")
    arrays: list = []
    body = {f.name: _pack_value(getattr(msg, f.name), arrays) for f in dataclasses.fields(msg)}
    header = msgpack.packb({"type": msg.TYPE, "v": PROTOCOL_VERSION, "rid": rid, "body": body},
                           use_bin_type=True)
    return [header] + [memoryview(a.reshape(-1).view(np.uint8)) if a.size else b"" for a in arrays]


MAX_DEPTH = 32      # nesting of maps/lists in a body; deeper is malformed (and would exhaust the stack)
MAX_NDIM = 16


def _unpack_value(value, frames: list, depth: int = 0):
    if depth > MAX_DEPTH:
        raise WireError(f"body nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, dict):
        if "__nd__" in value:
            index, dtype, shape = value.get("__nd__"), value.get("dtype"), value.get("shape")
            if (type(index) is not int or not 0 <= index < len(frames) or dtype not in _DTYPES
                    or not isinstance(shape, list) or len(shape) > MAX_NDIM
                    or not all(type(d) is int and d >= 0 for d in shape)):
                raise WireError(f"bad array reference {str(value)[:200]}")
            dtype, buffer = _DTYPES[dtype], frames[index]
            if math.prod(shape) * dtype.itemsize != len(buffer):  # Python ints: no overflow
                raise WireError(f"array frame {index} has {len(buffer)} bytes, "
                                f"expected {shape} x {dtype.name}")
            return np.frombuffer(buffer, dtype=dtype).reshape(shape)
        return {k: _unpack_value(v, frames, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_unpack_value(v, frames, depth + 1) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        raise WireError("NaN and infinite numbers are not accepted")
    return value


_SIMPLE = {int: (int,), float: (int, float), str: (str,), bool: (bool,), list: (list,), dict: (dict,)}


def _check_type(cls, name: str, value) -> None:
    hint = typing.get_type_hints(cls)[name]
    allowed = _SIMPLE.get(hint)
    if allowed is None:
        return
    if hint is int and isinstance(value, bool) or not isinstance(value, allowed):
        raise WireError(f"{cls.TYPE}.{name} must be {hint.__name__}, got {type(value).__name__}")
    if hint is float and not math.isfinite(value):
        raise WireError(f"{cls.TYPE}.{name} must be finite, got {value}")


def decode(frames: list) -> tuple[Any, int]:
    """List of frames -> (message, request id). Raises WireError saying what is wrong."""
    if not frames:
        raise WireError("empty message")
    try:
        header = msgpack.unpackb(bytes(frames[0]), raw=False, strict_map_key=True)
    except Exception as e:  # msgpack raises a zoo of exception types on garbage
        raise WireError(f"header is not msgpack: {type(e).__name__}: {e}") from None
    if not isinstance(header, dict) or not {"type", "v", "rid", "body"} <= set(header):
        raise WireError("header must be a map with type, v, rid and body")
    if header["v"] != PROTOCOL_VERSION:
        raise WireError(f"protocol version {header['v']!r}, this build speaks {PROTOCOL_VERSION}")
    cls = MESSAGES.get(header["type"]) if isinstance(header["type"], str) else None
    if cls is None:
        raise WireError(f"unknown message type {header['type']!r}")
    body, rid = header["body"], header["rid"]
    if not isinstance(body, dict) or not isinstance(rid, int):
        raise WireError("body must be a map and rid an integer")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if unknown := set(body) - set(fields):
        raise WireError(f"{cls.TYPE}: unknown fields {sorted(unknown)}")
    required = {n for n, f in fields.items()
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    if missing := required - set(body):
        raise WireError(f"{cls.TYPE}: missing fields {sorted(missing)}")
    data = [memoryview(f.buffer if isinstance(f, zmq.Frame) else f) for f in frames[1:]]
    values = {}
    for name, value in body.items():
        _check_type(cls, name, value)
        values[name] = _unpack_value(value, data)
    return cls(**values), rid


# ----------------------------------------------------------------------------- sockets

def is_loopback(addr: str) -> bool:
    host = addr.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    return addr.startswith(("ipc://", "inproc://")) or host in ("127.0.0.1", "localhost", "::1")


def _load_key(path: str, secret: bool) -> bytes:
    """Keys are stored as the two Z85 lines written by `python wire.py keygen DIR`."""
    with open(path) as f:
        public, secret_key = (line.strip().encode() for line in f.read().splitlines()[:2])
    return secret_key if secret else public


def curve_keys_from_env() -> str | None:
    """RLAX_CURVE_KEY: path of the shared key file (servers and clients use the same pair)."""
    return os.environ.get("RLAX_CURVE_KEY") or None


class Server:
    """A ROUTER socket with a dispatch table. Handlers are `handler(msg, peer) -> reply | None`."""

    def __init__(self, name: str, bind: str, *, max_message_bytes: int = MAX_MESSAGE_BYTES,
                 curve_key: str | None = None):
        self.name, self.bind_addr, self.instance = name, bind, os.urandom(6).hex()
        self.handlers: dict[type, Callable] = {Ping: lambda m, p: Pong(self.name, self.instance)}
        self.ctx = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)  # bigger: peer is dropped by zmq
        self.sock.setsockopt(zmq.LINGER, 0)
        curve_key = curve_key or curve_keys_from_env()
        if curve_key:
            self.sock.curve_secretkey = _load_key(curve_key, secret=True)
            self.sock.curve_publickey = _load_key(curve_key, secret=False)
            self.sock.curve_server = True
        elif not is_loopback(bind):
            raise ValueError(f"{name}: refusing to bind {bind} without CURVE keys; "
                             "create them with `python wire.py keygen DIR` and set RLAX_CURVE_KEY")
        self.sock.bind(bind)
        self.bad_messages = 0

    def on(self, cls, handler) -> None:
        self.handlers[cls] = handler

    def reply(self, peer, msg) -> None:
        identity, rid = peer
        self.sock.send_multipart([identity] + encode(msg, rid), copy=False)

    def handle(self, frames: list) -> None:
        identity, payload = frames[0], frames[1:]
        try:
            msg, rid = decode(payload)
        except Exception as e:  # WireError, and whatever else garbage provokes: never die of it
            self.bad_messages += 1
            self.reply((identity, 0), Error(f"{self.name}: malformed message: {type(e).__name__}: {e}"[:1000]))
            return
        handler = self.handlers.get(type(msg))
        if handler is None:
            self.reply((identity, rid), Error(f"{self.name} does not serve {msg.TYPE!r}"))
            return
        try:
            answer = handler(msg, (identity, rid))
        except (ValueError, KeyError, TypeError, WireError) as e:
            # A handler rejects a well-formed message with bad content: say why, keep serving.
            self.bad_messages += 1
            answer = Error(f"{self.name}: bad {msg.TYPE}: {type(e).__name__}: {e}"[:1000])
        except Exception as e:  # a bug of ours: report it loudly, but one message must not kill the server
            self.bad_messages += 1
            traceback.print_exc()
            answer = Error(f"{self.name}: internal error on {msg.TYPE}: {type(e).__name__}: {e}"[:1000])
        if answer is not None:
            self.reply((identity, rid), answer)

    def serve(self, stop: threading.Event | None = None, tick: Callable | None = None,
              poll_ms: int = 50) -> None:
        """Serve until `stop` is set; `tick()` runs after every poll (deferred replies, expiry)."""
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        while stop is None or not stop.is_set():
            if poller.poll(poll_ms):
                while True:  # drain everything queued before the next tick
                    try:
                        frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    self.handle(frames)
            if tick is not None:
                tick()

    def close(self) -> None:
        self.sock.close(0)


class Client:
    """A DEALER socket that sends one request at a time and waits for its reply with a timeout."""

    def __init__(self, name: str, addr: str, *, timeout_s: float = 30.0, curve_key: str | None = None):
        self.name, self.addr, self.timeout_s = name, addr, timeout_s
        self.curve_key = curve_key or curve_keys_from_env()
        self._rids = itertools.count(1)
        self.sock = None
        self._connect()

    def _connect(self) -> None:
        if self.sock is not None:
            self.sock.close(0)
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        if self.curve_key:
            self.sock.curve_serverkey = _load_key(self.curve_key, secret=False)
            self.sock.curve_publickey = _load_key(self.curve_key, secret=False)
            self.sock.curve_secretkey = _load_key(self.curve_key, secret=True)
        self.sock.connect(self.addr)

    def call(self, msg, timeout_s: float | None = None, what: str | None = None):
        """Send `msg`, return the reply. Raises TimeoutError naming what was awaited and from where,
        RemoteError if the server answered with an Error."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        rid = next(self._rids)
        self.sock.send_multipart(encode(msg, rid), copy=False)
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            if not self.sock.poll(int(left * 1000) + 1):
                continue
            reply, reply_rid = decode(self.sock.recv_multipart(copy=False))
            if isinstance(reply, Error) and reply_rid in (rid, 0):
                raise RemoteError(reply.error)
            if reply_rid == rid:
                return reply
            # else: a late reply to an earlier, timed-out request; drop it.
        # Reconnect so a server that restarted is found again and nothing stale stays queued.
        self._connect()
        raise TimeoutError(f"{self.name}: no reply to {msg.TYPE} ({what or 'request'}) "
                           f"from {self.addr} within {timeout_s:.1f}s")

    def close(self) -> None:
        self.sock.close(0)


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser(description="Wire utilities.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    keygen = sub.add_parser("keygen", help="write a CURVE key pair to DIR/curve.key (chmod 600)")
    keygen.add_argument("dir")
    args = parser.parse_args()
    if args.cmd == "keygen":
        os.makedirs(args.dir, exist_ok=True)
        public, secret = zmq.curve_keypair()
        path = os.path.join(args.dir, "curve.key")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(public.decode() + "\n" + secret.decode() + "\n")
        print(f"wrote {path}; start every role with RLAX_CURVE_KEY={path}")
