"""The judge of the verifier: the trusted side of an assert job.

Two processes per assert job, both forked from the executor's launcher (executor.py), which imported
their code before it entered the sandbox:
  candidate (candidate.py, untrusted)  the program's own process: runs the program, says hello (its
                              names), then answers the judge's requests about its objects.
  judge (here, trusted)       forked for one job and confined as a candidate is: runs the tests in a
                              namespace it builds itself, with the program's objects as handles
                              (judge_job, judge_main, Handle); it checks every message it gets.
boundary.py is the codec and the conversation both use.

What an honest program can rely on is what one Python process gives it (reference.py states that
harness as code; tests/test_fidelity.py holds the verifier to it over a corpus of honest programs
and their planted-bug twins). docs/verifier.md lists the few differences that remain, each with its
reason. The rules that make this hold without trusting the program:
  names      the program's top-level names shadow builtins and module names as in one process,
             except where that would let a program redefine what the tests use to judge it
             (_bind_program_names: a builtin-named function is the tests' only when it is the
             function under test; a module-named one only when the tests do not use it as a module).
  values     plain data and the standard library's value types cross by value (boundary.py); a
             program's exception is raised in the judge as its own class name with its builtin
             bases, args, str and attributes (_Channel.exception); everything else is a Handle.
  handles    every use of a program object is a request the candidate answers: calls, attributes,
             items, iteration, repr/str/hash/len/bool, context managers, and every operator between
             program objects. An operator that puts a plain value of the tests beside a program
             object (`obj == 5`, `obj - 5`, `5 in obj`) is never the program's: that is how tests
             hold a result against its expected value, so it gets Python's default (identity,
             TypeError, iteration in the judge). See Handle.
  arguments  the tests' own objects that are not plain data (a lambda, a generator, an instance
             of a test class) are lent to the program: its uses of them are requests the judge
             answers (_Channel.serve), running only the tests' code. A plain list, dict or set
             the program changes in place is changed in the tests too when the call returns.
  globals    a module global of plain data that the program's functions change is updated in the
             tests' namespace with every reply (_Channel.update_globals).
"""

import array
import ast
import builtins
import collections
import importlib
import linecache
import os
import sys
import traceback
import types

from boundary import (ARGREF, EXC, EXC_CLASS, HANDLE, HYBRID, HYBRID_BASES, LENT, NAMED, OK, PREFETCH_AFTER,
                      PREFETCH_MAX, PURE_MODULES, RAISED, REFUSED, Peer, containers, describe, ext, from_bytes,
                      named_ref, pack, resolve_named, send_frame, to_plain)
from verdicts import INFRA_ERROR, BoundaryError

ROUND_TRIPS_PER_MARK = 1024  # the judge tells the executor of its requests in steps of this many

_LOAD_FAILURES = ("syntax_error", "runtime_error", "memory")  # what a failed hello may say
CANDIDATE_GONE = "candidate_gone"  # the report when the program's process died or its channel broke
_BUILTIN_NAMES = frozenset(dir(builtins))


class CandidateGone(Exception):
    """The candidate process died or stopped answering in the middle of the tests."""


class AmbiguousName(Exception):
    """The program shadows a builtin the tests may use to judge it, and nothing says which it is."""


class ForgedName(Exception):
    """The program binds a standard object under a name the standard library uses for another one
    (`from operator import truth as Counter`), and the tests use that name: refused (_forged_name)."""


class CandidateMemoryError(MemoryError):
    """The candidate raised MemoryError (its address-space limit)."""


# ============================================================================ judge side (trusted tests)

_FROM_PROGRAM = "_oubliette_from_program"  # set on each exception the judge raises for the program


# The dunders the tests may read of a program object: its names, doc and attributes' dict. Every other
# dunder the judge's machinery probes (numpy's __array_interface__, __array__, __float__ by
# attribute...) would let the program describe a value the judge builds itself, outside the codec.
_FORWARDED_DUNDERS = frozenset({"__name__", "__qualname__", "__doc__", "__module__", "__wrapped__", "__dict__"})


def _forwarded(name: str) -> bool:
    return not name.startswith("_oubliette_") and (not name.startswith("__") or name in _FORWARDED_DUNDERS)


def _program_exc_str(self):
    text = self.__dict__.get("_oubliette_str")
    return text if type(text) is str else BaseException.__str__(self)


def _program_exc_getattr(self, name: str):
    """An attribute of a program's exception that its args and plain attributes do not hold (a
    class attribute, a method): asked of the program's own exception object."""
    own = self.__dict__.get("_oubliette_handle")
    if own is None or not _forwarded(name):
        raise AttributeError(name)
    return getattr(own, name)


class _Channel(Peer):
    """The judge's end: one Handle per program object (h1 is h2 iff they name the same object), the
    tests' objects lent to the program, and the classes the tests name (Handle's operators)."""

    def __init__(self, fd: int, progress_fd: int | None = None):
        super().__init__(fd)
        self.progress_fd, self.round_trips = progress_fd, 0
        self.handles, self.classes, self.types, self.exc_classes, self.hybrids = {}, {}, {}, {}, {}
        self.argrefs: list = []  # per call in flight: the containers of its arguments (ARGREF)
        self.lent, self.lent_index = [], {}
        self.ns: dict = {}            # the tests' namespace (the program's live globals are updated in it)
        self.globals_bound: dict = {}  # name -> the value the judge last bound there for the program
        self.decoding = 0              # > 0 while a message of the program is decoded (requests made then are not the tests')
        self.hooks = {HANDLE: self.handle, NAMED: lambda ref: resolve_named(ref, True), LENT: self._lent,
                      HYBRID: self._hybrid, EXC_CLASS: self._exc_class, EXC: self.exception,
                      ARGREF: self._argref}

    def receive(self, what: str = "answering"):
        try:
            raw = self.reader.next()
        except OSError as e:
            raise CandidateGone(f"the program's channel failed while {what}: {e}") from None
        if raw is None:
            raise CandidateGone(f"the program died while {what}")
        self.decoding += 1
        try:
            return from_bytes(raw, self.hooks)
        finally:
            self.decoding -= 1

    def send(self, msg) -> None:
        try:
            send_frame(self.fd, msg)
        except OSError as e:
            raise CandidateGone(f"the program's channel failed: {e}") from None

    # -- decoding what the program sends
    def handle(self, payload):
        """A program object's Handle, or the stand-in class (ProgramClass) of a program class."""
        if type(payload) is not list or len(payload) != 5 or type(payload[0]) is not int \
                or not all(type(s) is str for s in payload[1:4]) or type(payload[4]) is not list \
                or not all(type(i) is int for i in payload[4][:64]):
            raise BoundaryError("malformed handle from the program")
        hid, label, tname, kind, mro = payload
        mro = tuple(mro[:64])
        if kind == "class":
            return self.program_class(hid, label, mro)
        h = self.handles.get(hid)
        if h is None:
            if mro:
                cls = self.program_class(mro[0], tname, mro)
            else:  # an object of a type that is not the program's (a generator, a list iterator...)
                cls = self.types.get(tname)
                if cls is None:
                    cls = self.types[tname] = type(tname if tname.isidentifier() else "object", (Handle,),
                                                   {"__slots__": (), "__doc__": _forwarded_doc})
            h = self.handles[hid] = Handle.__new__(cls)  # not cls(...): a stand-in's call is the program's
            Handle.__init__(h, self, hid, label, frozenset(mro), kind)
        return h

    def program_class(self, cid: int, name: str, mro: tuple) -> "ProgramClass":
        cls = self.classes.get(cid)
        if cls is None:
            body = {"__slots__": (), "__doc__": _forwarded_doc, "_oubliette_cid": cid, "_oubliette_cchan": self,
                    "_oubliette_cmro": frozenset(mro) | {cid}}
            cls = self.classes[cid] = ProgramClass(name if name.isidentifier() else "ProgramClass", (Handle,), body)
        return cls

    def _argref(self, k):
        inside = self.argrefs[-1] if self.argrefs else []
        if type(k) is not int or not 0 <= k < len(inside):
            raise BoundaryError("malformed reference to an argument from the program")
        return inside[k]

    def _lent(self, jid):
        if type(jid) is not int or not 0 <= jid < len(self.lent):
            raise BoundaryError(f"no object #{jid!r} was lent to the program")
        return self.lent[jid]

    def _hybrid(self, payload):
        if type(payload) is not list or len(payload) != 2:
            raise BoundaryError("malformed value from the program")
        value, h = payload[0], self.handle(payload[1]) if type(payload[1]) is list else None
        base = type(value)
        if base not in HYBRID_BASES or base is bool or not isinstance(h, Handle):
            raise BoundaryError("malformed value from the program")
        immutable = base not in (list, dict, set)
        if immutable and h._oubliette_id in self.hybrids:
            return self.hybrids[h._oubliette_id]
        key = ("hybrid", base, h._oubliette_type)
        cls = self.types.get(key)
        if cls is None:
            cls = self.types[key] = type(h._oubliette_type, (base,), dict(_HYBRID_METHODS))
        obj = base.__new__(cls, value) if base not in (list, dict, set) else base.__new__(cls)
        if base in (list, dict, set):
            base.__init__(obj, value)
        object.__setattr__(obj, "_oubliette_handle", h)
        if immutable:
            self.hybrids[h._oubliette_id] = obj  # an enum member is one object, as in the program
        return obj

    def _exc_class(self, payload):
        if type(payload) is not list or len(payload) != 4 or type(payload[0]) is not int \
                or type(payload[1]) is not str or type(payload[2]) is not list:
            raise BoundaryError("malformed exception class from the program")
        hid, name, bases, ref = payload
        cls = self.exc_classes.get(hid)
        if cls is None and _stdlib_exception(ref) is not None:
            cls = self.exc_classes[hid] = _stdlib_exception(ref)
        if cls is None:
            bases = tuple(b for b in bases if isinstance(b, type) and issubclass(b, BaseException)) or (Exception,)
            body = {"__str__": _program_exc_str, "__getattr__": _program_exc_getattr, "__module__": "__program__",
                    "_oubliette_hid": hid}
            try:
                cls = type(name if name.isidentifier() else "ProgramError", bases, body)
            except TypeError:  # bases whose layouts conflict (OSError and ValueError): the first
                cls = type(name if name.isidentifier() else "ProgramError", bases[:1], body)
            self.exc_classes[hid] = cls
        return cls

    def exception(self, payload) -> BaseException:
        """The judge's own instance of an exception the program raised or returned: its class (a
        builtin, a pure module's, or the program's rebuilt with its builtin bases), args, str and
        plain attributes."""
        if type(payload) is not list or len(payload) != 6 or not isinstance(payload[0], type) \
                or not issubclass(payload[0], BaseException) or type(payload[1]) is not list \
                or type(payload[2]) is not str or type(payload[3]) is not dict \
                or type(payload[4]) is not list or len(payload[4]) != 3 \
                or not all(x is None or isinstance(x, BaseException) for x in payload[4][:2]) \
                or type(payload[4][2]) is not bool:
            raise BoundaryError("malformed exception from the program")
        cls, args, text, attrs, (cause, context, suppress), own = payload
        if cls is MemoryError:
            cls = CandidateMemoryError
        if _steers_the_tests(cls):  # however the program named it (a lent class included)
            cls = self._exc_class([-1 - len(self.exc_classes), cls.__name__, [Exception], None])
        try:
            e = cls(*args)
        except Exception:  # noqa: BLE001 - a constructor that wants other arguments (UnicodeDecodeError)
            e = cls.__new__(cls)
        try:
            e.args = tuple(args)
            for k, v in list(attrs.items())[:32]:
                if type(k) is str and k.isidentifier() and not k.startswith("_"):
                    setattr(e, k, v)
        except Exception:  # noqa: BLE001 - read-only attributes of a builtin exception
            pass
        if "_oubliette_hid" in vars(cls):
            e.__dict__["_oubliette_str"] = text
            if type(own) is list:  # the program's own exception: its other attributes and methods
                e.__dict__["_oubliette_handle"] = self.handle(own)
        e.__cause__, e.__context__, e.__suppress_context__ = cause, context, suppress
        return e

    # -- encoding what the judge sends
    def enc(self, x):
        return to_plain(x, self._other)

    def _other(self, x, enc):
        if isinstance(x, Handle):
            return ext(HANDLE, x._oubliette_id)
        if isinstance(x, ProgramClass):
            return ext(HANDLE, x._oubliette_cid)
        if getattr(type(x), "_oubliette_hybrid", False):
            return ext(HANDLE, object.__getattribute__(x, "_oubliette_handle")._oubliette_id)
        if isinstance(x, type) and "_oubliette_hid" in vars(x):
            return ext(HANDLE, x._oubliette_hid)
        ref = named_ref(x)
        if ref is not None:
            return ext(NAMED, ref)
        if isinstance(x, BaseException):
            try:
                args = enc(list(x.args))
            except BoundaryError:
                args = [str(x)]
            return ext(EXC, [enc(type(x)), args])
        jid = self.lent_index.get(id(x))
        if jid is None:
            jid = self.lent_index[id(x)] = len(self.lent)
            self.lent.append(x)
        return ext(LENT, jid)

    # -- the conversation
    def ask(self, op: str, target: int, what: str, arg=None, args_sent=None):
        """One request of the tests' code about a program object: its value, or the program's
        exception raised here. The reply's extras (the call's changed arguments, the program's changed
        globals) are applied first. Only the tests' requests count towards the deadline's allowance,
        not those made while decoding what the program sent (hashing its keys...)."""
        if not self.decoding:
            self.round_trips += 1
            if self.round_trips % ROUND_TRIPS_PER_MARK == 0 and self.progress_fd is not None:
                send_frame(self.progress_fd, {"round_trips": ROUND_TRIPS_PER_MARK})  # the executor's deadline
        reply = self.request(op, target, arg)
        if reply[0] in (OK, RAISED) and len(reply) == 3:
            extras = reply[2]
            if type(extras) is not dict:
                raise BoundaryError("malformed reply from the program")
            if "after" in extras and args_sent is not None:
                _write_back(args_sent, extras["after"])
            if "globals" in extras:
                self.update_globals(extras["globals"])
        elif len(reply) != 2:
            raise BoundaryError("malformed reply from the program")
        if reply[0] == OK:
            return reply[1]
        if reply[0] == RAISED:
            e = reply[1]
            if not isinstance(e, BaseException):
                raise BoundaryError("malformed reply from the program")
            if isinstance(e, (StopIteration, StopAsyncIteration)) and op != "next":
                # PEP 479's rule, applied here: a call's StopIteration would end the tests' map() early
                e = RuntimeError(f"the program raised {type(e).__name__} in {what}")
            e.__dict__[_FROM_PROGRAM] = True
            raise e
        raise BoundaryError(f"{what}: {str(reply[1])[:200]}")

    def update_globals(self, changed) -> None:
        """The program's module globals it changed (a counter its functions increment, a list they
        append to), as one process's tests would read them now. Only names the judge bound to the
        program's plain data at load and the tests have not rebound; never a program function or
        class, nor anything the tests hold under a name of their own."""
        if type(changed) is not dict:
            raise BoundaryError("malformed globals from the program")
        for name, value in list(changed.items())[:256]:
            if name in self.globals_bound and self.ns.get(name) is self.globals_bound[name] \
                    and not isinstance(value, (Handle, ProgramClass)):
                self.ns[name] = self.globals_bound[name] = value

    def serve(self, msg) -> list:
        """A request of the program about an object the tests lent it: the tests' own code runs on it,
        nothing else (no attribute of a function, generator or module; no underscore attribute)."""
        try:
            if len(msg) != 4 or type(msg[1]) is not str:
                raise BoundaryError("malformed request from the program")
            _, op, target, arg = msg
            obj = self._lent(target)
            result = _serve_lent(obj, op, arg)
        except (CandidateGone, CandidateMemoryError):
            raise
        except BoundaryError as e:
            return [REFUSED, str(e)[:300]]
        except BaseException as e:  # noqa: BLE001 - the tests' code raised: the program sees it
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            try:
                return [RAISED, self._other(e, self.enc)]
            except BoundaryError as e2:
                return [REFUSED, str(e2)[:300]]
        try:
            return [OK, self.enc(result)]
        except BoundaryError as e:
            return [REFUSED, str(e)[:300]]


_CONTROL_FLOW_MODULES = frozenset({"unittest", "doctest", "bdb", "pdb"})
"""Modules whose exceptions steer the tests' own machinery (unittest.SkipTest makes a failing test
"skipped", and a skipped run still wasSuccessful()): a program's instance of one is rebuilt from its
builtin bases, so the tests' runner sees a plain error."""


def _steers_the_tests(cls: type) -> bool:
    """Whether an exception class belongs to the tests' machinery: a private class, or one of
    _CONTROL_FLOW_MODULES (unittest.SkipTest would turn a failing test into a skipped one)."""
    module = getattr(cls, "__module__", "") or ""
    return cls.__name__.startswith("_") or module.partition(".")[0] in _CONTROL_FLOW_MODULES


def _stdlib_exception(ref):
    """The judge's own exception class for [module, qualname] of a standard-library module it has
    imported already (the tests' `import dataclasses` included), so `except
    dataclasses.FrozenInstanceError` catches the program's; None otherwise (the class is then rebuilt
    from its name and builtin bases): a private class, or one of _CONTROL_FLOW_MODULES."""
    if type(ref) is not list or len(ref) != 2 or not all(type(r) is str for r in ref) \
            or ref[0].partition(".")[0] not in sys.stdlib_module_names or not ref[1].isidentifier() \
            or ref[1].startswith("_") or ref[0].partition(".")[0] in _CONTROL_FLOW_MODULES:
        return None
    cls = getattr(sys.modules.get(ref[0]), ref[1], None)
    return cls if isinstance(cls, type) and issubclass(cls, BaseException) else None


# What the program may not read an attribute of: each holds or reaches frames, and through them
# every local and global of the tests (gi_frame, f_back, f_globals, tb_frame, co_consts...).
_OPAQUE_TYPES = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.GeneratorType,
                 types.CoroutineType, types.AsyncGeneratorType, types.FrameType, types.CodeType,
                 types.TracebackType, types.ModuleType, type)
# The dunders a function's wrapper reads (functools.wraps): names and text, never its globals or closure.
_FUNCTION_DUNDERS = frozenset({"__name__", "__qualname__", "__doc__", "__module__", "__wrapped__"})


def _lent_attribute(obj, name) -> str:
    """name if the program may read (or, on the tests' own objects, set) it on a lent object: a public
    attribute of anything but _OPAQUE_TYPES (a StringIO's read, a Mock's return_value, a test
    object's fields), or a function's name and doc; AttributeError otherwise."""
    if type(name) is str and (name in _FUNCTION_DUNDERS if name.startswith("_")
                              else not isinstance(obj, _OPAQUE_TYPES)):
        return name
    raise AttributeError(f"the program may not read {name!r} of the tests' {type(obj).__name__}")


def _serve_lent(obj, op: str, arg):
    if op == "call":
        if type(arg) is not list or len(arg) != 2 or type(arg[0]) is not list or type(arg[1]) is not dict:
            raise BoundaryError("malformed call from the program")
        return obj(*arg[0], **arg[1])
    if op == "getattr":
        return getattr(obj, _lent_attribute(obj, arg))
    if op == "setattr":
        if type(arg) is not list or len(arg) != 2 or type(arg[0]) is not str or arg[0].startswith("_") \
                or getattr(type(obj), "__module__", None) != "__main__" or isinstance(obj, _OPAQUE_TYPES):
            raise AttributeError("the program may set only public attributes of the tests' own objects")
        return setattr(obj, arg[0], arg[1])
    if op in _LENT_COMPARISONS:  # the tests' own operator, on their object and the program's value
        return _LENT_COMPARISONS[op](obj, arg)
    ops = {"iter": iter, "next": next, "len": len, "bool": bool, "repr": repr, "str": str, "hash": hash}
    if op in ops:
        return ops[op](obj)
    if op == "getitem":
        return obj[arg]
    if op == "contains":
        return arg in obj
    raise BoundaryError(f"unknown request {op!r}")


_LENT_COMPARISONS = {"eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "lt": lambda a, b: a < b,
                     "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b}


def _write_back(sent: list, after) -> None:
    """The program changed a plain container the tests passed it: make the tests' own objects hold
    what the program's copies hold now, keeping their identity (and their nested containers')."""
    if type(after) is not list or len(after) != 2:
        raise BoundaryError("malformed reply from the program")
    args, kwargs = sent
    if type(after[0]) is list and len(after[0]) == len(args):
        for mine, theirs in zip(args, after[0]):
            _sync(mine, theirs)
    if type(after[1]) is dict:
        for k, v in kwargs.items():
            if k in after[1]:
                _sync(v, after[1][k])


def _sync(mine, theirs, depth: int = 0) -> None:
    """Make the tests' container `mine` hold what the program's copy `theirs` holds now; nested
    containers of the same type are synced in place, so a row the tests kept sees the change too."""
    if depth > 100 or mine is theirs:
        return
    if isinstance(mine, list) and isinstance(theirs, list):
        new = list(theirs)
        for i in range(min(len(mine), len(new))):
            if type(mine[i]) is type(new[i]) and isinstance(mine[i], (list, dict, set, bytearray)):
                _sync(mine[i], new[i], depth + 1)
                new[i] = mine[i]
        mine[:] = new
    elif isinstance(mine, dict) and isinstance(theirs, dict):
        new = dict(theirs)
        for k, v in mine.items():
            if k in new and type(v) is type(new[k]) and isinstance(v, (list, dict, set, bytearray)):
                _sync(v, new[k], depth + 1)
                new[k] = v
        mine.clear()
        mine.update(new)
    elif isinstance(mine, (set, bytearray, collections.deque)) and type(theirs) is type(mine):
        mine.clear()
        (mine.update if isinstance(mine, set) else mine.extend)(theirs)
    elif type(mine) is array.array and type(theirs) is array.array and mine.typecode == theirs.typecode:
        mine[:] = theirs
    elif type(mine) is tuple and type(theirs) is tuple and len(mine) == len(theirs):  # its lists can change
        for m, t in zip(mine, theirs):
            if type(m) is type(t):
                _sync(m, t, depth + 1)


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
        if not _forwarded(name):
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
                exc.__dict__[_FROM_PROGRAM] = True
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


_forwarded_doc = property(lambda self: self._oubliette_ask("getattr", f"{self._oubliette_label}.__doc__", "__doc__"))


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
        if not _forwarded(name):
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
    if not _forwarded(name):
        raise AttributeError(name)
    return getattr(object.__getattribute__(self, "_oubliette_handle"), name)


_HYBRID_METHODS = {
    "_oubliette_hybrid": True,
    "__getattr__": _hybrid_getattr,
    "__repr__": lambda self: repr(object.__getattribute__(self, "_oubliette_handle")),
    "__str__": lambda self: str(object.__getattribute__(self, "_oubliette_handle")),
}
"""An instance of a program's subclass of a builtin value type, in the judge: the builtin value
(compared, hashed and computed with by the builtin type's own methods) and the program's object
behind it (its other attributes, repr and str)."""


def _test_line(exc: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == "<tests>"]
    return f" at tests line {frames[-1].lineno}: {frames[-1].line}" if frames else ""


def _message(e: BaseException) -> str:
    """An exception's message without asking the program anything: str(e) of `assert r == 5, r`
    would call repr() on a handle or a hybrid, a request the program answers (with a SystemExit, or
    not at all). Plain args are shown; others by their type."""
    def show(a):
        if type(a) in (str, int, float, bool, bytes, type(None)):
            return a if type(a) is str else repr(a)
        if isinstance(a, Handle):
            return f"<program object {a._oubliette_label}>"
        return f"<{type(a).__name__}>"
    try:
        return " ".join(show(a) for a in e.args)[:300]
    except BaseException:  # noqa: BLE001 - a huge int, an args attribute replaced...
        return "(no message)"


def _failure_report(e: BaseException) -> dict:
    """What an exception that ended the tests says about the program (never infra_error: all of
    these arise from the program's values or behaviour, or from tests acting on them)."""
    try:
        return _describe_failure(e)
    except BaseException:  # noqa: BLE001 - describing it asked something of the program that failed
        return {"status": "failed", "detail": f"the tests failed ({type(e).__name__})"}


def _describe_failure(e: BaseException) -> dict:
    where, msg = _test_line(e), _message(e)
    if isinstance(e, MemoryError):  # the program's, or ours holding its values: both its doing
        return {"status": "memory", "detail": "out of memory" + (
            " in the program" if isinstance(e, CandidateMemoryError) else " holding the program's values")}
    if getattr(e, "__dict__", {}).get(_FROM_PROGRAM):
        return {"status": "runtime_error", "detail": f"the program raised {type(e).__name__}: {msg}{where}"}
    if isinstance(e, CandidateGone):  # a fact, not a verdict: the executor knows how it died
        return {"status": CANDIDATE_GONE, "detail": msg}
    if isinstance(e, AssertionError):
        return {"status": "failed", "detail": f"assertion failed{where}" + (f": {msg[:200]}" if msg else "")}
    if isinstance(e, (BoundaryError, AmbiguousName, ForgedName)):
        return {"status": "failed", "detail": f"{msg}{where}"}
    return {"status": "failed", "detail": f"the tests raised {type(e).__name__}: {msg}{where}"}


# ---------------------------------------------------------------------------- the tests' namespace

class _TestNames:
    """What the tests' code does with names: every name it reads (loads), the names it reads an
    attribute of (attr_hosts: `math.isclose` uses math as a module), and the names it calls on
    another call of the program (helpers: `abs(f(x) - y)`, `sorted(g(x))` judge f's and g's results)."""

    @classmethod
    def from_superset(cls, names: set) -> "_TestNames":
        """Without parsing: when the program has no name of a builtin or a module, the names the
        tests' code mentions are enough (_judge_imports)."""
        used = cls.__new__(cls)
        used.loads, used.attr_hosts, used.helpers = names, set(), set()
        return used

    def __init__(self, tree: ast.AST, program_names: set):
        self.loads, self.attr_hosts, self.helpers = set(), set(), set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                self.loads.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                self.attr_hosts.add(node.value.id)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and any(_calls_program(arg, program_names) for arg in [*node.args, *node.keywords]):
                self.helpers.add(node.func.id)


def _calls_program(tree: ast.AST, program_names: set) -> bool:
    """Whether an expression calls one of the program's names (`f(3)`, `obj.area()` on a program name)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            root = node.func
            while isinstance(root, (ast.Attribute, ast.Call, ast.Subscript)):
                root = root.func if isinstance(root, ast.Call) else root.value
            if isinstance(root, ast.Name) and root.id in program_names:
                return True
    return False


def _bound_by_tests(tree: ast.AST) -> set:
    """Every name the tests bind anywhere: assigned, a loop or with or except target, imported,
    defined, declared global: the tests' own, never updated from the program (_Channel.update_globals)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).partition(".")[0] for a in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            names.update(node.names)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            names.add(node.name)
    return names


def _checked_name(tree: ast.AST) -> str | None:
    """NAME in the tests' top-level `check(NAME)`: HumanEval's tests as training jobs send them (the
    entry point called at the end), read as the job's entry point."""
    for node in getattr(tree, "body", []):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name) \
                and node.value.func.id == "check" and len(node.value.args) == 1 \
                and isinstance(node.value.args[0], ast.Name):
            return node.value.args[0].id
    return None


def _code_names(code: types.CodeType) -> set:
    """Every name the compiled tests mention (globals, attributes, locals' names aside)."""
    names, stack = set(), [code]
    while stack:
        c = stack.pop()
        names.update(c.co_names)
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return names


def _judge_imports(imports, wanted: set) -> dict:
    """What the tests may use of the program's imports ({name: [module, attribute]} from its hello),
    as the usual harnesses allow (`math.isclose`, `Counter`), built by the judge alone: it imports
    each module itself, by name: a standard-library module under its own name (`import sys`) or, under
    any name, a module of PURE_MODULES (`import re as regex`) or a public name of one
    (resolve_named). Only the names the tests use (wanted) are imported. Malformed or disallowed
    entries are skipped (a test using one gets NameError: the program's failure)."""
    out = {}
    if type(imports) is not dict:
        return out
    for name, origin in list(imports.items())[:256]:
        if name not in wanted or type(name) is not str or not name.isidentifier() or name.startswith("__") \
                or type(origin) is not list or len(origin) != 2 or not all(type(s) is str for s in origin):
            continue
        module, attr = origin
        try:
            if not attr:
                if module in PURE_MODULES or (name == module.partition(".")[0] and module in sys.stdlib_module_names
                                              and module.isidentifier()):
                    out[name] = importlib.import_module(name if name == module.partition(".")[0] else module)
            else:
                out[name] = resolve_named([module, attr], True)
        except (BoundaryError, ImportError):
            continue
    return out


# Modules whose public names tests commonly use without importing them (`Counter`, `isclose`,
# `defaultdict`): a standard object the program binds under one of those names must be that object.
_TRUSTED_HOMES = (*sorted(PURE_MODULES), "decimal", "random", "typing")
_standard: tuple[dict, dict] | None = None


def standard_names() -> tuple[dict[str, tuple[list, set]], dict[int, str]]:
    """({name: (where it is defined, ids of the objects it stands for)}, {id: a name} of every
    standard object): each public name of _TRUSTED_HOMES and each of those modules' own name (for the
    module), and among the objects also every builtin."""
    global _standard
    if _standard is None:
        names: dict[str, tuple[list, set]] = {}
        objects = {id(v): n for n, v in vars(builtins).items()}
        for home in _TRUSTED_HOMES:
            module = importlib.import_module(home)
            names.setdefault(home, ([], set()))[0].append(home)
            names[home][1].add(id(module))
            for name, value in vars(module).items():
                if not name.startswith("_") and (callable(value) or isinstance(value, types.ModuleType)):
                    names.setdefault(name, ([], set()))[0].append(f"{home}.{name}")
                    names[name][1].add(id(value))
                    objects.setdefault(id(value), f"{home}.{name}")
        _standard = names, objects
    return _standard


def _forged_name(name: str, value) -> str | None:
    """Why binding `value` under `name` forges a name the tests may rely on, or None: a standard
    object (one the judge resolved: a builtin, a pure module's function or class, a module) under
    the name of a different standard object. A program's own function under such a name is its own,
    as in one process (`python curate.py check` warns about tests that trust it). Builtins' names
    have their own rule (_bind_program_names)."""
    names, objects = standard_names()
    if name not in names or name in _BUILTIN_NAMES or id(value) in names[name][1]:
        return None
    if not isinstance(value, types.ModuleType) and id(value) not in objects:
        return None  # the program's own object (a Handle, a value): never asked anything here
    what = value.__name__ if isinstance(value, types.ModuleType) else objects[id(value)]
    return (f"the program binds {what} under the name {name}, which stands for "
            f"{' or '.join(names[name][0])}: a name the tests use must be what it says")


def trusted_names(tests: str) -> list[str]:
    """The standard names (standard_names: `Counter`, `isclose`, `math`) the tests judge with but
    neither import nor define: applied to another call's result (`Counter(words(s))`) or used as a
    module (`math.sqrt`). They take the program's, whatever it binds there (`python curate.py check`
    warns). The function under test (`add(2, 3)`, the NAME of `check(NAME)`) is the program's by design."""
    tree = ast.parse(tests)
    judging = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and any(
                isinstance(sub, ast.Call) for arg in [*node.args, *(k.value for k in node.keywords)]
                for sub in ast.walk(arg)):
            judging.add(node.func.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            judging.add(node.value.id)
    judging -= _bound_by_tests(tree) | {_checked_name(tree)}
    return sorted(n for n in judging if n in standard_names()[0] and n not in _BUILTIN_NAMES)


def _bind_program_names(ns: dict, values: dict, imports: dict, used: _TestNames, entry_point) -> None:
    """Bind the program's names for the tests as one process would, except where that would let the
    program redefine what the tests use to judge it:
      a builtin's name (`def max`, `from math import pow`) is the program's when it is the entry
      point or, without one, when the tests never call it on a result of the program (the function
      under test: `assert pow(2, 3) == 8`); a name the tests apply to another call of the program
      (`abs(f(x) - y)`, `sorted(g(x))`, `len(h())`) stays Python's, since there it judges that
      call's result and the program could replace it with one that always agrees;
      a standard-library module's name (`def tokenize`, `check(fnmatch)`) is the program's callable
      unless the tests use it as a module (`math.isclose`: then it is the judge's import of that
      module, if the program imported it, or undefined);
      every other name is the program's (a value, a name the judge resolves, or a Handle), and the
      program's imports of standard modules are the judge's own imports (_judge_imports);
      but a standard object under the name of another (`from operator import truth as Counter`,
      `import cmath as math`) that the tests use, other than the function under test, is refused:
      ForgedName, the program's failure (_forged_name)."""
    program = {**values, **imports}
    for name in sorted(program.keys() & used.loads - {entry_point}):
        if (why := _forged_name(name, program[name])) is not None:
            raise ForgedName(why)
    under_test = {n for n, v in program.items() if n in used.loads and n not in used.helpers and callable(v)
                  and not isinstance(v, types.ModuleType)}
    shadowing = {n for n in under_test if n in _BUILTIN_NAMES}
    if entry_point is None and shadowing and len(under_test) > 1:
        raise AmbiguousName(f"the program defines {', '.join(sorted(shadowing))}, named like a builtin, and the "
                            f"tests use other functions of it too ({', '.join(sorted(under_test - shadowing))}): "
                            "the judge cannot tell the function under test from a builtin the tests apply "
                            "(name the entry point, or rename it)")
    for name, value in program.items():
        if name in _BUILTIN_NAMES:
            if name != entry_point and (entry_point is not None or name not in shadowing):
                continue
        elif name in sys.stdlib_module_names and name != entry_point and not isinstance(value, types.ModuleType):
            if name in used.attr_hosts or not callable(value):
                continue
        ns[name] = value


def judge_main(tests: str, code: types.CodeType, entry_point: str | None, fd: int,
               progress_fd: int | None = None) -> dict:
    """Runs in the judge process, once the tests compiled: build the tests' namespace, run the tests,
    return the report {"status", "detail"} (status in JUDGE_STATUSES).

    The namespace is the judge's own: its builtins, its imports of standard modules (_judge_imports),
    and the program's names (_bind_program_names) as values decoded by the codec or Handles to the
    candidate. Nothing of the program runs here, and no dunder name of the program is bound (a
    program-supplied `__builtins__` would make every builtin the tests call a call into the program)."""
    chan = _Channel(fd, progress_fd)
    tests_module = types.ModuleType("__main__")  # the tests are __main__, as `python tests.py` runs them:
    sys.modules["__main__"] = tests_module       # unittest.main() and `if __name__ == "__main__":` find them
    ns = tests_module.__dict__
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
        chan.decoding += 1
        values = {name: from_bytes(packed, chan.hooks) for name, packed in names.items()
                  if type(name) is str and name.isidentifier() and not name.startswith("__")
                  and type(packed) is bytes}
        chan.decoding -= 1
        imports = hello.get("imports") if type(hello.get("imports")) is dict else {}
        shadowing = any(n in _BUILTIN_NAMES or n in sys.stdlib_module_names for n in [*values, *imports])
        tree = ast.parse(tests, "<tests>") if shadowing else None
        used = _TestNames(tree, {*values, *imports}) if shadowing else _TestNames.from_superset(_code_names(code))
        # the function under test: the job's entry point, or the NAME of the tests' own `check(NAME)`
        subject = entry_point if entry_point is not None else _checked_name(tree) if tree is not None else None
        wanted = used.loads | ({entry_point} if entry_point else set())  # check(f) is the judge's call
        _bind_program_names(ns, values, _judge_imports(imports, wanted), used, subject)
        if entry_point is not None and not callable(ns.get(entry_point)):
            return {"status": "failed", "detail": f"the program does not define {entry_point}()"}
        chan.ns = ns  # the program's plain data names, kept current as its functions change them
        pushable = {n for n, v in values.items() if ns.get(n) is v
                    and not isinstance(v, (Handle, ProgramClass)) and not callable(v)} & _code_names(code)
        if pushable:  # never a name the tests bind anywhere: theirs, even when it holds the same object
            pushable -= _bound_by_tests(tree if tree is not None else ast.parse(tests, "<tests>"))
        chan.globals_bound = {n: values[n] for n in pushable}
        ns.update(__name__="__main__", __builtins__=builtins)
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


def judge_job(tests: str, entry_point: str | None, fd: int, marks_fd: int, progress_fd: int | None = None) -> dict:
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
        return judge_main(tests, code, entry_point, fd, progress_fd)
    except (MemoryError, CandidateGone, BoundaryError, RecursionError) as e:
        return _failure_report(e)
    except BaseException as e:  # noqa: BLE001
        return {"status": INFRA_ERROR, "detail": f"the judge failed: {describe(e)}"}


JUDGE_STATUSES = ("passed", "failed", CANDIDATE_GONE, "memory", INFRA_ERROR) + _LOAD_FAILURES
"""What a judge's report may say: a verdict's status, or CANDIDATE_GONE, which the executor turns
into one (Executor._verdict_of_assert: only it sees how the candidate's process ended)."""
