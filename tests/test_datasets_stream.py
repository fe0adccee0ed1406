"""Datasets larger than memory, and bad rows named, never fatal, never altered (dataset_files.py).
Run: python -m pytest -q tests/test_datasets_stream.py"""
import datetime
import decimal
import json
import os
import sys
import types

import pytest

import dataset_files
import tasks

pa = pytest.importorskip("pyarrow", reason="Parquet needs pyarrow (requirements-datasets.txt)")
import pyarrow.parquet as pq  # noqa: E402


def _code_rows(n, start=0):
    return [{"task_id": f"t{i}", "prompt": f"def f{i}(x):\n", "tests": f"assert f{i}(1) == {i}\n"}
            for i in range(start, start + n)]


def _corrupt_row_group(path, group):
    """Overwrite the first page header of a row group's first column chunk (an uncompressed file)."""
    chunk = pq.ParquetFile(path).metadata.row_group(group).column(0)
    at = chunk.dictionary_page_offset or chunk.data_page_offset
    data = bytearray(path.read_bytes())
    data[at:at + 8] = b"\xff" * 8
    path.write_bytes(bytes(data))


# ----------------------------------------------------------------------------- read a batch at a time

def test_parquet_is_read_a_row_group_and_a_batch_at_a_time_never_whole(tmp_path, monkeypatch):
    """The loader reads a Parquet file through ParquetFile.iter_batches, one row group at a time and a
    small batch within it, and hands out the first problem before the later groups are read; the
    whole-table reads (read_table, ParquetFile.read) are never called."""
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(_code_rows(12)), path, row_group_size=4)
    assert pq.ParquetFile(path).metadata.num_row_groups == 3

    def whole(*a, **k):
        raise AssertionError("the whole table was read")
    monkeypatch.setattr(pq, "read_table", whole)
    monkeypatch.setattr(pq.ParquetFile, "read", whole)
    calls, real = [], pq.ParquetFile.iter_batches

    def iter_batches(self, *a, **k):
        calls.append((k.get("row_groups"), k.get("batch_size")))
        return real(self, *a, **k)
    monkeypatch.setattr(pq.ParquetFile, "iter_batches", iter_batches)
    monkeypatch.setattr(dataset_files, "_BATCH_BYTES", 1)  # a batch of one row
    problems = tasks.iter_problems(str(path))
    number, first = next(problems)
    assert (number, first.item_id) == (1, "t0") and calls == [([0], 1)]
    rest = list(problems)
    assert [p.item_id for _, p in rest] == [f"t{i}" for i in range(1, 12)]
    assert calls == [([0], 1), ([1], 1), ([2], 1)]
    assert [n for n, _ in rest] == list(range(2, 13))


def test_a_corrupt_row_group_is_one_error_naming_its_rows_and_the_others_load(tmp_path):
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(_code_rows(9)), path, row_group_size=3, compression="none")
    _corrupt_row_group(path, 1)
    numbered, errors = tasks.scan_jsonl(str(path))
    assert [(n, p.item_id) for n, p in numbered] == [(1, "t0"), (2, "t1"), (3, "t2"), (7, "t6"), (8, "t7"),
                                                     (9, "t8")]
    assert len(errors) == 1 and errors[0].startswith(f"{path}: rows 4-6: row group 2 of 3 cannot be read ("), errors
    with pytest.raises(ValueError, match=r"(?s)1 bad line\(s\).*rows 4-6: row group 2 of 3"):
        tasks.load_jsonl(str(path))


def test_a_json_file_of_lines_is_streamed_and_a_json_list_still_loads(tmp_path, monkeypatch):
    """A .json file of JSON lines is read a line at a time (not read whole first); a JSON list is one
    document and is read whole, its rows numbered."""
    lines = tmp_path / "lines.json"
    lines.write_text("\n\n" + "".join(json.dumps(r) + "\n" for r in _code_rows(3)))
    listed = tmp_path / "list.json"
    listed.write_text(" \n" + json.dumps(_code_rows(3), indent=1))
    assert [(n, p.item_id) for n, p in tasks.scan_jsonl(str(listed))[0]] == [(1, "t0"), (2, "t1"), (3, "t2")]
    reads = []
    real_open = open

    def spy_open(*a, **k):
        f = real_open(*a, **k)
        real_read = f.read

        def read(size=-1):
            reads.append(size)
            return real_read(size)
        f.read = read
        return f
    monkeypatch.setattr("builtins.open", spy_open)
    assert [(n, p.item_id) for n, p in tasks.scan_jsonl(str(lines))[0]] == [(3, "t0"), (4, "t1"), (5, "t2")]
    assert reads and all(size > 0 for size in reads), reads  # only the peek at the first character


# ----------------------------------------------------------------------------- numbers, timestamps, bytes

def test_integer_and_float_answers_are_math_answers(tmp_path):
    """A math row's `answer` given as a number (an int or float column, a JSON number) is that number's
    text, as the grader reads it: GSM8K style (question) graded after "####", MATH-500 style (problem)
    boxed. Floats are their shortest round-trip decimal without an exponent; a float32 column's value
    is the float32's shortest decimal. A bool or a NaN is the row's error."""
    pytest.importorskip("math_verify", reason="math rows need math-verify (requirements-math.txt)")
    import math_answers
    rows = [{"question": "What is 6*7?", "answer": 42}, {"problem": "Half of 7?", "answer": 3.5},
            {"problem": "0.1 + 0.2?", "answer": 0.1 + 0.2}, {"question": "Big?", "answer": 1e20},
            {"question": "Small?", "answer": 1e-7}, {"question": "Below zero?", "answer": -5},
            {"problem": "Yes?", "answer": True}, {"question": "What?", "answer": float("nan")}]
    path = tmp_path / "math.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    numbered, errors = tasks.scan_jsonl(str(path))
    assert [(n, p.kind, p.answer, p.answer_format, p.solutions) for n, p in numbered] == [
        (1, "math", "42", "hash", ()), (2, "math", "3.5", "boxed", ()),
        (3, "math", "0.30000000000000004", "boxed", ()), (4, "math", "100000000000000000000", "hash", ()),
        (5, "math", "0.0000001", "hash", ()), (6, "math", "-5", "hash", ())]
    assert errors == [f"{path}:7: field 'answer' must be text or a number, got bool",
                      f"{path}:8: field 'answer' is nan, not a finite number"]
    by_id = {p.prompt: p for _, p in numbered}
    assert math_answers.math_verdict("6 times 7.\n#### 42", by_id["What is 6*7?"].answer, "hash")["passed"]
    assert math_answers.math_verdict("So \\boxed{3.5}", by_id["Half of 7?"].answer, "boxed")["passed"]
    assert not math_answers.math_verdict("#### 41", by_id["What is 6*7?"].answer, "hash")["passed"]

    table = pa.table({"question": ["a?", "b?", "c?", "d?"],
                      "answer": pa.array([42, 7, None, -3], pa.int64()),
                      "f32": pa.array([0.3, 2.5, 1.0, None], pa.float32())})
    pq.write_table(table, tmp_path / "math.parquet")
    numbered, errors = tasks.scan_jsonl(str(tmp_path / "math.parquet"))
    assert [p.answer for _, p in numbered] == ["42", "7", "-3"]
    assert errors == [f"{tmp_path / 'math.parquet'}: row 3: missing field 'prompt'"]  # no answer at all
    floats = pa.table({"problem": ["x?", "y?"], "answer": pa.array([0.3, 0.1], pa.float32())})
    pq.write_table(floats, tmp_path / "f32.parquet")
    assert [p.answer for p in tasks.load_jsonl(str(tmp_path / "f32.parquet"))] == ["0.3", "0.1"]
    decimals = pa.table({"problem": ["z?", None], "question": [None, "w?"],
                         "answer": pa.array([decimal.Decimal("3.140"), decimal.Decimal("-2.50")], pa.decimal128(6, 3))})
    pq.write_table(decimals, tmp_path / "dec.parquet")
    assert [(p.answer, p.answer_format) for p in tasks.load_jsonl(str(tmp_path / "dec.parquet"))] == [
        ("3.140", "boxed"), ("-2.500", "hash")]


def test_a_reward_row_with_timestamps_and_decimals_is_its_json_line(tmp_path):
    """A reward row goes to the function as JSON: a timestamp is ISO 8601 text at the column's own
    precision (nanoseconds kept, the zone's offset written), a date, time, duration and decimal their
    text too; a cell with no JSON form (bytes that are not UTF-8) is that row's error, naming the field,
    and the other rows load."""
    ns = 1_700_000_000_123_456_789
    table = pa.table({
        "prompt": ["a", "b", "c"],
        "created": pa.array([ns, None, 0], pa.timestamp("ns")),
        "zoned": pa.array([ns // 1000] * 3, pa.timestamp("us", tz="Europe/Paris")),
        "day": pa.array([19675, 0, 1], pa.date32()),
        "took": pa.array([90_500_000_000, -1, 0], pa.duration("ns")),
        "price": pa.array([decimal.Decimal("1.50"), None, decimal.Decimal("0.00")], pa.decimal128(6, 2)),
        "blob": pa.array([b"fine", None, b"\xff\xfe"], pa.binary()),
    })
    path = tmp_path / "reward.parquet"
    pq.write_table(table, path)
    numbered, errors = tasks.scan_jsonl(str(path), reward=True)
    rows = [json.loads(p.row) for _, p in numbered]
    assert rows == [
        {"prompt": "a", "created": "2023-11-14T22:13:20.123456789", "zoned": "2023-11-14T23:13:20.123456+01:00",
         "day": "2023-11-14", "took": "PT90.5S", "price": "1.50", "blob": "fine"},
        {"prompt": "b", "zoned": "2023-11-14T23:13:20.123456+01:00", "day": "1970-01-01",
         "took": "-PT0.000000001S"}]
    assert errors == [f"{path}: row 3: field 'blob' holds bytes that are not UTF-8 text (byte 0xff at offset 0); "
                      f"a reward row goes to the function whole, as JSON"]
    assert datetime.datetime.fromisoformat(rows[0]["zoned"]).utcoffset() == datetime.timedelta(hours=1)


def test_a_python_row_source_gets_the_same_conversions(monkeypatch):
    """hf: with a source that gives Python rows (a stand-in here): datetimes, dates and decimals become
    their JSON text; a value with no JSON form is that row's error in a reward row."""
    rows = [{"prompt": "a", "when": datetime.datetime(2024, 5, 1, 12, 30, tzinfo=datetime.timezone.utc),
             "day": datetime.date(2024, 5, 1), "cost": decimal.Decimal("2.50"), "raw": b"ok"},
            {"prompt": "b", "odd": {1, 2}}]
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=lambda *a, **k: rows))
    numbered, errors = tasks.scan_jsonl("hf:some/set", reward=True)
    assert [json.loads(p.row) for _, p in numbered] == [
        {"prompt": "a", "when": "2024-05-01T12:30:00+00:00", "day": "2024-05-01", "cost": "2.50", "raw": "ok"}]
    assert errors == ["hf:some/set: row 2: field 'odd' holds a set value, which has no JSON form; a reward row "
                      "goes to the function whole, as JSON"]


def test_a_non_utf8_line_is_that_lines_error_and_the_others_load(tmp_path):
    """Bytes that are not UTF-8 in a JSON line, or in a row of a JSON list, are that line's (row's)
    error, naming the byte; never a silent U+FFFD. Line numbers stay text mode's (CRLF files too)."""
    good = [json.dumps(r).encode() for r in _code_rows(3)]
    bad = b'{"task_id": "bad", "prompt": "def caf\xe9(x):\\n", "tests": "assert 1"}'
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b"\r\n".join([good[0], bad, b"", good[1], good[2]]) + b"\r\n")
    numbered, errors = tasks.scan_jsonl(str(path))
    assert [(n, p.item_id) for n, p in numbered] == [(1, "t0"), (4, "t1"), (5, "t2")]
    assert errors == [f"{path}:2: not UTF-8 text: byte 0xe9 at column 38"]
    assert not any("\ufffd" in p.prompt + p.tests for _, p in numbered)
    listed = tmp_path / "rows.json"
    listed.write_bytes(b"[" + b",\n".join([good[0], bad, good[1]]) + b"]")
    numbered, errors = tasks.scan_jsonl(str(listed))
    assert [(n, p.item_id) for n, p in numbered] == [(1, "t0"), (3, "t1")]
    assert errors == [f"{listed}: row 2: not UTF-8 text: byte 0xe9 at line 2, column 38"]
    with pytest.raises(ValueError, match=r"rows\.jsonl:2: not UTF-8 text: byte 0xe9"):
        tasks.load_jsonl(str(path))


def test_a_binary_parquet_column_is_text_when_utf8_and_a_named_error_when_not(tmp_path):
    """A binary column where a format reads text (older writers store strings so) is that text when it
    is UTF-8, and the row's error naming the field and byte when it is not; bytes in a column no format
    reads (an image) do not make a row bad."""
    table = pa.table({"prompt": pa.array([b"def f(x):\n", b"def g(x):  # caf\xe9\n", b"def h(x):\n"], pa.binary()),
                      "tests": ["assert f(1)", "assert g(1)", "assert h(1)"],
                      "image": pa.array([b"\x89PNG\r\n", b"\x00", b"\xff\xd8\xff"], pa.large_binary())})
    path = tmp_path / "binary.parquet"
    pq.write_table(table, path)
    numbered, errors = tasks.scan_jsonl(str(path))
    assert [(n, p.prompt) for n, p in numbered] == [(1, "def f(x):\n"), (3, "def h(x):\n")]
    assert errors == [f"{path}: row 2: field 'prompt' holds bytes that are not UTF-8 text (byte 0xe9 at offset 16)"]


# ----------------------------------------------------------------------------- hf: through Arrow batches

class _ArrowDataset:
    """Stands in for a datasets.Dataset: its Arrow table, handed out a batch at a time."""

    def __init__(self, table):
        self.table, self.data, self.batches = table, table, []  # .data: its Arrow table (nbytes)

    def __len__(self):
        return self.table.num_rows

    def with_format(self, kind):
        assert kind == "arrow"
        return self

    def iter(self, batch_size):
        for start in range(0, self.table.num_rows, batch_size):
            self.batches.append(batch_size)
            yield self.table.slice(start, batch_size)


def test_an_hf_dataset_is_read_from_its_arrow_table_a_batch_at_a_time(monkeypatch):
    table = pa.table({"prompt": [f"p{i}" for i in range(5)],
                      "at": pa.array([10**15 * i for i in range(5)], pa.timestamp("ns"))})
    ds = _ArrowDataset(table)
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=lambda *a, **k: ds))
    monkeypatch.setattr(dataset_files, "_BATCH_BYTES", 1)
    numbered, errors = tasks.scan_jsonl("hf:some/set", reward=True)
    assert errors == [] and ds.batches == [1] * 5
    assert [json.loads(p.row)["at"] for _, p in numbered][:2] == ["1970-01-01T00:00:00.000000000",
                                                                  "1970-01-12T13:46:40.000000000"]


def test_an_hf_folder_through_the_real_datasets_library(tmp_path, monkeypatch):
    """The real library (if installed): a local folder of Parquet is loaded into its Arrow cache and read
    a batch at a time, converted as a Parquet file is."""
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))  # if this imports it first
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    datasets = pytest.importorskip("datasets", reason="hf: needs datasets (requirements-datasets.txt)")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")  # if imported before
    (tmp_path / "set").mkdir()
    table = pa.table({"prompt": ["a", "b"], "at": pa.array([1, None], pa.timestamp("ns", tz="UTC")),
                      "blob": pa.array([b"ok", b"\xff"])})
    pq.write_table(table, tmp_path / "set" / "train.parquet")
    numbered, errors = tasks.scan_jsonl(f"hf:{tmp_path / 'set'}", reward=True)
    assert [json.loads(p.row) for _, p in numbered] == [
        {"prompt": "a", "at": "1970-01-01T00:00:00.000000001+00:00", "blob": "ok"}]
    assert len(errors) == 1 and "row 2: field 'blob' holds bytes that are not UTF-8 text" in errors[0]
    assert os.path.isdir(tmp_path / "cache")
