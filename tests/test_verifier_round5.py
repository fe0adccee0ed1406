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
