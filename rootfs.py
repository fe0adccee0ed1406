"""The sandbox's files: a read-only tmpfs image of everything a program may read, so reading changes
nothing a later program can observe.

Trusted code (the verifier's pool builds the image; isolation.enter_sandbox makes it each executor's
root). Linux-specific, needs root. Standard library only.

Why an image. Files on a disk live in the host's page cache, and the page cache is state every
process shares: a program that reads chosen pages of a large file it can open makes them resident,
and a later program learns which ones are, with a non-blocking read (preadv2 with RWF_NOWAIT answers
EAGAIN for a page not in memory), with mincore on a mapping, or by timing a read (a page fault that
goes to disk is a hundred times slower). One page of a pair per bit carries a token from one
execution to the next, and an io program can count its own cases. A read-only bind mount does not
help (the cache behind it is the host's), and refusing the probes in seccomp does not either (the
timing stays). So a program can reach no file on a disk:

  * every file it can open is a copy on this tmpfs: the interpreter and its shared libraries, the
    standard library (without its own test suite and GUI), the third-party packages the verifier
    was told to offer (`--packages`, default numpy, with the packages they require), a few shell
    commands (COMMANDS: subprocess.run(["echo", ...]) works) and the time-zone database. A tmpfs
    file's pages exist from the moment it is written until it is removed: they are never read in
    from anywhere, so reading one changes nothing. The image is mounted noswap (where swap exists
    and the kernel cannot do that, the verifier refuses to start: a swapped-out page comes back on
    a read) and noatime, then remounted read-only; `nonresident_pages` is the probe that checks it.
  * the rest of the sandbox's root is tmpfs too (its /etc, its /tmp, each execution's scratch) and
    the character devices null, zero, random and urandom, which have no pages;
  * the executor itself was started from the host's disk before it entered the sandbox: the files
    it has mapped (the interpreter, libc, the extension modules it imported) stay reachable through
    those mappings in every child it forks, so it locks them in memory (mlockall) when it enters
    the sandbox: all of their pages are resident, always.

The image is built once per verifier process (shared by its pools, each executor binds it), in a
directory under the host's /tmp that no program sees, and unmounted when its last pool closes;
`remove_stale_images` unmounts those of verifiers killed before closing.
"""
from __future__ import annotations

import ctypes
import errno
import functools
import importlib.metadata
import importlib.util
import mmap
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading

from isolation import MNT_DETACH, MS_NOATIME, MS_NODEV, MS_NOSUID, MS_RDONLY, MS_REMOUNT, check_ret, libc, mount

IMAGE_PREFIX = "rlax-rootfs-"
DEFAULT_PACKAGES = ("numpy",)
COMMANDS = ("sh", "bash", "echo", "printf", "cat", "ls", "true", "false", "env", "sleep", "head", "tail",
            "wc", "sort", "uniq", "tr", "cut", "grep", "sed", "seq", "date", "pwd", "mkdir", "rm", "cp",
            "mv", "touch", "basename", "dirname", "expr", "test", "yes")
"""Commands a program may run (those of them the host has), from /usr/bin or /bin."""
STDLIB_LEFT_OUT = {"test", "tests", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3",
                   "site-packages", "dist-packages", "__phello__"}
"""Directories of the standard library not copied: its own test suite, the GUI (and _tkinter, which
would bring X11), installers, and config-* (the static library for embedding)."""
ZONEINFO = "/usr/share/zoneinfo"
NEVER_COPIED = {"etc", "proc", "sys", "dev", "run", "tmp", "var", "home", "mnt", "media", "srv", "boot"}
"""Top-level directories a symlink in the image may point into but never brings along (the sandbox
has its own /etc, /dev and /tmp)."""


class ImageError(RuntimeError):
    """The image could not be built (what is missing is in the message): the verifier does not start."""


# ============================================================================ what goes in

def _package_dirs(names: tuple[str, ...]) -> list[str]:
    """Top-level files and directories in site-packages of the distributions that provide `names`
    (importable module names) and of every distribution they require, transitively."""
    todo, dists = [], {}
    for name in names:
        if importlib.util.find_spec(name) is None:
            raise ImageError(f"the sandbox is to offer package {name!r}, which is not installed here")
        try:  # most distributions are named as their module; the full map costs seconds to build
            todo.append(importlib.metadata.distribution(name).metadata["Name"])
        except importlib.metadata.PackageNotFoundError:
            todo += importlib.metadata.packages_distributions().get(name, [])
    while todo:
        dist_name = todo.pop()
        key = re.sub(r"[-_.]+", "-", dist_name).lower()
        if key in dists:
            continue
        try:
            dist = importlib.metadata.distribution(dist_name)
        except importlib.metadata.PackageNotFoundError:
            continue  # an optional requirement not installed
        dists[key] = dist
        for req in dist.requires or []:
            if "extra" not in req.partition(";")[2]:  # extras are optional; other markers: include
                todo.append(re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", req).group(0))
    tops = set()
    for dist in dists.values():
        for f in dist.files or []:
            full = os.path.realpath(dist.locate_file(f))
            site = os.path.realpath(dist.locate_file(""))
            if full.startswith(site + os.sep):
                tops.add(os.path.join(site, os.path.relpath(full, site).split(os.sep)[0]))
    return sorted(t for t in tops if os.path.exists(t))


def _walk(top: str, left_out: set[str]):
    """Files and symlinks under top (top itself if it is a file), skipping directories in left_out
    and compiled files of optimisation levels the interpreter does not use."""
    if not os.path.isdir(top) or os.path.islink(top):
        yield top
        return
    for d, dirs, files in os.walk(top):
        dirs[:] = sorted(x for x in dirs if x not in left_out and not x.startswith("config-")
                         and not os.path.islink(os.path.join(d, x)))
        yield from (os.path.join(d, x) for x in sorted(files) if ".opt-" not in x and not x.startswith("_tkinter"))
        yield from (os.path.join(d, x) for x in os.listdir(d) if os.path.islink(os.path.join(d, x))
                    and os.path.isdir(os.path.join(d, x)))


def _is_elf(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def _shared_libraries(elves: list[str]) -> set[str]:
    """Every shared library the loader resolves for these ELF files (ldd), and the loader itself."""
    ldd = shutil.which("ldd") or "/usr/bin/ldd"
    found: set[str] = set()
    for i in range(0, len(elves), 200):
        out = subprocess.run([ldd, *elves[i:i + 200]], capture_output=True, text=True, timeout=120,
                             env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"})
        if out.returncode not in (0, 1) or not out.stdout:
            raise ImageError(f"ldd could not list the shared libraries the sandbox needs: {out.stderr[-300:]}")
        for line in out.stdout.splitlines():
            m = re.search(r"(?:=>\s*)?(/\S+)\s+\(0x", line)
            if m:
                found.add(m.group(1))
    return found


@functools.lru_cache(maxsize=4)
def image_files(packages: tuple[str, ...]) -> tuple[str, ...]:
    """The host paths the image copies (files; symlinks on the way are copied as symlinks)."""
    paths = sysconfig.get_paths()
    files: list[str] = []
    for p in {os.path.realpath(paths["stdlib"]), os.path.realpath(paths["platstdlib"])}:
        files += _walk(p, STDLIB_LEFT_OUT)
    exe = sys.executable
    bindir = os.path.dirname(exe)
    files += [os.path.join(bindir, n) for n in os.listdir(bindir) if re.fullmatch(r"python[0-9.]*", n)]
    for d in _package_dirs(packages):
        files += _walk(d, {"tests"})
    files += [p for p in ("/bin", "/sbin", "/lib", "/lib32", "/lib64") if os.path.islink(p)]  # merged /usr
    files += [os.path.join(d, name) for name in COMMANDS for d in ("/usr/bin", "/bin")
              if os.path.exists(os.path.join(d, name))]
    if os.path.isdir(ZONEINFO):
        files += _walk(ZONEINFO, set())
    elves = [f for f in files if os.path.isfile(f) and _is_elf(f)]
    files += sorted(_shared_libraries(elves))
    return tuple(dict.fromkeys(files))


# ============================================================================ building it

def _copy_into(root: str, path: str, depth: int = 0) -> int:
    """Copy host `path` to root + path: each directory on the way made (mode 755), each symlink on
    the way copied as a symlink and followed. Returns the bytes copied."""
    if depth > 40:
        raise ImageError(f"too many symlinks on the way to {path}")
    parts = os.path.normpath(path).strip("/").split("/")
    cur = ""
    for i, part in enumerate(parts):
        cur += "/" + part
        dst = root + cur
        if os.path.islink(cur):
            if not os.path.lexists(dst):
                os.symlink(os.readlink(cur), dst)
            target = os.path.normpath(os.path.join(os.path.dirname(cur), os.readlink(cur), *parts[i + 1:]))
            if target.split("/")[1] in NEVER_COPIED:  # zoneinfo/localtime -> /etc/localtime: left dangling
                return 0
            return _copy_into(root, target, depth + 1)
        if i < len(parts) - 1:
            if not os.path.isdir(dst):
                os.mkdir(dst, 0o755)
            continue
        if os.path.isdir(cur):
            os.makedirs(dst, 0o755, exist_ok=True)
            return 0
        if os.path.lexists(dst) or not os.path.isfile(cur):
            return 0
        mode = os.stat(cur).st_mode & 0o755
        with open(cur, "rb") as src, open(dst, "wb") as out:
            n = 0
            while chunk := src.read(1 << 20):  # written in full: a hole would be a page made on read
                n += out.write(chunk)
        os.chmod(dst, mode | 0o444)
        return n
    return 0


def _swap_in_use() -> bool:
    try:
        with open("/proc/swaps") as f:
            return len(f.read().strip().splitlines()) > 1
    except OSError:
        return False


class Image:
    """One mounted image (see the module docstring). `path` is its directory on the host."""

    def __init__(self, packages: tuple[str, ...]):
        if os.geteuid() != 0:
            raise ImageError("building the sandbox image needs root (a tmpfs mount)")
        files = image_files(packages)
        size = sum(os.path.getsize(f) for f in files if os.path.isfile(f))
        self.path = tempfile.mkdtemp(prefix=f"{IMAGE_PREFIX}{os.getpid()}-")
        os.chmod(self.path, 0o700)  # nobody but root on the host walks into it
        opts = f"size={size + size // 8 + (64 << 20)},nr_inodes={len(files) * 3 + 4096},mode=755"
        flags = MS_NOSUID | MS_NODEV | MS_NOATIME
        try:
            try:
                mount("tmpfs", self.path, "tmpfs", flags, opts + ",noswap")
                self.noswap = True
            except OSError as e:
                if e.errno == errno.EPERM:
                    raise ImageError(f"mounting its tmpfs was refused ({e}): no CAP_SYS_ADMIN (an unprivileged "
                                     "container?) or a seccomp filter forbids mount and unshare") from None
                if _swap_in_use():
                    raise ImageError(f"this kernel cannot mount a tmpfs noswap ({e}) and swap is in use: "
                                     "a swapped-out page of the image would be read back in, a state a "
                                     "program could observe; turn swap off (swapoff -a)") from None
                mount("tmpfs", self.path, "tmpfs", flags, opts)
                self.noswap = False
            self.bytes = sum(_copy_into(self.path, f) for f in files)
            mount(None, self.path, None, MS_REMOUNT | MS_RDONLY | flags)
        except BaseException:
            self._unmount()
            raise
        self.packages, self.files = packages, len(files)

    def _unmount(self) -> None:
        libc.umount2(self.path.encode(), MNT_DETACH)
        try:
            os.rmdir(self.path)
        except OSError:
            pass

    def describe(self) -> str:
        return (f"a read-only tmpfs image ({self.files} files, {self.bytes / 2**20:.0f} MiB"
                f"{', noswap' if self.noswap else ', no swap on this host'}): the interpreter, its "
                f"standard library, {', '.join(self.packages) or 'no third-party package'}, "
                f"{len(COMMANDS)} commands")


_images: dict[tuple[str, ...], list] = {}  # packages -> [Image, users]
_lock = threading.Lock()


def acquire(packages: tuple[str, ...]) -> Image:
    """The image offering `packages`, built on first use in this process; release() it when done."""
    with _lock:
        if packages not in _images:
            if not _images:
                remove_stale_images()
            _images[packages] = [Image(packages), 0]
        _images[packages][1] += 1
        return _images[packages][0]


def release(image: Image) -> None:
    """One user fewer; the last one unmounts it (executors still inside keep their binds alive)."""
    with _lock:
        entry = _images.get(image.packages)
        if entry is None or entry[0] is not image:
            return
        entry[1] -= 1
        if entry[1] <= 0:
            del _images[image.packages]
            image._unmount()


def remove_stale_images() -> int:
    """Unmount and remove the images of verifier processes that are gone (killed before closing).
    Returns how many."""
    removed, tmp = 0, tempfile.gettempdir()
    for name in os.listdir(tmp):
        m = re.fullmatch(re.escape(IMAGE_PREFIX) + r"(\d+)-.*", name)
        if not m or os.path.exists(f"/proc/{m.group(1)}"):
            continue
        path = os.path.join(tmp, name)
        libc.umount2(path.encode(), MNT_DETACH)
        try:
            os.rmdir(path)
            removed += 1
        except OSError:
            pass
    return removed


# ============================================================================ the probe

libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]


def nonresident_pages(root: str) -> dict[str, int]:
    """{file: pages not in memory} for every regular file under root (mincore on a mapping of each),
    so {} means every page is resident: what a program could probe (RWF_NOWAIT, mincore, timing)
    tells it nothing, whatever any earlier program read."""
    page, out = mmap.PAGESIZE, {}
    for d, _, files in os.walk(root):
        for name in files:
            path = os.path.join(d, name)
            if os.path.islink(path) or not os.path.isfile(path) or os.path.getsize(path) == 0:
                continue
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                m = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)  # private: its pages are the file's
            view = ctypes.c_char.from_buffer(m)
            vec = ctypes.create_string_buffer((size + page - 1) // page)
            try:
                check_ret(libc.mincore(ctypes.c_void_p(ctypes.addressof(view)), size, vec), f"mincore {path}")
            finally:
                del view
                m.close()
            missing = sum(1 for b in vec.raw if not b & 1)
            if missing:
                out[path] = missing
    return out

