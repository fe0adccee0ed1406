"""Attacks on the verdict through ONE long-lived executor pool, as the verifier service runs: a
program that reads the tests or expected outputs (its caller's frames, the objects and the raw
memory it inherited, an earlier job's freed memory, the verifier's environment), state that
outlives a job (SysV and POSIX IPC, keyrings, abstract sockets, IPv6 flow labels, files), a
program that gets itself reported as infra_error (a decoder bomb, a directory tree cleanup chokes
on, a leftover that stops the cleanup helper, a standard-library function that kills the judge),
a program that supplies what the tests run (their builtins, a module under a module's name), a
judge poisoned for the next job, memory limits that are per process instead of per job, and honest
programs whose tests use modules the program imported. docs/verifier.md "Threat model" lists each
kind and how it is stopped.

Every attack must end in a program status (never infra_error) and must not pass.
Run: python -m pytest -q tests/test_verifier_attacks.py      (about 40 s on 2 cores)
"""
import os
import secrets
import signal
import textwrap
import threading
import time

import pytest

import isolation
import verifier
from verdicts import PROGRAM_STATUSES

SECRET = "S3CR3T-" + secrets.token_hex(8)    # what the tests expect; only the judge may hold it
PLANT = "PLANT-" + secrets.token_hex(8)      # what an earlier job's tests held
ENV_SECRET = "ENVSECRET-" + secrets.token_hex(8)
SMALL = {"timeout_s": 20.0, "memory_mb": 512, "max_procs": 8}

# The reader: everything a program can look at in its own process, searched for the three kinds
# of marker (the search pattern is assembled at run time so the program's own text never matches).
READER = r'''
import ctypes, gc, os, re, sys
PAT = re.compile(("(?:S3C" + "R3T|PLA" + "NT|ENVSE" + "CRET)-[0-9a-f]{16}").encode())
def _grep(found, data):
    found.update(m.decode() for m in PAT.findall(data))
def _strings(v):
    if isinstance(v, str):
        return [v.encode("utf-8", "replace")]
    if isinstance(v, (bytes, bytearray)):
        return [bytes(v)]
    if isinstance(v, dict):
        return [s for x in list(v.keys()) + list(v.values()) for s in _strings(x) if isinstance(x, (str, bytes, bytearray))]
    if isinstance(v, (list, tuple)):
        return [s for x in v if isinstance(x, (str, bytes, bytearray)) for s in _strings(x)]
    return []
def scan():
    found = set()
    f = sys._getframe()
    while f is not None:                                  # the caller's frames
        for v in list(f.f_locals.values()):
            for s in _strings(v):
                _grep(found, s)
        f = f.f_back
    for o in gc.get_objects():                            # every object the process holds
        for s in _strings(o):
            _grep(found, s)
    for k, v in os.environ.items():
        _grep(found, (k + "=" + v).encode())
    r, w = os.pipe()                                      # raw memory, freed memory included
    seeds = {id(object()) , id(b"x" * 1000), id(b"y" * (1 << 20)), id(sys), id(os.environ)}
    done = set()
    for seed in seeds:
        base = seed & ~0xFFFF
        for i in range(-512, 512):
            addr = base + i * 0x10000
            if addr <= 0 or addr in done:
                continue
            done.add(addr)
            try:
                os.write(w, (ctypes.c_char * 0x10000).from_address(addr))
            except OSError:
                continue
            _grep(found, os.read(r, 0x10000))
    return sorted(found - {""})
'''


@pytest.fixture(scope="module")
def pool():
    """One executor, long-lived: every job below runs on the same executor process, one after
    the other. The verifier's environment holds a secret the programs must not find."""
    os.environ["OUBLIETTE_TEST_SECRET"] = ENV_SECRET
    try:
        p = verifier.ExecutorPool(1)
    finally:
        del os.environ["OUBLIETTE_TEST_SECRET"]
    yield p
    p.close()


def run(pool, program, tests, entry_point=None, **limits):
    job = {"kind": "assert", "program": textwrap.dedent(program), "tests": textwrap.dedent(tests),
           **SMALL, **limits}
    if entry_point:
        job["entry_point"] = entry_point
    return pool.run([job])[0]


def assert_program_status(v, passed=False):
    assert v.status in PROGRAM_STATUSES, v   # never infra_error
    assert v.passed is passed, v


# ----------------------------------------------------------------------------- reading the answers

def test_a_program_cannot_read_the_tests_an_earlier_job_or_the_environment(pool):
    # plant: a job whose tests hold PLANT many times, in the job, the judge and the frames
    plant_tests = f"PLANTED = {[PLANT] * 50!r}\nassert f(1) == {PLANT!r}\n"
    assert_program_status(run(pool, "def f(x): return x", plant_tests), passed=False)
    # reader, assert-style: passes only if it finds the expected value somewhere
    v = run(pool, READER + "def f():\n    return [s for s in scan() if s.startswith('S3C')][:1]\n",
            f"assert f() == [{SECRET!r}]\n")
    assert_program_status(v, passed=False)
    # and it finds nothing at all: the earlier job's tests, this job's, the verifier's environment
    v = run(pool, READER + "def f():\n    return scan()\n", f"r = f()\nassert r == [], r\n# {SECRET}\n")
    assert v.passed, v.detail


def test_an_io_program_cannot_read_its_expected_output(pool):
    program = READER + "print(' '.join(s for s in scan() if s.startswith('S3C')) or 'nothing')\n"
    v = pool.run([{"kind": "io", "program": program, "cases": [["", SECRET], ["1\n", SECRET + " "]],
                   "partial_reward": True, **SMALL}])[0]
    assert_program_status(v, passed=False)
    assert v.fraction == 0.0 and "nothing" in v.detail, v


# ----------------------------------------------------------------------------- state that outlives a job

# IPv6 flow labels live in the network namespace and linger (here 30 s) after their socket is gone.
# A label that exists makes a request for it with "create, exclusive" fail: that is how it is read.
FLOW_LABELS = r'''
import errno, socket, struct
def _flow_request(label, share, flags):   # struct in6_flowlabel_req (linux/in6.h), linger 30 s
    return struct.pack("=16sIBBHHHI", socket.inet_pton(socket.AF_INET6, "::1"), socket.htonl(label),
                       0, share, flags, 0, 30, 0)
def flow_plant(label):   # IPV6_FLOWLABEL_MGR, IPV6_FL_A_GET, share IPV6_FL_S_ANY, IPV6_FL_F_CREATE
    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        s.setsockopt(socket.IPPROTO_IPV6, 32, _flow_request(label, 255, 1))
    finally:
        s.close()
def flow_taken(label):   # share IPV6_FL_S_EXCL, CREATE|EXCL: refused iff the label exists (and then made)
    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        s.setsockopt(socket.IPPROTO_IPV6, 32, _flow_request(label, 1, 3))
        return False
    except OSError as e:
        if e.errno in (errno.EEXIST, errno.EPERM):
            return True
        raise
    finally:
        s.close()
'''

PLANT_STATE = FLOW_LABELS + r'''
import array, ctypes, os, socket
libc = ctypes.CDLL(None, use_errno=True)
def _try(fn):
    try:
        r = fn()
        return "created" if r is None or r >= 0 else "refused: errno %d" % ctypes.get_errno()
    except OSError as e:
        return "refused: %s" % e
def _abstract():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.bind("\0oubliette_probe")            # a name, kept alive past the job by putting it in flight
    a.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [a.fileno(), b.fileno()]))])
def _unix_socket():
    socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
def plant():
    out = {
        "flowlabel": _try(lambda: flow_plant(0x05EC7)),
        "msg": _try(lambda: libc.msgget(0x5EC7, 0o1666)),
        "sem": _try(lambda: libc.semget(0x5EC7, 1, 0o1666)),
        "shm": _try(lambda: libc.shmget(0x5EC7, 4096, 0o1666)),
        "mqueue": _try(lambda: libc.mq_open(b"/oubliette_probe", os.O_CREAT | os.O_RDWR, 0o666, None)),
        "keyring": _try(lambda: libc.syscall(248, b"user", b"oubliette_probe", b"1", 1, -4)),
        "abstract": _try(_abstract),
        "unix_socket": _try(_unix_socket),
    }
    for path in ("/tmp/oubliette_probe", "/dev/shm/oubliette_probe", "oubliette_probe"):
        out[path] = _try(lambda: open(path, "w").close())
    return out
'''

READ_STATE = FLOW_LABELS + r'''
import ctypes, errno, os, socket
libc = ctypes.CDLL(None, use_errno=True)
def _abstract_taken():
    s, _ = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        s.bind("\0oubliette_probe")
        return False
    except OSError as e:
        return e.errno == errno.EADDRINUSE
def read():
    found = []
    if libc.msgget(0x5EC7, 0) >= 0: found.append("msg")
    if libc.semget(0x5EC7, 0, 0) >= 0: found.append("sem")
    if libc.shmget(0x5EC7, 0, 0) >= 0: found.append("shm")
    if libc.mq_open(b"/oubliette_probe", os.O_RDONLY) >= 0: found.append("mqueue")
    if libc.syscall(250, 10, -4, b"user", b"oubliette_probe", 0) >= 0: found.append("keyring")
    try:
        if _abstract_taken(): found.append("abstract")
    except OSError:
        pass
    if flow_taken(0x05EC7): found.append("flowlabel")
    for path in ("/tmp/oubliette_probe", "/dev/shm/oubliette_probe", "oubliette_probe", "../oubliette_probe"):
        if os.path.exists(path): found.append(path)
    return found
'''


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the probes call keyctl by its x86_64 number")
def test_no_kernel_object_or_file_outlives_a_job(pool):
    v = run(pool, PLANT_STATE, "r = plant()\nassert False, repr({k: s[:7] for k, s in r.items()})\n")
    assert v.status == "failed", v  # the plant's report travels in the assertion's message
    for refused in ("keyring", "abstract", "unix_socket"):  # by the seccomp filter
        assert f"{refused}': 'refused'" in v.detail, v.detail
    assert "'flowlabel': 'created'" in v.detail, v.detail  # gone with the execution's network namespace
    v = run(pool, READ_STATE, "r = read()\nassert r == [], r\n")
    assert v.passed, v.detail
    for kind in ("msg", "sem", "shm"):  # nothing was left on the host either
        with open(f"/proc/sysvipc/{kind}") as f:
            assert not any(line.split()[:1] == [str(0x5EC7)] for line in f), kind


def test_an_io_program_cannot_count_its_cases():
    """A counter in SysV shared memory, in IPv6 flow labels (the network namespace) or in a file
    would tell each case which answer to print."""
    base = (secrets.randbits(16) + 1) << 2  # below 0x80000: no sysctl restricts these
    counter = FLOW_LABELS + f"BASE = {base}\n" + r'''
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
k = 0
sid = libc.shmget(0x5EC8, 4096, 0o1666)
if sid >= 0:
    p = libc.shmat(sid, None, 0)
    if p and p != ctypes.c_void_p(-1).value:
        n = ctypes.c_int.from_address(p)
        k, n.value = n.value, n.value + 1
for path in ("count", "/tmp/count"):
    try:
        k = max(k, os.path.getsize(path))
        open(path, "a").write("x")
    except OSError:
        pass
n = 0
while n < 3 and flow_taken(BASE + n):   # the first free label is taken now, for the next case
    n += 1
k = max(k, n)
print(["alpha", "beta", "gamma"][k % 3])
'''
    p = verifier.ExecutorPool(1)
    try:
        v = p.run([{"kind": "io", "program": counter, "partial_reward": True, **SMALL,
                    "cases": [["", "alpha"], ["", "beta"], ["", "gamma"]]}])[0]
    finally:
        p.close()
    assert v.status == "failed" and abs(v.fraction - 1 / 3) < 1e-9, v  # every case saw a count of 0


# ----------------------------------------------------------------------------- infra_error is not reachable

DECODER_BOMB = r'''
import struct, sys, msgpack
fd = sys._getframe(1).f_locals["fd"]     # the candidate's end of the call channel
payload = msgpack.packb(1)
for _ in range(5000):
    payload = msgpack.packb(msgpack.ExtType(1, payload))   # a tuple in a tuple ... 5000 deep
hello = msgpack.packb({"ok": True, "names": {"f": payload}, "imports": {}}, use_bin_type=True)
import os
os.write(fd, struct.pack(">I", len(hello)) + hello)
os._exit(0)
'''

DEEP_TREE = r'''
import os
for _ in range(3000):
    os.mkdir("d")
    os.chdir("d")
os.chmod(".", 0)
def f(x): return 0
'''

STOP_THE_SWEEPER = r'''
import os, signal, time
if os.fork() == 0:
    os.setsid()
    while True:                          # stop every process this uid may signal, forever
        try:
            os.kill(-1, signal.SIGSTOP)
        except OSError:
            pass
def f(x): return 0
'''


@pytest.mark.parametrize("name, program", [("decoder_bomb", DECODER_BOMB), ("deep_tree", DEEP_TREE),
                                           ("stop_the_sweeper", STOP_THE_SWEEPER)],
                         ids=["decoder_bomb", "deep_tree", "stop_the_sweeper"])
def test_a_program_cannot_get_itself_reported_as_infra_error(pool, name, program):
    out = {}
    t = threading.Thread(target=lambda: out.update(v=run(pool, program, "assert f(1) == 918273645\n",
                                                         timeout_s=2.0)), daemon=True)
    t.start()
    t.join(timeout=60)
    assert not t.is_alive(), f"{name}: the verifier did not return"
    assert_program_status(out["v"], passed=False)
    assert run(pool, "def f(x): return 918273645", "assert f(1) == 918273645\n").passed  # and it serves on


def test_deep_tree_is_removed_without_namespaces_too(tmp_path):
    """rlimits mode removes a scratch directory by walking it: the program's 3000 levels, and on the
    host 1500 levels with no permissions on the deepest."""
    p = verifier.ExecutorPool(1, isolation="rlimits")
    try:
        v = run(p, DEEP_TREE, "assert f(1) == 918273645\n", timeout_s=5.0)
        assert_program_status(v, passed=False)
        assert run(p, "def f(x): return 918273645", "assert f(1) == 918273645\n").passed
    finally:
        p.close()
    d = tmp_path / "t"
    d.mkdir()
    fd = os.open(d, os.O_RDONLY)
    for _ in range(1500):  # each level made from its parent's fd: no path walked, so linear time
        os.mkdir("d", dir_fd=fd)
        fd, parent = os.open("d", os.O_RDONLY, dir_fd=fd), fd
        os.close(parent)
    os.chmod(fd, 0)
    os.close(fd)
    isolation.remove_tree(str(d))
    assert not d.exists()


# ----------------------------------------------------------------------------- the judge runs nothing a program names

# The candidate is the program's own process, so the program can rewrite the hello it sends (here by
# wrapping the candidate's send_frame) and name anything there. f is wrong: each forgery would
# make a wrong program pass if the judge bound what the hello names.
FORGED_HELLO = r"""
import sys
_S = sys.modules["candidate"]           # the module whose code sends the hello
def f(x):
    return 0
def _zero(*args, **kwargs):
    return 0
def _sorted(*args, **kwargs):
    return [1, 2, 3]
_send = _S.send_frame
def _forge(fd, obj):
    if isinstance(obj, dict) and "names" in obj:
        cand = sys._getframe(1).f_locals["cand"]
        fake = {"abs": _zero, "round": _zero, "sorted": _sorted, "len": _zero}
        obj["names"]["__builtins__"] = _S.pack(cand.enc(fake))
        obj["imports"]["math"] = ["unittest.mock", "call"]      # call.isclose(...) is truthy
        obj["imports"]["helper"] = ["statistics", "sys"]        # a module a pure module imported
        obj["names"]["forged"] = _S.pack(cand.enc(True))       # a name only the forged hello has
    _send(fd, obj)
_S.send_frame = _forge
"""


@pytest.mark.parametrize("tests", ["assert abs(f(3) - 918273645) < 1\n",
                                   "assert sorted(f([3, 1, 2])) == [1, 2, 3]\n",
                                   "assert math.isclose(f(2), 2 ** 0.5)\n",
                                   "helper.modules[\"os\"]._exit(3)\n"],
                         ids=["builtins_abs", "builtins_sorted", "math_bound_to_mock_call",
                              "sys_through_a_pure_module"])
def test_a_program_cannot_supply_what_the_tests_run(pool, tests):
    assert_program_status(run(pool, FORGED_HELLO, tests), passed=False)


def test_the_forged_hello_is_the_one_the_judge_reads(pool):
    """The forgeries above are refused, not missed: the judge sees the forged hello's own extra name."""
    assert run(pool, FORGED_HELLO, "assert forged is True\n").passed


# An honest-looking import of a standard-library function the tests then call as the program's own:
# the judge holds a proxy to the candidate's copy, never one of its own.
STDLIB_KILLERS = {
    "os._exit": ("from os import _exit as square", "assert square(3) == 9\n"),
    "os.abort": ("from os import abort as square", "assert square() == 9\n"),
    "os.closerange": ("from os import closerange as square", "assert square(0, 1 << 16) == 9\n"),
    "ctypes.string_at": ("from ctypes import string_at as square", "assert square(8) == 9\n"),
    "faulthandler._sigsegv": ("from faulthandler import _sigsegv as square", "assert square() == 9\n"),
}


@pytest.mark.parametrize("name", sorted(STDLIB_KILLERS))
def test_a_function_the_program_imported_never_runs_in_the_judge(pool, name):
    program, tests = STDLIB_KILLERS[name]
    v = run(pool, program + "\n", tests)
    assert_program_status(v, passed=False)
    assert v.status == "crashed" and "the program died" in v.detail, v  # a proxy: it ran in the candidate
    assert run(pool, "def square(x): return x * x", "assert square(3) == 9\n").passed


def test_a_poisoned_judge_cannot_fail_the_next_program(pool):
    good = "def f(x): return 918273645"
    # through the program's imports (the judge would call them for the tests)
    assert_program_status(run(pool, "from signal import alarm as f", "assert f(1) == 918273645\n"))
    assert_program_status(run(pool, "from sys import setrecursionlimit as f", "assert f(40) == 918273645\n"))
    # through the tests themselves: what one job's tests do to their judge ends with that job
    run(pool, good, "import math, signal, sys\nsignal.alarm(1)\nsys.setrecursionlimit(50)\nmath.pi = 3\n"
                    "assert f(1) == 918273645\n")
    time.sleep(1.5)  # past the alarm
    deep = "def depth(n): return 0 if n == 0 else 1 + depth(n - 1)\n"
    v = run(pool, good, "import math, sys\nassert sys.getrecursionlimit() >= 1000 and math.pi > 3.14\n"
                        + deep + "assert depth(150) == 150 and f(1) == 918273645\n")
    assert v.passed, v


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the probe reads shmget's x86_64 errors")
def test_the_judge_is_filtered_and_namespaced_per_job(pool):
    """The tests (trusted) probe their own process: the seccomp filter is on, and neither SysV memory
    nor a flow label the previous job's tests made is there."""
    label = secrets.randbits(18) + 1
    probe = FLOW_LABELS + "import ctypes, socket\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    plant = probe + f"assert libc.shmget(0x5EC9, 4096, 0o1666) >= 0\nflow_plant({label})\nassert f(1) == 1\n"
    assert run(pool, "def f(x): return x", plant).passed
    check = probe + f"""
try:
    socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    filtered = False
except PermissionError:
    filtered = True
assert filtered, "no seccomp filter in the judge"
assert libc.shmget(0x5EC9, 0, 0) < 0, "SysV memory of the previous job's judge"
assert not flow_taken({label}), "a flow label of the previous job's judge"
assert f(1) == 1
"""
    v = run(pool, "def f(x): return x", check)
    assert v.passed, v
    with open("/proc/sysvipc/shm") as f:  # and it was made in the execution's namespace, not the host's
        assert not any(line.split()[:1] == [str(0x5EC9)] for line in f)


def test_the_judges_death_while_running_the_tests_is_the_programs_failure(pool):
    v = run(pool, "def f(x): return x", "assert f(1) == 1\nimport os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    assert v.status == "crashed" and "judge died" in v.detail, v
    assert run(pool, "def f(x): return 918273645", "assert f(1) == 918273645\n").passed


def test_a_flow_label_token_does_not_reach_a_later_execution(pool):
    """A tool call ("run" job) plants a 16-bit token as flow labels; a later scoring job reads them."""
    token, base = secrets.randbits(16) | 1, (secrets.randbits(13) + 1) << 5
    planter = FLOW_LABELS + f"for i in range(16):\n    if {token} >> i & 1:\n        flow_plant({base} + i)\nprint('planted')\n"
    v = pool.run([{"kind": "run", "program": planter, **SMALL}])[0]
    assert v.passed and "planted" in v.detail, v
    reader = FLOW_LABELS + f"print(sum(flow_taken({base} + i) << i for i in range(16)))\n"
    v = pool.run([{"kind": "io", "program": reader, "cases": [["", str(token)]], **SMALL}])[0]
    assert v.status == "failed" and "got '0" in v.detail, v


@pytest.mark.skipif(not os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children"),
                    reason="finding the launcher needs /proc/PID/task/PID/children")
def test_an_executor_that_fails_for_its_own_reasons_is_replaced_and_the_job_retried():
    p = verifier.ExecutorPool(1)
    try:
        [pid] = p.executor_pids()
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            children = [int(c) for c in f.read().split()]
        assert children, "an executor holds its launcher"
        for child in children:  # the launcher: the executor's next job is an infra failure
            os.kill(child, signal.SIGKILL)
        v = run(p, "def f(x): return 918273645", "assert f(1) == 918273645\n")
        assert v.passed, v
        assert p.restarts == 1 and p.executor_pids() != [pid], (p.restarts, p.executor_pids(), pid)
    finally:
        p.close()


# ----------------------------------------------------------------------------- limits are per job

@pytest.mark.skipif(os.geteuid() != 0, reason="the per-job memory limit is a cgroup (root)")
def test_memory_limit_is_per_job_not_per_process(pool):
    if "per execution" not in pool.report["memory"]:  # no memory cgroup: the report must say so
        assert pool.report["memory"].startswith("per process only"), pool.report
        return
    # Each child holds its 100 MB until the job ends; the parent counts for at most 2 s (select: it
    # never waits on the children that survive), ample for 6 x 100 MB where the limit is per process.
    hog = r'''
import os, select, time
def f():
    r, w = os.pipe()
    for _ in range(6):
        if os.fork() == 0:
            block = b"\x01" * (100 << 20)       # 100 MB, touched
            os.write(w, b"1")
            time.sleep(10)
            os._exit(0)
    os.close(w)
    got, deadline = b"", time.time() + 2
    while len(got) < 6 and select.select([r], [], [], max(0.0, deadline - time.time()))[0]:
        chunk = os.read(r, 6)
        if not chunk:
            break
        got += chunk
    return len(got)
'''
    v = run(pool, hog, "assert f() == 6\n", memory_mb=256, timeout_s=10.0)
    assert_program_status(v, passed=False)     # 6 x 100 MB never fit in one job's 256 MB


# ----------------------------------------------------------------------------- honest programs

def test_tests_may_use_the_modules_the_program_imported(pool):
    honest = "import math\nimport re as regex\nfrom collections import Counter\n" \
             "def f(x): return math.sqrt(x)\ndef words(s): return regex.findall(r'\\w+', s)\n"
    tests = "assert math.isclose(f(2), 2 ** 0.5)\nassert Counter(words('a b a')) == Counter({'a': 2, 'b': 1})\n" \
            "assert regex.fullmatch(r'\\d+', '42')\n"
    assert run(pool, honest, tests).passed
    # a class named like the module is never what the tests get under that name
    forged = "class math:\n    @staticmethod\n    def isclose(*a, **k): return True\ndef f(x): return 0\n"
    v = run(pool, forged, "assert math.isclose(f(2), 2 ** 0.5)\n")
    assert_program_status(v, passed=False)
    assert "NameError" in v.detail, v
    # asyncio (a socketpair for its loop) runs under the seccomp filter
    v = run(pool, "import asyncio\nasync def g(): return 3\ndef f(): return asyncio.run(g())\n",
            "assert f() == 3\n")
    assert v.passed, v.detail


@pytest.mark.skipif(os.geteuid() != 0, reason="switching uids needs root")
def test_the_sweeper_can_kill_the_uid_and_the_uid_cannot_stop_the_sweeper():
    """kill_uid's helper, with sweeper_credentials: a leftover of the uid gets EPERM signalling it
    (so it cannot SIGSTOP it between its uid switch and its kill), and the helper can kill it."""
    uid, reaper = isolation.role_uids(os.getpid())[0], isolation.role_uids(os.getpid())[2]
    r, w = os.pipe()
    sweeper = os.fork()
    if sweeper == 0:  # waits until the leftover has tried, then kills it
        code = 1
        try:
            isolation.sweeper_credentials(uid, reaper)
            leftover_pid = int(os.read(r, 32))  # 0: the leftover could signal us
            if leftover_pid:
                os.kill(leftover_pid, 9)
                code = 0
        finally:
            os._exit(code)
    leftover = os.fork()
    if leftover == 0:
        code = 1
        try:
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            try:
                os.kill(sweeper, 19)  # SIGSTOP
                os.kill(sweeper, 18)  # SIGCONT, so that it can fail the test
                os.write(w, b"0")
            except PermissionError:
                os.write(w, str(os.getpid()).encode())
                import time
                time.sleep(30)
        finally:
            os._exit(code)
    assert os.waitpid(sweeper, 0)[1] == 0          # it killed the leftover
    status = os.waitpid(leftover, 0)[1]
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == 9, status  # ... which could not stop it
    os.close(r), os.close(w)


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.isdir("/sys/fs/cgroup/pids"),
                    reason="cgroup directories need root and a pids hierarchy")
def test_a_killed_verifiers_cgroups_are_removed_by_the_next_pool():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)  # a pid that is gone, like a SIGKILLed verifier's executor
    stale = f"/sys/fs/cgroup/pids/oubliette-{pid}"
    os.mkdir(stale)
    p = verifier.ExecutorPool(1)
    try:
        assert not os.path.exists(stale)
        assert all(os.path.isdir(f"/sys/fs/cgroup/pids/oubliette-{x}") for x in p.executor_pids())
    finally:
        p.close()


# ----------------------------------------------------------------------------- the richer codec, forged

# The program rewrites its hello (as FORGED_HELLO does) to name things the codec can carry now:
# builtins and module functions by name, exception classes, live globals. Each forgery would make
# a wrong program pass if the judge trusted it.
FORGE_CODEC = r"""
import sys
_B = sys.modules["boundary"]
def f(x):
    return 0
_send = _B.send_frame
def _forge(fd, obj):
    if isinstance(obj, dict) and "names" in obj:
        obj["names"].update(FORGED)
        obj["live"] = LIVE
    _send(fd, obj)
sys.modules["candidate"].send_frame = _forge
"""
FORGED_NAMES = {
    # the judge's own eval, or os.system, under the name the tests call: refused by name
    "eval_by_name": ("FORGED = {'f': _B.pack(_B.ext(_B.NAMED, ['builtins', 'eval']))}\nLIVE = []",
                     "assert f('918273645') == 918273645\n"),
    "os_by_name": ("FORGED = {'f': _B.pack(_B.ext(_B.NAMED, ['os', 'getpid']))}\nLIVE = []",
                   "assert f() > 0\n"),
    "private_method_by_name": ("FORGED = {'f': _B.pack(_B.ext(_B.NAMED, ['builtins', 'int.__new__']))}\nLIVE = []",
                               "assert f(int, '7') == 7\n"),
    # a module the judge imported for the tests, claimed live: it stays the judge's module
    "live_module": ("import math\nFORGED = {}\nLIVE = ['math']\n"
                    "class _M:\n    def isclose(self, *a, **k): return True\n"
                    "def g(x):\n    global math\n    math = _M()\n    return 0\n",
                    "r = g(2)\nassert math.isclose(r, 2 ** 0.5)\n"),
    # an argument reference the call never had
    "argref_out_of_range": ("FORGED = {'f': _B.pack(_B.ext(_B.ARGREF, 3))}\nLIVE = []",
                            "assert f == [918273645]\n"),
}


@pytest.mark.parametrize("name", sorted(FORGED_NAMES))
def test_a_program_cannot_forge_what_the_codec_names(pool, name):
    forgery, tests = FORGED_NAMES[name]
    assert_program_status(run(pool, FORGE_CODEC + forgery + "\n", tests), passed=False)


def test_a_program_cannot_reach_past_what_the_tests_lent_it(pool):
    """The tests lend the program a generator and a lambda; the program speaks the judge's protocol
    directly (through the candidate's own Candidate object) to walk from them to the tests' frames
    and globals. Every step is refused: only the tests' own objects' public attributes are served."""
    program = r'''
import sys
def probe(gen, fn):
    cand = object.__getattribute__(fn, "_cand")
    jid_gen, jid_fn = object.__getattribute__(gen, "_jid"), object.__getattribute__(fn, "_jid")
    got = []
    for jid, name in ((jid_gen, "gi_frame"), (jid_gen, "gi_code"), (jid_fn, "__globals__"),
                      (jid_fn, "__closure__"), (jid_fn, "func_globals"), (jid_gen, "__class__")):
        try:
            got.append(cand.result(cand.request("getattr", jid, name)))
        except BaseException as e:
            got.append(type(e).__name__)
    for jid in range(jid_fn + 1, jid_fn + 4):  # objects never lent
        try:
            got.append(cand.result(cand.request("call", jid, [[], {}])))
        except BaseException as e:
            got.append(type(e).__name__)
    return got
'''
    tests = r'''
SECRET = 918273645
def make():
    hidden = SECRET
    def gen():
        yield 1
    return gen(), (lambda: hidden)
g, fn = make()
got = probe(g, fn)
assert all(x in ("AttributeError", "RuntimeError") for x in got), got
'''
    v = run(pool, program, tests)
    assert v.passed, v  # every probe was refused, and the tests could say so


def test_a_program_exception_is_its_own_not_the_judges(pool):
    """Exceptions cross as their class: a program cannot make the judge raise a status the judge
    reserves (SystemExit, KeyboardInterrupt, MemoryError all score as the program's), nor fake a
    test's own AssertionError into a pass."""
    for exc in ("SystemExit(0)", "KeyboardInterrupt()", "MemoryError()", "AssertionError('x')",
                "StopIteration()", "GeneratorExit()"):
        v = run(pool, f"def f(x):\n    raise {exc}\n",
                "try:\n    f(1)\nexcept Exception:\n    pass\nassert f(1) == 918273645\n")
        assert_program_status(v, passed=False)
    # a program class named like a builtin exception is rebuilt with its own bases, never the builtin
    v = run(pool, "class ValueError(Exception):\n    pass\ndef f(x):\n    raise ValueError('no')\n",
            "import builtins\ntry:\n    f(1)\nexcept builtins.ValueError:\n    pass\n")
    assert_program_status(v, passed=False)


# Each of these made a wrong program pass, or excused it, or stretched its time limit, through the
# one-process semantics the codec gives honest programs; each must fail (never infra_error).
ALWAYS_EQUAL = "    def __eq__(self, o): return True\n"
SEMANTICS_FORGERIES = {
    # a class named like the tests' own parameter, the function under test, or the tests' TestCase:
    # a plain value of the tests is never handed to a program object's __eq__
    "class_named_candidate": ("class candidate: pass\nclass _Any(candidate):\n" + ALWAYS_EQUAL
                              + "def add(x, y): return _Any()\n",
                              "def check(candidate):\n    assert candidate(2, 3) == 5\n", "add"),
    "function_under_test_is_a_class": ("class f:\n    def __new__(cls, *a): return object.__new__(_Any)\n"
                                       "class _Any(f):\n    def __init__(self, *a): pass\n" + ALWAYS_EQUAL,
                                       "assert f(3) == 918273645\nassert f([1, 2]) == [2, 1]\n", None),
    "named_like_the_testcase": ("class TestAdd: pass\nclass _Any(TestAdd):\n" + ALWAYS_EQUAL
                                + "def add(x, y): return _Any()\n",
                                "import unittest\nclass TestAdd(unittest.TestCase):\n    def test(self):\n"
                                "        self.assertEqual(add(2, 3), 5)\n"
                                "r = unittest.TextTestRunner(verbosity=0).run("
                                "unittest.defaultTestLoader.loadTestsFromTestCase(TestAdd))\n"
                                "assert r.wasSuccessful()\n", None),
    "solution_subclass": ("class Solution:\n    def twoSum(self, nums, target): return _Any()\n"
                          "class _Any(Solution):\n" + ALWAYS_EQUAL,
                          "assert Solution().twoSum([2, 7, 11, 15], 9) == [0, 1]\n", None),
    "contains_a_plain_value": ("class Bag:\n    def __contains__(self, x): return True\n"
                               "    def __iter__(self): return iter([])\ndef f(x): return Bag()\n",
                               "assert 918273645 in f(3)\n", None),
    "arithmetic_remembers_the_value": ("class M:\n    def __sub__(self, y): return M()\n"
                                       "    def __abs__(self): return 0\ndef f(x): return M()\n",
                                       "assert abs(f(3) - 918273645) < 1e-9\n", None),
    # the tests' own locals and names they rebind are never the program's globals
    "a_global_named_like_a_tests_local": ("tol = 1e9\ndef _uses(): return tol\ndef area(r): return 0.0\n",
                                          "def check(candidate):\n    tol = 1e-6\n    def close(a, b):\n"
                                          "        return abs(a - b) < tol\n"
                                          "    assert close(candidate(1), 3.141592653589793)\ncheck(area)\n",
                                          None),
    "a_global_named_like_an_except_target": ("e = ValueError()\ndef _uses(): return e\n"
                                             "def parse(s):\n    global e\n    e = ValueError()\n"
                                             "    raise TypeError('wrong')\n",
                                             "try:\n    parse('x')\nexcept Exception as e:\n"
                                             "    assert isinstance(e, ValueError)\n", None),
    # the unittest runner's own control flow, raised by the program, is a plain error
    "unittest_should_stop": ("import unittest.case\ndef add(x, y): raise unittest.case._ShouldStop()\n",
                             "import unittest\nclass T(unittest.TestCase):\n    def test(self):\n"
                             "        self.assertEqual(add(2, 3), 5)\n"
                             "r = unittest.TextTestRunner(verbosity=0).run("
                             "unittest.defaultTestLoader.loadTestsFromTestCase(T))\nassert r.wasSuccessful()\n",
                             None),
    "unittest_skip": ("import unittest\ndef add(x, y): raise unittest.SkipTest('later')\n",
                      "import unittest\nclass T(unittest.TestCase):\n    def test(self):\n"
                      "        self.assertEqual(add(2, 3), 5)\n"
                      "r = unittest.TextTestRunner(verbosity=0).run("
                      "unittest.defaultTestLoader.loadTestsFromTestCase(T))\n"
                      "assert r.wasSuccessful() and not r.skipped\n", None),
    # two builtin names: neither is "the function under test", so the tests' abs stays Python's
    "two_builtin_names": ("def pow(a, b): return 0.0\ndef abs(x): return 0\n",
                          "assert abs(pow(2, 0.5) - 1.4142135623730951) < 1e-9\n", None),
    # a StopIteration from a call would end the tests' map() early
    "stopiteration_ends_map": ("def is_prime(n):\n    raise StopIteration\n",
                               "assert all(map(is_prime, [2, 3, 5]))\nassert not any(map(is_prime, [4, 6]))\n",
                               None),
    # describing the failure must not ask the program (its repr raising SystemExit was infra_error)
    "systemexit_from_repr": ("class _I(int):\n    def __str__(self): return '7'\n"
                             "    def __repr__(self): raise SystemExit(0)\ndef f(x): raise ValueError(_I(7))\n",
                             "assert f(1) == 2\n", None),
}


@pytest.mark.parametrize("name", sorted(SEMANTICS_FORGERIES))
def test_one_process_semantics_give_a_wrong_program_nothing(pool, name):
    program, tests, entry_point = SEMANTICS_FORGERIES[name]
    assert_program_status(run(pool, program, tests, entry_point), passed=False)


def test_decoding_the_programs_values_does_not_stretch_its_time_limit(pool):
    """The deadline grows with the tests' requests only: hashing 20,000 keys of the program's hello
    (requests the judge makes while decoding) buys the program no time."""
    program = ("import time\nclass _K: pass\nPAD = {_K(): 0 for _ in range(20000)}\n"
               "def f(x):\n    t = time.process_time()\n    while time.process_time() - t < 3.0: pass\n"
               "    return x + 1\n")
    v = run(pool, program, "assert f(1) == 2\n", timeout_s=1.0)
    assert v.status == "timeout", v


# Round two: each made a wrong program pass through the faithful semantics; each must fail.
ROUND_TWO = {
    # the tests' loop variable holds the same singleton (True/False) the program last pushed
    "singleton_loop_variable": ("exp = False\ndef is_prime(n):\n    global exp\n    exp = not exp\n    return exp\n",
                                "inputs = [[2], [4], [9], [3], [8]]\nresults = [True, False, False, True, False]\n"
                                "for i, (inp, exp) in enumerate(zip(inputs, results)):\n"
                                "    assert is_prime(*inp) == exp\n", None),
    # the candidate patched back to sending StopIteration from a call
    "stopiteration_patched_back": ("import sys\n_C = sys.modules['candidate'].Candidate\n_r = _C._raised\n"
                                   "def _raised(self, e):\n"
                                   "    return _r(self, StopIteration() if isinstance(e, RuntimeError) else e)\n"
                                   "_C._raised = _raised\ndef is_prime(n):\n    raise StopIteration\n",
                                   "assert all(map(is_prime, [2, 3, 5]))\nassert not any(map(is_prime, [4, 6]))\n",
                                   None),
    # numpy reads __array_interface__ of the returned object: an empty array of the program's choice
    "array_interface": ("class A:\n    __array_interface__ = {'shape': (0,), 'typestr': '<f8', 'version': 3,"
                        " 'data': (4096, True)}\ndef f(x): return A()\n",
                        "import math\nr = f(3)\nassert math.isclose(float(getattr(r, '__array_interface__', {}).get("
                        "'shape', (1,))[0] or 3.14), 3.14)\nassert r.__array_interface__['shape'] == (0,)\n", None),
    # HumanEval as training jobs send it (check(NAME) at the end, no entry point), abs redefined
    "humaneval_training_format_abs": ("def abs(x): return 0\ndef f(x): return 99.0\n",
                                      "def check(candidate):\n    assert abs(candidate(3) - 0.5) < 1e-9\n"
                                      "check(f)\n", None),
    # a result stored first, then judged by a builtin the program redefined
    "stored_result_then_abs": ("def abs(x): return 0\ndef area(r): return 0.0\n",
                               "r = area(10)\nassert abs(r - 314.159) < 1e-6\n", None),
    "solution_with_sorted": ("def sorted(xs): return [0, 1]\nclass Solution:\n"
                             "    def twoSum(self, nums, target): return [5, 5]\n",
                             "sol = Solution()\nassert sorted(sol.twoSum([2, 7, 11, 15], 9)) == sorted([0, 1])\n",
                             None),
}


@pytest.mark.parametrize("name", sorted(ROUND_TWO))
def test_round_two_forgeries_fail(pool, name):
    program, tests, entry_point = ROUND_TWO[name]
    assert_program_status(run(pool, program, tests, entry_point), passed=False)


def test_a_builtin_named_function_under_test_is_the_programs(pool):
    """The honest side of the rule: MBPP's `sum(10, 15)` and HumanEval's check(max) call the program."""
    assert run(pool, "def sum(a, b):\n    return 5\n", "assert sum(10, 15) == 6\n").status == "failed"
    assert run(pool, "def sum(a, b):\n    return 6\n", "assert sum(10, 15) == 6\n").passed
    assert run(pool, "def max(xs):\n    return xs[0]\n",
               "def check(candidate):\n    assert candidate([3, 1]) == 3\ncheck(max)\n").passed
    assert not run(pool, "def max(xs):\n    return xs[0]\n",
                   "def check(candidate):\n    assert candidate([1, 3]) == 3\ncheck(max)\n").passed
