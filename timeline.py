"""timeline.py: what each role was doing and when, from the roles' own timers.

Each role given `--timeline PATH` (launch.sh gives every trainer and worker
$RUN_DIR/timeline/<role>.jsonl) appends one JSON line per span of work:

    {"role": "worker-0", "span": "sample", "start": 1764561234.123, "end": 1764561235.456, "version": 7}

start/end are wall-clock seconds (time.time(), comparable across the processes of one machine); any
other keys are the span's context (the trainer's step, the worker's weight version and tokens).
Spans: the trainer's "wait" (for rollouts), "train", "push", "eval", "checkpoint"; a worker's "pull"
(weights), "sample", "verify", "submit". Between its spans a role is idle or doing bookkeeping.
`python plot.py` draws them as a timeline; bench/run_all.py sums them per role and span.
"""
from __future__ import annotations

import contextlib
import glob
import json
import os
import time


class Timeline:
    def __init__(self, path: str, role: str):
        self.role, self.file = role, None
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self.file = open(path, "a")

    def add(self, name: str, start: float, end: float, **context) -> None:
        if self.file is not None:
            self.file.write(json.dumps({"role": self.role, "span": name, "start": round(start, 4),
                                        "end": round(end, 4), **context}) + "\n")
            self.file.flush()

    @contextlib.contextmanager
    def span(self, name: str, **context):
        """Time the block; the yielded dict may be added to inside it, and is written with the span."""
        start = time.time()
        try:
            yield context
        finally:
            self.add(name, start, time.time(), **context)


def read(run_dir: str) -> list[dict]:
    """Every span of a run dir's timeline/*.jsonl, sorted by start; a torn last line is skipped."""
    spans = []
    for path in sorted(glob.glob(os.path.join(run_dir, "timeline", "*.jsonl"))):
        with open(path) as f:
            for line in f:
                try:
                    spans.append(json.loads(line))
                except ValueError:
                    continue
    return sorted(spans, key=lambda s: s["start"])


def totals(spans: list[dict]) -> dict:
    """Seconds per (role kind, span): roles "worker-3" and "worker-0" count as "worker"."""
    out: dict = {}
    for s in spans:
        key = (s["role"].split("-")[0], s["span"])
        out[key] = out.get(key, 0.0) + s["end"] - s["start"]
    return out
