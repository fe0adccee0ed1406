"""A dataset's rows, read a line or a batch of rows at a time: JSON lines, a JSON list, Parquet, and a
Hugging Face dataset (hf:<name>[:<config>[:<split>]], from its Arrow cache). tasks.py makes problems of
them (tasks.iter_problems); curate.py reads them again to write the rows it keeps.

Every source gives (where, row): where is a line number, "row N", or "rows N-M" for rows a table could
not read; a row is what its JSON line would be, whatever the source (the comment above _BATCH_BYTES),
or a ValueError naming what is wrong with it (text that is not UTF-8, invalid JSON). A bad row never
stops the others, and nothing is replaced (no U+FFFD). Parquet and hf: need the datasets extra
(requirements-datasets.txt).
"""
from __future__ import annotations

import datetime
import decimal
import json
import os
import re

DATASETS_EXTRA = "requirements-datasets.txt"


def _extra_missing(what: str, module: str) -> ValueError:
    return ValueError(f"{what} needs the Python package {module!r}, which is not installed: "
                      f"pip install -r {DATASETS_EXTRA}")


def _json_rows(path: str):
    """(line number, object or error) for a .jsonl file, or a .json file of JSON lines, read a line at
    a time; a .json file whose first character (after blanks) is "[" is one JSON list (read whole, as
    one JSON document must be), numbered by row. A line (or a list's row) holding bytes that are not
    UTF-8 is that line's error, naming the byte: never read with a replacement character."""
    # surrogateescape: a byte that is not UTF-8 becomes one lone surrogate, found by _BAD_BYTE, and the
    # lines split exactly as text mode splits them (curate.py numbers lines the same way).
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        if path.endswith(".json") and _first_char(f) == "[":
            yield from _json_list_rows(path, f.read())
            return
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            bad = _BAD_BYTE.search(line)
            if bad is not None:
                yield lineno, ValueError(f"not UTF-8 text: {_bad_byte(bad)} at column {bad.start() + 1}")
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as e:
                yield lineno, ValueError(f"invalid JSON ({e.msg} at column {e.colno})")


_BAD_BYTE = re.compile("[\udc80-\udcff]")  # what errors="surrogateescape" makes of a byte that is not UTF-8
_JSON_BLANK = re.compile(r"[ \t\n\r]*")


def _bad_byte(match) -> str:
    return f"byte 0x{ord(match.group()) - 0xDC00:02x}"


def _first_char(f) -> str:
    """The first character of a text file that is not a blank ("" if none); the file is left at its start."""
    try:
        while chunk := f.read(1 << 16):
            if rest := chunk.lstrip():
                return rest[0]
        return ""
    finally:
        f.seek(0)


def _json_list_rows(path: str, text: str):
    """The rows of a JSON list, one raw_decode at a time (the values json.loads gives), so that a row
    holding bytes that are not UTF-8 is that row's error; invalid JSON anywhere is the file's error."""
    def invalid(e: json.JSONDecodeError):
        return ValueError(f"{path}: invalid JSON ({e.msg} at line {e.lineno}, column {e.colno})")
    pos = _JSON_BLANK.match(text).end()
    if not text.startswith("[", pos):  # blanks JSON does not allow before the "["
        try:
            json.loads(text)
        except json.JSONDecodeError as e:
            raise invalid(e) from None
        raise ValueError(f"{path}: expected a JSON list of rows")
    decoder, number = json.JSONDecoder(), 0
    pos = _JSON_BLANK.match(text, pos + 1).end()
    if text.startswith("]", pos):
        pos += 1
    else:
        while True:
            try:
                rec, end = decoder.raw_decode(text, pos)
            except json.JSONDecodeError as e:
                raise invalid(e) from None
            number += 1
            bad = _BAD_BYTE.search(text, pos, end)
            if bad is not None:
                line = text.count("\n", 0, bad.start()) + 1
                column = bad.start() - text.rfind("\n", 0, bad.start())
                yield f"row {number}", ValueError(f"not UTF-8 text: {_bad_byte(bad)} at line {line}, column {column}")
            else:
                yield f"row {number}", rec
            pos = _JSON_BLANK.match(text, end).end()
            if text.startswith(",", pos):
                pos = _JSON_BLANK.match(text, pos + 1).end()
            elif text.startswith("]", pos):
                pos += 1
                break
            else:
                raise invalid(json.JSONDecodeError("Expecting ',' delimiter", text, pos))
    if (pos := _JSON_BLANK.match(text, pos).end()) != len(text):
        raise invalid(json.JSONDecodeError("Extra data", text, pos))


# ---- tables (Parquet, a Hugging Face dataset's Arrow cache): read a batch of rows at a time
#
# A table's row is read as the JSON line it would be, so every source gives a format the same values:
#   null -> the field is left out (as a line that leaves it out); str, int, bool, float64 as they are;
#   float32 -> the shortest decimal that reads back as the same float32 (0.3, not 0.30000001192092896);
#     float16 as its exact value;
#   timestamp -> ISO 8601 text at the column's own precision ("2024-05-01T12:30:00.123456789"), with
#     its offset when the column has a time zone ("...+02:00"); date -> "2024-05-01"; time -> "12:30:00";
#   duration -> ISO 8601 in seconds ("PT90.5S", "-PT0.000000001S"); decimal -> a Decimal, the number
#     it is (an answer's digits, "3.140"; in a reward row's JSON a string of those digits, tasks._json_default);
#   binary -> the text it is, when it is UTF-8;
#   lists and structs -> JSON lists and objects of the same (a map's entries: [key, value] pairs).
# A cell with no such form (bytes that are not UTF-8, a value pyarrow cannot convert) is an Unreadable,
# which tasks._problem_from_record makes that row's error where the row's format reads the field (tasks.READ_FIELDS;
# every field of a reward row). Nothing is replaced and no load stops at one bad cell.

_BATCH_BYTES = 4 << 20  # rows per batch: about this much data (a row group's uncompressed size / its rows)


class Unreadable:
    """A table cell with no JSON form; str() says why, after "field 'name'"."""

    __slots__ = ("reason",)

    def __init__(self, reason: str):
        self.reason = reason

    def __str__(self):
        return self.reason

    def __repr__(self):
        return f"Unreadable({self.reason!r})"


def _iso_duration(count: int, digits: int) -> str:
    """A duration of `count` units of 10**-digits seconds in ISO 8601 seconds, exactly: "PT90.5S"."""
    seconds = decimal.Decimal(abs(count)).scaleb(-digits)
    text = format(seconds.normalize() if seconds else decimal.Decimal(0), "f")
    return f"{'-' if count < 0 else ''}PT{text}S"


def _jsonable(value):
    """A Python value (of a table's cell) as JSON would hold it; an Unreadable when it has no JSON form."""
    if value is None or isinstance(value, (str, int, float, Unreadable)):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        value = bytes(value)
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as e:
            return Unreadable(f"holds bytes that are not UTF-8 text (byte 0x{value[e.start]:02x} at offset {e.start})")
    if isinstance(value, decimal.Decimal):  # a number: an answer's digits (tasks._number_text), a reward
        return value                         # row's JSON string (tasks._json_default)
    if isinstance(value, (list, tuple)):
        out = [_jsonable(v) for v in value]
        return next((v for v in out if isinstance(v, Unreadable)), out)
    if isinstance(value, dict):
        out = {k: _jsonable(v) for k, v in value.items()}
        return next((v for v in out.values() if isinstance(v, Unreadable)), out)
    if isinstance(value, (datetime.date, datetime.time)):  # datetime.datetime is a date
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return _iso_duration((value.days * 86400 + value.seconds) * 10**6 + value.microseconds, 6)
    return Unreadable(f"holds a {type(value).__name__} value, which has no JSON form")


def _json_column(col):
    """An Arrow column with the types that have no JSON value (temporal, float32, binary)
    turned into ones that do, in Arrow (module comment above); other columns as they are."""
    import pyarrow as pa
    import pyarrow.compute as pc
    t = col.type
    if pa.types.is_timestamp(t):
        if not t.tz:
            return pc.strftime(col, format="%Y-%m-%dT%H:%M:%S")  # %S carries the unit's fraction
        text = pc.strftime(col, format="%Y-%m-%dT%H:%M:%S%z")  # the column's zone, offset +HHMM
        return pc.replace_substring_regex(text, pattern=r"([+-]\d\d)(\d\d)$", replacement=r"\1:\2")
    if pa.types.is_date(t):
        return pc.strftime(col, format="%Y-%m-%d")
    if pa.types.is_time(t):
        return pc.strftime(col, format="%H:%M:%S")
    if pa.types.is_duration(t):
        digits = {"s": 0, "ms": 3, "us": 6, "ns": 9}[t.unit]
        counts = pc.cast(col, pa.int64()).to_pylist()
        return pa.array([None if c is None else _iso_duration(c, digits) for c in counts], pa.string())
    if pa.types.is_float32(t):  # Arrow writes a float32 as its shortest decimal
        return pc.cast(pc.cast(col, pa.string()), pa.float64())
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        try:
            return pc.cast(col, pa.string() if pa.types.is_binary(t) else pa.large_string())  # all UTF-8
        except pa.ArrowInvalid:
            return col  # some cell is not UTF-8: _jsonable names it, the others are decoded there
    return col


def _cell(col, i: int):
    try:
        return col[i].as_py()
    except UnicodeDecodeError as e:
        return Unreadable(f"holds text that is not UTF-8 (byte 0x{e.object[e.start]:02x} at offset {e.start})")
    except Exception as e:  # noqa: BLE001 - pyarrow's errors name the value
        return Unreadable(f"holds a value pyarrow cannot convert ({type(e).__name__}: {e})")


def _column_values(col) -> list:
    """A column of a batch as Python values (_jsonable's), a cell that has none as an Unreadable."""
    import pyarrow as pa
    try:
        col = _json_column(col)
    except Exception:  # noqa: BLE001 - left as it is: a cell with no value is named below
        pass
    try:
        values = col.to_pylist()
    except Exception:  # noqa: BLE001 - some cell pyarrow cannot convert: the others are kept
        values = [_cell(col, i) for i in range(len(col))]
    t = col.type
    if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_integer(t)
            or pa.types.is_boolean(t) or pa.types.is_float64(t) or pa.types.is_null(t)):
        values = [_jsonable(v) for v in values]
    return values


def _arrow_rows(batch):
    """The rows of an Arrow record batch (or table) as dicts, a column at a time, nulls left out."""
    names = batch.schema.names
    columns = [_column_values(batch.column(i)) for i in range(batch.num_columns)]
    for values in zip(*columns) if columns else [()] * batch.num_rows:
        yield {k: v for k, v in zip(names, values) if v is not None}


def _table_rows(batches, total: int, what: str):
    """("row N", dict) for the rows of an iterator of Arrow batches holding `total` rows in all. If
    reading stops at an error (a corrupt page), the rows not read are one error, ("rows N-M",
    ValueError naming `what`): the rows before it are kept."""
    number = 0
    try:
        for batch in batches:
            for rec in _arrow_rows(batch):
                number += 1
                yield f"row {number}", rec
    except Exception as e:  # noqa: BLE001 - pyarrow's errors name the problem
        if number < total:
            reason = " ".join(str(e).split())  # pyarrow's messages span lines
            yield f"rows {number + 1}-{total}", ValueError(f"{what} cannot be read ({type(e).__name__}: {reason})")


def _parquet_rows(path: str):
    """The rows of a Parquet file, a row group at a time and a batch of about _BATCH_BYTES at a time
    within it (ParquetFile.iter_batches): the whole table is never in memory, let alone as Python
    objects. A row group that cannot be read is one error naming its rows; the other groups are read."""
    try:
        import pyarrow.parquet
    except ImportError:
        raise _extra_missing(f"reading {path}", "pyarrow") from None
    try:
        # the footer only; then column chunks read through a 1 MiB buffer as pages are decoded, not
        # pre-buffered whole (pre_buffer, the default, holds a row group's compressed chunks at once)
        pf = pyarrow.parquet.ParquetFile(path, buffer_size=1 << 20, pre_buffer=False)
    except Exception as e:  # noqa: BLE001 - pyarrow's errors name the problem
        raise ValueError(f"{path}: not a readable Parquet file ({type(e).__name__}: {e})") from None
    with pf:
        meta, first = pf.metadata, 0
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            rows = group.num_rows
            if not rows:
                continue
            size = max(1, min(rows, _BATCH_BYTES * rows // max(group.total_byte_size, 1)))
            batches = pf.iter_batches(batch_size=size, row_groups=[g], use_threads=False)  # threads: +30 MB
            for where, rec in _table_rows(batches, rows, f"row group {g + 1} of {meta.num_row_groups}"):
                if where.startswith("row "):
                    yield f"row {first + int(where[4:])}", rec
                else:
                    lo, hi = where[5:].split("-")
                    yield f"rows {first + int(lo)}-{first + int(hi)}", rec
            first += rows


def _hf_rows(spec: str):
    """DATA=hf:<name>[:<config>[:<split>]] (no config, or an empty one: the dataset's default; split
    "train" when not given): a Hugging Face dataset, loaded with `datasets.load_dataset` (the datasets
    extra), which keeps it as a memory-mapped Arrow file in its cache; its rows are read from that a
    batch at a time, converted as a Parquet file's are. hf:HuggingFaceH4/MATH-500::test is MATH-500's
    one split."""
    parts = spec[len("hf:"):].split(":")
    if not parts[0] or len(parts) > 3 or (len(parts) == 3 and not parts[2]):
        raise ValueError(f"a Hugging Face dataset is given as hf:<name>[:<config>[:<split>]], got {spec!r}")
    name, split = parts[0], parts[2] if len(parts) > 2 else "train"
    config = (parts[1] if len(parts) > 1 else "") or None
    try:
        import datasets
    except ImportError:
        raise _extra_missing(f"DATA={spec}", "datasets") from None
    try:
        rows = datasets.load_dataset(name, config, split=split)
    except Exception as e:  # noqa: BLE001 - a missing dataset, config or split, no network: its message says
        raise ValueError(f"DATA={spec}: cannot load {name!r} (config {config!r}, split {split!r}): "
                         f"{type(e).__name__}: {e}") from None
    if hasattr(rows, "with_format") and hasattr(rows, "iter") and hasattr(rows, "__len__"):  # a datasets.Dataset
        total = len(rows)
        nbytes = getattr(getattr(rows, "data", None), "nbytes", 0) or 0
        size = max(1, min(max(total, 1), _BATCH_BYTES * total // nbytes if nbytes else 1000))
        yield from _table_rows(rows.with_format("arrow").iter(batch_size=size), total, f"DATA={spec}")
        return
    for i, rec in enumerate(rows, 1):  # any other iterable of rows
        yield f"row {i}", _present(rec)


def _present(rec):
    """A row of a Python source without its null fields (a column that a row leaves null is a field
    that row does not have, as in a JSON line that leaves it out), its values as JSON holds them."""
    return {k: _jsonable(v) for k, v in rec.items() if v is not None} if isinstance(rec, dict) else rec


def dataset_rows(path: str):
    """The rows of a dataset as (where, object), where = a line number (JSON lines), "row N", or
    "rows N-M" for rows a table could not read; or (where, ValueError) for a line that is not JSON or
    not UTF-8 text. DATA can be: a .jsonl file (one object per line), a .json file (a list of objects,
    or one object per line), a .parquet file (pyarrow), or hf:<name>[:<config>[:<split>]] (the
    datasets extra). Every source is read a line, or a batch of rows, at a time (a JSON list is one
    document, read whole); a table's row is read as its JSON line would be (null fields left out,
    timestamps as ISO 8601 text, ...: the comment above _BATCH_BYTES). ValueError if the source
    cannot be read."""
    if path.startswith("hf:"):
        return _hf_rows(path)
    if not os.path.isfile(path):
        raise ValueError(f"dataset {path!r} does not exist or is not a file")
    return _parquet_rows(path) if path.endswith(".parquet") else _json_rows(path)
