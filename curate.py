"""Dataset curation by pass rate: keep the training problems the starting policy solves sometimes.

    python curate.py --model checkpoints/coldstart --out runs/curated                 # the embedded task
    python curate.py --model CKPT --data train.jsonl --k 8 --out runs/curated         # a dataset
    python curate.py --model CKPT --data train.jsonl --low 0.1 --high 0.9 --out DIR   # a narrower band
    python curate.py check train.jsonl [--format chat|completion]                     # check a dataset first

Why. RLAX (Apple 2025) credits part of its gain to curating the dataset. With binary rewards, GRPO's
advantage is a sample's reward minus its group's mean: a problem the starting policy solves in every
sample, or in none, gives a group of equal rewards, zero advantage and no gradient, so its G samples
are wasted. DAPO's dynamic sampling (grpo.py) drops such groups after paying for them; curation drops
their problems before training, by measuring each problem's pass rate once, with the starting policy.
Training on the problems whose pass rate lies strictly between 0 and 1 wastes fewer samples. (The
rate moves as training goes on, so this is a first filter, not a guarantee.)

What it does:
  1. The training problems. With --data: the TRAINING split of that dataset exactly as trainer.py
     makes it (tasks.load_jsonl, then tasks.split_dataset with min(--heldout, n // 2) held out: the
     held-out problems are never sampled). Without: the embedded task, the first --problems DISTINCT
     problems of tasks.train_problems(--seed), "the same problem" meaning tasks.problem_key (for a
     generated problem its function "family:coeffs", which the stream draws many times).
  2. --k completions per problem from the checkpoint, built and cut exactly as an inference worker
     does it (workitems.problem_item makes the work item: prompt format, program prefix, stop strings;
     sampler.py's build_prompts, row_keys, generate and cut_completions, and envs.score_jobs, do the rest), at
     --temperature 1 with --max-new-tokens as the trainer's. Every completion is scored in the real
     sandbox: verifier.py in a process of its own (warmup.verifier_service: no fork where JAX runs).
     A verdict that is an infrastructure failure (lifecycle.infra_failures: infra_error,
     reward_error) says nothing about the policy: it is left out of the problem's samples and
     counted apart, so a problem's rate is passed / valid samples.
  3. Outputs under --out:
       pass_rates.jsonl  one line per problem: {"key", "item_id", "k" (valid samples: the rate's
                         denominator), "passed", "rate" (passed / k; null with no valid sample),
                         "infra_errors", "too_long" (prompt + max_new_tokens exceed the trainer's
                         seq_len: never sampled, as the trainer would skip it)}
       keep.txt          "#" header lines (band, checkpoint, problems), then the problem_key of every
                         problem in the band, one a line: trainer --curated keep.txt trains on those only
       kept.jsonl        --data only: the dataset lines of the kept problems, verbatim, in file order
                         (from a JSON list, Parquet or hf: source, each row as one JSON line):
                         a dataset of its own (trainer --data kept.jsonl splits it again, so its
                         held-out problems are then drawn from the kept ones; to keep the original
                         split, train on the whole file with trainer --curated keep.txt)
       report.json       the histogram of pass counts 0..k (problems and shares), how many are in the
                         band, the mean pass rate before and after curation, the settings; printed too

The band. A problem is kept when low < rate < high; --include-low / --include-high make an end
inclusive. The defaults keep "neither never nor always solved". Rates are multiples of 1/k (of one
over the valid samples, with infra failures), so --low 0.01 keeps the same as --low 0 (strict) at any
k below 100; --low 0.25 --include-low with k=8 keeps 2/8 to 7/8. A problem without a valid sample (too
long, or every verdict an infra failure) has no rate and is never kept. The histogram puts a problem
with infra failures at its rate rounded to the nearest k-th. An empty band is not an error: every file
is written, the report says so, and the exit status is 0 (trainer --curated refuses an empty list).

The dataset check (`python curate.py check FILE`, check_dataset): every bad line of the file, then every
problem whose reference solutions all fail when verified exactly as the worker verifies a model's
completion (the program built by prompts.py, judged in the verifier's sandbox). A code problem (assert
or io) that fails there runs once more, its first failing job unchanged, in the dataset's own harness
(reference.py: program and tests in one plain Python process), and its line says which failure it is:
  FILE:LINE: ID: the reference solution fails: STATUS (DETAIL)
      it fails in one process too: the reference (or the row's tests) is wrong;
  FILE:LINE: ID: the verifier fails the reference solution that one Python process passes (STATUS:
  DETAIL); a verifier limit (docs/verifier.md, "Differences from one process"): leave this problem out
  or change its tests
      (one line) only the verifier fails it, e.g. the tests seed `random` in their own process and the
      program draws from another's: training on that problem would reward even a right program 0.
The last line is "checked N problems: P reference solutions pass, F fail, B bad lines", "F fail" reading
"F fail (L of them only in the verifier)" when L > 0 of them are verifier limits; the exit status is 1
when F or B > 0. reference.py runs programs WITHOUT a sandbox: only the file's own reference solutions go
through it (trusted, as the dataset is), never generated code.

Time: the embedded default (1024 problems x 8 samples of checkpoints/coldstart) took 2 min 4 s on a
2-core CPU shared with another job (2026-12-02); 681 problems (0.665) were in the default band, mean
pass rate 0.141 before curation and 0.212 after.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
import types
from dataclasses import dataclass

import cli
import envs
import hf_io
import lifecycle
import model
import prompts
import sampler
import scorers
import tasks
import trainer
import warmup
import workitems
from verdicts import INFRA_ERROR

# ----------------------------------------------------------------------------- config


@dataclass
class Sampling:
    """Which problems, which policy, how it samples them (curate.py and rejection_sample.py).

    The defaults are trainer.Config's, so the samples are those training starts from."""
    model: str = ""
    """the policy: a Hugging Face checkpoint folder (required)"""
    out: str = ""
    """directory the outputs are written to (required)"""
    data: str = ""
    """JSONL dataset (tasks.load_jsonl formats): its training split is sampled. "" = the embedded task"""
    heldout: int = trainer.Config.heldout
    """--data: held-out problems, as trainer --heldout (min(heldout, n // 2) are held out, never sampled)"""
    problems: int = 1024
    """embedded task only: how many distinct training problems (tasks.problem_key) to sample"""
    k: int = 8
    """samples per problem"""
    seed: int = 0
    """the embedded stream's seed (as trainer --seed) and the sampling seed"""
    prompt_format: str = trainer.Config.prompt_format
    """"completion" or "chat" (prompts.py); "" = chat when the checkpoint has a chat template"""
    temperature: float = trainer.Config.temperature
    """sampling temperature (the workers sample at the trainer's, 1 by default)"""
    max_new_tokens: int = trainer.Config.max_new_tokens
    """longest completion, as trainer --max-new-tokens"""
    dtype: str = trainer.Config.dtype
    """what the model computes in, as trainer --dtype"""
    batch_rows: int = 256
    """decode rows per generate() call (whole problems of k rows each)"""

    def __post_init__(self):
        if not self.model:
            raise ValueError("--model is required: the checkpoint folder of the policy")
        if not os.path.isfile(os.path.join(self.model, "config.json")):
            raise ValueError(f"--model {self.model!r} is not a checkpoint folder (no config.json there)")
        if not self.out:
            raise ValueError("--out is required: the directory the outputs are written to")
        if self.data and not os.path.isfile(self.data):
            raise ValueError(f"--data {self.data!r} does not exist or is not a file")
        for name in ("k", "problems", "heldout", "max_new_tokens", "batch_rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if not self.temperature > 0:
            raise ValueError(f"--temperature must be > 0 (greedy samples all agree), got {self.temperature}")
        if self.prompt_format not in ("",) + prompts.FORMATS:
            raise ValueError(f"--prompt-format must be one of {prompts.FORMATS} or '', got {self.prompt_format!r}")
        hf_io.compute_dtype_override(self.dtype)  # raises on an unknown one


@dataclass
class Config(Sampling):
    """Curation settings: the sampling, then the band of pass rates kept."""
    low: float = 0.0
    """keep problems with pass rate above this (at or above with --include-low)"""
    high: float = 1.0
    """keep problems with pass rate below this (at or below with --include-high)"""
    include_low: bool = False
    """the band includes its lower end: rate >= low"""
    include_high: bool = False
    """the band includes its upper end: rate <= high"""

    def __post_init__(self):
        super().__post_init__()
        Band(self.low, self.high, self.include_low, self.include_high)  # raises on a bad band

    def band(self) -> "Band":
        return Band(self.low, self.high, self.include_low, self.include_high)


# ----------------------------------------------------------------------------- the band (pure)

@dataclass(frozen=True)
class Band:
    """The pass rates kept: low < rate < high, each end inclusive if asked."""
    low: float = 0.0
    high: float = 1.0
    include_low: bool = False
    include_high: bool = False

    def __post_init__(self):
        if not 0.0 <= self.low < self.high <= 1.0:
            raise ValueError(f"the band needs 0 <= low < high <= 1, got low={self.low} high={self.high}")

    def __contains__(self, rate) -> bool:
        if rate is None:  # no valid sample: no rate
            return False
        above = rate >= self.low if self.include_low else rate > self.low
        below = rate <= self.high if self.include_high else rate < self.high
        return above and below

    def __str__(self) -> str:
        return (f"{self.low:g} {'<=' if self.include_low else '<'} rate "
                f"{'<=' if self.include_high else '<'} {self.high:g}")


@dataclass(frozen=True)
class PassRate:
    """One problem's measurement: passed of k valid samples (infra failures not among them)."""
    key: str
    item_id: str
    k: int
    passed: int
    infra_errors: int = 0
    too_long: bool = False

    @property
    def rate(self) -> float | None:
        return self.passed / self.k if self.k else None

    def to_json(self) -> dict:
        return {"key": self.key, "item_id": self.item_id, "k": self.k, "passed": self.passed, "rate": self.rate,
                "infra_errors": self.infra_errors, "too_long": self.too_long}


def tally(key: str, item_id: str, verdicts: list) -> PassRate:
    """A problem's PassRate from its verdicts, (passed, status) pairs: infra failures are left out of k."""
    infra = [lifecycle.infra_failures([status]) > 0 for _, status in verdicts]
    return PassRate(key, item_id, k=infra.count(False), infra_errors=infra.count(True),
                    passed=sum(bool(ok) for (ok, _), bad in zip(verdicts, infra) if not bad))


def select(rates: list, band: Band) -> list:
    """The PassRates whose rate lies in the band, in their order."""
    return [r for r in rates if r.rate in band]


def histogram(rates: list, k: int) -> list:
    """Problems per pass count 0..k: [{"passed": c, "problems": n, "share": n / rated}, ...]. A problem
    with fewer than k valid samples (infra failures) counts at its rate rounded to the nearest k-th; one
    without a rate is not counted (summarize()'s "unrated")."""
    rated = [r.rate for r in rates if r.rate is not None]
    counts = [0] * (k + 1)
    for rate in rated:
        counts[round(rate * k)] += 1
    return [{"passed": c, "problems": n, "share": n / len(rated) if rated else 0.0} for c, n in enumerate(counts)]


def summarize(rates: list, k: int, band: Band) -> dict:
    """The numbers of the report: distribution, band, mean pass rate before and after curation."""
    kept = select(rates, band)
    rated = [r.rate for r in rates if r.rate is not None]
    mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    return {"problems": len(rates), "k": k, "rated": len(rated), "unrated": len(rates) - len(rated),
            "too_long": sum(r.too_long for r in rates), "infra_errors": sum(r.infra_errors for r in rates),
            "histogram": histogram(rates, k), "band": str(band),
            "band_settings": dataclasses.asdict(band), "kept": len(kept),
            "kept_share": len(kept) / len(rates) if rates else 0.0, "empty_band": not kept,
            "mean_rate_before": mean(rated), "mean_rate_after": mean([r.rate for r in kept])}


def write_outputs(out_dir: str, rates: list, k: int, band: Band, header: list, lines: dict | None = None,
                  info: dict | None = None) -> dict:
    """Write pass_rates.jsonl, keep.txt (the `header` lines as "#" comments, then the kept keys),
    kept.jsonl when `lines` (item_id -> the dataset line, bytes) is given, and report.json (summarize()
    plus `info`). Returns the report."""
    os.makedirs(out_dir, exist_ok=True)
    kept = select(rates, band)
    report = {**(info or {}), **summarize(rates, k, band)}
    files = {name: os.path.join(out_dir, name) for name in ("pass_rates.jsonl", "keep.txt", "report.json")}
    with open(files["pass_rates.jsonl"], "w") as f:
        f.writelines(json.dumps(r.to_json()) + "\n" for r in rates)
    with open(files["keep.txt"], "w") as f:
        f.writelines(f"# {line}\n" for line in header)
        f.writelines(r.key + "\n" for r in kept)
    if lines is not None:
        files["kept.jsonl"] = os.path.join(out_dir, "kept.jsonl")
        with open(files["kept.jsonl"], "wb") as f:
            for r in sorted(kept, key=lambda r: lines[r.item_id][0]):
                line = lines[r.item_id][1]
                f.write(line if line.endswith((b"\n", b"\r")) else line + b"\n")
    report["files"] = sorted(files.values())
    with open(files["report.json"], "w") as f:
        json.dump(report, f, indent=1)
    return report


def format_report(report: dict) -> str:
    """The printed report: the histogram with a bar per count, the band, the mean pass rates."""
    k, rows = report["k"], []
    rows.append(" passed  problems  share")
    for h in report["histogram"]:
        rows.append(f"{h['passed']:>4}/{k:<3}{h['problems']:>8}  {h['share']:5.3f}  {'#' * round(40 * h['share'])}")
    if report["unrated"]:
        rows.append(f"{report['unrated']} problems have no rate ({report['too_long']} too long for seq_len, "
                    f"the rest only infra failures): never kept")
    rows.append(f"band {report['band']}: {report['kept']} of {report['problems']} problems kept "
                f"({report['kept_share']:.3f})")
    fmt = lambda x: "n/a" if x is None else f"{x:.3f}"  # noqa: E731
    rows.append(f"mean pass rate: {fmt(report['mean_rate_before'])} over all {report['rated']} rated, "
                f"{fmt(report['mean_rate_after'])} over the {report['kept']} kept")
    if report["empty_band"]:
        rows.append(f"warning: the band {report['band']} holds no problem: keep.txt lists none")
    return "\n".join(rows)


# ----------------------------------------------------------------------------- the problems

def embedded_problems(n: int, seed: int) -> list:
    """The first n distinct problems (by tasks.problem_key) of the embedded training stream of `seed`."""
    stream, seen, out = tasks.train_problems(seed), set(), []
    for i in range(100 * n):
        p = stream[i]
        if tasks.problem_key(p) not in seen:
            seen.add(tasks.problem_key(p))
            out.append(p)
            if len(out) == n:
                return out
    raise ValueError(f"--problems {n}: only {len(out)} distinct training problems in the first {100 * n} "
                     f"of the stream (the embedded task has a few thousand)")


def dataset_problems(path: str, heldout: int) -> tuple[list, list, dict]:
    """(training split, held-out split, item_id -> (line number, the line's bytes)) of a dataset,
    split exactly as trainer.Trainer.load_data splits it."""
    problems = tasks.load_jsonl(path)
    if len(problems) < 2:
        raise ValueError(f"dataset {path} holds {len(problems)} problem: the trainer holds some out, so "
                         f"curation needs at least 2")
    train, held = tasks.split_dataset(problems, min(heldout, len(problems) // 2))
    # A JSON-lines file keeps its lines verbatim; a row of any other source (a JSON list, Parquet, a
    # Hugging Face dataset) becomes one JSON line, so kept.jsonl is a dataset the trainer reads either way.
    rows = {int(w) if isinstance(w, int) else int(w.split()[1]): (w, r) for w, r in tasks.dataset_rows(path)}
    raw = []
    if os.path.isfile(path) and all(isinstance(w, int) for w, _ in rows.values()):
        with open(path, "rb") as f:  # scan_jsonl numbers lines as text mode splits them: so does splitlines
            raw = f.read().splitlines(keepends=True)
    line = lambda n: raw[n - 1] if raw else (json.dumps(rows[n][1], default=str) + "\n").encode()
    lines = {p.item_id: (n, line(n)) for n, p in tasks.scan_jsonl(path)[0]}
    return train, held, lines


# ----------------------------------------------------------------------------- the dataset check

def check_dataset(path: str, make_pool, fmt: str = "completion", timeout_s: float = 5.0, out=None) -> int:
    """`python curate.py check`: report every bad line of a dataset, then verify each problem's
    reference solutions exactly as the worker would verify a model's completion in format `fmt`
    (prompts.reference_completions -> prompts.assemble_program -> the verifier's sandbox, in this
    process). make_pool() returns that sandbox: an executor pool with run(jobs) -> verdicts and close()
    (the command makes a verifier.ExecutorPool); it is called only when some problem has a reference
    solution, and the pool is closed before returning. A problem passes if any of its references
    passes: references are tried in rounds (the first of every problem, then the second of those
    still failing, ...), so a dataset with many references per problem (APPS) costs about one run per
    problem.

    A code problem (assert or io, not math) whose references all fail in the verifier is then told
    apart: its first failing job (the same program and tests or cases) runs once more through the
    dataset's own harness, reference.reference_batch (program and tests in ONE plain Python process,
    2 at a time). If that passes, the verifier, not the reference, is what fails: a verifier limit
    (docs/verifier.md; tests that change the program's world from outside, such as seeding `random` in
    the tests), on which training would give a wrong reward, so its line says to leave the problem out
    or change its tests. If it fails too, the reference is wrong (or the row's tests are). The
    reference harness runs the program WITHOUT a sandbox: only the dataset's own reference solutions
    go through it, never generated code.

    Prints one line per bad line and per failing problem, then as its last line
    "checked N problems: P reference solutions pass, F fail, B bad lines", with "F fail (L of them only
    in the verifier)" when L > 0 of the F pass in one process (N problems loaded, of which N - P - F
    have no reference). Returns the exit status: 1 if F or B > 0 or the file holds no problem, else 0."""
    out = out or sys.stdout
    numbered, errors = tasks.scan_jsonl(path)
    for e in errors:
        print(e, file=out)
    problems = [p for _, p in numbered]
    _warn_trusted_names(path, numbered, out)
    refs = {i: list(p.solutions) if p.kind == "math" else prompts.reference_completions(p, fmt)
            for i, p in enumerate(problems)}
    pending = [i for i in refs if refs[i]]
    passed, first_failure = _run_references(problems, refs, pending, make_pool, fmt, timeout_s)
    failed = [i for i in pending if i not in passed]
    only_verifier = _passes_in_one_process(problems, failed, first_failure)
    for i in failed:
        lineno, p = numbered[i]
        status, detail, _ = first_failure[i]
        n = len(refs[i])
        detail = " ".join(detail.split())[:200]
        if i in only_verifier:
            which = ("the verifier fails the reference solution that one Python process passes" if n == 1 else
                     f"the verifier fails all {n} reference solutions, the first of which one Python process passes")
            print(f"{path}:{lineno}: {p.item_id}: {which} ({status}" + (f": {detail}" if detail else "") +
                  '); a verifier limit (docs/verifier.md, "Differences from one process"): '
                  "leave this problem out or change its tests", file=out)
            continue
        which = "the reference solution fails" if n == 1 else f"all {n} reference solutions fail, the first"
        print(f"{path}:{lineno}: {p.item_id}: {which}: {status}" + (f" ({detail})" if detail else ""), file=out)
    if not numbered:
        print(f"{path}: holds no problems", file=out)
    if len(numbered) > len(pending):
        print(f"{len(numbered) - len(pending)} problem(s) have no reference solution", file=out)
    limits = f" ({len(only_verifier)} of them only in the verifier)" if only_verifier else ""
    print(f"checked {len(numbered)} problems: {len(passed)} reference solutions pass, {len(failed)} fail{limits}, "
          f"{len(errors)} bad lines", file=out, flush=True)
    return 1 if failed or errors or not numbered else 0


def _warn_trusted_names(path: str, numbered: list, out) -> None:
    """check_dataset's step: a warning per assert problem whose tests judge with a standard name
    (`Counter(words(s))`, `isclose(area(1), 3.14)`, judge_names.trusted_names) they neither import nor
    define: in the verifier, as in one process, they then take the program's, and a program can bind
    any function of its own there (one that agrees with anything).
    The verifier refuses only a *standard* object under another's name (docs/verifier.md)."""
    import judge_names
    for lineno, p in numbered:
        if p.kind != "assert":
            continue
        try:
            names = judge_names.trusted_names(p.tests)
        except SyntaxError:
            continue  # reported with the verdicts: the tests do not compile
        if names:
            print(f"{path}:{lineno}: {p.item_id}: warning: the tests use {', '.join(names)} without importing it: "
                  "they trust the program for it; import it in the tests", file=out)


def _run_references(problems: list, refs: dict, pending: list, make_pool, fmt: str, timeout_s: float):
    """(passed, first_failure) (check_dataset's step): the indices of `pending` problems of which some
    reference passes, and each other's first failing (status, detail, job): the verifier's verdict and
    the job it judged. Rounds: the first reference of every pending problem, then the next of those
    still failing, ...; make_pool() is called only if something is pending, and its pool closed before
    returning."""
    passed: set[int] = set()
    first_failure: dict[int, tuple[str, str, dict]] = {}
    if not pending:
        return passed, first_failure
    pool = make_pool()
    try:
        for round_ in range(max(len(r) for r in refs.values())):
            todo = [i for i in pending if round_ < len(refs[i]) and i not in passed]
            jobs = [_reference_job(problems[i], refs[i][round_], fmt, timeout_s) for i in todo]
            for i, job, v in zip(todo, jobs, pool.run(jobs)):
                if v.passed:
                    passed.add(i)
                else:
                    first_failure.setdefault(i, (v.status, v.detail, job))
    finally:
        pool.close()
    return passed, first_failure


def _passes_in_one_process(problems: list, failed: list, first_failure: dict) -> set:
    """check_dataset's step: the indices of the `failed` code problems (assert or io) whose first failing
    job passes in the dataset's own harness (reference.reference_batch, one batch, 2 workers): failures
    of the verifier, not of the reference. Runs the jobs' programs UNSANDBOXED: only reference solutions
    from the dataset may come here."""
    todo = [i for i in failed if problems[i].kind in ("assert", "io")]
    if not todo:
        return set()
    import reference
    verdicts = reference.reference_batch([first_failure[i][2] for i in todo], workers=2)
    return {i for i, v in zip(todo, verdicts) if v["passed"]}


def _reference_job(p, completion: str, fmt: str, timeout_s: float) -> dict:
    """The verifier job of one reference completion of problem p, its program built as the worker
    builds a model's (prompts.assemble_program); a math reference scores against its own answer."""
    if p.kind == "math":
        return {"kind": "math", "completion": completion, "answer": p.answer, "format": p.answer_format}
    program = prompts.assemble_program(fmt, prompts.program_prefix(p, fmt), completion, prompts.stop_strings(p, fmt))
    job = {"kind": p.kind, "program": program, "timeout_s": timeout_s}
    job.update({"cases": [list(c) for c in p.cases]} if p.kind == "io" else {"tests": p.tests})
    return job


def _check_main(argv: list[str]) -> int:
    """The command `python curate.py check`: its flags, the verifier's executor pool (in this process:
    nothing here has started JAX, so forking executors is safe), the exit status."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python curate.py check",
        description="Report every bad line of a dataset and every problem whose reference solutions all fail, "
                    "with the programs built exactly as the inference worker builds them (prompts.py); a code "
                    "problem that fails is run again in one plain Python process (reference.py, unsandboxed: "
                    "the dataset's own references only) to tell a verifier limit from a wrong reference.")
    parser.add_argument("file", help="the dataset: .jsonl, .json, .parquet or hf:<name>[:<config>[:<split>]]")
    parser.add_argument("--format", choices=prompts.FORMATS, default="completion",
                        help="the prompt format whose programs are checked (default: completion)")
    parser.add_argument("--executors", type=int, default=max(1, min(8, os.cpu_count() or 1)),
                        help="sandbox executor processes (default: the CPU count, at most 8)")
    parser.add_argument("--isolation", default="namespaces",
                        help="the verifier's isolation: namespaces (default) or, by name only, rlimits")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per program (default 5, as a work item's)")
    args = parser.parse_args(argv)
    import verifier
    make_pool = lambda: verifier.ExecutorPool(args.executors, isolation=args.isolation)
    try:
        return check_dataset(args.file, make_pool, args.format, args.timeout)
    except (ValueError, scorers.MathVerifyMissing, verifier.IsolationUnavailable) as e:  # no file, grader, sandbox
        print(f"error: {e}", file=sys.stderr)
        return 2


# ----------------------------------------------------------------------------- sampling and scoring

def load_policy(model_dir: str, prompt_format: str = "", dtype: str = "bfloat16") -> types.SimpleNamespace:
    """The checkpoint as the trainer and the workers load it: config, weights, tokenizer, prompt format."""
    mcfg, params = hf_io.load_hf(model_dir, bf16_fix=True, **hf_io.compute_dtype_override(dtype))
    fmt, template = prompts.prompt_format(model_dir, prompt_format)
    return types.SimpleNamespace(model=model_dir, mcfg=mcfg, params=params, tokenizer=hf_io.load_tokenizer(model_dir),
                                 fmt=fmt, template=template)


def seq_len(policy, problems: list, max_new_tokens: int, dataset: bool) -> int:
    """T as trainer.Trainer.load_data picks it: a dataset's from its longest prompt (all splits), the
    embedded task's the model's max."""
    if not dataset:
        return policy.mcfg.max_seq_len
    lens = [len(policy.tokenizer.encode(prompts.model_prompt(p, policy.fmt, policy.template))) for p in problems]
    return workitems.fit_seq_len(lens, max_new_tokens, policy.mcfg.max_seq_len)


def verify(jobs: list) -> list:
    """(passed, status) per job from the verifier service (warmup.verifier_service's verifier_client.VerifierFleet:
    a batch it cannot get answered comes back infra_error)."""
    fleet, out = warmup.verifier_service(), []
    for s in range(0, len(jobs), warmup.VERIFY_CHUNK):
        verdicts = fleet.verify(jobs[s:s + warmup.VERIFY_CHUNK])
        if lost := [v for v in verdicts if v.status == INFRA_ERROR]:
            print(f"curate: {len(lost)} verdicts lost ({lost[0].detail}): counted as infra failures", file=sys.stderr)
        out += [(v.passed, v.status) for v in verdicts]
    return out


def sample_and_verify(policy, problems: list, k: int, T: int, seed: int = 0, temperature: float = 1.0,
                      max_new_tokens: int = 16, batch_rows: int = 256, log=print) -> list:
    """k samples of each problem, each verified: per problem, in order, a list of k (completion text,
    passed, status), or None for a problem whose prompt does not fit T (never sampled, as the trainer
    skips it). The work items are the trainer's (workitems.problem_item, version 0); temperature 0
    decodes greedily."""
    tcfg = trainer.Config(model=policy.model, max_new_tokens=max_new_tokens, temperature=temperature or 1.0)
    tok, pad = policy.tokenizer, policy.tokenizer.pad_id
    items = [workitems.problem_item(p, p.item_id, tcfg, k, T, 0, fmt=policy.fmt, template=policy.template)
             for p in problems]
    samples = {i: [] for i, item in enumerate(items)
               if workitems.fits(len(tok.encode(item.prompt)), T, max_new_tokens)}
    turn_end = prompts.end_of_turn_id(policy.template, tok) if policy.template else None
    groups = {}  # one generate() call needs one seq_len and one set of stop strings (as in Worker.run_batch)
    for i in samples:
        groups.setdefault(sampler.settings(items[i]), []).append(i)
    per_call, done, t0, shown = max(1, batch_rows // k), 0, time.monotonic(), time.monotonic()
    for index in groups.values():
        rows = max(model.MIN_DECODE_ROWS, min(per_call, len(index)) * k)  # one shape per group: one compile
        for s in range(0, len(index), per_call):
            chunk = [items[i] for i in index[s:s + per_call]]
            stop = tuple(chunk[0].stop)
            eos = sampler.eos_for(tok, stop, turn_end)  # the worker's rule
            prompt_RT, prompt_len_R = sampler.build_prompts(chunk, tok, rows, pad)
            out = sampler.generate(policy.params, policy.mcfg, prompt_RT, prompt_len_R,
                                   sampler.row_keys(seed, chunk, 0, rows), max_new_tokens=max_new_tokens,
                                   temperature=temperature, top_p=chunk[0].top_p, eos_id=eos, pad_id=pad)
            _, texts, _ = sampler.cut_completions(out, tok, stop, pad)
            texts = texts[:len(chunk) * k]
            results = verify(envs.score_jobs(chunk, texts))
            for j, i in enumerate(index[s:s + per_call]):
                samples[i] = [(t, passed, status) for t, (passed, status) in
                              zip(texts[j * k:(j + 1) * k], results[j * k:(j + 1) * k])]
            done += len(chunk)
            if time.monotonic() - shown > 15 or done == len(samples):
                shown = time.monotonic()
                log(f"curate: {done}/{len(samples)} problems sampled and verified ({shown - t0:.0f} s)")
    return [samples.get(i) for i in range(len(problems))]


def sample_pass_rates(policy, problems: list, k: int, T: int, seed: int = 0, temperature: float = 1.0,
                      max_new_tokens: int = 16, batch_rows: int = 256, log=print) -> list:
    """One PassRate per problem, in order, from k verified samples each (sample_and_verify)."""
    samples = sample_and_verify(policy, problems, k, T, seed, temperature, max_new_tokens, batch_rows, log)
    return [tally(tasks.problem_key(p), p.item_id, [(ok, status) for _, ok, status in got]) if got is not None
            else PassRate(tasks.problem_key(p), p.item_id, k=0, passed=0, too_long=True)
            for p, got in zip(problems, samples)]


# ----------------------------------------------------------------------------- main

def main(cfg: Config) -> dict:
    t0, band = time.time(), cfg.band()
    os.makedirs(cfg.out, exist_ok=True)
    if cfg.data:
        problems, held, lines = dataset_problems(cfg.data, cfg.heldout)
        source = f"{cfg.data}: its training split, {len(problems)} problems ({len(held)} held out, never sampled)"
        every = problems + held
    else:
        problems, lines = embedded_problems(cfg.problems, cfg.seed), None
        source = f"the embedded task: the first {len(problems)} distinct training problems of seed {cfg.seed}"
        every = problems
    policy = load_policy(cfg.model, cfg.prompt_format, cfg.dtype)
    T = seq_len(policy, every, cfg.max_new_tokens, bool(cfg.data))
    print(f"curate: {source}; {cfg.k} samples each from {cfg.model} ({policy.fmt} format, seq_len {T}, "
          f"temperature {cfg.temperature:g})", flush=True)
    rates = sample_pass_rates(policy, problems, cfg.k, T, cfg.seed, cfg.temperature, cfg.max_new_tokens,
                              cfg.batch_rows, log=lambda text: print(text, flush=True))
    header = [f"curate.py: the problems with {band} ({cfg.k} samples each, temperature {cfg.temperature:g})",
              f"checkpoint: {cfg.model}", f"problems: {source}", "one tasks.problem_key per line"]
    info = {"model": cfg.model, "source": source, "data": cfg.data, "settings": dataclasses.asdict(cfg),
            "prompt_format": policy.fmt, "seq_len": T, "seconds": round(time.time() - t0, 1)}
    report = write_outputs(cfg.out, rates, cfg.k, band, header, lines, info)
    print(format_report(report))
    print(f"curate: wrote {', '.join(report['files'])} in {report['seconds']:.1f} s", flush=True)
    return report


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "check":
        sys.exit(_check_main(sys.argv[2:]))
    config = cli.parse(Config, description=__doc__.split("\n\n")[0])
    try:
        main(config)
    except (ValueError, RuntimeError) as e:  # a bad dataset, no chat template, a verifier that cannot start
        raise SystemExit(f"curate.py: error: {e}")
