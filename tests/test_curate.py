"""curate.py: the band and the report on known counts (no model), then the command end to end with the
tiny cold-start checkpoint on a dataset whose pass rates do not depend on the model, the embedded
task, bad input, and `curate.py check` telling a verifier limit from a wrong reference.

Run: python -m pytest -q tests/test_curate.py      (about 30 s on a 2-core CPU)
"""
import json
import subprocess
import sys

import pytest

from conftest import ROOT

import curate
import tasks

MODEL = "checkpoints/coldstart"


def rates(*counts, k=8):
    """PassRates named p<passed> (p<passed>i<infra> with infra failures) from (passed, infra) counts."""
    return [curate.PassRate(f"p{p}i{i}" if i else f"p{p}", f"id{j}", k=k - i, passed=p, infra_errors=i)
            for j, (p, i) in enumerate(c if isinstance(c, tuple) else (c, 0) for c in counts)]


def kept(rs, *band):
    return [r.key for r in curate.select(rs, curate.Band(*band))]


# ----------------------------------------------------------------------------- the band (pure)

def test_band_keeps_the_rates_strictly_inside_by_default_and_each_end_on_request():
    rs = rates(0, 1, 4, 7, 8)
    assert kept(rs) == ["p1", "p4", "p7"]                             # neither never nor always solved
    assert kept(rs, 0.0, 1.0, True, False) == ["p0", "p1", "p4", "p7"]  # --include-low
    assert kept(rs, 0.0, 1.0, False, True) == ["p1", "p4", "p7", "p8"]  # --include-high
    assert kept(rs, 0.1, 0.6) == ["p1", "p4"]
    assert kept(rs, 0.125, 0.5) == []                                 # 1/8 and 4/8 are the ends: out...
    assert kept(rs, 0.125, 0.5, True) == ["p1"]                       # ...unless included
    assert kept(rs, 0.125, 0.5, True, True) == ["p1", "p4"]
    assert kept(rs, 0.01, 0.99) == kept(rs)                           # rates are k-ths: 0.01 acts as 0
    assert kept(rs, 0.9, 1.0) == []
    assert str(curate.Band(0.25, 1.0, True)) == "0.25 <= rate < 1"


def test_infra_failures_leave_the_denominator_and_a_problem_without_valid_samples_has_no_rate():
    r = curate.tally("key", "id", [(True, "passed"), (False, "infra_error"), (False, "failed"),
                                   (False, "reward_error"), (True, "passed"), (False, "timeout")])
    assert (r.k, r.passed, r.infra_errors, r.rate) == (4, 2, 2, 0.5)
    # 7 of 8 valid, all passed: always solved, so out of the default band (an 8th sample that failed
    # for the verifier's reasons must not make it look sometimes-solved)
    r = curate.tally("key", "id", [(True, "passed")] * 7 + [(False, "infra_error")])
    assert (r.k, r.passed, r.rate) == (7, 7, 1.0) and r.rate not in curate.Band()
    r = curate.tally("key", "id", [(False, "infra_error")] * 3)
    assert (r.k, r.rate) == (0, None)
    assert r.rate not in curate.Band(0.0, 1.0, True, True)


def test_histogram_and_means_on_known_counts():
    # 7 of 7 valid -> bin 8; 6 of 7 (0.857) -> the nearest eighth, bin 7; no valid sample -> no bin
    rs = rates(0, 1, 4, 8, (7, 1), (6, 1), (0, 8), k=8)
    s = curate.summarize(rs, 8, curate.Band())
    assert [h["problems"] for h in s["histogram"]] == [1, 1, 0, 0, 1, 0, 0, 1, 2]
    assert [h["share"] for h in s["histogram"]][0] == pytest.approx(1 / 6)
    assert sum(h["share"] for h in s["histogram"]) == pytest.approx(1.0)
    assert (s["problems"], s["rated"], s["unrated"], s["infra_errors"], s["kept"]) == (7, 6, 1, 10, 3)
    assert s["mean_rate_before"] == pytest.approx((0 + 1 / 8 + 4 / 8 + 1 + 1 + 6 / 7) / 6)
    assert s["mean_rate_after"] == pytest.approx((1 / 8 + 4 / 8 + 6 / 7) / 3)
    assert not s["empty_band"]
    s = curate.summarize(rs, 8, curate.Band(0.9, 1.0))
    assert s["empty_band"] and s["kept"] == 0 and s["mean_rate_after"] is None


def test_write_outputs_on_known_counts(tmp_path):
    rs = rates(0, 1, 4, 8)
    lines = {f"id{j}": (j + 1, f'{{"item_id": "id{j}"}}\n'.encode()) for j in range(4)}
    report = curate.write_outputs(str(tmp_path), rs, 8, curate.Band(), ["band 0 < rate < 1", "checkpoint X"],
                                  lines, {"model": "X"})
    keep = (tmp_path / "keep.txt").read_text().splitlines()
    assert keep == ["# band 0 < rate < 1", "# checkpoint X", "p1", "p4"]
    assert (tmp_path / "kept.jsonl").read_bytes() == lines["id1"][1] + lines["id2"][1]
    rows = [json.loads(line) for line in (tmp_path / "pass_rates.jsonl").read_text().splitlines()]
    assert [(r["key"], r["k"], r["passed"], r["rate"]) for r in rows] == \
        [("p0", 8, 0, 0.0), ("p1", 8, 1, 0.125), ("p4", 8, 4, 0.5), ("p8", 8, 8, 1.0)]
    assert json.loads((tmp_path / "report.json").read_text()) == report and report["model"] == "X"
    # an empty band: every file still written, and the report says so
    report = curate.write_outputs(str(tmp_path / "empty"), rs, 8, curate.Band(0.6, 0.9), ["h"], lines)
    assert report["empty_band"] and (tmp_path / "empty" / "keep.txt").read_text() == "# h\n"
    assert (tmp_path / "empty" / "kept.jsonl").read_bytes() == b""
    assert "holds no problem" in curate.format_report(report)


# ----------------------------------------------------------------------------- the command

def run(*args, timeout=300):
    return subprocess.run([sys.executable, "curate.py", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


# Plain-asserts rows whose programs are valid whatever the model writes: the prompt ends in a comment
# and the completion is cut at the first line break (or NUL), so the tests alone decide the verdict.
STOP = ["\n", "\r", "\u0000"]
TESTS = {"always": "assert True\n", "never": "assert False\n",
         "coin": "import os\nassert os.urandom(1)[0] < 128\n",  # passes with probability 1/2, per sample
         "broken": "assert (\n",                              # tests that do not compile: infra_error
         "long": "assert True\n"}                             # a prompt too long for the model: never sampled


def dataset(tmp_path):
    """The rows (as written) and the file: two always, two never, a coin, a broken one, a long one,
    and a problem the split holds out (an id found so that trainer's split holds out exactly it)."""
    rows = {f"{kind}-{n}": {"item_id": f"{kind}-{n}", "prompt": f"# {kind}:", "tests": TESTS[kind], "stop": STOP}
            for kind, n in (("always", 1), ("always", 2), ("never", 1), ("never", 2), ("coin", 1), ("broken", 1),
                            ("long", 1))}
    rows["long-1"]["prompt"] = "# " + "long " * 20 + ":"  # 102 bytes + 16 new tokens > max_seq_len 88
    for j in range(1000):
        held = {"item_id": f"held-{j}", "prompt": "# held out:", "tests": "assert True\n", "stop": STOP}
        probe = [tasks.Problem(r["item_id"], r["prompt"], r["tests"], "", "assert") for r in [*rows.values(), held]]
        if tasks.split_dataset(probe, 1)[1][0].item_id == held["item_id"]:
            break
    lines = {i: json.dumps(r) + "\n" for i, r in rows.items()}
    lines["coin-1"] = '{"tests": %s,   "prompt": "# coin:", "item_id": "coin-1", "stop": %s}\n' % (
        json.dumps(TESTS["coin"]), json.dumps(STOP))  # kept.jsonl must copy this line as it is
    lines[held["item_id"]] = json.dumps(held) + "\n"
    path = tmp_path / "data.jsonl"
    path.write_text("".join(lines.values()) + "\n")  # a trailing blank line: skipped, as load_jsonl does
    return lines, held["item_id"], path


def test_kept_rows_of_a_json_list_are_json_lines_the_trainer_reads(tmp_path):
    """A dataset that is not JSON lines (here a JSON list; Parquet and hf: go the same way) gives each
    problem's row as one JSON line, so kept.jsonl is a dataset of its own; JSON lines stay verbatim."""
    lines, _, path = dataset(tmp_path)
    rows = [json.loads(line) for line in lines.values()]
    listed = tmp_path / "data.json"
    listed.write_text(json.dumps(rows, indent=1))
    train, held, got = curate.dataset_problems(str(listed), 1)
    assert {p.item_id for p in train + held} == set(got) == set(lines)
    kept = tmp_path / "kept.jsonl"
    kept.write_bytes(b"".join(got[i][1] for i in sorted(got)))
    assert [p.item_id for p in tasks.load_jsonl(str(kept))] == sorted(got)
    assert {i: json.loads(got[i][1]) for i in got} == {r["item_id"]: r for r in rows}
    assert {i: n for i, (n, _) in got.items()} == {r["item_id"]: n for n, r in enumerate(rows, 1)}
    assert curate.dataset_problems(str(path), 1)[2]["coin-1"][1] == lines["coin-1"].encode()  # verbatim


def test_command_on_a_dataset_with_known_pass_rates(tmp_path):
    lines, held, path = dataset(tmp_path)
    out = tmp_path / "out"
    k = 16  # the coin problem is 0/16 or 16/16 with probability 2^-15
    proc = run("--model", MODEL, "--data", str(path), "--heldout", "1", "--k", str(k), "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = {r["item_id"]: r for r in map(json.loads, (out / "pass_rates.jsonl").read_text().splitlines())}
    assert set(got) == set(lines) - {held}  # the held-out problem is never sampled
    for i, r in got.items():
        assert r["key"] == i and r["too_long"] == i.startswith("long")
        if i.startswith("long"):
            assert (r["k"], r["passed"], r["rate"], r["infra_errors"]) == (0, 0, None, 0)
        elif i.startswith("always"):
            assert (r["k"], r["passed"], r["rate"], r["infra_errors"]) == (k, k, 1.0, 0)
        elif i.startswith("never"):
            assert (r["k"], r["passed"], r["rate"], r["infra_errors"]) == (k, 0, 0.0, 0)
        elif i.startswith("broken"):  # the verifier cannot judge: no valid sample, not a failure
            assert (r["k"], r["passed"], r["rate"], r["infra_errors"]) == (0, 0, None, k)
    coin = got["coin-1"]
    assert coin["k"] == k and 0 < coin["passed"] < k and coin["rate"] == coin["passed"] / k

    keep = (out / "keep.txt").read_text().splitlines()
    assert [line for line in keep if not line.startswith("#")] == ["coin-1"]
    assert tasks.read_keys(str(out / "keep.txt")) == {"coin-1"}  # as trainer --curated reads it
    header = "\n".join(line for line in keep if line.startswith("#"))
    assert "0 < rate < 1" in header and MODEL in header
    assert (out / "kept.jsonl").read_text() == lines["coin-1"]  # verbatim, a dataset of its own
    assert [p.item_id for p in tasks.load_jsonl(str(out / "kept.jsonl"))] == ["coin-1"]

    report = json.loads((out / "report.json").read_text())
    assert (report["problems"], report["rated"], report["unrated"], report["kept"]) == (7, 5, 2, 1)
    assert report["too_long"] == 1 and report["seq_len"] == 88
    assert report["infra_errors"] == k and report["k"] == k
    assert {h["passed"]: h["problems"] for h in report["histogram"] if h["problems"]} == \
        {0: 2, k: 2, coin["passed"]: 1}
    assert report["mean_rate_before"] == pytest.approx((2 + coin["rate"]) / 5)
    assert report["mean_rate_after"] == pytest.approx(coin["rate"])
    assert "band 0 < rate < 1: 1 of 7 problems kept" in proc.stdout
    assert "os.fork() was called" not in proc.stderr, proc.stderr


def test_embedded_problems_are_distinct_functions_in_stream_order():
    stream = tasks.train_problems(3)
    keys = [tasks.problem_key(stream[i]) for i in range(400)]
    assert len(set(keys[:300])) < 300  # the stream repeats functions this early: distinctness is tested
    first = list(dict.fromkeys(keys))[:300]
    problems = curate.embedded_problems(300, 3)
    assert [tasks.problem_key(p) for p in problems] == first
    assert all(p.item_id == stream[keys.index(tasks.problem_key(p))].item_id for p in problems)  # first draws


def test_command_on_the_embedded_task(tmp_path):
    out = tmp_path / "out"
    proc = run("--model", MODEL, "--problems", "16", "--k", "2", "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [json.loads(line) for line in (out / "pass_rates.jsonl").read_text().splitlines()]
    keys = [r["key"] for r in rows]
    stream, first = tasks.train_problems(0), []
    for i in range(1000):
        if tasks.problem_key(stream[i]) not in first:
            first.append(tasks.problem_key(stream[i]))
    assert keys == first[:16]  # the first 16 distinct functions of the stream, in order
    assert all(r["k"] + r["infra_errors"] == 2 for r in rows)
    kept = [line for line in (out / "keep.txt").read_text().splitlines() if not line.startswith("#")]
    assert kept == [r["key"] for r in rows if r["k"] == 2 and r["passed"] == 1]
    assert not (out / "kept.jsonl").exists()
    report = json.loads((out / "report.json").read_text())
    assert [h["passed"] for h in report["histogram"]] == [0, 1, 2] and report["problems"] == 16


def test_check_tells_a_verifier_limit_from_a_wrong_reference(tmp_path):
    """`curate.py check` runs the first failing reference of a code problem again in one plain Python
    process (reference.py): a reference that passes there but fails in the verifier is a verifier limit
    (here: the tests seed `random` in their own process, the program draws from another one's), said
    apart from a wrong reference, which fails in both. One executor pool for the whole file."""
    import io
    import random
    import verifier
    mbpp = lambda task_id, code, tests, **more: {"task_id": task_id, "text": "Write a function.", "code": code,
                                                 "test_list": tests, **more}
    rows = [mbpp(1, "def add(a, b):\n    return a + b\n", ["assert add(2, 3) == 5", "assert add(-1, 1) == 0"]),
            mbpp(2, "def add_one(a):\n    return a + 2\n", ["assert add_one(1) == 2"]),      # wrong: both fail
            mbpp(3, "import random\n\ndef draw():\n    return random.random()\n",          # a verifier limit
                 [f"assert draw() == {random.Random(7).random()!r}"], test_setup_code="import random\nrandom.seed(7)"),
            {"item_id": "sum-io", "question": "Print the sum of two integers given on one line.",
             "inputs": ["2 3\n", "10 -4\n"], "outputs": ["5\n", "6\n"],
             "solution": "a, b = map(int, input().split())\nprint(a + b)\n"}]
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pools = []

    def make_pool():
        pools.append(verifier.ExecutorPool(2))
        return pools[-1]

    out = io.StringIO()
    assert curate.check_dataset(str(path), make_pool, out=out) == 1
    lines = out.getvalue().splitlines()
    assert len(pools) == 1
    # the verifier's own detail (which assert) follows each status: its wording is the verifier's
    assert lines[0].startswith(f"{path}:2: 2: the reference solution fails: failed ("), lines
    assert lines[1].startswith(f"{path}:3: 3: the verifier fails the reference solution that one Python process "
                               f"passes (failed"), lines
    assert lines[1].endswith('); a verifier limit (docs/verifier.md, "Differences from one process"): '
                             "leave this problem out or change its tests"), lines
    assert lines[2:] == ["checked 4 problems: 2 reference solutions pass, 2 fail (1 of them only in the verifier), "
                         "0 bad lines"], lines


def test_bad_input_is_a_clear_error(tmp_path):
    for kwargs, says in (({}, "--model is required"),
                         ({"model": str(tmp_path)}, "no config.json"),
                         ({"model": MODEL, "k": 0}, "--k must be >= 1"),
                         ({"model": MODEL, "low": 0.5, "high": 0.5}, "0 <= low < high <= 1"),
                         ({"model": MODEL, "low": 0.0, "high": 1.5}, "0 <= low < high <= 1"),
                         ({"model": MODEL, "data": str(tmp_path / "none.jsonl")}, "does not exist")):
        with pytest.raises(ValueError, match=says):
            curate.Config(out=str(tmp_path), **kwargs)
    curate.Config(model=MODEL, out=str(tmp_path))  # and the defaults are fine
    proc = run("--model", "checkpoints/missing", "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and "no config.json" in proc.stderr, proc.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x", "tests": "assert True"}\n{not json\n')
    proc = run("--model", MODEL, "--data", str(bad), "--out", str(tmp_path / "out"))
    assert proc.returncode == 1 and "bad.jsonl:2: invalid JSON" in proc.stderr, proc.stderr
