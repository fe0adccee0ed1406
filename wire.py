"""The wire: every message the roles exchange, defined once, and the two socket shapes that carry them.

Every role imports this module; no role defines a message of its own. A message is a dataclass
registered under a type name. On the wire it is a ZeroMQ multipart message:

    frame 0     msgpack map {"type": <name>, "v": PROTOCOL_VERSION, "rid": <request id>, "body": {...}}
    frame 1..n  raw bytes of each numpy array in the body, in order of appearance

Arrays in the body are replaced by a small map {"__nd__": i, "dtype": "bfloat16", "shape": [...]}
that names their frame, so a 16 MiB weight chunk is sent straight from its array's buffer (no pickle,
no base64, no extra copy). ZeroMQ delivers a multipart message whole or not at all. Weights travel as
a manifest and chunks (the messages below; weights.py tells their layout, checks and path), never as
one message.

Sockets: servers bind a ROUTER, clients connect a DEALER (Client; verifier_client.VerifierFleet is
the verifier's client over several). A client tags each request with a fresh request id and discards replies with
another id, so a reply that arrives after its request timed out can never be mistaken for the answer
to the next one. Servers reply to a malformed message with an
`Error` and carry on; a handler may also defer its reply (long polls, batches that run in the
background) and send it later with `Server.reply`.

Security: servers bind to loopback by default; binding any other address requires CURVE keys, and
traffic is then encrypted and admitted by key (curve.py: the keys, the allowlist, `keygen`).
"""
from __future__ import annotations

import collections
import dataclasses
import functools
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

import envs
from curve import ZapHandler, curve_keys_from_env, load_client_keys, load_key, load_public_key

PROTOCOL_VERSION = 1
MAX_MESSAGE_BYTES = 1 << 30  # 1 GiB: far above any chunk or rollout batch
DTYPES = {name: np.dtype(name) for name in
           ("bool", "int8", "uint8", "int16", "int32", "int64", "uint32", "float16", "float32", "float64")}
DTYPES["bfloat16"] = np.dtype(ml_dtypes.bfloat16)


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


# --- parameter server: weights, streamed in chunks ---------------------------------------------
# A weight version travels as a MANIFEST (a map, checked by versions.Manifest.from_dict) and a sequence
# of chunks, each a byte range of the version's tensors laid end to end, with its CRC32. weights.py
# tells the whole path; these messages are its ZeroMQ transport's (weights_zmq.py): push_weights
# (trainer -> param server), WeightStore (the param server's versions), WeightFetcher and ChunkServer
# (-> workers, and between them). They stay here with every other message: one registry and codec,
# one socket the param server serves weights and work on, one list that docs/protocol.md describes.

@message("push_chunk")
class PushChunk:
    """Trainer -> param server: chunk `index` (counting from 0, sent in order) of the push `push_id`.
    `crc` is the CRC32 of `data` (uint8). A wrong CRC or index discards the whole push."""
    push_id: str
    index: int
    data: np.ndarray  # uint8, checked by versions.chunk_array where it is received
    crc: int


@message("push_commit")
class PushCommit:
    """Trainer -> param server: the push `push_id` is complete; `manifest` (versions.Manifest) describes it.
    The server checks it against the chunks it received and every tensor's CRC, then makes the version
    visible at once, or discards the push and answers an Error (the previous version stays served)."""
    push_id: str
    manifest: dict


@message("get_weights")
class GetWeights:
    """Worker -> param server: the manifest of the newest version with version >= min_version, unless
    the newest is (have_version, have_lineage) (then `WeightsUnchanged`). Waits up to wait_s for
    min_version (or for a lineage other than have_lineage) to appear. A relaying worker names itself
    and the address of its chunk server (`relay`): the reply's `sources` then name where to fetch."""
    have_version: int = -1
    min_version: int = 0
    wait_s: float = 0.0
    have_lineage: str = ""
    worker: str = ""
    incarnation: str = ""
    relay: str = ""
    relayed_bytes: int = 0  # what this worker's chunk server has served its children, in all


@message("weight_manifest")
class WeightManifest:
    """Param server -> worker: what to fetch (`manifest`) and from where: `sources` lists chunk
    servers nearest first (the worker's relay parent, its parent, ...); "" is the param server itself,
    always last. For an adapter version (LoRA), `base` is the manifest of the full version it applies
    to, fetched first by a worker that does not hold it; {} for a full version. `delta`: a
    deltas.DeltaManifest that rebuilds the version from the one the worker said it has; {} for none."""
    manifest: dict
    sources: list = field(default_factory=lambda: [""])
    base: dict = field(default_factory=dict)
    delta: dict = field(default_factory=dict)


@message("weights_unchanged")
class WeightsUnchanged:
    version: int  # the newest version the server has (-1: none yet)
    lineage: str = ""


@message("get_chunk")
class GetChunk:
    """Worker -> param server or a relaying worker: chunk `index` of (version, lineage). A relay that
    is still receiving that version waits up to wait_s for the chunk before it answers an Error."""
    version: int
    lineage: str
    index: int
    wait_s: float = 0.0
    delta: bool = False  # the delta's bytes for the chunk (deltas.py), not the chunk itself


@message("chunk")
class Chunk:
    version: int
    index: int
    data: np.ndarray  # uint8, checked by versions.chunk_array where it is received
    crc: int


# --- parameter server: work queue and rollouts -------------------------------------------------

@message("enqueue_work")
class EnqueueWork:
    """Trainer -> param server: work items, each a dict {item_id, prompt, tests, group_size, ...}.
    Idempotent per item_id; `requeue=True` also re-issues items already delivered (trainer resume)."""
    items: list
    requeue: bool = False


@message("hello")
class Hello:
    """Worker -> param server, once at start: `incarnation` is random per process start, so a
    restarted worker (same name, new incarnation) releases its dead predecessor's leases at once."""
    worker: str
    incarnation: str


@message("lease_work")
class LeaseWork:
    """Worker -> param server: lease up to max_items items for lease_s seconds (renewed by
    RenewLeases while the worker samples them)."""
    worker: str
    max_items: int = 1
    lease_s: float = 60.0
    wait_s: float = 0.0  # long poll: wait up to this long for an item when the queue is empty
    incarnation: str = ""


@message("renew_leases")
class RenewLeases:
    """Worker -> param server, a heartbeat every lease_s / 3 while it holds leases: extend each
    [item_id, lease] by lease_s. A live worker, however slow, keeps its items; a dead one stops
    renewing and loses them within lease_s. Reply: Ok({"renewed": n, "lost": [item ids]})."""
    worker: str
    leases: list
    lease_s: float = 60.0
    incarnation: str = ""


@message("work")
class Work:
    items: list  # the leased item dicts, each with its "lease" id added


@message("submit_rollout")
class SubmitRollout:
    """Worker -> param server: the finished group for one item (`rollout` is a Rollout.to_dict()),
    under a lease the server issued for it. A second submit of the same item is a duplicate:
    acknowledged, counted, dropped."""
    worker: str
    item_id: str
    lease: str
    rollout: dict


@message("forged_rollout")
class ForgedRollout:
    """Trainer -> param server: the rollout of `item_id` it was sent is forged (audit.py says why): the
    worker that submitted it is refused from then on, and the item is issued again (the trainer has not
    acknowledged it). Answered with Ok(info={"refused": the worker's identity, "reissued": bool})."""
    item_id: str
    why: str


@message("get_rollouts")
class GetRollouts:
    """Trainer -> param server: up to max_items finished rollouts, waiting up to wait_s for one.
    `ack` lists the item ids of the rollouts the trainer received in its previous reply: a
    rollout stays with the server, and is sent again, until it is acknowledged, so a lost reply
    loses nothing (the trainer recognises a rollout it already holds as a duplicate)."""
    max_items: int
    wait_s: float = 0.0
    ack: list = field(default_factory=list)


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
    """Worker -> verifier: jobs, each a dict {"kind": "assert"|"io", "program", ...} (see verifier.py).
    While the batch runs, the verifier's Pong to the same connection carries info["batches"]: for each
    batch of that connection still running, its request id (as text) -> the seconds it may still take
    (verifier.py:ExecutorPool.submit_batch), which is how long its client waits. ping_s > 0: the client
    pings every ping_s while it waits, so a batch whose connection falls silent has been given up
    (its client died or left) and is dropped (verifier.py:VerifierService.tick); 0: never dropped."""
    jobs: list
    ping_s: float = 0.0


@message("cancel_batch")
class CancelBatch:
    """Worker -> verifier: the client gave up on the VerifyBatch it sent on this connection as request
    `request`: its jobs not yet started are never run and its running ones are stopped. Answered with
    Ok, or an Error when no such batch of this connection is running."""
    request: int


@message("verdicts")
class Verdicts:
    """Verifier -> worker: one dict {passed, reward, status, detail, fraction} per job, in order."""
    verdicts: list


# --- records carried inside messages ------------------------------------------------------------
# A work item and a rollout are dataclasses defined here once (a weight manifest, the third record,
# is versions.Manifest). On the wire they travel as maps (`to_dict`); `from_dict` is the one place a
# received map becomes a record, checking every field's presence and type, so a malformed one is an
# error reply where it enters a role, never a crash later. To add a field, add it here with a default:
# old and new senders then interoperate.


@functools.cache
def field_types(cls) -> dict:
    """typing.get_type_hints(cls), once per class: resolving the (string) annotations is most of the
    cost of checking a received message or record, and a class's fields never change."""
    return typing.get_type_hints(cls)


def check_fields(cls, data) -> dict:
    """The map `data` if it has every required field of the record dataclass `cls`, no other, each of
    its declared type; else WireError. Every record's from_dict starts here."""
    if not isinstance(data, dict):
        raise WireError(f"{cls.KIND} must be a map, got {type(data).__name__}")
    hints = field_types(cls)
    if unknown := set(data) - set(hints):
        raise WireError(f"{cls.KIND} has unknown fields {sorted(unknown)}")
    for f in dataclasses.fields(cls):
        if f.name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise WireError(f"{cls.KIND} lacks field {f.name!r}")
            continue
        value, hint = data[f.name], hints[f.name]
        allowed = (int, float) if hint is float else (hint,)
        if (hint is int and isinstance(value, bool)) or not isinstance(value, allowed):
            raise WireError(f"{cls.KIND}.{f.name} must be {hint.__name__}, got {type(value).__name__}")
    return data


@dataclass
class WorkItem:
    """Trainer -> param server -> worker: one prompt to sample `group_size` times and verify."""
    KIND: typing.ClassVar[str] = "work item"
    item_id: str              # "train/<cursor index>|<problem id>" or "eval/<step>/<j>|<problem id>"
    prompt: str
    group_size: int           # G
    seq_len: int              # T: prompt + completion + padding, the rollout's row length
    max_new_tokens: int
    min_version: int          # never sample with weights older than this (the staleness bound)
    lineage: str = ""         # the trainer process that enqueued it
    tests: str = ""           # assert-style tests (HumanEval's end with check(entry_point))
    entry_point: str = ""
    kind: str = "assert"      # "assert" | "io" (stdin/stdout cases) | "math" | "reward" (scorers.py)
    cases: list = field(default_factory=list)
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list = field(default_factory=lambda: ["\n"])
    prompt_format: str = "completion"   # prompts.FORMATS: how the program is built from a completion
    program_prefix: str = ""            # completion format: what precedes the completion in the program
    partial_reward: bool = False        # "io" items: reward the fraction of cases passed
    eval: bool = False        # an evaluation item: scored for pass@k, never trained on
    crn_key: str = ""         # evaluation items: the key of their common random numbers
    timeout_s: float = 5.0    # per program, in the verifier
    lease: str = ""           # set by the param server when it leases the item
    answer: str = ""          # "math": the reference final answer
    answer_format: str = ""   # "math": "hash" (#### n) or "boxed" (\boxed{n})
    row: str = ""             # "reward": the dataset line (JSON text) the reward function receives
    env: str = ""             # a name in envs.ENVS: a multi-turn episode (envs.run_episodes); "": one turn
    max_turns: int = 1        # env: model turns at most
    seed: int = -1            # the run's sampling seed (the trainer's): each row's key comes from it, the item id
                              # and the version (sampler.row_keys), so the trainer can draw a row again (audit.py);
                              # -1: the worker's own --seed (a tool's items)

    @classmethod
    def from_dict(cls, data) -> "WorkItem":
        item = cls(**check_fields(cls, data))
        if item.group_size < 1 or item.max_new_tokens < 1 or item.seq_len < 2:
            raise WireError(f"work item {item.item_id}: group_size, max_new_tokens and seq_len must be positive")
        if item.prompt_format not in ("chat", "completion"):
            raise WireError(f"work item {item.item_id}: prompt_format must be 'chat' or 'completion', "
                            f"got {item.prompt_format!r}")
        if item.kind not in ("assert", "io", "math", "reward"):
            raise WireError(f"work item {item.item_id}: kind must be assert, io, math or reward, got {item.kind!r}")
        if item.env not in ("", *envs.ENVS) or not 1 <= item.max_turns <= 64:
            raise WireError(f"work item {item.item_id}: env must be '' or one of {', '.join(envs.ENVS)} "
                            f"(envs.ENVS) and max_turns in [1, 64]")
        return item

    def to_dict(self) -> dict:
        """The map that travels; the fields of math and reward items only on those items."""
        data = dataclasses.asdict(self)
        for name in ("answer", "answer_format", "row", "env"):
            if not data[name]:
                del data[name]
        if data["max_turns"] == 1:
            del data["max_turns"]
        return data


@dataclass
class Rollout:
    """Worker -> param server -> trainer: one item's group of G sampled completions, verified.
    Its tokens were sampled with weights of `lineage`: `version` is the oldest version that sampled
    any of them (lifecycle.rollout_version: what the staleness bound checks), `versions_GT` says which
    version sampled each token (empty: every token was sampled by `version`, as with --inflight off)."""
    KIND: typing.ClassVar[str] = "rollout"
    item_id: str
    version: int
    lineage: str
    worker: str
    prompt_len: int           # prompt tokens (the same for every row of the group)
    tokens_GT: np.ndarray     # int32 [G, T]: prompt + completion, padded
    logp_behav_GT: np.ndarray # float32 [G, T]: the sampler's log-probs of the tokens it drew
    mask_GT: np.ndarray       # float32 [G, T]: 1 on completion tokens the verifier saw
    rewards_G: np.ndarray     # float32 [G]
    finished_G: np.ndarray    # bool [G]: the completion ended (stop string or EOS), not truncated
    statuses: list            # G verdict statuses (lifecycle.INFRA_ERROR: the verifier failed)
    texts: list = field(default_factory=list)
    eval: bool = False
    sample_s: float = 0.0
    verify_s: float = 0.0
    versions_GT: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int32))  # int32 [G, T] or empty
    inflight: str = "off"     # the worker's in-flight mode (lifecycle.INFLIGHT_MODES)
    env_stats: dict = field(default_factory=dict)  # multi-turn: {"turns": [G ints], "tool_calls": [G ints]}
    macs: list = field(default_factory=list)  # G verdict seals (attest.py) from a verifier with a key, or empty

    @classmethod
    def from_dict(cls, data) -> "Rollout":
        r = cls(**check_fields(cls, data))
        G, T = r.tokens_GT.shape if r.tokens_GT.ndim == 2 else (-1, -1)
        if G < 1 or r.tokens_GT.dtype != np.int32:
            raise WireError("rollout.tokens_GT must be a non-empty int32 [G, T] array")
        for name in ("logp_behav_GT", "mask_GT"):
            if getattr(r, name).shape != (G, T) or getattr(r, name).dtype != np.float32:
                raise WireError(f"rollout.{name} must be float32 of shape {(G, T)}")
        if r.rewards_G.shape != (G,) or r.rewards_G.dtype != np.float32 or not np.all(np.isfinite(r.rewards_G)):
            raise WireError(f"rollout.rewards_G must be {G} finite float32 values")
        if r.finished_G.shape != (G,) or r.finished_G.dtype != np.bool_:
            raise WireError(f"rollout.finished_G must be {G} booleans")
        if len(r.statuses) != G or not all(isinstance(s, str) for s in r.statuses):
            raise WireError(f"rollout.statuses must be {G} strings")
        if not 0 < r.prompt_len < T:
            raise WireError(f"rollout.prompt_len {r.prompt_len} outside (0, {T})")
        if r.env_stats and not (set(r.env_stats) == {"turns", "tool_calls"} and all(
                isinstance(v, list) and len(v) == G and all(isinstance(x, int) and x >= 0 for x in v)
                for v in r.env_stats.values())):
            raise WireError(f"rollout.env_stats must map turns and tool_calls to {G} counts each")
        if r.macs and not (len(r.macs) == G and all(isinstance(m, str) and len(m) <= 128 for m in r.macs)):
            raise WireError(f"rollout.macs must be {G} strings (or none)")
        if r.inflight not in ("off", "keep", "recompute"):
            raise WireError(f"rollout.inflight must be off, keep or recompute, got {r.inflight!r}")
        if r.versions_GT.size:
            sampled = r.mask_GT > 0
            if r.versions_GT.shape != (G, T) or r.versions_GT.dtype != np.int32:
                raise WireError(f"rollout.versions_GT must be int32 of shape {(G, T)} (or empty)")
            if sampled.any() and int(r.versions_GT[sampled].min()) != r.version:
                raise WireError(f"rollout.version {r.version} is not its oldest token's version "
                                f"{int(r.versions_GT[sampled].min())}")
        return r

    def to_dict(self) -> dict:
        """The map that travels; the per-token fields only when they say something (a receiver that
        predates them refuses unknown fields, and without them every token is `version`)."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if not self.versions_GT.size and self.inflight == "off":
            del data["versions_GT"], data["inflight"]
        if not self.env_stats:
            del data["env_stats"]
        return data

    def token_versions(self) -> np.ndarray:
        """int32 [G, T]: the version that sampled each token (meaningful where mask_GT is 1)."""
        return self.versions_GT if self.versions_GT.size else np.full(self.tokens_GT.shape, self.version, np.int32)


# ----------------------------------------------------------------------------- encoding

def _pack_value(value, arrays: list):
    if isinstance(value, np.ndarray) or type(value).__module__.startswith("jax"):
        array = np.ascontiguousarray(np.asarray(value))
        if array.dtype.name not in DTYPES:
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


def encode(msg, rid: int = 0, run: str = "") -> list:
    """Message -> list of frames (header bytes, then array buffers). `run`: the sender's run id
    (RLAX_RUN_ID), carried in the header when set; a Server of another run refuses the message."""
    if type(msg).__name__ not in {c.__name__ for c in MESSAGES.values()} or not hasattr(msg, "TYPE"):
        raise WireError(f"{type(msg).__name__} is not a registered wire message")
    arrays: list = []
    body = {f.name: _pack_value(getattr(msg, f.name), arrays) for f in dataclasses.fields(msg)}
    header = {"type": msg.TYPE, "v": PROTOCOL_VERSION, "rid": rid, "body": body}
    if run:
        header["run"] = run
    header = msgpack.packb(header, use_bin_type=True)
    return [header] + [memoryview(a.reshape(-1).view(np.uint8)) if a.size else b"" for a in arrays]


MAX_DEPTH = 32      # nesting of maps/lists in a body; deeper is malformed (and would exhaust the stack)
MAX_NDIM = 16


def _unpack_value(value, frames: list, depth: int = 0):
    if depth > MAX_DEPTH:
        raise WireError(f"body nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, dict):
        if "__nd__" in value:
            index, dtype, shape = value.get("__nd__"), value.get("dtype"), value.get("shape")
            if (type(index) is not int or not 0 <= index < len(frames) or dtype not in DTYPES
                    or not isinstance(shape, list) or len(shape) > MAX_NDIM
                    or not all(type(d) is int and d >= 0 for d in shape)):
                raise WireError(f"bad array reference {str(value)[:200]}")
            dtype, buffer = DTYPES[dtype], frames[index]
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
    hint = field_types(cls)[name]
    allowed = _SIMPLE.get(hint)
    if allowed is None:
        return
    if hint is int and isinstance(value, bool) or not isinstance(value, allowed):
        raise WireError(f"{cls.TYPE}.{name} must be {hint.__name__}, got {type(value).__name__}")
    if hint is float and not math.isfinite(value):
        raise WireError(f"{cls.TYPE}.{name} must be finite, got {value}")


def decode(frames: list) -> tuple[Any, int]:
    """List of frames -> (message, request id). Raises WireError saying what is wrong."""
    msg, rid, _ = decode_with_run(frames)
    return msg, rid


def decode_with_run(frames: list) -> tuple[Any, int, str]:
    """decode, and the sender's run id from the header ("" when it sent none)."""
    if not frames:
        raise WireError("empty message")
    try:
        header = msgpack.unpackb(bytes(frames[0]), raw=False, strict_map_key=True)
    except Exception as e:  # msgpack raises a zoo of exception types on garbage
        raise WireError(f"header is not msgpack: {type(e).__name__}: {e}") from None
    if not isinstance(header, dict) or not {"type", "v", "rid", "body"} <= set(header):
        raise WireError("header must be a map with type, v, rid and body")
    run = header.get("run", "")
    if not isinstance(run, str) or len(run) > 100:
        raise WireError("header: run must be a short string")
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
    return cls(**values), rid, run


# ----------------------------------------------------------------------------- sockets

def is_loopback(addr: str) -> bool:
    host = addr.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    return addr.startswith(("ipc://", "inproc://")) or host in ("127.0.0.1", "localhost", "::1")


class Server:
    """A ROUTER socket with a dispatch table. Handlers are `handler(msg, peer) -> reply | None`."""

    def __init__(self, name: str, bind: str, *, max_message_bytes: int = MAX_MESSAGE_BYTES,
                 curve_key: str | None = None, curve_clients=None, run_id: str | None = None):
        """`curve_key`: this server's key pair file (default RLAX_CURVE_KEY). `curve_clients`: the
        allowed client public keys, as `load_client_keys` takes them (default RLAX_CURVE_CLIENTS,
        else the server's own public key: the shared-pair setup). `run_id`: the run this server
        belongs to (default RLAX_RUN_ID, which launch.sh sets for every role): a message that names
        another run is refused (a client that names none, a tool or a test, is served)."""
        self.name, self.bind_addr, self.instance = name, bind, os.urandom(6).hex()
        self.run_id = os.environ.get("RLAX_RUN_ID", "") if run_id is None else run_id
        self.other_runs = 0  # messages refused because they named another run
        self.handlers: dict[type, Callable] = {Ping: lambda m, p: Pong(self.name, self.instance)}
        self.ctx = zmq.Context.instance()
        self.bad_messages = 0
        self.bytes_sent = 0
        self.client_key = ""  # the CURVE public key (Z85) of the client whose message is being handled
        self.public_key = ""  # this server's own (Z85): clients of the shared-pair setup hold it too
        self._zap, self._zap_domain = None, f"rlax-{name}-{self.instance}".encode()
        curve_key = curve_key or curve_keys_from_env()
        if curve_clients is None:
            curve_clients = os.environ.get("RLAX_CURVE_CLIENTS") or None
        if curve_key:
            secret, public = load_key(curve_key, secret=True), load_key(curve_key, secret=False)
            self.public_key = public.decode()
            allowed = load_client_keys(curve_clients) if curve_clients is not None else {public}
            self._zap = ZapHandler.of(self.ctx)  # before the socket exists: no handshake goes unchecked
            self._zap.allow(self._zap_domain, name, allowed)
        elif curve_clients is not None:
            raise ValueError(f"{name}: a client allowlist (curve_clients / RLAX_CURVE_CLIENTS) needs the "
                             "server's own CURVE key pair (curve_key / RLAX_CURVE_KEY)")
        elif not is_loopback(bind):
            raise ValueError(f"{name}: refusing to bind {bind} without CURVE keys; "
                             "create them with `python curve.py keygen DIR` and set RLAX_CURVE_KEY")
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)  # bigger: peer is dropped by zmq
        self.sock.setsockopt(zmq.LINGER, 0)
        if curve_key:
            self.sock.curve_secretkey, self.sock.curve_publickey = secret, public
            self.sock.curve_server = True
            self.sock.zap_domain = self._zap_domain
            try:  # no reachable ZAP handler = refuse, not admit everyone (libzmq's default)
                self.sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
            except (AttributeError, zmq.ZMQError):
                pass
        self.sock.bind(bind)

    @property
    def refused_clients(self) -> int:
        """CURVE handshakes refused because the client's key is not on the allowlist."""
        return self._zap.refused.get(self._zap_domain, 0) if self._zap else 0

    def on(self, cls, handler) -> None:
        self.handlers[cls] = handler

    def reply(self, peer, msg) -> None:
        identity, rid = peer
        frames = encode(msg, rid)
        self.bytes_sent += sum(len(f) for f in frames)  # what this socket sent: weight broadcast tests
        self.sock.send_multipart([identity] + frames, copy=False)

    def handle(self, frames: list) -> None:
        identity, payload = frames[0], frames[1:]
        self.client_key = ""
        if self._zap is not None:  # the ZAP handler names each CURVE client by its key (its User-Id)
            try:
                self.client_key = frames[-1].get("User-Id") or ""
            except (AttributeError, zmq.ZMQError):
                pass
        try:
            msg, rid, run = decode_with_run(payload)
        except Exception as e:  # WireError, and whatever else garbage provokes: never die of it
            self.bad_messages += 1
            self.reply((identity, 0), Error(f"{self.name}: malformed message: {type(e).__name__}: {e}"[:1000]))
            return
        if run and self.run_id and run != self.run_id and not isinstance(msg, Ping):
            self.other_runs += 1
            self.reply((identity, rid), Error(
                f"{self.name} at {self.bind_addr} belongs to run {self.run_id}, not to run {run}: two runs "
                f"share this address; give each run its own ports (launch.sh: PORT=..., or leave PORT unset "
                f"to have free ones picked)"))
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
        if self._zap is not None:
            self._zap.forget(self._zap_domain)


class Client:
    """A DEALER socket: `call` sends one request and waits for its reply with a timeout (pinging the
    server meanwhile, if asked); `pipeline` keeps several in flight. `send`, `receive` and `reconnect`
    are the parts they are made of (verifier_client.VerifierFleet waits with them, its deadline set by
    the verifier's pongs)."""

    def __init__(self, name: str, addr: str, *, timeout_s: float = 30.0, curve_key: str | None = None,
                 curve_server_key: str | None = None, run_id: str | None = None):
        """`curve_key`: this client's key pair file (default RLAX_CURVE_KEY). `curve_server_key`: a
        file holding the server's public key, .pub or pair (default RLAX_CURVE_SERVER_KEY, else the
        public key of `curve_key`: the shared-pair setup). `run_id`: the run this client belongs to
        (default RLAX_RUN_ID), named in every request so that a server of another run refuses it."""
        self.name, self.addr, self.timeout_s = name, addr, timeout_s
        self.run_id = os.environ.get("RLAX_RUN_ID", "") if run_id is None else run_id
        self.curve_key = curve_key or curve_keys_from_env()
        self.curve_server_key = curve_server_key or os.environ.get("RLAX_CURVE_SERVER_KEY") or None
        self._keys = None
        if self.curve_key:
            public = load_key(self.curve_key, secret=False)
            server = load_public_key(self.curve_server_key) if self.curve_server_key else public
            self._keys = (server, public, load_key(self.curve_key, secret=True))
        elif self.curve_server_key:
            raise ValueError(f"{name}: a server key (curve_server_key / RLAX_CURVE_SERVER_KEY) needs the "
                             "client's own CURVE key pair (curve_key / RLAX_CURVE_KEY)")
        self._rids = itertools.count(1)
        self.sock = None
        self.reconnect()

    def reconnect(self) -> None:
        """A fresh socket to addr: a server that restarted is found again, and no reply to a request
        sent before this is ever read (it went to the old socket)."""
        if self.sock is not None:
            self.sock.close(0)
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        if self._keys:
            self.sock.curve_serverkey, self.sock.curve_publickey, self.sock.curve_secretkey = self._keys
        self.sock.connect(self.addr)

    def send(self, msg) -> int:
        """Send `msg` as a request without waiting; returns its request id, which its reply carries."""
        rid = next(self._rids)
        self.sock.send_multipart(encode(msg, rid, self.run_id), copy=False)
        return rid

    def receive(self, timeout_s: float):
        """(reply, request id) of the next reply to come, or None if none came within timeout_s. An
        Error with request id 0 is the server's answer to a message it could not read at all."""
        if not self.sock.poll(max(1, int(timeout_s * 1000) + 1)):
            return None
        return decode(self.sock.recv_multipart(copy=False))

    def call(self, msg, timeout_s: float | None = None, what: str | None = None, ping_s: float | None = None):
        """Send `msg`, return the reply. Raises TimeoutError naming what was awaited and from where,
        RemoteError if the server answered with an Error. With `ping_s` (> 0), the same socket pings the
        server every ping_s while the reply is outstanding: a Server answers pings from its serving
        loop at once, even while a deferred request runs, so a pong missing for 2 x ping_s means the
        process is gone or hung, and the call gives up then rather than after timeout_s."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        rid, start = self.send(msg), time.monotonic()
        deadline, why = start + timeout_s, f"within {timeout_s:.1f}s"
        next_ping, ping_rid, pong_due = start + ping_s if ping_s else math.inf, None, math.inf
        while (now := time.monotonic()) < deadline:
            if now > pong_due:
                why = f"and no pong within {2 * ping_s:.1f}s after {now - start:.1f}s"
                break
            if now >= next_ping:
                ping_rid, pong_due, next_ping = self.send(Ping()), now + 2 * ping_s, math.inf
            if (got := self.receive(min(deadline, pong_due, next_ping) - now)) is None:
                continue
            reply, reply_rid = got
            if isinstance(reply, Error) and reply_rid in (rid, 0):
                raise RemoteError(reply.error)
            if reply_rid == rid:
                return reply
            if reply_rid == ping_rid:
                ping_rid, pong_due, next_ping = None, math.inf, time.monotonic() + ping_s
            # else: a late reply to an earlier, timed-out request; drop it.
        raise self._timed_out(msg, what, why)

    def _timed_out(self, msg, what: str | None, why: str) -> TimeoutError:
        """The error of a request given up on. Reconnects first, so a server that restarted is found
        again and a late reply to the abandoned request is never read (it goes to the old socket)."""
        self.reconnect()
        return TimeoutError(f"{self.name}: no reply to {msg.TYPE} ({what or 'request'}) from {self.addr} {why}")

    def pipeline(self, msgs, window: int, timeout_s: float | None = None, what: str | None = None):
        """Send the messages of the iterable `msgs` keeping up to `window` requests in flight, and yield
        their replies in the order of `msgs` (a server may answer out of order: replies are matched by
        request id). Each request has timeout_s from its sending. Raises RemoteError on the first Error
        reply and TimeoutError like `call`; the replies still in flight are then dropped as stale by
        the next call, as `call` drops a late reply. window=1 is `call` in a loop."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        msgs, inflight, replies = iter(msgs), collections.OrderedDict(), {}

        def send_next() -> bool:
            msg = next(msgs, None)
            if msg is None:
                return False
            inflight[self.send(msg)] = (msg, time.monotonic() + timeout_s)
            return True
        while len(inflight) < window and send_next():
            pass
        while inflight:
            rid, (msg, deadline) = next(iter(inflight.items()))
            while rid not in replies:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._timed_out(msg, what, f"within {timeout_s:.1f}s")
                if (got := self.receive(left)) is not None:
                    reply, reply_rid = got
                    if isinstance(reply, Error) and reply_rid == 0:
                        raise RemoteError(reply.error)
                    if reply_rid in inflight:
                        replies[reply_rid] = reply
            reply = replies.pop(rid)
            del inflight[rid]
            if isinstance(reply, Error):
                raise RemoteError(reply.error)
            send_next()  # before handing the reply out: the server never waits on the consumer
            yield reply

    def close(self) -> None:
        self.sock.close(0)
