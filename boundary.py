"""The values that cross the verifier's boundary: the codec and the frames both sides use.

The candidate (the program's process, untrusted) and the judge (the tests' process, trusted) exchange
msgpack frames. A value crosses in one of four ways, and each side decodes into objects of its own,
never the sender's classes:
  by value   plain data (None, bool, int, float, str, bytes, list, tuple, dict, set, frozenset,
             complex, big ints) and the standard-library values _std knows (Counter, defaultdict,
             OrderedDict, deque, namedtuple classes and their instances, Fraction, Decimal, the
             datetime types, range, dict views, array, bytearray, slice, SimpleNamespace, POSIX
             paths): the receiver rebuilds its
             own instance of the same type, so `Counter(s)["z"] == 0`, `f(1, 2) == 0.5` for a
             Fraction and `p.x` of a namedtuple behave as in one process.
  by name    a builtin (`len`, `str.lower`, `int`, `ValueError`) or a function, class or constant of
             a pure standard-library module (`math.sqrt`, `json.JSONDecodeError`): the receiver
             takes its own (resolve_named: the judge only from NAMED_BUILTINS and PURE_MODULES).
  by handle  any other object stays where it was made: the receiver gets an id that the sender
             answers requests about (judge.py: a program object in the judge, a test's lambda or
             generator in the candidate).
  hybrid     an instance of a program's subclass of a builtin value type (an IntEnum member, an int
             subclass, a namedtuple class with methods): the builtin value AND a handle. The judge
             compares it by the value (so a subclass's __eq__ cannot lie) and asks the program for
             anything else (`.name`, its methods, repr).
Exceptions cross as their class (by name, or a program class rebuilt with its builtin bases), args,
str and plain attributes (judge.py). Depth is bounded while decoding (from_bytes).
"""

import array
import builtins
import collections
import datetime
import decimal
import fractions
import importlib
import os
import pathlib
import struct
import sys
import types

import msgpack

from verdicts import BoundaryError

(TUPLE, SET, FROZENSET, BIGINT, COMPLEX, HANDLE, STD, NAMED, LENT, HYBRID, EXC_CLASS,
 EXC, ARGREF) = range(1, 14)
MAX_DEPTH = 100
MAX_RPC_BYTES = 64 << 20
REQUEST, OK, RAISED, REFUSED = range(4)  # the first field of every message (Peer)
PREFETCH_AFTER = 1000       # a program iterator's first 1,000 items are fetched one at a time, exactly as asked
PREFETCH_MAX = 1024         # then in batches doubling up to this many items
PREFETCH_BUDGET_S = 0.002   # a batch is filled for at most this long (so a slow generator runs ahead little)

# Modules the judge may import for the tests when the program imported them, and whose functions,
# classes and constants cross by name: each computes on its arguments only. Not here: anything that
# touches files, processes, signals or the interpreter (os, sys, signal, ctypes, faulthandler...),
# that evaluates text as code (typing, dataclasses) or that keeps settings a call could change for
# the rest of the tests (random, decimal, calendar).
PURE_MODULES = frozenset({"array", "bisect", "cmath", "collections", "copy", "datetime", "fractions",
                          "functools", "heapq", "itertools", "json", "math", "numbers", "operator", "re",
                          "statistics", "string", "textwrap", "unicodedata"})
# Builtins that cross by name: the value types and exceptions, and functions that compute on their
# arguments. Not: eval, exec, compile, open, input, print, getattr and friends, globals, vars,
# __import__, breakpoint: a program that returns one of those gets a handle, whose calls run in it.
NAMED_BUILTINS = frozenset({
    "abs", "all", "any", "ascii", "bin", "bool", "bytearray", "bytes", "callable", "chr", "complex",
    "dict", "divmod", "enumerate", "filter", "float", "format", "frozenset", "hash", "hex", "int",
    "isinstance", "issubclass", "iter", "len", "list", "map", "max", "min", "next", "object", "oct",
    "ord", "pow", "range", "repr", "reversed", "round", "set", "slice", "sorted", "str", "sum", "tuple",
    "type", "zip"}) | frozenset(n for n, v in vars(builtins).items()
                                if isinstance(v, type) and issubclass(v, BaseException))
_METHOD_TYPES = {t.__name__: t for t in (str, bytes, int, float, complex, list, dict, set, frozenset, tuple)}
_NAMEDTUPLE_ATTRS = frozenset({"__doc__", "__slots__", "_fields", "_field_defaults", "__new__", "_make",
                               "_replace", "__repr__", "_asdict", "__getnewargs__", "__match_args__",
                               "__module__", "__qualname__", "__annotations__", "__orig_bases__"})
HYBRID_BASES = (bool, int, float, complex, str, bytes, tuple, frozenset, list, dict, set)
_namedtuples: dict = {}  # (typename, fields, defaults) -> the class this process made for it


def pack(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def ext(code: int, payload) -> msgpack.ExtType:
    return msgpack.ExtType(code, pack(payload))


# ---------------------------------------------------------------------------- encoding

def namedtuple_class(cls) -> tuple | None:
    """(typename, fields, defaults) if cls is a namedtuple class with nothing of its own added, else
    None (a namedtuple subclass with methods crosses as a hybrid)."""
    fields = cls.__dict__.get("_fields")
    if cls.__bases__ != (tuple,) or type(fields) is not tuple or not all(type(f) is str for f in fields):
        return None
    if not set(cls.__dict__) <= _NAMEDTUPLE_ATTRS | set(fields):
        return None
    defaults = getattr(cls, "_field_defaults", {})
    return cls.__name__, list(fields), [defaults[f] for f in fields if f in defaults]


def _std(x, enc):
    """x as an STD ExtType if its exact type is one of STD_TYPES, else None."""
    t = type(x)
    if t is collections.Counter:
        return ext(STD, ["Counter", [[enc(k), enc(v)] for k, v in x.items()]])
    if t is collections.OrderedDict:
        return ext(STD, ["OrderedDict", [[enc(k), enc(v)] for k, v in x.items()]])
    if t is collections.defaultdict:
        return ext(STD, ["defaultdict", enc(x.default_factory), [[enc(k), enc(v)] for k, v in x.items()]])
    if t is collections.deque:
        return ext(STD, ["deque", [enc(v) for v in x], x.maxlen])
    if t is fractions.Fraction:
        return ext(STD, ["Fraction", enc(x.numerator), enc(x.denominator)])
    if t is decimal.Decimal:
        return ext(STD, ["Decimal", str(x)])
    if t is datetime.date:
        return ext(STD, ["date", x.year, x.month, x.day])
    if t is datetime.datetime:
        return ext(STD, ["datetime", x.year, x.month, x.day, x.hour, x.minute, x.second, x.microsecond,
                         enc(x.tzinfo), x.fold])
    if t is datetime.time:
        return ext(STD, ["time", x.hour, x.minute, x.second, x.microsecond, enc(x.tzinfo), x.fold])
    if t is datetime.timedelta:
        return ext(STD, ["timedelta", x.days, x.seconds, x.microseconds])
    if t is datetime.timezone:
        return ext(STD, ["timezone", x.utcoffset(None).total_seconds(), x.tzname(None)])
    if t is range:
        return ext(STD, ["range", enc(x.start), enc(x.stop), enc(x.step)])
    if t is slice:
        return ext(STD, ["slice", enc(x.start), enc(x.stop), enc(x.step)])
    if t is type({}.keys()):
        return ext(STD, ["keys", [enc(k) for k in x]])
    if t is type({}.values()):
        return ext(STD, ["values", [enc(v) for v in x]])
    if t is type({}.items()):
        return ext(STD, ["items", [[enc(k), enc(v)] for k, v in x]])
    if t is array.array:
        return ext(STD, ["array", x.typecode, x.tobytes()])
    if t is bytearray:
        return ext(STD, ["bytearray", bytes(x)])
    if t is types.SimpleNamespace:
        return ext(STD, ["namespace", [[str(k), enc(v)] for k, v in vars(x).items()]])
    if t in (pathlib.PurePosixPath, pathlib.PosixPath):
        return ext(STD, ["path", t.__name__, str(x)])
    if isinstance(x, tuple) and (nt := namedtuple_class(t)) is not None:
        return ext(STD, ["namedtuple", nt[0], nt[1], [enc(d) for d in nt[2]], [enc(v) for v in x]])
    if isinstance(x, type) and issubclass(x, tuple) and (nt := namedtuple_class(x)) is not None:
        return ext(STD, ["namedtuple_class", nt[0], nt[1], [enc(d) for d in nt[2]]])
    return None


def named_ref(x) -> list | None:
    """[module, qualname] if x crosses by name (see the module docstring), else None."""
    try:
        if type(x) in (types.MethodDescriptorType, types.WrapperDescriptorType,
                       types.ClassMethodDescriptorType):  # str.lower, str.__add__
            owner = x.__objclass__
            if owner in _METHOD_TYPES.values() and not x.__name__.startswith("_"):
                return ["builtins", f"{owner.__name__}.{x.__name__}"]
            return None
        if not (isinstance(x, type) or type(x) in (types.BuiltinFunctionType, types.FunctionType)):
            return None
        mod, qual = x.__module__, x.__qualname__
        if type(mod) is not str or type(qual) is not str:
            return None
        if mod == "builtins":
            return ["builtins", qual] if qual in NAMED_BUILTINS and getattr(builtins, qual) is x else None
        home = mod.lstrip("_").partition(".")[0]
        if home in PURE_MODULES and qual.isidentifier() and not qual.startswith("_") \
                and getattr(sys.modules.get(home), qual, None) is x:
            return [home, qual]
    except Exception:  # noqa: BLE001 - the program's objects can raise on any attribute
        pass
    return None


def resolve_named(ref, trusted_side: bool):
    """The receiver's own object for a NAMED reference. The judge (trusted_side) resolves only what
    named_ref would send: NAMED_BUILTINS, public methods of builtin value types, and a pure module's
    own public functions, classes and constants; anything else is a BoundaryError. The candidate
    resolves what the judge sends, which is the same set."""
    if type(ref) is not list or len(ref) != 2 or not all(type(s) is str for s in ref):
        raise BoundaryError("malformed name from the other side")
    module, qual = ref
    if module == "builtins":
        owner, _, meth = qual.partition(".")
        if meth:
            if owner in _METHOD_TYPES and meth.isidentifier() and not meth.startswith("_"):
                found = getattr(_METHOD_TYPES[owner], meth, None)
                if found is not None:
                    return found
        elif qual in NAMED_BUILTINS:
            return getattr(builtins, qual)
    elif module in PURE_MODULES and qual.isidentifier() and not qual.startswith("_"):
        obj = getattr(importlib.import_module(module), qual, None)
        if obj is not None and (not trusted_side or named_ref(obj) == ref):
            return obj
    raise BoundaryError(f"{module}.{qual} does not cross the boundary by name")


def to_plain(x, other, depth: int = 0, budget: list | None = None, refs: dict | None = None):
    """Python value -> msgpack-able structure. Plain data by value (exact types), STD_TYPES by value,
    anything else `other(x, enc)` (the side's own rule: a handle, a name, a hybrid, a lent object), or
    BoundaryError when other is None. budget: [nodes left] or [nodes left, bytes of text left (str,
    bytes, bytearray, array.array)]; TooBig when either is spent (before anything big is copied). refs: {id: k} of the
    containers of a call's arguments (containers()), sent as ARGREF k so that a result holding an
    argument (or a row of one) is the caller's own object, as in one process."""
    if depth > MAX_DEPTH:
        raise BoundaryError(f"value nested deeper than {MAX_DEPTH}")
    t = type(x)
    if budget is not None:
        budget[0] -= 1
        if len(budget) > 1 and t in (str, bytes, bytearray, array.array):
            budget[1] -= len(x) * (x.itemsize if t is array.array else 1)
        if min(budget) < 0:
            raise TooBig
    if x is None or t is bool or t is float or t is str or t is bytes:
        return x
    if t is int:
        return x if -(1 << 63) <= x < (1 << 64) else msgpack.ExtType(BIGINT, format(x, "x").encode())
    if refs and id(x) in refs and t in CONTAINERS:
        return ext(ARGREF, refs[id(x)])

    def enc(v):
        return to_plain(v, other, depth + 1, budget, refs)
    if t is list:
        return [enc(v) for v in x]
    if t is dict:
        return {enc(k): enc(v) for k, v in x.items()}
    if t is tuple:
        return ext(TUPLE, [enc(v) for v in x])
    if t is set:
        return ext(SET, [enc(v) for v in x])
    if t is frozenset:
        return ext(FROZENSET, [enc(v) for v in x])
    if t is complex:
        return msgpack.ExtType(COMPLEX, struct.pack("<dd", x.real, x.imag))
    std = _std(x, enc)
    if std is not None:
        return std
    if other is None:
        raise BoundaryError(f"a value of type {t.__name__} cannot cross the sandbox boundary")
    return other(x, enc)


CONTAINERS = (list, dict, set, bytearray, array.array, collections.deque, collections.Counter,
              collections.OrderedDict, collections.defaultdict)


def containers(call: list, limit: int = 100_000) -> list:
    """The mutable containers inside a call's [args, kwargs] (exact CONTAINERS types, walked through
    exact lists, tuples and dicts in order), the same list on both sides: the sender's originals and
    the receiver's decoded copies line up index by index. [] for plain scalars (most calls)."""
    out, seen = [], 0
    stack = [*reversed(call[1].values()), *reversed(call[0])]
    while stack and seen < limit:
        v = stack.pop()
        seen += 1
        t = type(v)
        if t in CONTAINERS:
            out.append(v)
        if t is list or t is tuple:
            stack.extend(reversed(v))
        elif t is dict:
            stack.extend(reversed(list(v.values())))
    return out


class TooBig(Exception):
    """to_plain's node budget ran out."""


# ---------------------------------------------------------------------------- decoding

def _namedtuple(typename, fields, defaults):
    key = (typename, tuple(fields), repr(defaults))
    cls = _namedtuples.get(key)
    if cls is None:
        cls = _namedtuples[key] = collections.namedtuple(typename, fields, defaults=defaults or None)
    return cls


def _std_value(payload, dec):
    """The receiver's own instance for an STD payload (every field checked by the constructor)."""
    kind, rest = payload[0], payload[1:]
    pairs = lambda items: [(dec(k), dec(v)) for k, v in items]  # noqa: E731
    try:
        if kind == "Counter":
            return collections.Counter(dict(pairs(rest[0])))
        if kind == "OrderedDict":
            return collections.OrderedDict(pairs(rest[0]))
        if kind == "defaultdict":
            factory = dec(rest[0])
            if factory is not None and not callable(factory):
                raise BoundaryError("a defaultdict factory that is not callable")
            return collections.defaultdict(factory, pairs(rest[1]))
        if kind == "deque":
            return collections.deque([dec(v) for v in rest[0]], rest[1])
        if kind == "Fraction":
            return fractions.Fraction(dec(rest[0]), dec(rest[1]))
        if kind == "Decimal":
            return decimal.Decimal(rest[0])
        if kind == "date":
            return datetime.date(*rest)
        if kind == "datetime":
            return datetime.datetime(*rest[:7], tzinfo=dec(rest[7]), fold=rest[8])
        if kind == "time":
            return datetime.time(*rest[:4], tzinfo=dec(rest[4]), fold=rest[5])
        if kind == "timedelta":
            return datetime.timedelta(days=rest[0], seconds=rest[1], microseconds=rest[2])
        if kind == "timezone":
            offset = datetime.timedelta(seconds=rest[0])
            return datetime.timezone(offset, rest[1]) if rest[1] is not None else datetime.timezone(offset)
        if kind in ("range", "slice"):
            return (range if kind == "range" else slice)(*(dec(v) for v in rest))
        if kind == "keys":
            return dict.fromkeys(dec(k) for k in rest[0]).keys()
        if kind == "values":
            return dict(enumerate(dec(v) for v in rest[0])).values()
        if kind == "items":
            return dict(pairs(rest[0])).items()
        if kind == "array":
            a = array.array(rest[0])
            a.frombytes(rest[1])
            return a
        if kind == "bytearray":
            return bytearray(rest[0])
        if kind == "namespace":
            return types.SimpleNamespace(**{str(k): dec(v) for k, v in rest[0]})
        if kind == "path":
            return {"PurePosixPath": pathlib.PurePosixPath, "PosixPath": pathlib.PosixPath}[rest[0]](rest[1])
        if kind == "namedtuple":
            return _namedtuple(rest[0], rest[1], [dec(d) for d in rest[2]])(*(dec(v) for v in rest[3]))
        if kind == "namedtuple_class":
            return _namedtuple(rest[0], rest[1], [dec(d) for d in rest[2]])
    except BoundaryError:
        raise
    except Exception as e:  # noqa: BLE001 - a malformed payload (wrong arity, bad typecode...)
        raise BoundaryError(f"malformed {str(kind)[:40]} value: {type(e).__name__}: {e}"[:200]) from None
    raise BoundaryError(f"unknown value kind {str(kind)[:40]!r}")


def from_bytes(data: bytes, hooks: dict | None = None, _depth: int = 0):
    """msgpack bytes -> the receiver's own values, nested at most MAX_DEPTH deep (BoundaryError
    otherwise). hooks: {tag: function(payload, decode)} for the tags whose meaning is the side's
    own (HANDLE, NAMED, LENT, HYBRID, EXC_CLASS, EXC); a tag without a hook is malformed.

    The depth is bounded while decoding, not after: a tagged value is decoded by a nested call, and
    each nested call holds a msgpack unpacker on the C stack, so bytes nesting a few hundred tuples
    would overflow the decoding process's stack (a crash, not an exception)."""
    if _depth > MAX_DEPTH:
        raise BoundaryError(f"value nested deeper than {MAX_DEPTH}")

    def dec(v):  # a value inside an already-decoded payload (already a decoded structure)
        return v

    def ext_hook(code, payload):
        if code == BIGINT:
            return int(payload.decode("ascii"), 16)
        if code == COMPLEX:
            return complex(*struct.unpack("<dd", payload))
        inner = from_bytes(payload, hooks, _depth + 1)
        if code == TUPLE:
            return tuple(inner)
        if code == SET:
            return set(inner)
        if code == FROZENSET:
            return frozenset(inner)
        if code == STD:
            if type(inner) is not list or not inner:
                raise BoundaryError("malformed value")
            return _std_value(inner, dec)
        hook = (hooks or {}).get(code)
        if hook is None:
            raise BoundaryError(f"unknown value tag {code}")
        return hook(inner)
    try:
        value = msgpack.unpackb(data, ext_hook=ext_hook, strict_map_key=False, raw=False)
    except (BoundaryError, MemoryError):
        raise
    except Exception as e:  # msgpack and the constructors raise many types on malformed input
        raise BoundaryError(f"malformed value: {type(e).__name__}: {e}"[:300]) from None
    if _depth == 0 and type(value) in (list, dict) and len(data) > MAX_DEPTH:
        _check_depth(value)  # a value nested deeper than MAX_DEPTH takes more than MAX_DEPTH bytes
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


# ---------------------------------------------------------------------------- frames

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


class FrameReader:
    """recv_frame over a buffer: one read() usually brings a whole small frame, header and body, so
    a round trip costs two system calls per side instead of four."""

    def __init__(self, fd: int, limit: int = MAX_RPC_BYTES):
        self.fd, self.limit, self.buf = fd, limit, bytearray()

    def next(self):
        """The next frame's bytes; None at EOF (also mid-frame)."""
        while True:
            if len(self.buf) >= 4:
                (n,) = struct.unpack_from(">I", self.buf)
                if n > self.limit:
                    raise BoundaryError(f"frame of {n} bytes exceeds the {self.limit}-byte limit")
                if len(self.buf) >= 4 + n:
                    frame = bytes(self.buf[4:4 + n])
                    del self.buf[:4 + n]
                    return frame
            want = 4 + n - len(self.buf) if len(self.buf) >= 4 else 4
            chunk = os.read(self.fd, min(max(want, 1 << 16), 1 << 22))
            if not chunk:
                return None
            self.buf += chunk


def describe(e: BaseException) -> str:
    try:
        return f"{type(e).__name__}: {e}"[:300]
    except Exception:  # noqa: BLE001 - a program's exception whose __str__ raises
        return f"{type(e).__name__} (unprintable)"[:300]


# ---------------------------------------------------------------------------- the conversation
# One request, then its reply; while a side waits for its reply it serves the other's requests (the
# program calling a lambda the tests passed it, which asks the program something in turn...).
#   request  [REQUEST, op, target id, argument]
#   reply    [OK, value (, the call's arguments after it, when it changed them)]
#            [RAISED, the exception (EXC)]     [REFUSED, why]   (a malformed request or a value that cannot cross)

class Peer:
    """One side's end of the channel: sends requests, serves the other side's (serve) while waiting."""

    def __init__(self, fd: int):
        self.fd, self.reader = fd, FrameReader(fd)

    def send(self, msg) -> None:
        send_frame(self.fd, msg)

    def request(self, op: str, target: int, arg=None):
        """The reply to one request: [OK, ...], or [RAISED, exc]/[REFUSED, why] as decoded."""
        self.send([REQUEST, op, target, arg])
        while True:
            msg = self.receive()
            if type(msg) is not list or not msg or msg[0] not in (REQUEST, OK, RAISED, REFUSED):
                raise BoundaryError("malformed message from the other side")
            if msg[0] != REQUEST:
                return msg
            self.send(self.serve(msg))

    def receive(self):
        raise NotImplementedError

    def serve(self, msg) -> list:
        raise NotImplementedError
