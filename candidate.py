"""The candidate side of the verifier: the program's own process (untrusted).

Forked from the executor's launcher (executor.py) for one job and confined there, it runs the program
and then, for an assert job, answers the judge's requests about the program's objects (candidate_main);
for an io job it runs the program as __main__ on stdin/stdout (io_candidate_main). Everything here runs
after the program, in its process: it is as untrusted as the program, which can patch or replace any
of it, so the judge (judge.py) checks every message it gets and decides every verdict. boundary.py is
the codec and the conversation both sides use. Standard library and msgpack only: no numpy, no zmq
(tests/test_verifier.py checks).
"""

import atexit
import builtins
import copy
import operator
import os
import sys
import threading
import time
import traceback
import types

from boundary import (CONTAINERS, EXC, EXC_CLASS, HANDLE, HYBRID, HYBRID_BASES, LENT, MAX_RPC_BYTES, NAMED, OK, PREFETCH_BUDGET_S,
                      PREFETCH_MAX, PURE_MODULES, RAISED, REFUSED, Peer, TooBig, containers, describe, ext,
                      from_bytes, named_ref, pack, resolve_named, send_frame, to_plain)
from verdicts import BoundaryError

HELLO_VALUE_NODES = 100_000  # a module-level value bigger than this (or 1 MiB of text) is exported as a handle,
# found before it is copied: a 200 MiB table must not cost the program its memory limit
LIVE_NODES = 1_000  # a live global up to this size is compared by content after every request
HELLO_VALUE_BYTES = 1 << 20

# The operators a request may name: operator's functions, run on the candidate's objects.
_OPERATORS = frozenset({
    "eq", "ne", "lt", "le", "gt", "ge", "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul",
    "and_", "or_", "xor", "lshift", "rshift", "iadd", "isub", "imul", "itruediv", "ifloordiv", "imod",
    "ipow", "imatmul", "iand", "ior", "ixor", "ilshift", "irshift", "neg", "pos", "abs", "invert",
    "index", "contains"})
_CONVERSIONS = {"int": int, "float": float, "complex": complex, "bytes": bytes, "round": round, "trunc": lambda x: x.__trunc__(),
                "floor": lambda x: x.__floor__(), "ceil": lambda x: x.__ceil__(), "reversed": reversed}


class _Lent:
    # A test's object lent to the program (a lambda, a generator, a test class's instance): every use
    # is a request to the judge, which runs the tests' code. (No docstring: __doc__ is the object's.)
    __slots__ = ("_cand", "_jid")
    __doc__ = property(lambda self: self._ask("getattr", "__doc__"))

    def __init__(self, cand, jid):
        object.__setattr__(self, "_cand", cand)
        object.__setattr__(self, "_jid", jid)

    def _ask(self, op, arg=None):
        return self._cand.result(self._cand.request(op, self._jid, arg))

    def __call__(self, *args, **kwargs):
        return self._ask("call", [self._cand.enc(list(args)), self._cand.enc(kwargs)])

    def __iter__(self):
        return self._ask("iter")

    def __next__(self):
        return self._ask("next")

    def __len__(self):
        return self._ask("len")

    def __bool__(self):
        return self._ask("bool")

    def __getitem__(self, key):
        return self._ask("getitem", self._cand.enc(key))

    def __contains__(self, x):
        return self._ask("contains", self._cand.enc(x))

    def __getattr__(self, name):
        if name.startswith("__") and name not in ("__name__", "__qualname__", "__doc__", "__module__",
                                                  "__wrapped__"):
            raise AttributeError(name)
        return self._ask("getattr", name)

    def __setattr__(self, name, value):
        self._ask("setattr", [name, self._cand.enc(value)])

    def __eq__(self, other):
        return self._ask("eq", self._cand.enc(other))

    def __ne__(self, other):
        return self._ask("ne", self._cand.enc(other))

    def __lt__(self, other):
        return self._ask("lt", self._cand.enc(other))

    def __le__(self, other):
        return self._ask("le", self._cand.enc(other))

    def __gt__(self, other):
        return self._ask("gt", self._cand.enc(other))

    def __ge__(self, other):
        return self._ask("ge", self._cand.enc(other))

    def __hash__(self):
        return self._ask("hash")

    def __repr__(self):
        return self._ask("repr")

    def __str__(self):
        return self._ask("str")


class Candidate(Peer):
    """The candidate's end: its objects by id, the judge's lent objects as _Lent proxies."""

    def __init__(self, fd: int, ns: dict):
        super().__init__(fd)
        self.ns, self.objects, self.index, self.lent, self.live = ns, [], {}, {}, {}
        self.hooks = {HANDLE: self._own, NAMED: lambda ref: resolve_named(ref, False), LENT: self._lent,
                      EXC: self._exception}

    # -- values
    def hid(self, x) -> int:
        """The id the judge knows x by. A bound method is made anew at every attribute read, so it is
        known by its object and function: `obj.add` read 100,000 times is one handle, not 100,000."""
        key = (id(x.__self__), id(x.__func__)) if type(x) is types.MethodType else id(x)
        h = self.index.get(key)
        if h is None:
            h = self.index[key] = len(self.objects)
            self.objects.append(x)
        return h

    def _own(self, hid):
        if type(hid) is not int or not 0 <= hid < len(self.objects):
            raise BoundaryError(f"no program object #{hid!r}")
        return self.objects[hid]

    def _lent(self, jid):
        p = self.lent.get(jid)
        if p is None:
            p = self.lent[jid] = _Lent(self, jid)
        return p

    def _exception(self, payload):
        cls, args = payload[0], tuple(payload[1])
        try:
            return cls(*args)
        except Exception:  # noqa: BLE001 - a program class whose __init__ wants other arguments
            e = cls.__new__(cls)
            e.args = args
            return e

    def enc(self, x, budget=None):
        return to_plain(x, self._other, budget=budget)

    def _other(self, x, enc):
        if isinstance(x, _Lent):
            return ext(LENT, object.__getattribute__(x, "_jid"))
        ref = named_ref(x)
        if ref is not None:
            return ext(NAMED, ref)
        if isinstance(x, BaseException):
            return ext(EXC, self._exc_payload(x, enc))
        if isinstance(x, type) and issubclass(x, BaseException):
            bases = [enc(b) for b in x.__bases__ if issubclass(b, BaseException)]
            mod = getattr(x, "__module__", None)
            ref = [mod, x.__qualname__] if type(mod) is str and mod.partition(".")[0] in sys.stdlib_module_names \
                and getattr(sys.modules.get(mod), x.__qualname__, None) is x else None
            return ext(EXC_CLASS, [self.hid(x), str(x.__name__)[:80], bases, ref])
        base = next((b for b in type(x).__mro__ if b in HYBRID_BASES), None)
        if base is not None:
            return ext(HYBRID, [enc(_base_value(x, base)), self._handle_payload(x)])
        return ext(HANDLE, self._handle_payload(x))

    def _handle_payload(self, x) -> list:
        """[id, label, type name, kind, ids of the program classes in its class's mro]."""
        cls = x if isinstance(x, type) else type(x)
        mro = [self.hid(c) for c in cls.__mro__ if c.__module__ == PROGRAM_MODULE]
        kind = "class" if isinstance(x, type) else "function" if callable(x) else "object"
        label = getattr(x, "__qualname__", None) if kind != "object" else cls.__qualname__
        return [self.hid(x), str(label if type(label) is str else cls.__qualname__)[:80],
                str(type(x).__name__)[:80], kind, mro]

    def _exc_payload(self, e: BaseException, enc) -> list:
        try:
            args = enc(list(e.args))
        except Exception:  # noqa: BLE001 - args that cannot cross: the message stands in
            args = [describe(e).partition(": ")[2]]
        try:
            text = str(e)
        except Exception:  # noqa: BLE001
            text = "(unprintable)"
        attrs = {}
        for k, v in list(getattr(e, "__dict__", {}).items())[:32]:
            if type(k) is str and not k.startswith("_"):
                try:
                    attrs[k] = enc(v)
                except Exception:  # noqa: BLE001 - an attribute that cannot cross is left out
                    pass
        if isinstance(e, OSError):  # slots, not __dict__: errno, strerror, filename, filename2
            for k in ("errno", "strerror", "filename", "filename2"):
                try:
                    attrs[k] = enc(getattr(e, k))
                except Exception:  # noqa: BLE001
                    pass
        chain = []
        for linked in (e.__cause__, e.__context__):
            try:
                chain.append(enc(linked) if isinstance(linked, BaseException) and linked is not e else None)
            except Exception:  # noqa: BLE001 - a linked exception that cannot cross is left out
                chain.append(None)
        own = self._handle_payload(e) if type(e).__module__ == PROGRAM_MODULE else None
        return [enc(type(e)), args, text[:2000], attrs, [*chain, bool(e.__suppress_context__)], own]

    # -- the conversation
    def receive(self):
        raw = self.reader.next()
        if raw is None:
            os._exit(0)  # the judge is done with us
        return from_bytes(raw, self.hooks)

    def result(self, reply):
        """A reply of the judge about a lent object -> the value, or raise what the tests raised."""
        if reply[0] == OK:
            return reply[1]
        if reply[0] == RAISED and isinstance(reply[1], BaseException):
            raise reply[1]
        raise RuntimeError(f"the tests' object refused: {str(reply[1])[:200]}")

    def serve(self, msg) -> list:
        """The reply to one request of the judge, with what the request changed that the tests can
        see: the call's arguments ("after") and the program's live globals ("globals")."""
        extras, refs = {}, None
        try:
            _, op, target, arg = msg
            if op == "next":
                return self._with_globals(self._next_batch(self._own(target), arg), extras)
            obj = self._own(target)
            if op == "call":  # arg: the packed [args, kwargs], kept to tell whether the call changed them
                raw, arg = arg, from_bytes(arg, self.hooks) if type(arg) is bytes else None
                if type(arg) is not list or len(arg) != 2 or type(arg[0]) is not list or type(arg[1]) is not dict:
                    raise BoundaryError("malformed call")
                inside = containers(arg)
                try:
                    result = obj(*arg[0], **arg[1])
                finally:
                    if inside and pack(after := self.enc(arg)) != raw:
                        extras["after"] = after
                refs = {id(c): k for k, c in enumerate(inside)} if inside else None
            else:
                result = self._simple(obj, op, arg)
        except BoundaryError as e:
            return [REFUSED, str(e)[:300]]
        except StopIteration as e:  # a call's StopIteration would end the tests' map() or zip() early
            return self._with_globals(self._raised(RuntimeError(f"the program raised StopIteration{_args(e)}")), extras)
        except BaseException as e:  # noqa: BLE001 - reported to the judge, which raises it in the tests
            return self._with_globals(self._raised(e), extras)
        return self._with_globals(self._reply(result, refs), extras)

    def _simple(self, obj, op: str, arg):
        """Every request but a call and next: an operator, a conversion or a protocol of obj."""
        if op == "op":
            name, reflected, others = arg
            if name not in _OPERATORS or type(others) is not list or len(others) > 1:
                raise BoundaryError(f"unknown operator {name!r}")
            return getattr(operator, name)(*([*others, obj] if reflected else [obj, *others]))
        if op == "conv":
            return _CONVERSIONS[arg[0]](obj, *arg[1:])
        if op not in _SIMPLE_OPS:
            raise BoundaryError(f"unknown request {op!r}")
        return _SIMPLE_OPS[op](obj, arg)

    def _with_globals(self, reply: list, extras: dict) -> list:
        """reply + [extras] when there are any: the live globals whose value changed since the judge
        last saw them (_changed_globals), and the call's changed arguments."""
        if reply[0] in (OK, RAISED):
            try:
                changed = self._changed_globals()
            except Exception:  # noqa: BLE001 - a global that cannot cross: the tests keep the old value
                changed = {}
            if changed:
                extras["globals"] = changed
            if extras:
                reply = [*reply, extras]
        return reply

    def _changed_globals(self) -> dict:
        """{name: value} of the live globals (_live_names) rebound or changed in place since the judge
        last saw them. A container of at most LIVE_NODES items is compared by its packed bytes; a
        bigger one by identity and length only (so a same-length change to it is not seen)."""
        changed = {}
        for name, (ident, size, packed) in list(self.live.items()):
            value = self.ns.get(name)
            if packed is None and id(value) == ident and _size(value) == size:
                continue
            try:
                now = self.enc(value, budget=[LIVE_NODES, HELLO_VALUE_BYTES])
                now_packed = pack(now)
            except TooBig:
                now, now_packed = self.enc(value), None
            if id(value) == ident and now_packed is not None and now_packed == packed:
                continue
            self.live[name] = (id(value), _size(value), now_packed)
            changed[name] = now
        return changed

    def track(self, names: list) -> None:
        """Start watching these globals as the judge has them now (the hello's values)."""
        for name in names:
            value = self.ns.get(name)
            try:
                packed = pack(self.enc(value, budget=[LIVE_NODES, HELLO_VALUE_BYTES]))
            except TooBig:
                packed = None
            except Exception:  # noqa: BLE001 - a global that cannot cross is not watched
                continue
            self.live[name] = (id(value), _size(value), packed)

    def _reply(self, result, refs=None) -> list:
        try:
            value = to_plain(result, self._other, refs=refs)
            reply = [OK, value]
            if len(pack(reply)) > MAX_RPC_BYTES - 1024:
                return [REFUSED, "a result above the frame limit"]
            return reply
        except (BoundaryError, ValueError, TypeError, OverflowError, RecursionError) as e:
            return [REFUSED, f"the result cannot cross the boundary: {describe(e)}"]

    def _raised(self, e: BaseException) -> list:
        try:
            return [RAISED, ext(EXC, self._exc_payload(e, lambda v: self.enc(v)))]
        except BaseException as e2:  # noqa: BLE001 - an exception class that cannot cross
            return [REFUSED, f"the program raised {describe(e)} ({describe(e2)})"]

    def _next_batch(self, it, n) -> list:
        """Up to n items of the iterator (filled for at most PREFETCH_BUDGET_S): [OK, [items, how it
        ended: 0 not yet, 1 StopIteration, 2 raised, the exception]]."""
        items, end, exc, start = [], 0, None, time.perf_counter()
        n = n if type(n) is int and 1 <= n <= PREFETCH_MAX else 1
        try:
            for _ in range(n):
                item = next(it)
                try:
                    items.append(self.enc(item))  # encoded now: a generator may change what it yielded
                except (BoundaryError, ValueError, TypeError, OverflowError, RecursionError) as e:
                    return [REFUSED, f"the result cannot cross the boundary: {describe(e)}"]
                if time.perf_counter() - start > PREFETCH_BUDGET_S:
                    break
        except StopIteration as e:  # its value is the generator's return value (`yield from` reads it)
            end, exc = 1, StopIteration(e.value) if e.value is not None else None
        except BaseException as e:  # noqa: BLE001 - raised in the tests after the items before it
            if not items:
                return self._raised(e)
            end, exc = 2, e
        try:
            return [OK, [items, end, None if exc is None else ext(EXC, self._exc_payload(exc, self.enc))]]
        except (BoundaryError, ValueError, TypeError, OverflowError, RecursionError) as e:
            return [REFUSED, f"the result cannot cross the boundary: {describe(e)}"]


def _size(value):
    return len(value) if type(value) in CONTAINERS else None


def _args(e: BaseException) -> str:
    try:
        return f": {e.args[0]!r}"[:200] if e.args else ""
    except Exception:  # noqa: BLE001
        return ""


def _base_value(x, base):
    """The builtin value inside an instance of a subclass of base, read by base's own methods (so the
    subclass's overrides do not change what the judge compares)."""
    if base in (int, bool):
        return int.__int__(x)
    if base is float:
        return float.__float__(x)
    if base is complex:
        return complex(complex.__getattribute__(x, "real"), complex.__getattribute__(x, "imag"))
    if base is str:
        return str.__str__(x)
    if base is bytes:
        return bytes.__bytes__(x) if hasattr(bytes, "__bytes__") else bytes(memoryview(x))
    if base is dict:
        return dict(dict.items(x))
    return base(base.__iter__(x))


_SIMPLE_OPS = {
    "getattr": lambda o, a: getattr(o, a),
    "setattr": lambda o, a: setattr(o, a[0], a[1]),
    "delattr": lambda o, a: delattr(o, a),
    "getitem": lambda o, a: o[a],
    "setitem": lambda o, a: o.__setitem__(a[0], a[1]),
    "delitem": lambda o, a: o.__delitem__(a),
    "iter": lambda o, a: iter(o),
    "len": lambda o, a: len(o),
    "str": lambda o, a: str(o),
    "repr": lambda o, a: repr(o),
    "bool": lambda o, a: bool(o),
    "hash": lambda o, a: hash(o),
    "format": lambda o, a: format(o, a),
    "enter": lambda o, a: o.__enter__(),
    "exit": lambda o, a: o.__exit__(*a),
    "dir": lambda o, a: [str(n) for n in dir(o)],
    "copy": lambda o, a: copy.copy(o),
    "deepcopy": lambda o, a: copy.deepcopy(o),
}


def _pure_import(value) -> list[str] | None:
    """[module, ""] for a module the program imported under any name (`import math`, `import re as
    regex`), [module, name] for a pure module's public name (`from collections import Counter`), else
    None. Only a hint: the judge imports the module itself, by name, and binds only what its own
    rules allow (_judge_imports), so a forged hint can at worst bind a standard module of its own."""
    try:
        if isinstance(value, types.ModuleType):
            name = value.__name__
            return [name, ""] if type(name) is str and sys.modules.get(name) is value \
                and name.partition(".")[0] in sys.stdlib_module_names else None
        ref = named_ref(value)
        return ref if ref is not None and ref[0] in PURE_MODULES else None
    except Exception:  # noqa: BLE001 - the program's objects can raise on any attribute
        return None


def _live_names(ns: dict) -> list[str]:
    """The program's module-level data names that some function of the program reads or writes: the
    tests read these through the candidate (their value now), the rest as they were at load."""
    codes, seen, used = [], set(), set()
    for value in ns.values():
        if isinstance(value, types.FunctionType) and value.__module__ == PROGRAM_MODULE:
            codes.append(value.__code__)
        elif isinstance(value, type) and value.__module__ == PROGRAM_MODULE:
            for attr in list(vars(value).values()):
                fn = getattr(attr, "__func__", attr)
                fn = getattr(fn, "fget", fn)
                if isinstance(fn, types.FunctionType):
                    codes.append(fn.__code__)
    while codes:
        code = codes.pop()
        if id(code) in seen:
            continue
        seen.add(id(code))
        used.update(code.co_names)
        codes.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return [n for n in used if n in ns and not n.startswith("__") and not callable(ns[n])
            and not isinstance(ns[n], types.ModuleType)]


PROGRAM_MODULE = "__main__"
PROGRAM_FILE = "program.py"


def _main_namespace() -> dict:
    """The program's namespace, as `python program.py` gives it: a module registered as __main__
    (so pickle, `sys.modules[__name__]` and `if __name__ == "__main__":` behave as in one process),
    __file__ in its scratch directory (its working directory), sys.argv of the script alone."""
    module = types.ModuleType(PROGRAM_MODULE)
    module.__dict__.update(__builtins__=builtins, __file__=os.path.join(os.getcwd(), PROGRAM_FILE))
    sys.modules[PROGRAM_MODULE] = module
    sys.argv = [PROGRAM_FILE]
    return module.__dict__


def candidate_main(program: str, fd: int) -> None:
    """Runs in the sandboxed candidate: load the program, say hello (its names: each a value, a
    name or a handle), then answer the judge's requests until EOF."""
    ns = _main_namespace()
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
    cand, names, imports = Candidate(fd, ns), {}, {}
    for name, value in list(ns.items()):
        if name.startswith("__"):
            continue
        if (origin := _pure_import(value)) is not None:
            imports[name] = origin  # the judge binds its own import of it
            continue
        if isinstance(value, types.ModuleType):
            continue
        try:
            packed = pack(cand.enc(value, budget=[HELLO_VALUE_NODES, HELLO_VALUE_BYTES]))
            if len(packed) > HELLO_VALUE_BYTES:
                packed = pack(ext(HANDLE, cand._handle_payload(value)))
        except TooBig:
            packed = pack(ext(HANDLE, cand._handle_payload(value)))
        except Exception:  # noqa: BLE001 - a value that cannot cross, or an object that raises when asked
            continue
        names[name] = packed
    cand.track([n for n in _live_names(ns) if n in names])
    send_frame(fd, {"ok": True, "names": names, "imports": imports})
    while True:
        cand.send(cand.serve(cand.receive()))


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
        exec(code, _main_namespace())
    except SystemExit as e:
        exit_code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - a runtime error is exit status 1, as for `python prog.py`
        traceback.print_exc()
        exit_code = 1
    os._exit(_interpreter_exit(exit_code) & 0xFF)


def _interpreter_exit(exit_code: int) -> int:
    """What the interpreter does at exit before the process ends, as `python prog.py` would: wait for
    the threads that are not daemons, run the atexit handlers, flush stdout and stderr (the current
    ones and the original ones). The exit status: exit_code, or 1 if one of those failed."""
    try:
        for t in threading.enumerate():
            if t is not threading.main_thread() and not t.daemon:
                t.join()
        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001 - a handler that raises: as the interpreter, report and go on
        traceback.print_exc()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001
            exit_code = exit_code or 1
    return exit_code
