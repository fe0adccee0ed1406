"""The program's objects in the judge: Handle, ProgramClass and the hybrid values, stand-ins whose every use
is a request to the candidate (judge.py's _Channel carries it).

A program object that does not cross by value (boundary.py) stays in the candidate; the judge holds a
Handle to it (a program class: a ProgramClass, so `isinstance(x, Point)` and subclassing work; an
instance of a program's subclass of a builtin value type: a hybrid, the builtin value and a Handle).
Calls, attributes, items, iteration, repr/str/hash/len/bool, context managers and every operator
between program objects are requests the candidate answers; an operator that puts a plain value of
the tests beside a program object is never the program's (Handle says why that cannot forge a pass).
Nothing here runs a line of the program: it only asks, and checks what comes back.
"""
from __future__ import annotations

import collections
from typing import TYPE_CHECKING

from boundary import PREFETCH_AFTER, PREFETCH_MAX, containers, pack
from verdicts import BoundaryError

if TYPE_CHECKING:
    from judge import _Channel


class CandidateGone(Exception):
    """The candidate process died or stopped answering in the middle of the tests."""


FROM_PROGRAM = "_oubliette_from_program"  # set on each exception the judge raises for the program


# The dunders the tests may read of a program object: its names, doc and attributes' dict. Every other
# dunder the judge's machinery probes (numpy's __array_interface__, __array__, __float__ by
# attribute...) would let the program describe a value the judge builds itself, outside the codec.
_FORWARDED_DUNDERS = frozenset({"__name__", "__qualname__", "__doc__", "__module__", "__wrapped__", "__dict__"})


def forwarded(name: str) -> bool:
    return not name.startswith("_oubliette_") and (not name.startswith("__") or name in _FORWARDED_DUNDERS)


def _is_program_value(chan: "_Channel", x) -> bool:
    """Whether x is one of the program's objects on this channel (a handle, a class stand-in or a hybrid)."""
    if isinstance(x, Handle):
        return x._oubliette_chan is chan
    if isinstance(x, ProgramClass):
        return x._oubliette_cchan is chan
    h = object.__getattribute__(x, "_oubliette_handle") if getattr(type(x), "_oubliette_hybrid", False) else None
    return isinstance(h, Handle) and h._oubliette_chan is chan


def _is_other_program_value(h: "Handle", other) -> bool:
    return _is_program_value(h._oubliette_chan, other)


class Handle:
    """An object of the program, as the judge holds it: an id, usable only by the candidate.

    Objects the program makes (instances of its classes, its functions and classes themselves,
    closures, generators...) never leave the candidate. The judge gets a Handle of a class named
    like the object's own (`type(h).__name__` is "Point"), and every use of it is a request:
      h(*args)  h.attr  h.attr = v  h[key]  h[key] = v   iter(h) next(h) len(h) str(h) repr(h)
      hash(h) bool(h) format(h)  with h:   int(h) float(h) round(h)  isinstance(h, C)
      h OP g  (g a program object: ==, <, +, in ... as the program defines them; never with a plain value)
    A call's plain arguments that the program changes in place are changed in the tests too.

    Why this cannot forge a pass. The program never sees a test's expected value unless the test
    passes it: `==`, `<`, arithmetic and `in` are exactly the operators tests use to hold a result
    against an expectation (`f(3) == 918273645`, `abs(f(x) - y) < 1e-6`, `y in f(x)`), and
    forwarding one with a plain value of the tests beside a program object would let the program
    answer "equal" (or return an object that remembers y and later says 0). So none is: `h == 5`
    is False, `h < 5` and `h - 5` are TypeError, and `5 in h` iterates h and compares here, whatever
    h's class (the program decides its class and its mro, so no class can be singled out as
    trusted). To make `f(3) == 918273645` true, f must return 918273645 (a subclass of int arrives
    as a hybrid compared by its int value). Between two program objects every operator is the
    program's: both sides are its own (a test comparing two program objects checks what the program
    chooses, exactly as in one process). What the program answers (a call's result, an attribute,
    its len or str) is a value fixed before the judge compares it, exactly as a plain return value is.
    The Handle's own code runs in the judge and executes nothing of the program; a malformed or
    hostile reply is a BoundaryError (status failed), a dead candidate CandidateGone (the executor,
    which sees how it died, makes that crashed, timeout or memory).
    """
    __slots__ = ("__weakref__", "_oubliette_chan", "_oubliette_id", "_oubliette_label", "_oubliette_mro",
                 "_oubliette_kind", "_oubliette_buf", "_oubliette_asked", "_oubliette_end")

    def __init__(self, chan: _Channel, hid: int, label: str, mro: frozenset, kind: str):
        for k, v in (("chan", chan), ("id", hid), ("label", label), ("mro", mro), ("kind", kind),
                     ("buf", None), ("asked", 0), ("end", None)):
            object.__setattr__(self, "_oubliette_" + k, v)

    @property
    def _oubliette_type(self) -> str:
        return type(self).__name__

    def _oubliette_ask(self, op: str, what: str, arg=None, args_sent=None):
        return self._oubliette_chan.ask(op, self._oubliette_id, what, arg, args_sent)

    def _oubliette_enc(self, x):
        return self._oubliette_chan.enc(x)

    def _oubliette_meets(self, other) -> bool:
        """Whether an operator between this object and `other` is the program's to answer: only when
        `other` is the program's too (see the class docstring)."""
        return _is_other_program_value(self, other)

    def _oubliette_op(self, name: str, others: tuple = (), reflected: bool = False):
        """operator.<name>(self, *others) (reflected: (*others, self)), run by the candidate."""
        return self._oubliette_ask("op", f"{name}({self._oubliette_label})", [name, reflected, [self._oubliette_enc(o) for o in others]])

    def __call__(self, *args, **kwargs):
        return _call(self._oubliette_chan, self._oubliette_id, self._oubliette_label, args, kwargs)

    def __getattr__(self, name: str):
        if not forwarded(name):
            raise AttributeError(name)
        return self._oubliette_ask("getattr", f"{self._oubliette_label}.{name}", name)

    def __setattr__(self, name, value):
        self._oubliette_ask("setattr", f"{self._oubliette_label}.{name} = ...", [name, self._oubliette_enc(value)])

    def __delattr__(self, name):
        self._oubliette_ask("delattr", f"del {self._oubliette_label}.{name}", name)

    def __getitem__(self, key):
        return self._oubliette_ask("getitem", f"{self._oubliette_label}[...]", self._oubliette_enc(key))

    def __setitem__(self, key, value):
        self._oubliette_ask("setitem", f"{self._oubliette_label}[...] = ...", [self._oubliette_enc(key), self._oubliette_enc(value)])

    def __delitem__(self, key):
        self._oubliette_ask("delitem", f"del {self._oubliette_label}[...]", self._oubliette_enc(key))

    def __iter__(self):
        return self._oubliette_ask("iter", f"iter({self._oubliette_label})")

    def __next__(self):
        buf = self._oubliette_buf
        if buf:
            return buf.popleft()
        end = self._oubliette_end
        if end is not None:
            object.__setattr__(self, "_oubliette_end", StopIteration())
            raise end
        asked = self._oubliette_asked
        n = 1 if asked < PREFETCH_AFTER else min(PREFETCH_MAX, 1 << (asked - PREFETCH_AFTER + 1))
        object.__setattr__(self, "_oubliette_asked", asked + 1)
        got = self._oubliette_ask("next", f"next({self._oubliette_label})", n)
        if type(got) is not list or len(got) != 3 or type(got[0]) is not list or got[1] not in (0, 1, 2) \
                or not got[0] and got[1] == 0 or (got[1] == 2 and not isinstance(got[2], BaseException)) \
                or (got[1] == 1 and not (got[2] is None or type(got[2]) is StopIteration)):
            raise BoundaryError("malformed reply from the program")
        items, ended, exc = got
        if ended:
            object.__setattr__(self, "_oubliette_end", exc if ended == 2 or isinstance(exc, StopIteration)
                               else StopIteration())
            if ended == 2:
                exc.__dict__[FROM_PROGRAM] = True
        if items:
            object.__setattr__(self, "_oubliette_buf", collections.deque(items[1:]))
            return items[0]
        return self.__next__()

    def __len__(self):
        return self._oubliette_typed("len", int)

    def __str__(self):
        return self._oubliette_typed("str", str)

    def __repr__(self):
        return self._oubliette_typed("repr", str)

    def __bool__(self):
        return self._oubliette_typed("bool", bool)

    def __hash__(self):
        return self._oubliette_typed("hash", int)

    def __format__(self, spec):
        value = self._oubliette_ask("format", f"format({self._oubliette_label})", spec)
        if type(value) is not str:
            raise BoundaryError("format() of a program object returned a non-str")
        return value

    def __enter__(self):
        return self._oubliette_ask("enter", f"{self._oubliette_label}.__enter__()")

    def __exit__(self, et, ev, tb):
        return self._oubliette_ask("exit", f"{self._oubliette_label}.__exit__()", self._oubliette_enc([et, ev, None]))

    def _oubliette_typed(self, op: str, typ: type):
        value = self._oubliette_ask(op, f"{op}({self._oubliette_label})")
        if type(value) is not typ:
            raise BoundaryError(f"{op}() of a program object returned {type(value).__name__}")
        return value

    # Comparisons answer with a real bool or raise: never NotImplemented, which is truthy and would
    # make a test's explicit `assert r.__eq__(x)` pass.
    def __eq__(self, other):
        if other is self:
            return True
        if not self._oubliette_meets(other):
            return False
        return self._oubliette_op("eq", (other,))

    def __ne__(self, other):
        if other is self:
            return False
        if not self._oubliette_meets(other):
            return True
        return self._oubliette_op("ne", (other,))

    def __contains__(self, x):
        if self._oubliette_meets(x):
            return bool(self._oubliette_op("contains", (x,)))
        return any(x is item or x == item for item in self)

    def __copy__(self):  # the program copies its object, as copy.copy would in one process
        return self._oubliette_ask("copy", f"copy({self._oubliette_label})")

    def __deepcopy__(self, memo):
        return self._oubliette_ask("deepcopy", f"deepcopy({self._oubliette_label})")

    def __dir__(self):
        names = self._oubliette_ask("dir", f"dir({self._oubliette_label})")
        if type(names) is not list or not all(type(n) is str for n in names):
            raise BoundaryError("dir() of a program object returned something else than names")
        return names

    def __reduce__(self):
        raise TypeError("a program object cannot be pickled by the tests")


def _call(chan: _Channel, target: int, label: str, args: tuple, kwargs: dict):
    """A call of a program function, method or class: the arguments' containers are noted for the
    reply's ARGREFs, and changed in place afterwards if the program changed its copies."""
    sent = [list(args), dict(kwargs)]
    chan.argrefs.append(containers(sent))
    try:
        return chan.ask("call", target, f"{label}(...)", pack(chan.enc(sent)), args_sent=sent)
    finally:
        chan.argrefs.pop()


forwarded_doc = property(lambda self: self._oubliette_ask("getattr", f"{self._oubliette_label}.__doc__", "__doc__"))


class ProgramClass(type):
    """The metaclass of the judge's stand-ins for the program's classes: `Square` in the tests is a
    class here, so `type(Square(3)) is Square`, `type(s).__name__ == "Square"`, `isinstance(s, Shape)`
    (asked of the program's mro, sent with every object) and `issubclass` hold as in one process.
    Calling it, its attributes (`Square.unit()`, `Color.RED`), iterating it, len, [key] and repr are
    requests to the program; a stand-in's instances are Handles."""

    def __call__(cls, *args, **kwargs):
        return _call(cls._oubliette_cchan, cls._oubliette_cid, cls.__name__, args, kwargs)

    def _oubliette_class_ask(cls, op: str, arg=None):
        return cls._oubliette_cchan.ask(op, cls._oubliette_cid, f"{op}({cls.__name__})", arg)

    def __getattr__(cls, name: str):
        if not forwarded(name):
            raise AttributeError(name)
        return cls._oubliette_class_ask("getattr", name)

    def __setattr__(cls, name, value):
        cls._oubliette_class_ask("setattr", [name, cls._oubliette_cchan.enc(value)])

    def __iter__(cls):
        return cls._oubliette_class_ask("iter")

    def __len__(cls):
        return _typed_value(cls._oubliette_class_ask("len"), int, "len")

    def __getitem__(cls, key):
        return cls._oubliette_class_ask("getitem", cls._oubliette_cchan.enc(key))

    def __contains__(cls, x):
        if not _is_program_value(cls._oubliette_cchan, x):  # a value of the tests: compared here
            return any(x is item or x == item for item in cls)
        return bool(cls._oubliette_cchan.ask("op", cls._oubliette_cid, f"in {cls.__name__}",
                                             ["contains", False, [cls._oubliette_cchan.enc(x)]]))

    def __repr__(cls):
        return _typed_value(cls._oubliette_class_ask("repr"), str, "repr")

    def __instancecheck__(cls, obj) -> bool:
        h = obj if isinstance(obj, Handle) else object.__getattribute__(obj, "_oubliette_handle") \
            if getattr(type(obj), "_oubliette_hybrid", False) else None
        return isinstance(h, Handle) and h._oubliette_chan is cls._oubliette_cchan \
            and cls._oubliette_cid in h._oubliette_mro

    def __subclasscheck__(cls, sub) -> bool:
        return isinstance(sub, ProgramClass) and sub._oubliette_cchan is cls._oubliette_cchan \
            and cls._oubliette_cid in sub._oubliette_cmro


def _typed_value(value, typ: type, op: str):
    if type(value) is not typ:
        raise BoundaryError(f"{op}() of a program object returned {type(value).__name__}")
    return value


def _binary(name: str, reflected: bool = False, ordering: bool = False):
    def method(self, other):
        if not self._oubliette_meets(other):
            if ordering:
                raise TypeError(f"the tests cannot order a program object ({self._oubliette_label}) "
                                f"with a value of theirs")
            return NotImplemented
        return self._oubliette_op(name, (other,), reflected)
    return method


def _unary(name: str):
    def method(self):
        return self._oubliette_op(name)
    return method


def _conversion(name: str, typ=None):
    def method(self, *args):
        value = self._oubliette_ask("conv", f"{name}({self._oubliette_label})", [name, *map(self._oubliette_enc, args)])
        if typ is not None and type(value) is not typ:
            raise BoundaryError(f"{name}() of a program object returned {type(value).__name__}")
        return value
    return method


for _op in ("lt", "le", "gt", "ge"):
    setattr(Handle, f"__{_op}__", _binary(_op, ordering=True))
for _op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "lshift", "rshift"):
    setattr(Handle, f"__{_op}__", _binary(_op))
    setattr(Handle, f"__r{_op}__", _binary(_op, reflected=True))
    setattr(Handle, f"__i{_op}__", _binary(f"i{_op}"))
for _op, _name in (("and_", "and"), ("or_", "or"), ("xor", "xor")):
    setattr(Handle, f"__{_name}__", _binary(_op))
    setattr(Handle, f"__r{_name}__", _binary(_op, reflected=True))
    setattr(Handle, f"__i{_name}__", _binary(f"i{_name}"))
for _op in ("neg", "pos", "abs", "invert"):
    setattr(Handle, f"__{_op}__", _unary(_op))
Handle.__index__ = _unary("index")
for _name, _typ in (("int", int), ("float", float), ("complex", complex), ("bytes", bytes), ("round", None),
                    ("trunc", None),
                    ("floor", None), ("ceil", None), ("reversed", None)):
    setattr(Handle, f"__{_name}__", _conversion(_name, _typ))


def _hybrid_getattr(self, name):
    if not forwarded(name):
        raise AttributeError(name)
    return getattr(object.__getattribute__(self, "_oubliette_handle"), name)


HYBRID_METHODS = {
    "_oubliette_hybrid": True,
    "__getattr__": _hybrid_getattr,
    "__repr__": lambda self: repr(object.__getattribute__(self, "_oubliette_handle")),
    "__str__": lambda self: str(object.__getattribute__(self, "_oubliette_handle")),
}
"""An instance of a program's subclass of a builtin value type, in the judge: the builtin value
(compared, hashed and computed with by the builtin type's own methods) and the program's object
behind it (its other attributes, repr and str)."""
