"""The judge of the verifier: the values that cross the boundary, the candidate's code and the judge's.

Three parts, each opened by a divider that says which process runs it:
  values across the boundary  both sides: the codec (to_plain, from_bytes, frames) every message
                              between candidate and judge goes through; each side decodes into
                              builtin types only, never the sender's classes.
  candidate side (untrusted)  runs in the candidate process, the program's own, after the program:
                              as untrusted as the program, which can patch or replace it
                              (candidate_main, io_candidate_main, _serve).
  judge side (trusted)        runs in the judge process, forked for one job and confined as a
                              candidate is: the tests, with the program's objects as handles
                              (judge_job, judge_main, Handle); it checks every message it gets.
Both processes are forked from the executor's launcher (sandbox.py), which imported this module
before it entered the sandbox. What the candidate runs imports no numpy and no zmq (standard
library and msgpack only: tests/test_verifier.py checks).
verifier.py's docstring explains why a verdict cannot be forged.
"""

import builtins
import importlib.util
import linecache
import os
import struct
import sys
import traceback
import types

import msgpack

from verdicts import INFRA_ERROR, BoundaryError

# ============================================================================ values across the boundary
# Arguments go judge -> candidate and results come back as msgpack bytes, decoded on the receiving
# side into builtin types (never the sender's classes); msgpack has no tuple/set/big-int/complex, so
# those travel as tagged ExtTypes. Plain data crosses by value; every other object stays where it
# was made and crosses as a handle (an id), see Handle.

_TUPLE, _SET, _FROZENSET, _BIGINT, _COMPLEX, _HANDLE = range(1, 7)
MAX_DEPTH = 100
MAX_RPC_BYTES = 64 << 20
HELLO_VALUE_NODES = 100_000  # a module-level value bigger than this (or 1 MiB) is exported as a handle
HELLO_VALUE_BYTES = 1 << 20


class _TooBig(Exception):
    """to_plain's node budget ran out."""


def to_plain(x, handle=None, depth: int = 0, budget: list | None = None):
    """Python value -> msgpack-able structure.

    Plain data (None, bool, int, float, str, bytes, complex, list, tuple, dict, set, frozenset)
    crosses by value, and an instance of a subclass of one of those is reduced to its builtin base
    (an int subclass whose __eq__ lies arrives as the plain int; an IntEnum member as its int; a
    Counter as a dict). A judge-side Handle crosses as its id. Any other object: `handle(x)` (the
    candidate's, which keeps the object and returns its handle), or BoundaryError where there is
    none (the judge's tests can send only plain data and handles). budget: [nodes left], _TooBig
    when spent.
    """
    if depth > MAX_DEPTH:
        raise BoundaryError(f"value nested deeper than {MAX_DEPTH}")
    if budget is not None:
        budget[0] -= 1
        if budget[0] < 0:
            raise _TooBig
    if x is None or isinstance(x, bool):
        return None if x is None else bool(x)
    if isinstance(x, int):
        x = int(x)
        return x if -(1 << 63) <= x < (1 << 64) else msgpack.ExtType(_BIGINT, format(x, "x").encode())
    if isinstance(x, float):
        return float(x)
    if isinstance(x, str):
        return str.__str__(x)
    if isinstance(x, (bytes, bytearray)):
        return bytes(x)
    if isinstance(x, complex):
        return msgpack.ExtType(_COMPLEX, struct.pack("<dd", x.real, x.imag))
    if isinstance(x, list):
        return [to_plain(v, handle, depth + 1, budget) for v in x]
    if isinstance(x, dict):
        return {to_plain(k, handle, depth + 1, budget): to_plain(v, handle, depth + 1, budget)
                for k, v in x.items()}
    for typ, code in ((tuple, _TUPLE), (frozenset, _FROZENSET), (set, _SET)):
        if isinstance(x, typ):
            return msgpack.ExtType(code, pack([to_plain(v, handle, depth + 1, budget) for v in x]))
    if isinstance(x, Handle):
        return msgpack.ExtType(_HANDLE, pack(x._oubliette_id))
    if handle is not None:
        return handle(x)
    raise BoundaryError(f"a value of type {type(x).__name__} cannot cross the sandbox boundary")


def pack(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def from_bytes(data: bytes, on_handle=None, _depth: int = 0):
    """msgpack bytes -> builtin values, nested at most MAX_DEPTH deep (BoundaryError otherwise). A
    handle's payload goes to on_handle (the judge makes a Handle of it, the candidate looks its
    object up); without on_handle a handle is malformed.

    The depth is bounded while decoding, not after: a tagged value (tuple, set, handle) is decoded
    by a nested call, and each nested call holds a msgpack unpacker on the C stack, so bytes nesting
    a few hundred tuples would overflow the decoding process's stack (a crash, not an exception)."""
    if _depth > MAX_DEPTH:
        raise BoundaryError(f"value nested deeper than {MAX_DEPTH}")

    def ext(code, payload):
        if code == _TUPLE:
            return tuple(from_bytes(payload, on_handle, _depth + 1))
        if code in (_SET, _FROZENSET):
            items = from_bytes(payload, on_handle, _depth + 1)
            return set(items) if code == _SET else frozenset(items)
        if code == _BIGINT:
            return int(payload.decode("ascii"), 16)
        if code == _COMPLEX:
            return complex(*struct.unpack("<dd", payload))
        if code == _HANDLE and on_handle is not None:
            return on_handle(from_bytes(payload, None, _depth + 1))
        raise BoundaryError(f"unknown value tag {code}")
    try:
        value = msgpack.unpackb(data, ext_hook=ext, strict_map_key=False, raw=False)
    except (BoundaryError, MemoryError):
        raise
    except Exception as e:  # msgpack raises many types on malformed input
        raise BoundaryError(f"malformed value: {type(e).__name__}: {e}") from None
    if _depth == 0:
        _check_depth(value)
    return value


def _check_depth(value) -> None:
    """BoundaryError if containers nest deeper than MAX_DEPTH (walked without recursion)."""
    stack = [(value, 0)]
    while stack:
        v, d = stack.pop()
        if type(v) in (list, tuple, set, frozenset, dict):
            if d >= MAX_DEPTH:
                raise BoundaryError(f"value nested deeper than {MAX_DEPTH}")
            items = [*v.keys(), *v.values()] if type(v) is dict else v
            stack.extend((x, d + 1) for x in items if type(x) in (list, tuple, set, frozenset, dict))


def send_frame(fd: int, obj) -> None:
    data = pack(obj)
    view = memoryview(struct.pack(">I", len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def recv_frame(fd: int, limit: int = MAX_RPC_BYTES):
    """Next length-prefixed msgpack frame from fd as raw bytes; None at EOF (also mid-frame)."""
    def read_exact(n):
        buf = bytearray()
        while len(buf) < n:
            chunk = os.read(fd, min(n - len(buf), 1 << 20))
            if not chunk:
                return None
            buf += chunk
        return bytes(buf)
    head = read_exact(4)
    if head is None:
        return None
    (n,) = struct.unpack(">I", head)
    if n > limit:
        raise BoundaryError(f"frame of {n} bytes exceeds the {limit}-byte limit")
    return read_exact(n)


def describe(e: BaseException) -> str:
    try:
        return f"{type(e).__name__}: {e}"[:300]
    except Exception:  # noqa: BLE001 - a program's exception whose __str__ raises
        return f"{type(e).__name__} (unprintable)"[:300]


# ============================================================================ candidate side (untrusted)
# Everything here runs in the program's own process, after the program: it is as untrusted as the
# program (which can patch or replace it). The judge therefore checks every message it gets.

_SKIP_NAMES = set(dir(builtins))
# Modules the judge may import for the tests when the program imported them (_judge_imports): each
# computes on its arguments only. Not here: anything that touches files, processes, signals or the
# interpreter (os, sys, signal, ctypes, faulthandler...), that evaluates text as code (typing,
# dataclasses) or that keeps settings a call could change for the rest of the tests (random,
# decimal, calendar).
PURE_MODULES = frozenset({"array", "bisect", "cmath", "collections", "copy", "datetime", "fractions",
                          "functools", "heapq", "itertools", "json", "math", "numbers", "operator", "re",
                          "statistics", "string", "textwrap", "unicodedata"})
_LOAD_FAILURES = ("syntax_error", "runtime_error", "memory")  # what a failed hello may say


class _Objects:
    """The program's objects the judge holds handles to, kept alive so their ids stay valid."""

    def __init__(self):
        self.objects, self.index = [], {}

    def handle(self, x) -> msgpack.ExtType:
        hid = self.index.get(id(x))
        if hid is None:
            hid = self.index[id(x)] = len(self.objects)
            self.objects.append(x)
        try:  # a label for the judge's messages: the function or class name, else the type's
            label = x.__qualname__ if isinstance(x, (type, types.FunctionType, types.BuiltinFunctionType,
                                                     types.MethodType)) else type(x).__qualname__
        except Exception:  # noqa: BLE001
            label = "object"
        return msgpack.ExtType(_HANDLE, pack([hid, str(label)[:80]]))

    def get(self, hid):
        if type(hid) is not int or not 0 <= hid < len(self.objects):
            raise BoundaryError(f"no program object #{hid!r}")
        return self.objects[hid]


def _serve(call, objects: _Objects) -> dict:
    """One request of the judge (op on a handle) -> the reply, every failure included."""
    try:
        op, target = call["op"], objects.get(call["h"])
        if op == "call":
            result = target(*from_bytes(call["args"], objects.get), **from_bytes(call["kwargs"], objects.get))
        elif op == "getattr":
            result = getattr(target, call["name"])
        elif op == "getitem":
            result = target[from_bytes(call["key"], objects.get)]
        elif op == "iter":
            result = iter(target)
        elif op == "next":
            result = next(target)
        elif op == "len":
            result = len(target)
        elif op == "str":
            result = str(target)
        elif op == "bool":
            result = bool(target)
        elif op == "isinstance":
            result = isinstance(objects.get(call["obj"]), target)
        else:
            raise BoundaryError(f"unknown request {op!r}")
    except BoundaryError as e:
        return {"ok": False, "boundary": str(e)[:300]}
    except BaseException as e:  # noqa: BLE001 - reported to the judge, which decides
        return {"ok": False, "exc": type(e).__name__, "msg": describe(e).partition(": ")[2]}
    try:
        value = pack(to_plain(result, objects.handle))
    except (BoundaryError, ValueError, TypeError, OverflowError, RecursionError) as e:
        return {"ok": False, "boundary": f"the result cannot cross the boundary: {describe(e)}"}
    if len(value) > MAX_RPC_BYTES - 1024:
        return {"ok": False, "boundary": f"a result of {len(value)} bytes is above the {MAX_RPC_BYTES}-byte limit"}
    return {"ok": True, "value": value}


def _pure_import(value) -> list[str] | None:
    """[module, ""] for a module of PURE_MODULES the program imported (`import math`), [module, name]
    for one of its public names (`from collections import Counter`), else None. Only a hint: the
    judge imports the module itself, by name, and binds only what its own rules allow
    (_judge_imports), so a forged hint can at worst bind a pure module's own function."""
    try:
        if isinstance(value, types.ModuleType):
            name = value.__name__
            return [name, ""] if name in PURE_MODULES and sys.modules.get(name) is value else None
        name = value.__name__
        if type(name) is not str or not name.isidentifier() or name.startswith("_"):
            return None
        for module in sorted(PURE_MODULES):
            if getattr(sys.modules.get(module), name, None) is value:
                return [module, name]
    except Exception:  # noqa: BLE001 - the program's objects can raise on any attribute
        pass
    return None


def candidate_main(program: str, fd: int) -> None:
    """Runs in the sandboxed candidate: load the program, say hello (its names: plain values or
    handles), then answer the judge's requests until EOF."""
    ns = {"__name__": "__candidate__", "__builtins__": builtins}
    try:
        code = compile(program, "<program>", "exec")
    except BaseException as e:  # noqa: BLE001 - SyntaxError, ValueError (NUL), RecursionError...
        send_frame(fd, {"ok": False, "status": "memory" if isinstance(e, MemoryError) else "syntax_error",
                        "error": describe(e)})
        return
    try:
        exec(code, ns)
    except BaseException as e:  # noqa: BLE001 - SystemExit and friends are program failures too
        send_frame(fd, {"ok": False, "status": "memory" if isinstance(e, MemoryError) else "runtime_error",
                        "error": describe(e)})
        return
    objects, names, imports = _Objects(), {}, {}
    for name, value in list(ns.items()):
        if name.startswith("__") or name in _SKIP_NAMES:
            continue
        if (origin := _pure_import(value)) is not None:
            imports[name] = origin  # the judge binds its own import of it
            continue
        if isinstance(value, types.ModuleType):
            continue
        try:
            packed = pack(to_plain(value, objects.handle, budget=[HELLO_VALUE_NODES]))
            if len(packed) > HELLO_VALUE_BYTES:
                packed = pack(objects.handle(value))
        except _TooBig:
            packed = pack(objects.handle(value))
        except (BoundaryError, ValueError, TypeError, OverflowError, RecursionError):
            continue
        names[name] = packed
    send_frame(fd, {"ok": True, "names": names, "imports": imports})
    while (raw := recv_frame(fd)) is not None:
        send_frame(fd, _serve(from_bytes(raw), objects))


def io_candidate_main(program: str, marks_fd: int) -> None:
    """Runs in the sandboxed candidate for io jobs: the program as __main__ on stdin/stdout.
    Before the program runs, marks_fd (see Executor._fork) gets b"R" (compiled), b"S" + the error
    (does not compile) or b"M" (out of memory compiling), and is closed."""
    try:
        code = compile(program, "<program>", "exec")
        os.write(marks_fd, b"R")
    except MemoryError:
        os.write(marks_fd, b"M")
        os._exit(1)
    except BaseException as e:  # noqa: BLE001 - SyntaxError, ValueError (NUL), RecursionError...
        os.write(marks_fd, b"S" + describe(e).encode("utf-8", "replace"))
        os._exit(1)
    os.close(marks_fd)
    exit_code = 0
    try:
        exec(code, {"__name__": "__main__", "__builtins__": builtins})
    except SystemExit as e:
        exit_code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - a runtime error is exit status 1, as for `python prog.py`
        traceback.print_exc()
        exit_code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001
        exit_code = exit_code or 1
    os._exit(exit_code & 0xFF)


# ============================================================================ judge side (trusted tests)


class CandidateGone(Exception):
    """The candidate process died or stopped answering in the middle of the tests."""


class CandidateMemoryError(MemoryError):
    """The candidate raised MemoryError (its address-space limit)."""


_EXC_TYPES = {n: t for n, t in vars(builtins).items() if isinstance(t, type)
              and issubclass(t, Exception) and n not in ("StopIteration", "StopAsyncIteration")}


def _program_exception(name: str, msg: str, what: str) -> BaseException:
    """The judge's copy of an exception the program raised: the builtin type of that name (so tests
    can catch ValueError...), marked as the program's (`oubliette_from_program`)."""
    if name == "MemoryError":
        e = CandidateMemoryError(msg)
    else:
        try:
            e = _EXC_TYPES.get(name, RuntimeError)(f"{name} in {what}: {msg}")
        except Exception:  # noqa: BLE001 - types whose constructor wants more (UnicodeDecodeError)
            e = RuntimeError(f"{name} in {what}: {msg}")
    e.oubliette_from_program = True
    return e


class _Channel:
    """The judge's end of the call channel: one request, one reply, strictly alternating. Every
    reply is checked; the handles it made are cached per object id, so a program object has exactly
    one Handle in the judge (h1 is h2 iff they name the same object)."""

    def __init__(self, fd: int):
        self.fd, self.handles = fd, {}

    def receive(self, what: str):
        try:
            raw = recv_frame(self.fd)
        except OSError as e:
            raise CandidateGone(f"the program's channel failed while {what}: {e}") from None
        if raw is None:
            raise CandidateGone(f"the program died while {what}")
        return from_bytes(raw)

    def handle(self, payload) -> "Handle":
        if type(payload) is not list or len(payload) != 2 or type(payload[0]) is not int \
                or type(payload[1]) is not str:
            raise BoundaryError("malformed handle from the program")
        h = self.handles.get(payload[0])
        if h is None:
            h = self.handles[payload[0]] = Handle(self, payload[0], payload[1][:80])
        return h

    def request(self, op: str, target: "Handle", what: str, **fields):
        try:
            send_frame(self.fd, {"op": op, "h": target._oubliette_id, **fields})
        except OSError as e:
            raise CandidateGone(f"the program's channel failed before computing {what}: {e}") from None
        reply = self.receive(f"computing {what}")
        if type(reply) is not dict or type(reply.get("ok")) is not bool:
            raise BoundaryError("malformed reply from the program")
        if reply["ok"]:
            if type(reply.get("value")) is not bytes:
                raise BoundaryError("malformed reply from the program")
            return from_bytes(reply["value"], self.handle)
        if "boundary" in reply:
            raise BoundaryError(f"{what}: {str(reply['boundary'])[:200]}")
        name, msg = str(reply.get("exc"))[:60], str(reply.get("msg"))[:300]
        if op == "next" and name == "StopIteration":
            raise StopIteration
        raise _program_exception(name, msg, what)


class Handle:
    """An object of the program, as the judge holds it: an id, usable only by the candidate.

    Objects the program makes (instances of its classes, its functions and classes themselves,
    closures, generators, numpy scalars...) never leave the candidate. The judge gets a Handle,
    and every use of it is a request to the candidate, answered with plain data or more handles:
      h(*args)  h.attr  h[key]       call, attribute read, item read (what the tests wrote out)
      iter(h) next(h) len(h) str(h) bool(h)   the same for no-argument protocols
      isinstance(h, C)               C a handle to a program class: asked of the candidate
      f(h), [h, ...] as an argument  the candidate gets its own object back
    `repr(h)` is local (`<program object Point #3>`); tests cannot set attributes on a handle.

    Equality is decided here, never by the program: a handle is equal only to itself (the same
    program object: the channel keeps one Handle per object), and unequal to every plain value and
    to every other handle; hash is by id; <, <=, >, >= raise TypeError, arithmetic is not offered
    (TypeError), and `x in h` iterates h and compares in the judge.
      assert area(Rect(2, 3)) == 6          works: area returns the int 6
      assert Stack().push(1).peek() == 1    works: two calls on handles, a plain int at the end
      p = Point(1, 2); assert p.x == 1      works: an attribute read returns the int 1
      assert make() == Point(1, 2)          fails (two different objects): compare attributes

    Why this cannot forge a pass. The program never sees a test's expected value unless the test
    passes it to the program in a call: `==`, `!=`, `<`, arithmetic and `in` are exactly the
    operators tests use to hold a result against an expectation (`f(3) == 918273645`,
    `abs(f(x) - y) < 1e-6`), and forwarding any of them would hand the expected value to the
    program and let it answer "equal"; none is forwarded. What the program answers (a call's
    result, an attribute, its len or str) is a value fixed before the judge compares it, exactly
    as a plain return value is. A handle compared with a plain value is False whatever the
    program's class says, so an object cannot stand in for the int, str or list a test expects:
    to make `f(3) == 918273645` true, f must return 918273645. The one comparison that can be True,
    a handle with itself, holds between two things the program produced; a test that compares two
    program objects (`make() == Point(1, 2)`) checks only what the program chooses (it builds both
    sides: Point could return one shared object), which is why it is identity, not the program's
    __eq__, and why such tests should compare attributes. The Handle's own code runs in the judge
    and executes nothing of the program; a malformed or hostile reply is a BoundaryError (status
    failed), a dead candidate CandidateGone (crashed).
    """
    __slots__ = ("_oubliette_chan", "_oubliette_id", "_oubliette_label")

    def __init__(self, chan: _Channel, hid: int, label: str):
        object.__setattr__(self, "_oubliette_chan", chan)
        object.__setattr__(self, "_oubliette_id", hid)
        object.__setattr__(self, "_oubliette_label", label)

    def _ask(self, op: str, what: str, **fields):
        return self._oubliette_chan.request(op, self, what, **fields)

    def _typed(self, op: str, typ: type):
        value = self._ask(op, f"{op}({self._oubliette_label})")
        if type(value) is not typ:
            raise BoundaryError(f"{op}() of a program object returned {type(value).__name__}")
        return value

    def __call__(self, *args, **kwargs):
        return self._ask("call", f"{self._oubliette_label}(...)", args=pack(to_plain(list(args))),
                         kwargs=pack(to_plain(dict(kwargs))))

    def __getattr__(self, name: str):
        if name.startswith("__") or name.startswith("_oubliette_"):
            raise AttributeError(name)  # the judge's own machinery probing dunders: local, no request
        return self._ask("getattr", f"{self._oubliette_label}.{name}", name=name)

    def __setattr__(self, name, value):
        raise AttributeError(f"the tests cannot set attributes of a program object ({name})")

    def __getitem__(self, key):
        return self._ask("getitem", f"{self._oubliette_label}[...]", key=pack(to_plain(key)))

    def __iter__(self):
        return self._ask("iter", f"iter({self._oubliette_label})")

    def __next__(self):
        return self._ask("next", f"next({self._oubliette_label})")

    def __len__(self):
        return self._typed("len", int)

    def __str__(self):
        return self._typed("str", str)

    def __bool__(self):
        return self._typed("bool", bool)

    def __instancecheck__(self, obj) -> bool:
        if not isinstance(obj, Handle) or obj._oubliette_chan is not self._oubliette_chan:
            return False  # a plain value is never an instance of a program class here
        value = self._ask("isinstance", f"isinstance(..., {self._oubliette_label})", obj=obj._oubliette_id)
        if type(value) is not bool:
            raise BoundaryError("isinstance() of a program object returned a non-bool")
        return value

    # Comparisons answer here with a real bool or raise: never NotImplemented, which is truthy and
    # would make a test's explicit `assert r.__eq__(x)` or `assert r.__lt__(x)` pass.
    def __eq__(self, other):
        return other is self

    def __ne__(self, other):
        return other is not self

    def _unordered(self, other):
        raise TypeError(f"the tests cannot order a program object ({self!r})")

    __lt__ = __le__ = __gt__ = __ge__ = _unordered

    def __hash__(self):
        return hash((id(self._oubliette_chan), self._oubliette_id))

    def __repr__(self):
        return f"<program object {self._oubliette_label} #{self._oubliette_id}>"

    def __copy__(self):
        return self  # a reference to an object in another process: copying copies the reference

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        raise TypeError("a program object cannot be pickled by the tests")


def _test_line(exc: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == "<tests>"]
    return f" at tests line {frames[-1].lineno}: {frames[-1].line}" if frames else ""


def _message(e: BaseException) -> str:
    """An exception's message without asking the program anything: str(e) of `assert r == 5, r`
    would call str() on a handle, a request to a candidate that may be gone by now."""
    try:
        return " ".join(a if isinstance(a, str) else repr(a) for a in e.args)[:300]
    except Exception:  # noqa: BLE001
        return "(no message)"


def _failure_report(e: BaseException) -> dict:
    """What an exception that ended the tests says about the program (never infra_error: all of
    these arise from the program's values or behaviour, or from tests acting on them)."""
    where, msg = _test_line(e), _message(e)
    if isinstance(e, MemoryError):  # the program's, or ours holding its values: both its doing
        return {"status": "memory", "detail": "out of memory" + (
            " in the program" if isinstance(e, CandidateMemoryError) else " holding the program's values")}
    if getattr(e, "oubliette_from_program", False):
        return {"status": "runtime_error", "detail": f"the program raised {msg}{where}"}
    if isinstance(e, CandidateGone):
        return {"status": "crashed", "detail": msg}
    if isinstance(e, AssertionError):
        return {"status": "failed", "detail": f"assertion failed{where}" + (f": {msg[:200]}" if msg else "")}
    if isinstance(e, BoundaryError):
        return {"status": "failed", "detail": f"{msg}{where}"}
    return {"status": "failed", "detail": f"the tests raised {type(e).__name__}: {msg}{where}"}


def _judge_imports(imports) -> dict:
    """What the tests may use of the program's imports ({name: [module, attribute]} from its hello),
    as the usual harnesses allow (`math.isclose`, `Counter`), built by the judge alone: it imports
    each module itself, by name, only from PURE_MODULES, and takes a public attribute of the
    module's own (_of_pure_module). A name that is a standard-library module's is bound to that
    module's own import or to nothing; dunders and builtins' names are never bound. Malformed or
    disallowed entries are skipped (a test using one gets NameError: the program's failure)."""
    out = {}
    if type(imports) is not dict:
        return out
    for name, origin in list(imports.items())[:256]:
        if type(name) is not str or not name.isidentifier() or name.startswith("__") or name in _SKIP_NAMES \
                or type(origin) is not list or len(origin) != 2 or not all(type(s) is str for s in origin):
            continue
        module, attr = origin
        if module not in PURE_MODULES or (attr and (not attr.isidentifier() or attr.startswith("_"))):
            continue
        if name in sys.stdlib_module_names and (attr or name != module):
            continue  # `math` is the judge's math or nothing
        obj = importlib.import_module(module)
        if attr:
            obj = getattr(obj, attr, None)
            if obj is None or not _of_pure_module(obj):
                continue
        out[name] = obj
    return out


def _of_pure_module(obj) -> bool:
    """Whether a pure module's attribute is its own: a constant (math.pi), or a function or class
    defined by a module of PURE_MODULES (or its C accelerator, _heapq for heapq). Not a module it
    imported (statistics.sys, json.codecs) nor another module's function it re-exports."""
    if isinstance(obj, types.ModuleType):
        return False
    if not callable(obj):
        return True
    origin = getattr(obj, "__module__", None)
    return type(origin) is str and origin.lstrip("_").partition(".")[0] in PURE_MODULES


def judge_main(code: types.CodeType, entry_point: str | None, fd: int) -> dict:
    """Runs in the judge process, once the tests compiled: build the tests' namespace, run the tests,
    return the report {"status", "detail"} (status in JUDGE_STATUSES).

    The namespace is the judge's own: its builtins, its imports of pure modules (_judge_imports),
    and the program's names as values decoded by the codec or Handles to the candidate. Nothing of
    the program runs here, and no dunder name of the program is bound (a program-supplied
    `__builtins__` would make every builtin the tests call a call into the program)."""
    chan = _Channel(fd)
    ns = {}
    try:
        hello = chan.receive("loading")
        if type(hello) is not dict or type(hello.get("ok")) is not bool:
            raise BoundaryError("malformed hello from the program")
        if not hello["ok"]:
            status = hello.get("status") if hello.get("status") in _LOAD_FAILURES else "failed"
            return {"status": status, "detail": f"the program failed to load: {str(hello.get('error'))[:300]}"}
        names = hello.get("names")
        if type(names) is not dict:
            raise BoundaryError("malformed hello from the program")
        for name, packed in names.items():
            if type(name) is str and not name.startswith("__") and name not in _SKIP_NAMES \
                    and type(packed) is bytes and (name == entry_point or name not in sys.stdlib_module_names):
                ns[name] = from_bytes(packed, chan.handle)
        ns.update(_judge_imports(hello.get("imports")))
        ns.update(__name__="__tests__", __builtins__=builtins)
        if entry_point is not None and not isinstance(ns.get(entry_point), Handle):
            return {"status": "failed", "detail": f"the program does not define {entry_point}()"}
        exec(code, ns)
        if entry_point is not None:
            check = ns.get("check")
            if not isinstance(check, types.FunctionType):  # never the program's own check()
                return {"status": INFRA_ERROR, "detail": "the tests define no check(candidate)"}
            check(ns[entry_point])
    except BaseException as e:  # noqa: BLE001 - every way the tests can end is a verdict
        report = _failure_report(e)
        e.__traceback__ = None  # let go of the program's values before anything else
        return report
    return {"status": "passed", "detail": "all tests passed"}


def judge_job(tests: str, entry_point: str | None, fd: int, marks_fd: int) -> dict:
    """A judge's whole life, in a process forked for this one job: compile the tests (a failure is
    the tests' alone: infra_error), write b"P" on marks_fd (from here on it handles the program's
    values, so its death is the program's doing: Executor.run_assert), run judge_main. Its report
    whatever happens: a failure the program can cause that escapes judge_main (while building its
    report) is still the program's; anything else is a bug of ours, infra_error."""
    try:
        code = compile(tests, "<tests>", "exec")
    except BaseException as e:  # noqa: BLE001
        return {"status": INFRA_ERROR, "detail": f"the tests do not compile: {describe(e)}"}
    linecache.cache["<tests>"] = (len(tests), None, tests.splitlines(True), "<tests>")
    os.write(marks_fd, b"P")
    os.close(marks_fd)
    try:
        return judge_main(code, entry_point, fd)
    except (MemoryError, CandidateGone, BoundaryError, RecursionError) as e:
        return _failure_report(e)
    except BaseException as e:  # noqa: BLE001
        return {"status": INFRA_ERROR, "detail": f"the judge failed: {describe(e)}"}


JUDGE_STATUSES = ("passed", "failed", "crashed", "memory", INFRA_ERROR) + _LOAD_FAILURES
