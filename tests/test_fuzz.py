"""Fuzz: hostile messages to the parameter server and the verifier service, both real processes.

Run: python -m pytest -q tests/test_fuzz.py      (about 40 s on a 2-core CPU)

From a seeded generator, each server gets a few hundred messages on a raw DEALER socket, one at a time:
random bytes, every wire message truncated at random points, valid msgpack with wrong types / missing /
unknown fields / deep or wide structures, array references to missing or wrong-sized frames, wrong
protocol versions and headers, many frames, schema-valid messages with absurd values (negative sizes,
NaN/inf floats, giant strings) and messages above ZeroMQ's MAXMSGSIZE. Every one must be answered
with an `error` (for the verifier: an error, or verdicts none of which passed), except messages above
MAXMSGSIZE, which ZeroMQ drops with the connection. After each category the process is still alive,
answers Ping, and its state is what it was: every message answered with an error or ignored, no
crash, no state change.
"""
import dataclasses
import math
import os
import signal
import subprocess
import sys
import typing

import msgpack
import numpy as np
import pytest
import zmq

import versions
import weights_zmq
import wire
from conftest import ROOT, free_port

SEED = 20261129
REPLY_TIMEOUT_S = 5.0      # a good server answers a bad message in milliseconds
DROP_TIMEOUT_S = 1.0       # how long we wait to see that an oversized message got no reply
VERIFIER_REQUEST_MB = 1    # verifier.py --max-request-mb: its MAXMSGSIZE is 4x this (4 MiB)
# The parameter server's MAXMSGSIZE is wire.MAX_MESSAGE_BYTES (1 GiB) and has no flag; messages above
# it would need > 1 GiB buffers here, so the parameter server gets the largest message we can afford
# (64 MiB, under its limit: it must be decoded and refused) and the verifier the truly oversized ones.
PS_BIG_BYTES = 64 << 20

GOOD_JOB = {"kind": "assert", "program": "def f(x):\n    return x * 2\n",
            "tests": "assert f(21) == 42\n"}
WRONG_JOB = {**GOOD_JOB, "program": "def f(x):\n    return x + 2\n"}

NOT_INT = [None, True, 1.5, math.nan, math.inf, "7", b"7", [], [7], {}, {"a": 7}]
NOT_FLOAT = [None, "0.5", b"\x00", [], [0.5], {}, {"wait": 1.0}]
NOT_STR = [None, True, 0, -1, 1.5, b"bytes", [], ["s"], {}, {"s": "s"}]
NOT_LIST = [None, True, 0, 1.5, "list", b"list", {}, {"0": 1}]
NOT_DICT = [None, True, 0, 1.5, "dict", b"dict", [], [["k", "v"]]]
NOT_BOOL = [None, 0, 1, 1.5, "true", [], {}]
WRONG_VALUES = {int: NOT_INT, float: NOT_FLOAT, str: NOT_STR, list: NOT_LIST, dict: NOT_DICT, bool: NOT_BOOL}
NON_FINITE = [math.nan, math.inf, -math.inf]


# ============================================================================ hostile message generators
# Each generator takes the seeded rng and yields (description, frames, expect), where expect is
#   "error"  the reply must be wire.Error (verifier: or verdicts none of which passed),
#   "any"    a schema-valid but absurd request: any well-formed reply, as long as nothing changes,
#   "drop"   above MAXMSGSIZE: an Error or no reply at all (ZeroMQ drops the peer).

def header(type_, body, v=wire.PROTOCOL_VERSION, rid=1, **extra) -> bytes:
    return msgpack.packb({"type": type_, "v": v, "rid": rid, "body": body, **extra}, use_bin_type=True)


def item(i: int, **kw) -> dict:
    return {"item_id": f"fuzz{i}", "prompt": f"p{i}", "group_size": 2, "seq_len": 8,
            "max_new_tokens": 4, "min_version": 0, **kw}


def rollout(item_id: str, G: int = 2, T: int = 8) -> dict:
    return {"item_id": item_id, "version": 0, "lineage": "", "worker": "w", "prompt_len": 3,
            "tokens_GT": np.ones((G, T), np.int32), "logp_behav_GT": np.zeros((G, T), np.float32),
            "mask_GT": np.ones((G, T), np.float32), "rewards_G": np.zeros(G, np.float32),
            "finished_G": np.ones(G, bool), "statuses": ["failed"] * G}


LINEAGE = "fuzz-lineage"


def tensors(version: int) -> list:
    return [("a.weight", np.full((4, 3), version, np.float32)), ("b.bias", np.arange(5, dtype=np.float32))]


def push_frames(push_id: str, version: int, manifest_change: dict | None = None) -> list:
    """A streamed push as raw messages: (frames, expect) for each chunk (16 bytes), then the commit
    with `manifest_change` applied to its manifest (expected to be refused when there is one)."""
    out, chunks = [], []
    pieces, entries = versions.cut_all(tensors(version), 16)
    for data, _ in pieces:
        out.append(([bytes(f) for f in wire.encode(wire.PushChunk(push_id, len(chunks), data, versions.crc32(data)))],
                    "any"))
        chunks.append([int(data.size), versions.crc32(data)])
    manifest = {**versions.Manifest(version, LINEAGE, entries, chunks).to_dict(), **(manifest_change or {})}
    out.append(([header("push_commit", {"push_id": push_id, "manifest": manifest})], "error"))
    return out


def sample(cls):
    """A plausible instance of any registered message (richer ones for messages that carry arrays), so
    the fuzz follows the wire as messages and fields are added."""
    rich = {"push_chunk": lambda: wire.PushChunk("fuzz", 1, np.zeros(4, np.uint8), 0),
            "chunk": lambda: wire.Chunk(1, 0, np.zeros(4, np.uint8), 0),
            "submit_rollout": lambda: wire.SubmitRollout(
                "w", "nope", "lease", rollout("nope")),
            "enqueue_work": lambda: wire.EnqueueWork([item(0)]),
            "verify_batch": lambda: wire.VerifyBatch([GOOD_JOB]),
            "rollouts": lambda: wire.Rollouts([rollout("x")])}
    if cls.TYPE in rich:
        return rich[cls.TYPE]()
    plain = {int: 1, float: 0.5, str: "s", list: [], dict: {}, bool: False}
    hints = typing.get_type_hints(cls)
    kwargs = {f.name: plain.get(hints[f.name], None) for f in dataclasses.fields(cls)
              if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    return cls(**kwargs)


def random_bytes(rng):
    for _ in range(40):
        frames = [rng.bytes(int(rng.integers(0, 2048))) for _ in range(int(rng.integers(1, 4)))]
        yield f"{len(frames)} random frames", frames, "error"
    # Random bytes after a valid-looking msgpack map prefix, and a few fixed nasties.
    for _ in range(10):
        yield "map prefix + junk", [b"\x84" + rng.bytes(int(rng.integers(0, 64)))], "error"
    for raw in (b"", b"\xc1", b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xff",
                b"\xc6\x7f\xff\xff\xff", b"\x91" * 100_000 + b"\x00"):
        yield f"raw {raw[:6]!r}", [raw], "error"


def truncated(rng, types):
    """Every message type encoded and cut: header at random points, array frames short or missing."""
    for name in types:
        frames = [bytes(f) for f in wire.encode(sample(wire.MESSAGES[name]), rid=7)]
        head = frames[0]
        for cut in sorted(set(rng.integers(0, len(head), size=6).tolist())):
            yield f"{name} header cut at {cut}/{len(head)}", [head[:cut]] + frames[1:], "error"
        for i in range(1, len(frames)):
            if len(frames[i]):
                cut = int(rng.integers(0, len(frames[i])))
                yield f"{name} frame {i} cut at {cut}", frames[:i] + [frames[i][:cut]] + frames[i + 1:], "error"
        if len(frames) > 1:
            yield f"{name} last frame missing", frames[:-1], "error"


def bad_headers(rng, served):
    """Valid msgpack, wrong envelope: versions, types, rids, bodies, missing keys."""
    name = served[0]
    body = {}
    for v in (0, 2, -1, 2**64 - 1, "1", None, [1], b"\x01"):
        yield f"protocol version {v!r}", [header(name, body, v=v)], "error"
    for t in (None, 0, b"ping", ["ping"], {"t": 1}, "", "PING", "ping ", "x" * 100_000,
              "".join(chr(int(c)) for c in rng.integers(0x20, 0x7e, 30))):
        yield f"type {str(t)[:20]!r}", [header(t, body)], "error"
    for rid in ("1", None, 1.5, [1], {"r": 1}, b"1"):
        yield f"rid {rid!r}", [header("ping", {}, rid=rid)], "error"
    for b in (None, 1, "body", [], [["k", "v"]], b"body"):
        yield f"body {b!r}", [header("ping", b)], "error"
    for missing in ("type", "v", "rid", "body"):
        h = {"type": "ping", "v": wire.PROTOCOL_VERSION, "rid": 1, "body": {}}
        del h[missing]
        yield f"header without {missing}", [msgpack.packb(h)], "error"
    for top in (None, 1, "ping", [], ["ping", 1, 1, {}], b"ping"):
        yield f"header {top!r}", [msgpack.packb(top)], "error"
    yield "map with int keys", [b"\x81\x01\x02"], "error"
    yield "ext type in body", [header("ping", {"x": msgpack.ExtType(5, b"abc")})], "error"
    for name in sorted(set(wire.MESSAGES) - set(served)):  # replies, other servers' messages
        yield f"unserved type {name}", [bytes(f) for f in wire.encode(sample(wire.MESSAGES[name]), rid=3)], "error"


def bad_fields(rng, types):
    """Every field of every served message given values of the wrong type; fields missing; unknown ones."""
    for name in types:
        cls = wire.MESSAGES[name]
        arrays: list = []
        good = {f.name: wire._pack_value(getattr(sample(cls), f.name), arrays) for f in dataclasses.fields(cls)}
        frames = [bytes(memoryview(a.reshape(-1).view(np.uint8))) for a in arrays]
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            pool = WRONG_VALUES.get(hints[f.name], [])
            for k in rng.choice(len(pool), size=min(4, len(pool)), replace=False) if pool else []:
                yield (f"{name}.{f.name} = {pool[k]!r}"[:80], [header(name, {**good, f.name: pool[k]})] + frames,
                       "error")
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            if required:
                yield f"{name} without {f.name}", [header(name, {k: v for k, v in good.items() if k != f.name})] \
                    + frames, "error"
        yield f"{name} with unknown field", [header(name, {**good, "evil": 1})] + frames, "error"
        yield f"{name} with bytes key", [header(name, {**good, b"evil": 1})] + frames, "error"


def deep_header(name: str, fname: str, depth: int) -> bytes:
    """A `name` message whose list field `fname` is a list nested `depth` deep, assembled by hand
    (msgpack.packb refuses input that deep; msgpack's unpacker accepts up to 1024 levels)."""
    return header(name, {fname: []})[:-1] + b"\x91" * depth + b"\x00"   # replace the empty list 0x90


def wide_structures(rng, list_field):
    """Big structures in a list-typed field: moderately deep, wide lists, big maps, big strings."""
    name, fname = list_field
    for depth in (10, 100, 300):
        yield f"{name}.{fname} nested {depth} deep", [deep_header(name, fname, depth)], "error"
    yield f"{name}.{fname} 200k ints", [header(name, {fname: list(range(200_000))})], "error"
    yield f"{name}.{fname} 50k empty maps", [header(name, {fname: [{}] * 50_000})], "error"
    yield f"{name}.{fname} map with 50k keys", [header(name, {fname: [{str(i): i for i in range(50_000)}]})], "error"
    yield f"{name}.{fname} 2 MiB string", [header(name, {fname: ["x" * (2 << 20)]})], "error"


def deep_nesting(rng, list_field):
    """Nesting close to msgpack's own limit (1024): deeper than Python's recursion limit in a decoder."""
    name, fname = list_field
    for depth in (900, 1000, 1020):
        yield f"{name}.{fname} nested {depth} deep", [deep_header(name, fname, depth)], "error"


ARRAY_REF = {"__nd__": 0, "dtype": "float32", "shape": [2, 3]}
ARRAY_FRAME = np.zeros((2, 3), np.float32).tobytes()


def bad_array_refs(rng, name, field, wrap):
    """Array references (the {"__nd__": i, ...} maps) pointing at missing or wrong-sized frames, with bad
    dtypes, indices and missing keys. `wrap(ref)` builds the message body around one reference."""
    ok, frame = ARRAY_REF, ARRAY_FRAME
    cases = [
        ("frame index past the end", {**ok, "__nd__": 5}, [frame]),
        ("no frames at all", ok, []),
        ("negative frame index", {**ok, "__nd__": -1}, [frame]),
        ("index a string", {**ok, "__nd__": "0"}, [frame]),
        ("index a list", {**ok, "__nd__": [0]}, [frame]),
        ("index None", {**ok, "__nd__": None}, [frame]),
        ("frame one byte short", ok, [frame[:-1]]),
        ("frame one byte long", ok, [frame + b"\x00"]),
        ("empty frame", ok, [b""]),
        ("unknown dtype", {**ok, "dtype": "object"}, [frame]),
        ("dtype a list", {**ok, "dtype": ["float32"]}, [frame]),
        ("dtype missing", {"__nd__": 0, "shape": [2, 3]}, [frame]),
        ("shape missing", {"__nd__": 0, "dtype": "float32"}, [frame]),
        ("shape an int", {**ok, "shape": 6}, [frame]),
        ("shape None", {**ok, "shape": None}, [frame]),
        ("shape giant", {**ok, "shape": [2**63 - 1]}, [frame]),
        ("shape of 1000 dims", {**ok, "shape": [1] * 1000}, [frame]),
    ]
    for what, ref, frames in cases:
        yield f"{name}.{field}: {what}", [header(name, wrap(ref))] + frames, "error"
    for _ in range(20):  # random references with well-typed shapes
        ref = {"__nd__": int(rng.integers(0, 4)), "dtype": str(rng.choice(["float32", "int8", "bfloat16", "x"])),
               "shape": rng.integers(0, 5, size=int(rng.integers(0, 4))).tolist()}
        frames = [rng.bytes(int(rng.integers(0, 40))) for _ in range(int(rng.integers(0, 3)))]
        yield f"{name}.{field}: random {ref}", [header(name, wrap(ref))] + frames, "error"


def bad_array_shapes(rng, name, field, wrap):
    """Array references whose shape is not a list of small non-negative ints, sized so that the byte
    count check alone does not catch them."""
    ok, frame = ARRAY_REF, ARRAY_FRAME
    cases = [
        ("shape of strings", {**ok, "shape": ["2", "3"]}, [frame]),
        ("shape of floats", {**ok, "shape": [2.0, 3.5]}, [frame]),
        ("shape nested", {**ok, "shape": [[2, 3]]}, [frame]),
        ("negative sizes", {**ok, "shape": [-2, -3]}, [frame]),
        ("negative size -1", {**ok, "shape": [-1, 6]}, [np.zeros(36, np.float32).tobytes()]),
        ("int64-overflowing shape", {**ok, "shape": [2**62, 4]}, [b""]),
        ("shape overflowing to 0", {**ok, "shape": [2**32, 2**32]}, [b""]),
    ]
    for what, ref, frames in cases:
        yield f"{name}.{field}: {what}", [header(name, wrap(ref))] + frames, "error"


def many_frames(rng, name):
    for n in (2, 100, 10_000):
        yield f"garbage header + {n} frames", [b"\xc1"] + [b"x"] * n, "error"
    yield f"bad {name} + 1000 frames of 1 KiB", [header(name, {"evil": 1})] + [rng.bytes(1024)] * 1000, "error"


def oversized_verifier(rng):
    limit = 4 * VERIFIER_REQUEST_MB << 20
    big = np.zeros(limit + 1, np.uint8)   # zero pages: costs no memory until written
    yield "one frame 1 byte above MAXMSGSIZE", [header("verify_batch", {"jobs": []}), big], "drop"
    yield "header frame above MAXMSGSIZE", [b"\x00" * (limit + 1)], "drop"
    yield "twice MAXMSGSIZE", [np.zeros(2 * limit, np.uint8)], "drop"
    # Under MAXMSGSIZE but over --max-request-mb: decoded, then refused by the service.
    job = {**GOOD_JOB, "tests": "#" * ((VERIFIER_REQUEST_MB << 20) + 1)}
    yield "batch above max_request_mb", [header("verify_batch", {"jobs": [job]})], "error"
    yield "program above 1 MiB", [header("verify_batch", {"jobs": [{**GOOD_JOB, "program": "#" * (1 << 20) + "1"}]})], \
        "error"
    # Many frames whose total is above the limit, each under it.
    yield "5 frames of 1 MiB", [b"\xc1"] + [np.zeros(1 << 20, np.uint8)] * 5, "error"


def oversized_ps(rng):
    yield f"{PS_BIG_BYTES >> 20} MiB of zeros", [np.zeros(PS_BIG_BYTES, np.uint8)], "error"
    yield f"{PS_BIG_BYTES >> 20} MiB in a push's array frame", \
        [header("push_chunk", {"push_id": "big", "index": 0, "crc": 0,
                               "data": {"__nd__": 0, "dtype": "uint8", "shape": [PS_BIG_BYTES]}}),
         np.zeros(PS_BIG_BYTES, np.uint8)], "error"
    yield "32 MiB worker name", [header("lease_work", {"worker": "w" * (32 << 20), "max_items": 0})], "error"


def absurd_ps(rng, lineage):
    """Schema-valid parameter-server requests whose values make no sense."""
    for max_items in (0, -1, -2**63):
        yield f"lease max_items {max_items}", [header("lease_work", {"worker": "w", "max_items": max_items})], "error"
        yield f"get_rollouts max_items {max_items}", [header("get_rollouts", {"max_items": max_items})], "error"
    for lease_s in (0.0, -1.0, 1e308, *NON_FINITE):
        yield f"lease_s {lease_s}", [header("lease_work", {"worker": "w", "lease_s": lease_s})], "error"
    # Giant but meaningful sizes: nothing to hand out, so an empty answer (or an error) and no change.
    yield "lease 2^63-1 items", [header("lease_work", {"worker": "w", "max_items": 2**63 - 1})], "any"
    yield "get_rollouts 2^63-1", [header("get_rollouts", {"max_items": 2**63 - 1})], "any"
    yield "get_weights have_version 2^64-1", [header("get_weights", {"have_version": 2**64 - 1})], "any"
    for bad in ({"group_size": 0}, {"group_size": -5}, {"max_new_tokens": 0}, {"seq_len": 1},
                {"seq_len": -2**63}, {"item_id": 5}, {"prompt": None}, {"group_size": 1.5}, {"group_size": True}):
        yield f"enqueue item {bad}", [header("enqueue_work", {"items": [item(900, **bad)]})], "error"
    yield "enqueue 5000 bad items", [header("enqueue_work", {"items": [{"item_id": "x"}] * 5000})], "error"
    # Weight pushes: good chunks, then a commit whose manifest is wrong (the push is discarded); bad
    # chunks; chunk requests for versions and indices that do not exist.
    good = push_frames("x", 5)[-1][0][0]
    entries = msgpack.unpackb(good)["body"]["manifest"]["tensors"]
    chunks = msgpack.unpackb(good)["body"]["manifest"]["chunks"]
    a, b = entries
    for what, change in (("tensor checksum off by one", {"tensors": [a[:3] + [a[3] ^ 1], b]}),
                         ("tensor checksum a string", {"tensors": [a[:3] + ["0"], b]}),
                         ("checksum 2^32", {"tensors": [a[:3] + [2**32], b]}),
                         ("duplicate names", {"tensors": [a, [a[0]] + b[1:]]}),
                         ("names not strings", {"tensors": [[1] + a[1:], b]}),
                         ("unknown dtype", {"tensors": [[a[0], "object"] + a[2:], b]}),
                         ("negative shape", {"tensors": [[a[0], a[1], [-4, -3], a[3]], b]}),
                         ("shape too big", {"tensors": [[a[0], a[1], [4, 4], a[3]], b]}),
                         ("no tensors", {"tensors": []}),
                         ("one chunk short", {"chunks": chunks[:-1]}),
                         ("chunk checksum off", {"chunks": [[chunks[0][0], chunks[0][1] ^ 1]] + chunks[1:]}),
                         ("negative version", {"version": -1}),
                         ("version a float", {"version": 5.0}),
                         ("unknown field", {"evil": 1})):
        for frames, expect in push_frames(f"absurd {what}", 5, change):
            yield f"push {what}", frames, expect
    data = np.arange(16, dtype=np.uint8)
    chunk = lambda **kw: [bytes(f) for f in wire.encode(wire.PushChunk(**{  # noqa: E731
        "push_id": "c", "index": 0, "data": data, "crc": versions.crc32(data), **kw}))]
    yield "push_chunk wrong crc", chunk(crc=versions.crc32(data) ^ 1), "error"
    yield "push_chunk crc 2^40", chunk(crc=2**40), "error"
    yield "push_chunk of float32", chunk(data=np.zeros(4, np.float32)), "error"
    yield "push_chunk of 2-D bytes", chunk(data=np.zeros((2, 2), np.uint8)), "error"
    yield "push_chunk empty", chunk(data=np.zeros(0, np.uint8), crc=0), "error"
    yield "push_chunk index 7 of no push", chunk(index=7), "error"
    yield "push_chunk index -1", chunk(index=-1), "error"
    yield "push_commit of no push", [header("push_commit", {"push_id": "nope", "manifest": {}})], "error"
    for version, lin_, index in ((99, LINEAGE, 0), (3, "other", 0), (3, LINEAGE, -1), (3, LINEAGE, 10**6),
                                 (-1, LINEAGE, 0), (2**63 - 1, LINEAGE, 2**63 - 1)):
        yield f"get_chunk v{version} {lin_} #{index}", [header("get_chunk", {"version": version, "lineage": lin_,
                                                                            "index": index})], "error"
    # Rollouts that do not match their schema (and an item nobody leased).
    good = rollout("fuzz-leased-0")
    for what, change in (("tokens float", {"tokens_GT": np.ones((2, 8), np.float32)}),
                         ("tokens 1-D", {"tokens_GT": np.ones(8, np.int32)}),
                         ("tokens empty", {"tokens_GT": np.ones((0, 8), np.int32)}),
                         ("logp wrong shape", {"logp_behav_GT": np.zeros((2, 7), np.float32)}),
                         ("rewards inf", {"rewards_G": np.array([np.inf, 0], np.float32)}),
                         ("rewards NaN", {"rewards_G": np.array([np.nan, 0], np.float32)}),
                         ("prompt_len 0", {"prompt_len": 0}), ("prompt_len = T", {"prompt_len": 8}),
                         ("prompt_len -1", {"prompt_len": -1}), ("no tokens", {"tokens_GT": None}),
                         ("item_id mismatch", {"item_id": "other"})):
        roll = {k: v for k, v in {**good, **change}.items() if v is not None}
        frames_r: list = []
        body = {"worker": "w", "item_id": "fuzz-leased-0", "lease": "forged",
                "rollout": wire._pack_value(roll, frames_r)}
        yield f"submit {what}", [header("submit_rollout", body)] + [a.tobytes() for a in frames_r], "error"


def non_finite_waits(rng):
    """Long polls with a NaN or infinite wait. The queue is empty and nothing is finished (see ps_seed),
    so these can only wait: a NaN deadline never passes, an infinite one is cut to 600 s."""
    for wait_s in NON_FINITE:
        yield f"lease wait_s {wait_s}", [header("lease_work", {"worker": "w", "wait_s": wait_s})], "error"
        yield f"get_rollouts wait_s {wait_s}", [header("get_rollouts", {"max_items": 1, "wait_s": wait_s})], "error"
        yield f"get_weights wait_s {wait_s}", [header("get_weights", {"min_version": 2**62, "wait_s": wait_s})], \
            "error"


def partial_enqueue(rng):
    """Atomicity: an EnqueueWork refused for one bad item must not have let the good ones before it in."""
    for bad in ({"group_size": 0}, {"item_id": 5}, {"seq_len": 1}):
        yield f"enqueue good + bad {bad}", [header("enqueue_work", {"items": [item(901), item(902, **bad)]})], "error"


def negative_versions(rng, lineage):
    """Correctly checksummed weights under a version that cannot exist (-1 means "no weights")."""
    for version in (-1, -2**63):
        for frames, expect in push_frames(f"negative {version}", version):
            yield f"push version {version}", frames, expect


def absurd_verifier(rng):
    """Schema-valid VerifyBatch messages whose jobs are nonsense: each job must come back 'error'."""
    jobs = [None, 5, "job", [], {}, {"kind": "rm -rf"}, {"kind": "assert"}, {**GOOD_JOB, "program": 5},
            {**GOOD_JOB, "tests": None}, {**GOOD_JOB, "entry_point": "not an identifier!"},
            {**GOOD_JOB, "evil": 1}, {"kind": "io", "program": "print(1)", "cases": []},
            {"kind": "io", "program": "print(1)", "cases": [["1"]]},
            {"kind": "io", "program": "print(1)", "cases": [[1, 2]]},
            {"kind": "io", "program": "print(1)", "cases": [["", "1"]], "partial_reward": "yes"}]
    for limit, values in (("timeout_s", [0, -1, 1e9, *NON_FINITE, "5", None]),
                          ("memory_mb", [0, -1, 2**62, 1.5, True]),
                          ("max_procs", [0, -5, 2**40]), ("max_output_kb", [0, 2**62]),
                          ("max_open_files", [-1]), ("max_file_mb", [-1, 2**63 - 1])):
        jobs += [{**GOOD_JOB, limit: v} for v in values]
    for job in jobs:
        yield f"job {job!r}"[:90], [header("verify_batch", {"jobs": [job]})], "error"
    yield "all bad jobs in one batch", [header("verify_batch", {"jobs": jobs})], "error"
    yield "5000 jobs (above max_jobs)", [header("verify_batch", {"jobs": [None] * 5000})], "error"
    # Programs that are strings but hostile to the executor itself: verdicts, none passed.
    for program in ("\x00", "x = '\\udcff'", "def f(x):\n" + "  " * 10_000 + "return 1",
                    "(" * 10_000):
        yield f"program {program[:20]!r}", [header("verify_batch", {"jobs": [{**GOOD_JOB, "program": program}]})], \
            "error"


# ============================================================================ servers under test


class Target:
    """One server process on loopback, started afresh (new port, new state dir) when the last category
    killed it or left it mishandling, so one bug does not hide the next; a raw DEALER per hostile
    message and a wire.Client for state checks."""

    def __init__(self, tmp, name, args, seed_state, state):
        self.tmp, self.name, self.args = tmp, name, args
        self.seed_state, self.state = seed_state, state
        self.proc, self.starts, self.clean = None, 0, False

    def ensure(self):
        if self.proc is not None and self.proc.poll() is None and self.clean:
            return
        self.stop()
        self.starts += 1
        self.addr = f"tcp://127.0.0.1:{free_port()}"
        self.log_path = os.path.join(self.tmp, f"{self.name}.{self.starts}.log")
        with open(self.log_path, "ab") as log:
            args = [a.replace("{start}", str(self.starts)) for a in self.args]
            self.proc = subprocess.Popen([sys.executable, *args, "--bind", self.addr], cwd=ROOT, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self.client = wire.Client("fuzz-check", self.addr, timeout_s=30)
        self.client.call(wire.Ping(), timeout_s=60, what=f"{self.name} start")
        self.seed_state(self)
        self.clean = True

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()[-3000:]

    def send(self, frames, expect):
        """Send one hostile message on a fresh DEALER; return None if the outcome is acceptable, else why."""
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.addr)
        try:
            sock.send_multipart(frames, copy=False)
            timeout = DROP_TIMEOUT_S if expect == "drop" else REPLY_TIMEOUT_S
            if not sock.poll(int(timeout * 1000)):
                if expect == "drop":
                    return None
                alive = "alive" if self.proc.poll() is None else f"DEAD (exit {self.proc.returncode})"
                return f"no reply within {timeout}s; server {alive}"
            try:
                reply, _ = wire.decode(sock.recv_multipart())
            except wire.WireError as e:
                return f"reply does not decode: {e}"
            if isinstance(reply, wire.Error):
                return None if reply.error else "empty error text"
            if isinstance(reply, wire.Verdicts) and expect == "error":
                passed = [v for v in reply.verdicts if v.get("passed") or v.get("reward")]
                return f"a hostile job passed: {passed}" if passed else None
            return None if expect == "any" else f"answered {type(reply).__name__}, not an error"
        finally:
            sock.close(0)

    def stop(self):
        if self.proc is not None:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
            self.client.close()
            self.proc = None


def lineage_of_wire():
    return LINEAGE


def ps_seed(target):
    """Weights at version 3, three items leased for an hour, nothing queued or finished: hostile requests
    can only change state by a bug, and long polls (lease, rollouts) can only wait."""
    c = target.client
    for v in (1, 2, 3):
        weights_zmq.push_weights(c, v, LINEAGE, tensors(v), chunk_bytes=16)
    c.call(wire.EnqueueWork([item(i) for i in range(3)]))
    assert len(c.call(wire.LeaseWork("holder", max_items=3, lease_s=3600)).items) == 3


def ps_state(target):
    """The counters the issue names, and the served weights' version and bytes."""
    stats = target.client.call(wire.GetStats()).info
    w = versions.Manifest.from_dict(target.client.call(wire.GetWeights()).manifest)
    chunks = [target.client.call(wire.GetChunk(w.version, w.lineage, i)).data.tobytes() for i in range(len(w.chunks))]
    return ({k: stats.get(k, 0) for k in ("queued", "leased", "finished", "version", "submitted", "enqueued",
                                       "delivered", "instance")}, w.version, chunks)


def verifier_seed(target):
    """The verifier holds no state to set up."""


def verifier_state(target):
    """What must survive in a stateless verifier is its judgement: right passes, wrong fails."""
    import verifier_client
    client = verifier_client.VerifierFleet("fuzz", [target.addr], timeout_s=60)
    try:
        return [(v.status, v.passed) for v in client.verify([GOOD_JOB, WRONG_JOB])]
    finally:
        client.close()


@pytest.fixture(scope="module")
def param_server(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("fuzz_ps"))
    target = Target(tmp, "param_server", ["param_server.py", "--state-dir", os.path.join(tmp, "state{start}")],
                    ps_seed, ps_state)
    yield target
    target.stop()


@pytest.fixture(scope="module")
def verifier_service(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("fuzz_verifier"))
    target = Target(tmp, "verifier", ["verifier.py", "--executors", "1",
                                      "--max-request-mb", str(VERIFIER_REQUEST_MB)], verifier_seed, verifier_state)
    yield target
    target.stop()


PS_TYPES = ["ping", "push_chunk", "push_commit", "get_weights", "get_chunk", "enqueue_work", "hello", "lease_work", "renew_leases",
            "submit_rollout", "get_rollouts", "get_stats"]
PUSH_ONE = lambda ref: {"push_id": "refs", "index": 0, "data": ref, "crc": 0}  # noqa: E731
JOB_REF = lambda ref: {"jobs": [ref]}  # noqa: E731
PS_CATEGORIES = {
    "random_bytes": lambda rng: random_bytes(rng),
    "truncated": lambda rng: truncated(rng, sorted(wire.MESSAGES)),
    "bad_headers": lambda rng: bad_headers(rng, PS_TYPES),
    "bad_fields": lambda rng: bad_fields(rng, PS_TYPES),
    "wide_structures": lambda rng: wide_structures(rng, ("enqueue_work", "items")),
    "bad_array_refs": lambda rng: bad_array_refs(rng, "push_chunk", "data", PUSH_ONE),
    "many_frames": lambda rng: many_frames(rng, "get_stats"),
    "absurd_values": lambda rng: absurd_ps(rng, lineage_of_wire()),
    "oversized": lambda rng: oversized_ps(rng),
    "deep_nesting": lambda rng: deep_nesting(rng, ("enqueue_work", "items")),
    "bad_array_shapes": lambda rng: bad_array_shapes(rng, "push_chunk", "data", PUSH_ONE),
    "non_finite_waits": lambda rng: non_finite_waits(rng),
    "negative_versions": lambda rng: negative_versions(rng, lineage_of_wire()),
    "partial_enqueue": lambda rng: partial_enqueue(rng),
}
VERIFIER_CATEGORIES = {
    "random_bytes": lambda rng: random_bytes(rng),
    "truncated": lambda rng: truncated(rng, sorted(wire.MESSAGES)),
    "bad_headers": lambda rng: bad_headers(rng, ["ping", "verify_batch"]),
    "bad_fields": lambda rng: bad_fields(rng, ["ping", "verify_batch"]),
    "wide_structures": lambda rng: wide_structures(rng, ("verify_batch", "jobs")),
    "bad_array_refs": lambda rng: bad_array_refs(rng, "verify_batch", "jobs", JOB_REF),
    "many_frames": lambda rng: many_frames(rng, "verify_batch"),
    "absurd_values": lambda rng: absurd_verifier(rng),
    "oversized": lambda rng: oversized_verifier(rng),
    "deep_nesting": lambda rng: deep_nesting(rng, ("verify_batch", "jobs")),
    "bad_array_shapes": lambda rng: bad_array_shapes(rng, "verify_batch", "jobs", JOB_REF),
}


def fuzz(target, category, generator):
    """Send every message of one category; fail with the list of those mishandled."""
    target.ensure()
    before = target.state(target)
    rng = np.random.default_rng([SEED, sum(map(ord, category))])
    failures, sent = [], 0
    target.clean = False  # until this category has passed every check
    for what, frames, expect in generator(rng):
        sent += 1
        if (why := target.send(frames, expect)) is not None:
            failures.append(f"{what}: {why}")
            if target.proc.poll() is not None:
                break  # dead: the rest would only repeat "no reply"
    assert target.proc.poll() is None, (f"{target.name} died during {category} after {sent} messages "
                                        f"(first failures: {failures[:3]}); log:\n{target.log()}")
    assert not failures, f"{len(failures)}/{sent} {category} messages mishandled:\n" + "\n".join(failures[:15])
    assert isinstance(target.client.call(wire.Ping(), timeout_s=10), wire.Pong)
    assert target.state(target) == before, f"{category} changed {target.name}'s state"
    assert sent >= 2
    target.clean = True


@pytest.mark.parametrize("category", list(PS_CATEGORIES))
def test_param_server_survives(param_server, category):
    fuzz(param_server, category, PS_CATEGORIES[category])


@pytest.mark.parametrize("category", list(VERIFIER_CATEGORIES))
def test_verifier_survives(verifier_service, category):
    fuzz(verifier_service, category, VERIFIER_CATEGORIES[category])
    assert verifier_state(verifier_service) == [("passed", True), ("failed", False)]
