"""Attacks of the fifth round, through one long-lived executor pool as the service runs it: state
carried from one execution to the next through the page cache (a token, an io program counting its
cases), names the tests rely on forged by an import alias, a scorer without a memory limit, and the
honest edge cases beside them (a large module-level table, an entry point bound to a standard
function). docs/verifier.md "Threat model" lists each class with its test.

Every attack must end in a program status (never infra_error) and must not pass.
Run: python -m pytest -q tests/test_verifier_round5.py
"""
import secrets
import textwrap

import pytest

import reference
import rootfs
import verifier
from verdicts import PROGRAM_STATUSES

SMALL = {"timeout_s": 20.0, "memory_mb": 512, "max_procs": 8}


@pytest.fixture(scope="module")
def pool():
    p = verifier.ExecutorPool(1)
    yield p
    p.close()


def run(pool, program, tests, **job):
    return pool.run([{"kind": "assert", "program": textwrap.dedent(program), "tests": textwrap.dedent(tests),
                      **SMALL, **job}])[0]


# ----------------------------------------------------------------------------- the page cache

# The carrier's pages: in the largest file a program can open, one page of a pair per bit, far enough
# apart that no readahead touches a neighbour. PROBES reads residency three ways: a non-blocking read
# (EAGAIN: not in memory), mincore on a private mapping, and the time one read takes.
CARRIER = r'''
import ctypes, mmap, os, time
def largest():
    best = (0, "")
    for d, ds, fs in os.walk("/"):
        for n in fs:
            p = os.path.join(d, n)
            try:
                if not os.path.islink(p) and os.path.isfile(p):
                    best = max(best, (os.path.getsize(p), p))
            except OSError:
                pass
    return best[1]
PATH = largest()
SIZE = os.path.getsize(PATH)
STRIDE = max(mmap.PAGESIZE, (SIZE // 300) // mmap.PAGESIZE * mmap.PAGESIZE)
def page(i):
    return i * STRIDE
def touch(bits):
    fd = os.open(PATH, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
    for i, b in enumerate(bits):
        os.pread(fd, 1, page(2 * i + b))
    os.close(fd)
def nowait(fd, off):
    try:
        os.preadv(fd, [bytearray(1)], off, os.RWF_NOWAIT)
        return 1
    except BlockingIOError:
        return 0
    except OSError:
        return None
def incore(m, off):
    libc = ctypes.CDLL(None, use_errno=True)
    view = ctypes.c_char.from_buffer(m)
    vec = ctypes.create_string_buffer(1)
    ok = libc.mincore(ctypes.c_void_p(ctypes.addressof(view) + off), mmap.PAGESIZE, vec)
    del view
    return None if ok != 0 else vec.raw[0] & 1
def timed(fd, off):
    t = time.perf_counter_ns()
    os.pread(fd, 1, off)
    return time.perf_counter_ns() - t
def read_bits(n):
    """Per probe: the bits it decodes (1: the second page of a pair is resident, the first not; 0:
    the reverse; None: it cannot tell)."""
    fd = os.open(PATH, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
    with open(PATH, "rb") as f:
        m = mmap.mmap(f.fileno(), SIZE, access=mmap.ACCESS_COPY)
    out = {"nowait": [], "mincore": [], "timing": []}
    for i in range(n):
        a, b = page(2 * i), page(2 * i + 1)
        for name, probe in (("nowait", lambda o: nowait(fd, o)), ("mincore", lambda o: incore(m, o))):
            ra, rb = probe(a), probe(b)
            out[name].append(None if None in (ra, rb) or ra == rb else int(rb > ra))
        ta, tb = timed(fd, a), timed(fd, b)    # the slower page of the pair was not in memory
        out["timing"].append(int(ta > tb))
    m.close()
    return out
'''


def test_a_token_does_not_cross_executions_through_the_page_cache(pool):
    """A tool call touches one page of a pair per bit of a 128-bit token; a later assert job reads
    which pages are resident. Every file it can open is in memory always (rootfs.py) and the
    deterministic probes are refused, so it decodes nothing; timing is noise."""
    token = [secrets.randbits(1) for _ in range(128)]
    planted = pool.run([{"kind": "run", "program": CARRIER + f"touch({token})\nprint(PATH, STRIDE)\n",
                         **SMALL}])[0]
    assert planted.status == "passed" and planted.detail.startswith("/"), planted
    v = run(pool, CARRIER + "def bits():\n    return read_bits(128)\n", f"""
        got = bits()
        token = {token}
        for name in ("nowait", "mincore"):
            assert all(b is None for b in got[name]), (name, got[name])
        same = sum(a == b for a, b in zip(got["timing"], token))
        assert same < 100, same      # a random guess matches 64 +- 6
        """, timeout_s=60.0)
    assert v.passed, v


def test_an_io_program_cannot_count_its_cases_through_the_page_cache(pool):
    """Each case's execution counts the marker pages already resident, touches the next one and
    prints the answer for its count: 3/3 if residency carried, at most 1/3 for an honest program."""
    counter = CARRIER + r'''
fd = os.open(PATH, os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
k = 0
while k < 3 and nowait(fd, page(7 + k)) == 1:
    k += 1
if k < 3:
    os.pread(fd, 1, page(7 + k))
print(["alpha", "beta", "gamma"][k % 3])
'''
    v = pool.run([{"kind": "io", "program": counter, "partial_reward": True, **SMALL,
                   "cases": [["", "alpha"], ["", "beta"], ["", "gamma"]]}])[0]
    assert v.status in PROGRAM_STATUSES and v.fraction <= 1 / 3 + 1e-9, v


def test_every_file_a_program_can_open_is_in_memory(pool):
    """The probe behind the two tests above: a program walks its whole root and finds only tmpfs
    (statfs), and every page of the pool's image is resident (mincore, from the host's side)."""
    walk = r'''
import ctypes, os, stat
def disk_files():
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(128)
    found = []
    for d, ds, fs in os.walk("/"):
        for n in ds + fs:
            p = os.path.join(d, n)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode) or stat.S_ISCHR(st.st_mode):
                continue   # a symlink is followed to its target; /dev/null and co. have no pages
            if libc.statfs(p.encode(), buf) != 0 or int.from_bytes(buf.raw[:8], "little") != 0x01021994:
                found.append(p)
    return found
'''
    v = run(pool, walk, "found = disk_files()\nassert found == [], found[:10]\n", timeout_s=60.0)
    assert v.passed, v
    assert pool.image is not None and rootfs.nonresident_pages(pool.image.path) == {}


def test_the_image_is_read_only_and_offers_what_was_asked(pool):
    """A program cannot write the image, imports numpy (the default package) and runs a command;
    a package the host lacks stops the pool at start, naming it."""
    v = run(pool, """
        import os, subprocess, numpy
        def f():
            try:
                open(numpy.__file__, "a").write("#")
                return "written"
            except OSError as e:
                pass
            return subprocess.run(["echo", str(int(numpy.arange(4).sum()))], capture_output=True,
                                  text=True).stdout.strip()
        """, "assert f() == '6', f()\n")
    assert v.passed, v
    with pytest.raises(verifier.IsolationUnavailable, match="no_such_package_xyz"):
        verifier.ExecutorPool(1, packages=("no_such_package_xyz",))


def test_the_page_cache_probes_are_refused(pool):
    """The filter refuses mincore, cachestat and a non-blocking preadv2 in every candidate; a plain
    preadv2 still reads."""
    v = run(pool, r"""
        import ctypes, errno, mmap, os
        def probes():
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(os.__file__, os.O_RDONLY)
            out = [os.preadv(fd, [bytearray(4)], 0, 0)]
            try:
                os.preadv(fd, [bytearray(4)], 0, os.RWF_NOWAIT)
            except OSError as e:
                out.append(errno.errorcode[e.errno])
            m = mmap.mmap(-1, mmap.PAGESIZE)
            view = ctypes.c_char.from_buffer(m)
            vec = ctypes.create_string_buffer(1)
            out.append((libc.mincore(ctypes.c_void_p(ctypes.addressof(view)), mmap.PAGESIZE, vec),
                        errno.errorcode[ctypes.get_errno()]))
            out.append((libc.syscall(451, fd, None, None, 0), errno.errorcode[ctypes.get_errno()]))
            return out
        """, "got = probes()\nassert got == [4, 'EPERM', (-1, 'EPERM'), (-1, 'EPERM')], got\n")
    assert v.passed, v


# ----------------------------------------------------------------------------- names the tests rely on

WORDS_TESTS = 'assert Counter(words("a b a")) == Counter({"a": 2, "b": 1})\n'


@pytest.mark.parametrize("program, tests, stands_for", [
    ("from operator import truth as Counter\ndef words(s):\n    return []\n", WORDS_TESTS, "collections.Counter"),
    ("import operator\nCounter = operator.truth\ndef words(s):\n    return []\n", WORDS_TESTS,
     "collections.Counter"),
    ("Counter = bool\ndef words(s):\n    return [1]\n", WORDS_TESTS, "collections.Counter"),
    ("from operator import add as isclose\ndef area(r):\n    return 1.0\n",
     "assert isclose(area(1.0), 3.14159, rel_tol=1e-3)\n", "math.isclose"),
    ("import cmath as math\ndef root(x):\n    return complex(x) ** 0.5 + 0j\n",
     "import cmath\nassert math.isclose(root(4), 2)\n", "math"),
])
def test_an_alias_cannot_forge_a_name_the_tests_use(pool, program, tests, stands_for):
    v = run(pool, program, tests)
    assert v.status == "failed" and not v.passed, v
    assert "which stands for" in v.detail and stands_for in v.detail.split("which stands for")[1], v


@pytest.mark.parametrize("program, tests, job", [
    ("from collections import Counter\ndef words(s):\n    return s.split()\n", WORDS_TESTS, {}),
    ("def Counter(xs):\n    if isinstance(xs, dict):\n        return dict(xs)\n    out = {}\n    for x in xs:\n        out[x] = out.get(x, 0) + 1\n    return out\n"
     "def words(s):\n    return s.split()\n", WORDS_TESTS, {}),   # its own Counter, as in one process
    ("from math import gcd as f\n", "def check(candidate):\n    assert candidate(12, 18) == 6\n",
     {"entry_point": "f"}),
    ("from math import gcd\n", "assert gcd(12, 18) == 6\n", {}),
    ("import math as m\nfrom fractions import Fraction as F\ndef half(x):\n    return F(x, 2)\n",
     "assert half(3) == F(3, 2) and m.isclose(float(half(1)), 0.5)\n", {}),
])
def test_honest_aliases_keep_their_names(pool, program, tests, job):
    v = run(pool, program, tests, **job)
    assert v.passed, v
    one_process = reference.reference_verdict({"kind": "assert", "program": program, "tests": tests, **job})
    assert one_process["passed"], one_process   # the dataset's own harness agrees


def test_curate_names_the_standard_names_tests_trust_the_program_for():
    import judge_names
    assert judge_names.trusted_names(WORDS_TESTS) == ["Counter"]
    assert judge_names.trusted_names("from collections import Counter\n" + WORDS_TESTS) == []
    assert judge_names.trusted_names("import math\nassert math.isclose(f(), 1) and isclose(g(), 2)\n") == ["isclose"]
    assert judge_names.trusted_names("assert math.sqrt(f(4)) == 2\nassert add(2, 3) == 5\n") == ["math"]
    assert judge_names.trusted_names("def check(c):\n    assert c(f()) == 1\ncheck(Counter)\n") == []


def test_curate_check_warns_about_tests_that_trust_the_program(pool, tmp_path):
    """`curate.py check` names each problem whose tests take a standard name from the program."""
    import io
    import json
    import types
    import curate
    rows = [{"task_id": 1, "text": "Count the words.", "code": "from collections import Counter\n"
             "def words(s):\n    return s.split()\n", "test_list": [WORDS_TESTS.strip()]},
            {"task_id": 2, "text": "Add.", "code": "def add(a, b):\n    return a + b\n",
             "test_list": ["assert add(2, 3) == 5"]}]
    path = tmp_path / "trust.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    shared = types.SimpleNamespace(run=pool.run, close=lambda: None)   # the module's pool stays open
    out = io.StringIO()
    assert curate.check_dataset(str(path), lambda: shared, out=out) == 0
    lines = out.getvalue().splitlines()
    assert lines[0] == (f"{path}:1: 1: warning: the tests use Counter without importing it: they trust the "
                        "program for it; import it in the tests"), lines
    assert lines[1].startswith("checked 2 problems: 2 reference solutions pass"), lines


# ----------------------------------------------------------------------------- every scorer bounded

def test_a_memory_hungry_reward_function_is_a_reward_error_not_the_hosts_memory(tmp_path):
    """A textbook Levenshtein reward builds the whole (n+1) x (m+1) table: on a 20k-character
    completion against a 20k-character row, 400 million cells. It runs under the graders' address-space
    limit (scorers.GRADER_MEMORY_MB), so it raises MemoryError there: a reward_error, never scored."""
    import scorers
    path = tmp_path / "lev.py"
    path.write_text(textwrap.dedent("""
        def levenshtein(completion, row):
            a, b = completion, row["target"]
            d = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
            for i in range(len(a) + 1):
                d[i][0] = i
            return 1.0 - d[-1][0] / max(len(a), 1)
        """))
    v = scorers.call_reward(f"{path}:levenshtein", "x" * 20000, {"target": "y" * 20000}, timeout_s=120.0)
    assert v["status"] == scorers.REWARD_ERROR and "MemoryError" in v["detail"], v
    small = scorers.call_reward(f"{path}:levenshtein", "abc", {"target": "abd"}, timeout_s=60.0)
    assert small["status"] == "failed" and small["reward"] == 0.0, small   # an honest call still scores


def test_a_large_module_level_table_crosses_as_a_handle(pool):
    """A 200 MiB table at module level is exported as a handle, found before it is copied: the
    program keeps its memory for itself (512 MiB here) and passes."""
    for table in ("bytes(200 << 20)", "array.array('b', bytes(200 << 20))"):
        v = run(pool, f"import array\nTABLE = {table}\ndef f(i):\n    return TABLE[i]\n",
                "assert f(3) == 0 and len(TABLE) == 200 << 20\n", memory_mb=512)
        assert v.passed, (table, v)
