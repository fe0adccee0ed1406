"""The judge of the verifier: the trusted side of an assert job.

Two processes per assert job, both forked from the executor's launcher (executor.py), which imported
their code before it entered the sandbox:
  candidate (candidate.py, untrusted)  the program's own process: runs the program, says hello (its
                              names), then answers the judge's requests about its objects.
  judge (here, trusted)       forked for one job and confined as a candidate is: runs the tests in a
                              namespace it builds itself, with the program's objects as handles
                              (judge_job, judge_main); it checks every message it gets.
boundary.py is the codec and the conversation both use; judge_names.py builds the tests' namespace;
judge_handles.py holds the program's objects in the judge (Handle, ProgramClass).

What an honest program can rely on is what one Python process gives it (reference.py states that
harness as code; tests/test_fidelity.py holds the verifier to it over a corpus of honest programs
and their planted-bug twins). docs/verifier.md lists the few differences that remain, each with its
reason. The rules that make this hold without trusting the program:
  names      the program's top-level names shadow builtins and module names as in one process,
             except where that would let a program redefine what the tests use to judge it
             (judge_names.bind_program_names: a builtin-named function is the tests' only when it is the
             function under test; a module-named one only when the tests do not use it as a module).
  values     plain data and the standard library's value types cross by value (boundary.py); a
             program's exception is raised in the judge as its own class name with its builtin
             bases, args, str and attributes (_Channel.exception); everything else is a Handle.
  handles    every use of a program object is a request the candidate answers: calls, attributes,
             items, iteration, repr/str/hash/len/bool, context managers, and every operator between
             program objects. An operator that puts a plain value of the tests beside a program
             object (`obj == 5`, `obj - 5`, `5 in obj`) is never the program's: that is how tests
             hold a result against its expected value, so it gets Python's default (identity,
             TypeError, iteration in the judge). See judge_handles.Handle.
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
import linecache
import os
import sys
import traceback
import types

from boundary import (ARGREF, EXC, EXC_CLASS, HANDLE, HYBRID, HYBRID_BASES, LENT, NAMED, OK, RAISED, REFUSED, Peer,
                      describe, ext, from_bytes, named_ref, resolve_named, send_frame, to_plain)
from judge_handles import FROM_PROGRAM, HYBRID_METHODS, CandidateGone, Handle, ProgramClass, forwarded, forwarded_doc
from judge_names import (BUILTIN_NAMES, AmbiguousName, ForgedName, TestNames, bind_program_names, bound_by_tests,
                         checked_name, code_names, judge_imports)
from verdicts import INFRA_ERROR, BoundaryError

ROUND_TRIPS_PER_MARK = 1024  # the judge tells the executor of its requests in steps of this many

_LOAD_FAILURES = ("syntax_error", "runtime_error", "memory")  # what a failed hello may say
CANDIDATE_GONE = "candidate_gone"  # the report when the program's process died or its channel broke


class CandidateMemoryError(MemoryError):
    """The candidate raised MemoryError (its address-space limit)."""


# ============================================================================ judge side (trusted tests)

def _program_exc_str(self):
    text = self.__dict__.get("_oubliette_str")
    return text if type(text) is str else BaseException.__str__(self)


def _program_exc_getattr(self, name: str):
    """An attribute of a program's exception that its args and plain attributes do not hold (a
    class attribute, a method): asked of the program's own exception object."""
    own = self.__dict__.get("_oubliette_handle")
    if own is None or not forwarded(name):
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
                                                   {"__slots__": (), "__doc__": forwarded_doc})
            h = self.handles[hid] = Handle.__new__(cls)  # not cls(...): a stand-in's call is the program's
            Handle.__init__(h, self, hid, label, frozenset(mro), kind)
        return h

    def program_class(self, cid: int, name: str, mro: tuple) -> "ProgramClass":
        cls = self.classes.get(cid)
        if cls is None:
            body = {"__slots__": (), "__doc__": forwarded_doc, "_oubliette_cid": cid, "_oubliette_cchan": self,
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
            cls = self.types[key] = type(h._oubliette_type, (base,), dict(HYBRID_METHODS))
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
            e.__dict__[FROM_PROGRAM] = True
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
    if getattr(e, "__dict__", {}).get(FROM_PROGRAM):
        return {"status": "runtime_error", "detail": f"the program raised {type(e).__name__}: {msg}{where}"}
    if isinstance(e, CandidateGone):  # a fact, not a verdict: the executor knows how it died
        return {"status": CANDIDATE_GONE, "detail": msg}
    if isinstance(e, AssertionError):
        return {"status": "failed", "detail": f"assertion failed{where}" + (f": {msg[:200]}" if msg else "")}
    if isinstance(e, (BoundaryError, AmbiguousName, ForgedName)):
        return {"status": "failed", "detail": f"{msg}{where}"}
    return {"status": "failed", "detail": f"the tests raised {type(e).__name__}: {msg}{where}"}


def judge_main(tests: str, code: types.CodeType, entry_point: str | None, fd: int,
               progress_fd: int | None = None) -> dict:
    """Runs in the judge process, once the tests compiled: build the tests' namespace, run the tests,
    return the report {"status", "detail"} (status in JUDGE_STATUSES).

    The namespace is the judge's own: its builtins, its imports of standard modules (judge_imports),
    and the program's names (bind_program_names) as values decoded by the codec or Handles to the
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
        shadowing = any(n in BUILTIN_NAMES or n in sys.stdlib_module_names for n in [*values, *imports])
        tree = ast.parse(tests, "<tests>") if shadowing else None
        used = TestNames(tree, {*values, *imports}) if shadowing else TestNames.from_superset(code_names(code))
        # the function under test: the job's entry point, or the NAME of the tests' own `check(NAME)`
        subject = entry_point if entry_point is not None else checked_name(tree) if tree is not None else None
        wanted = used.loads | ({entry_point} if entry_point else set())  # check(f) is the judge's call
        bind_program_names(ns, values, judge_imports(imports, wanted), used, subject)
        if entry_point is not None and not callable(ns.get(entry_point)):
            return {"status": "failed", "detail": f"the program does not define {entry_point}()"}
        chan.ns = ns  # the program's plain data names, kept current as its functions change them
        pushable = {n for n, v in values.items() if ns.get(n) is v
                    and not isinstance(v, (Handle, ProgramClass)) and not callable(v)} & code_names(code)
        if pushable:  # never a name the tests bind anywhere: theirs, even when it holds the same object
            pushable -= bound_by_tests(tree if tree is not None else ast.parse(tests, "<tests>"))
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
