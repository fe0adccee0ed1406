"""Memory and time of loading a large Parquet dataset: the trainer's loader (tasks.py, a row group and a
batch at a time) against the whole-table read it replaced (pyarrow.parquet.read_table(path).to_pylist()).

Run:  python bench/bench_dataset_memory.py                    # a ~1 GB file under /tmp, deleted after
      python bench/bench_dataset_memory.py --size-mb 256      # smaller
      python bench/bench_dataset_memory.py --variants stream   # ours only
      python bench/bench_dataset_memory.py --variants hf --size-mb 128   # DATA=hf:<folder>, needs datasets

The file: synthetic rows with long text columns, written in row groups of --group-mb (uncompressed) each
with pyarrow's default (snappy) compression. Most rows are plain-assert code problems (prompt, tests and a
reference solution, all kept in the Problem, and an `editorial` column no format reads, as published code
sets carry); one row in 32 is a GSM8K-style math row with an integer `answer` (a long question). The text
is random lowercase words, which snappy hardly compresses, so the file's size on disk is about its data's.

Each variant runs in a fresh child process (so one's freed memory does not hide the other's):
  stream    tasks.iter_problems (what tasks.load_jsonl / the trainer runs), every Problem kept in a list.
  whole     the old tasks._parquet_rows: read_table(path).to_pylist(), nulls dropped, then the same
            tasks._problem_from_record on each row, the table and the rows held until the last row (as
            the old generator held them), every Problem kept.
  hf        (if the datasets library is installed) DATA=hf:<a folder holding the file>: datasets converts
            it into its Arrow cache once (not timed, in the parent), then the child loads it as the trainer
            would: tasks.iter_problems("hf:<folder>").
Measured in the child: rss_start (VmRSS after the imports: math-verify, pyarrow, datasets for hf),
peak = VmHWM (the process's peak resident set) at the end, anon_peak = the peak of RssAnon sampled every
5 ms (the process's own memory, without the pages of a memory-mapped file, which hf's Arrow cache is:
those are the page cache's, shared and reclaimable), first_s = seconds to the first Problem, all_s = to
the last, kept_mb = the text the Problems hold (prompt, tests, solutions, answer: what the trainer keeps).

Measured: bench/README.md ("Dataset memory").

Last lines: `RESULT name=dataset_memory variant=<v> file_mb=<f> problems=<p> errors=<e>
rss_start_mb=<s> peak_mb=<m> peak_over_start_mb=<m - s> anon_peak_over_start_mb=<a> kept_mb=<k>
first_s=<t1> all_s=<t>`.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

def _status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


class _PeakAnon(threading.Thread):
    """Samples RssAnon (the process's own memory; a memory-mapped file's pages are RssFile, the page
    cache's, which the kernel reclaims) every 5 ms until stopped; .peak is the largest seen (MiB)."""

    def __init__(self):
        super().__init__(daemon=True)
        self.peak, self.running = _status_mb("RssAnon"), True

    def run(self):
        while self.running:
            self.peak = max(self.peak, _status_mb("RssAnon"))
            time.sleep(0.005)

    def stop(self) -> float:
        self.running = False
        self.join()
        return max(self.peak, _status_mb("RssAnon"))


def _text(rng, n_chars: int) -> str:
    """About n_chars of random lowercase words and newlines (numpy, fast)."""
    import numpy as np
    codes = rng.integers(97, 123, size=n_chars, dtype=np.uint8)
    codes[rng.random(n_chars) < 0.16] = 32   # a space about every 6 characters
    codes[rng.random(n_chars) < 0.01] = 10   # a newline about every 100
    return codes.tobytes().decode("ascii")


def generate(path: str, size_mb: float, group_mb: float, seed: int = 0) -> dict:
    """Write the synthetic Parquet file (row groups of about group_mb of text) until it holds size_mb
    on disk; returns its rows and sizes."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    rng = np.random.default_rng(seed)
    schema = pa.schema([("task_id", pa.string()), ("prompt", pa.string()), ("tests", pa.string()),
                        ("solution", pa.string()), ("editorial", pa.string()), ("question", pa.string()),
                        ("answer", pa.int64())])
    # lengths of a row's texts (characters): a prompt ~2 KB, tests ~1.5 KB, a solution ~1 KB,
    # an editorial ~4 KB; a math row's question ~3 KB
    rows, raw, target = 0, 0, size_mb * 2**20
    with pq.ParquetWriter(path, schema) as writer:
        while _written(path) < target:
            group = {k: [] for k in schema.names}
            group_raw = 0
            while group_raw < group_mb * 2**20:
                i = rows + len(group["task_id"])
                group["task_id"].append(f"synthetic/{i}")
                if i % 32 == 31:
                    q = _text(rng, int(rng.integers(2000, 4000)))
                    vals = dict(prompt=None, tests=None, solution=None, editorial=None,
                                question=q, answer=int(rng.integers(-10**6, 10**6)))
                    group_raw += len(q)
                else:
                    name = f"f{i}"
                    prompt = f'def {name}(x):\n    """' + _text(rng, int(rng.integers(1000, 3000))) + '"""\n'
                    tests = "".join(f"assert {name}({k}) == {k}  # " + _text(rng, 60) + "\n"
                                    for k in range(int(rng.integers(10, 30))))
                    solution = "    return x  # " + _text(rng, int(rng.integers(500, 1500))).replace("\n", " ") + "\n"
                    editorial = _text(rng, int(rng.integers(2000, 6000)))
                    vals = dict(prompt=prompt, tests=tests, solution=solution, editorial=editorial,
                                question=None, answer=None)
                    group_raw += len(prompt) + len(tests) + len(solution) + len(editorial)
                for k, v in vals.items():
                    group[k].append(v)
            writer.write_table(pa.Table.from_pydict(group, schema=schema))
            rows += len(group["task_id"])
            raw += group_raw
    meta = pq.ParquetFile(path).metadata
    return {"rows": rows, "file_mb": os.path.getsize(path) / 2**20, "text_mb": raw / 2**20,
            "row_groups": meta.num_row_groups}


def _written(path: str) -> int:
    return os.path.getsize(path) if os.path.exists(path) else 0


def child(variant: str, path: str) -> None:
    """Load the dataset one way and print one RESULT line (run in a fresh process)."""
    import math_answers
    import tasks
    math_answers.math_verify_module()  # imported before rss_start, as in a trainer that has it
    math_answers.parse_reference("1", "hash")
    import pyarrow.compute  # noqa: F401 - pyarrow's own import (some 50 MB) is not the loader's
    import pyarrow.parquet
    if variant == "hf":
        __import__("datasets")  # nor is the datasets library's (pandas, ...)
    rss_start, anon_start = _status_mb("VmRSS"), _status_mb("RssAnon")
    problems, errors, first = [], 0, None
    sampler = _PeakAnon()
    sampler.start()
    t0 = time.perf_counter()
    if variant in ("stream", "hf"):
        source = f"hf:{os.path.dirname(path)}" if variant == "hf" else path
        for number, got in tasks.iter_problems(source):
            if number is None:
                errors += 1
                continue
            if first is None:
                first = time.perf_counter() - t0
            problems.append(got)
    else:  # the old tasks._parquet_rows, then scan_jsonl's per-row work
        table = pyarrow.parquet.read_table(path)
        rows = table.to_pylist()
        name = os.path.basename(path)
        for i, rec in enumerate(rows, 1):
            rec = {k: v for k, v in rec.items() if v is not None}
            try:
                p = tasks._problem_from_record(rec, default_id=f"{name}:{i}")
            except ValueError:
                errors += 1
                continue
            if first is None:
                first = time.perf_counter() - t0
            problems.append(p)
        del table, rows
    total = time.perf_counter() - t0
    peak, peak_anon = _status_mb("VmHWM"), sampler.stop()
    kept = sum(len(p.prompt) + len(p.tests) + sum(map(len, p.solutions)) + len(p.answer) for p in problems)
    print(f"RESULT name=dataset_memory variant={variant} file_mb={os.path.getsize(path) / 2**20:.1f} "
          f"problems={len(problems)} errors={errors} rss_start_mb={rss_start:.0f} peak_mb={peak:.0f} "
          f"peak_over_start_mb={peak - rss_start:.0f} anon_peak_over_start_mb={peak_anon - anon_start:.0f} "
          f"kept_mb={kept / 2**20:.0f} first_s={first or float('nan'):.3f} all_s={total:.2f}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mb", type=float, default=1024, help="the file's size on disk (MiB)")
    ap.add_argument("--group-mb", type=float, default=64, help="text per row group (MiB, uncompressed)")
    ap.add_argument("--variants", default="stream,whole", help="comma-separated: stream, whole, hf")
    ap.add_argument("--dir", default=None, help="where to write the file (a new folder under it; default /tmp)")
    ap.add_argument("--keep", action="store_true", help="keep the file (its path is printed)")
    ap.add_argument("--child", nargs=2, metavar=("VARIANT", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(*args.child)
    variants = [v for v in args.variants.split(",") if v]
    bad = [v for v in variants if v not in ("stream", "whole", "hf")]
    if bad:
        sys.exit(f"unknown variants {bad}")
    folder = tempfile.mkdtemp(prefix="bench-dataset-memory-", dir=args.dir or "/tmp")
    os.mkdir(os.path.join(folder, "data"))  # hf: reads this folder; its cache is beside it, not in it
    path = os.path.join(folder, "data", "train.parquet")
    try:
        t0 = time.perf_counter()
        info = generate(path, args.size_mb, args.group_mb)
        print(f"wrote {path}: {info['file_mb']:.0f} MiB on disk, {info['text_mb']:.0f} MiB of text, "
              f"{info['rows']} rows in {info['row_groups']} row groups ({time.perf_counter() - t0:.0f} s)", flush=True)
        env = {**os.environ}
        if "hf" in variants:
            cache = os.path.join(folder, "hf-cache")
            env.update(HF_DATASETS_CACHE=cache, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
            t0 = time.perf_counter()
            build = "import datasets, sys; datasets.load_dataset(sys.argv[1], split='train')"
            subprocess.run([sys.executable, "-c", build, os.path.dirname(path)], check=True, env=env, cwd=ROOT)
            print(f"datasets built its Arrow cache in {time.perf_counter() - t0:.0f} s", flush=True)
        results = {}
        for v in variants:
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", v, path], env=env,
                                 cwd=ROOT, capture_output=True, text=True)
            line = next((s for s in out.stdout.splitlines() if s.startswith("RESULT ")), None)
            if out.returncode or line is None:
                print(f"variant {v} failed (exit {out.returncode}):\n{out.stdout}{out.stderr}", flush=True)
                continue
            print(line, flush=True)
            results[v] = dict(kv.split("=", 1) for kv in line.split()[1:])
        if results:
            print("\n| variant | peak RSS | over start | anonymous, over start | kept text | first problem "
                  "| all problems |")
            print("|---|---|---|---|---|---|---|")
            for v, r in results.items():
                print(f"| {v} | {r['peak_mb']} MiB | {r['peak_over_start_mb']} MiB | "
                      f"{r['anon_peak_over_start_mb']} MiB | {r['kept_mb']} MiB | {r['first_s']} s | {r['all_s']} s |")
        print(json.dumps({"file": info, "results": results}))
    finally:
        if args.keep:
            print(f"kept {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
