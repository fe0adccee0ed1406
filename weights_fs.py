"""A weight transport through a shared directory: each version a file, for workers that share a
filesystem with the param server but not a fast network path to it (preemptible remote machines).

    python param_server.py ... --weights-dir /shared/weights      # publishes every version there
    python inference_worker.py ... --weights-dir /shared/weights  # reads the newest from there

One implementation of weights.Transport (weights.py tells a version's life; versions.py its format).
Each version is one safetensors file named v<version>-<lineage>.safetensors (versions.write_file).

NOBODY SEES HALF A VERSION. The publisher writes to a temporary name, fsyncs it and renames it into
place (a rename is atomic: a reader opens the old name list's files or the new one's, never a
half-written file), then fsyncs the directory. A reader checks every byte against the tensors' CRCs
(versions.read_file) and offers nothing that fails: a torn, truncated or corrupt file is refused
with an error that names it, and the worker keeps the version it has.

WHICH IS NEWEST. The newest file's lineage (by modification time: a new trainer's versions start
again from 0) and in it the highest version. Publishing a new lineage's first version removes the
old lineage's files; otherwise the newest `keep` versions stay, and the base of every adapter
version kept (an adapter version's file is written after its base's, so a reader finds both).
"""
from __future__ import annotations

import os
import re
import time
from typing import Callable

import versions
import weights
from versions import Version, VersionBuffer, VersionKey

_NAME = re.compile(r"v(\d+)-([\w.-]*)\.safetensors")


class DirTransport(weights.Transport):
    """Versions as files in `folder`: `publish` writes one (and prunes to the newest `keep`),
    `newest` reads the newest not yet offered, polling every poll_s. `log(text)`: our log lines."""

    def __init__(self, folder: str, keep: int = 3, log: Callable[[str], None] = print, poll_s: float = 0.2):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.folder, self.keep, self.log, self.poll_s = folder, keep, log, poll_s
        os.makedirs(folder, exist_ok=True)
        self.offered: set[VersionKey] = set()  # handed to the reader (or refused): never again
        self.refused: dict[str, tuple] = {}    # path -> (mtime_ns, size) of a file that failed its check
        self.base: VersionBuffer | None = None  # the newest full version read: adapters apply to it

    def __repr__(self) -> str:
        return f"DirTransport({self.folder!r})"

    def path(self, key: VersionKey) -> str:
        if not _NAME.fullmatch(f"v0-{key.lineage}.safetensors"):
            raise ValueError(f"lineage {key.lineage!r} cannot name a file (want letters, digits, _ . -)")
        return os.path.join(self.folder, f"v{key.version:010d}-{key.lineage}.safetensors")

    def files(self) -> list:
        """[(mtime_ns, VersionKey, path)] of the version files in the folder (temporary names excluded)."""
        out = []
        for entry in os.scandir(self.folder):
            match = _NAME.fullmatch(entry.name)
            if match:
                try:
                    out.append((entry.stat().st_mtime_ns, VersionKey(int(match[1]), match[2]), entry.path))
                except FileNotFoundError:  # pruned meanwhile
                    pass
        return out

    # --- the publisher's side
    def publish(self, version: Version) -> None:
        """Write `version` (an adapter version's base first, if its file is not there), then prune."""
        if version.is_adapter:
            base = version.base
            if base is None or base.manifest.key != version.manifest.base_key:
                raise ValueError(f"adapter v{version.manifest.version} is published with its base")
            if not os.path.exists(self.path(base.manifest.key)):
                versions.write_file(self.path(base.manifest.key), base.manifest, base.chunks, fsync=True)
        versions.write_file(self.path(version.manifest.key), version.manifest, version.chunks, fsync=True)
        self.prune(version.manifest.lineage)

    def prune(self, lineage: str) -> None:
        """Remove other lineages' files and all but the newest `keep` versions of `lineage`, keeping
        the base of every adapter version kept. A reader holding a file open keeps reading it."""
        mine = sorted((key.version, path) for _, key, path in self.files() if key.lineage == lineage)
        keep = {path for _, path in mine[-self.keep:]}
        for _, path in mine[-self.keep:]:
            base = self.base_of(path)
            if base is not None:
                keep.add(self.path(VersionKey(base, lineage)))
        for _, key, path in self.files():
            if path not in keep:
                try:
                    os.remove(path)
                except FileNotFoundError:
                    pass

    @staticmethod
    def base_of(path: str) -> int | None:
        """The base version an adapter version's file names (its header's metadata), else None."""
        try:
            return versions.read_header(path).base
        except (ValueError, OSError):
            return None

    # --- the reader's side
    def newest(self, min_version: int, lineage: str, wait_s: float) -> VersionBuffer | None:
        deadline = time.monotonic() + wait_s
        while True:
            buf = self.look(min_version, lineage)
            if buf is not None or time.monotonic() >= deadline:
                return buf
            time.sleep(min(self.poll_s, max(0.0, deadline - time.monotonic())))

    def look(self, min_version: int, lineage: str) -> VersionBuffer | None:
        """The newest version in the folder if it is one to offer, read and checked; else None."""
        files = self.files()
        if not files:
            return None
        newest_lineage = max(files)[1].lineage
        key, path = max((k, p) for _, k, p in files if k.lineage == newest_lineage)
        if key in self.offered or (key.version < min_version and key.lineage == lineage):
            return None
        try:
            stat = os.stat(path)
        except FileNotFoundError:  # pruned meanwhile: a newer one is there
            return None
        if self.refused.get(path) == (stat.st_mtime_ns, stat.st_size):
            return None  # refused already, and not rewritten since
        try:
            buf = self.read(path)
        except (ValueError, OSError) as e:
            self.log(f"weights v{key.version} refused: {e}; keeping the version we have")
            self.refused[path] = (stat.st_mtime_ns, stat.st_size)
            return None
        self.offered.add(key)
        return buf

    def read(self, path: str) -> VersionBuffer:
        """A version's file read and checked; an adapter version with its base (the one we hold, else
        its file read too). ValueError naming the file if either is not a complete version."""
        buf = versions.read_file(path)
        if buf.is_adapter:
            base = self.base
            if base is None or base.key != buf.manifest.base_key:
                base_path = self.path(buf.manifest.base_key)
                if not os.path.exists(base_path):
                    raise ValueError(f"{path}: its base {base_path} is not there")
                base = versions.read_file(base_path)
                if base.is_adapter:
                    raise ValueError(f"{base_path}: an adapter version, not the full base {path} needs")
            buf.base = base
        if not buf.is_adapter:
            self.base = buf
        elif self.base is None or self.base.key != buf.base.key:
            self.base = buf.base
        return buf
