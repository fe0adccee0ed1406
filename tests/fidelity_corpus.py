"""The differential corpus of tests/test_fidelity.py: honest programs and their planted-bug twins, as data.

Each entry is one pair, written the way real datasets write programs and tests (MBPP's `assert f(...) ==
...` lines, HumanEval's `def check(candidate)`, APPS/Codeforces stdin/stdout, BigCodeBench/LiveCodeBench
tests with try/except, classes and unittest). The honest program is what a person would write; its twin
has one minimal, realistic bug that the tests catch in the reference harness (reference.py: program and
tests in one plain Python process), for the reason the bug's description says.

An entry is a dict:
  name         unique
  family       what it exercises (FAMILIES)
  kind         "assert" or "io"
  program      the honest program
  twin         the same program with the planted bug
  bug          one line: what the twin gets wrong
  tests        (assert) the tests' source, MBPP/HumanEval/unittest style
  entry_point  (assert, optional) HumanEval style: the tests define check(candidate) and the harness
               calls check(<entry_point>)
  cases        (io) [[stdin, expected stdout], ...]
  limit        (optional) one sentence: why the verifier may legitimately not reproduce the honest
               verdict (the tests change the program's world from outside the program). Such an
               honest program is expected to fail in the verifier; its twin must still fail.

Twins are mostly written as (old, new) edits of the honest program (`_twin`), so the bug is visibly
minimal; the edit must match exactly once. The `limit` entries are named limit_*. To add a pair: write it
with A(...) or IO(...) below; tests/test_fidelity.py checks that the reference passes the program and
fails the twin before it compares the verifier with the reference.
"""

import textwrap

FAMILIES = ("stdlib_values", "exceptions", "classes", "builtin_names", "module_names", "printing", "io",
            "mutation", "globals", "functions", "arguments", "recursion", "many_calls", "test_modules")

CORPUS: list[dict] = []


def _src(text: str) -> str:
    return textwrap.dedent(text).strip("\n") + "\n"


def _twin(program: str, edit) -> str:
    """The twin: the program's source as written here (indented) with edit applied, an (old, new)
    pair or a list of them (each old must occur exactly once, indented as written here), or the
    twin's whole source as a string."""
    if isinstance(edit, str):
        return _src(edit)
    for old, new in [edit] if isinstance(edit, tuple) else edit:
        assert program.count(old) == 1, f"the edit {old!r} must match exactly once"
        program = program.replace(old, new)
    return _src(program)


def A(name, family, program, tests, edit, bug, entry_point=None, limit=None):
    """An assert-style pair."""
    assert family in FAMILIES, family
    entry = {"name": name, "family": family, "kind": "assert", "program": _src(program),
             "twin": _twin(program, edit), "bug": bug, "tests": _src(tests)}
    if entry_point:
        entry["entry_point"] = entry_point
    if limit:
        entry["limit"] = limit
    CORPUS.append(entry)


def IO(name, family, program, cases, edit, bug, limit=None):
    """A stdin/stdout pair; cases as (stdin, expected stdout)."""
    assert family in FAMILIES, family
    entry = {"name": name, "family": family, "kind": "io", "program": _src(program),
             "twin": _twin(program, edit), "bug": bug, "cases": [list(c) for c in cases]}
    if limit:
        entry["limit"] = limit
    CORPUS.append(entry)


# ============================================================================ stdlib values returned and compared

A("counter_char_freq", "stdlib_values", """
    from collections import Counter

    def char_freq(s):
        return Counter(s)
""", """
    from collections import Counter
    result = char_freq("hello")
    assert result["l"] == 2
    assert result["z"] == 0
    assert result.most_common(1) == [("l", 2)]
    assert result == Counter({"l": 2, "h": 1, "e": 1, "o": 1})
""", ("return Counter(s)", "return {c: s.count(c) for c in s}"),
  "returns a plain dict: result['z'] raises KeyError and there is no most_common")

A("counter_word_count", "stdlib_values", """
    from collections import Counter

    def word_count(text):
        return Counter(text.lower().split())
""", """
    assert word_count("The cat and the hat") == Counter({"the": 2, "cat": 1, "and": 1, "hat": 1})
    assert word_count("a A a")["a"] == 3
    assert word_count("")["anything"] == 0
""", ("text.lower().split()", "text.split()"), "does not lowercase: 'The' and 'the' counted apart")

A("counter_top_k", "stdlib_values", """
    from collections import Counter

    def top_k_frequent(nums, k):
        return [x for x, _ in Counter(nums).most_common(k)]
""", """
    def check(candidate):
        assert candidate([1, 1, 1, 2, 2, 3], 2) == [1, 2]
        assert candidate([4], 1) == [4]
        assert sorted(candidate([5, 5, 6, 6, 7], 2)) == [5, 6]
""", ("most_common(k)", "most_common()[-k:]"), "takes the k least common", entry_point="top_k_frequent")

A("defaultdict_list_group", "stdlib_values", """
    from collections import defaultdict

    def group_by_length(words):
        groups = defaultdict(list)
        for w in words:
            groups[len(w)].append(w)
        return groups
""", """
    g = group_by_length(["a", "bb", "cc", "d"])
    assert g[1] == ["a", "d"]
    assert g[2] == ["bb", "cc"]
    assert g[5] == []
    assert len(g) == 3
""", [("groups = defaultdict(list)", "groups = {}"),
      ("groups[len(w)].append(w)", "groups.setdefault(len(w), []).append(w)")],
  "a plain dict: reading a missing length raises KeyError")

A("defaultdict_int_counts", "stdlib_values", """
    from collections import defaultdict

    def count_initials(names):
        counts = defaultdict(int)
        for name in names:
            counts[name[0].upper()] += 1
        return counts
""", """
    c = count_initials(["alice", "Bob", "anna", "carl"])
    assert c["A"] == 2 and c["B"] == 1 and c["C"] == 1
    assert c["Z"] == 0
    assert dict(c) == {"A": 2, "B": 1, "C": 1, "Z": 0}
""", ("name[0].upper()", "name[0]"), "does not uppercase the initial")

A("ordereddict_last_seen", "stdlib_values", """
    from collections import OrderedDict

    def last_seen_order(items):
        seen = OrderedDict()
        for i, x in enumerate(items):
            seen[x] = i
            seen.move_to_end(x)
        return seen
""", """
    d = last_seen_order("abcab")
    assert list(d.keys()) == ["c", "a", "b"]
    assert d["a"] == 3
    d.move_to_end("c")
    assert list(d) == ["a", "b", "c"]
    assert d.popitem(last=False) == ("a", 3)
""", ("            seen.move_to_end(x)\n", ""), "forgets move_to_end: keys in first-seen order")

A("deque_maxlen_tail", "stdlib_values", """
    from collections import deque

    def tail(iterable, n):
        return deque(iterable, maxlen=n)
""", """
    d = tail([0, 1, 2, 3, 4, 5, 6, 7, 8, 9], 3)
    assert list(d) == [7, 8, 9]
    assert d.maxlen == 3
    assert d.popleft() == 7
    d.append(10)
    d.append(11)
    assert list(d) == [9, 10, 11]
""", ("deque(iterable, maxlen=n)", "deque(list(iterable)[-n:])"), "no maxlen: appends grow the deque")

A("deque_rotate", "stdlib_values", """
    from collections import deque

    def rotate_right(xs, k):
        d = deque(xs)
        d.rotate(k)
        return d
""", """
    from collections import deque
    assert rotate_right([1, 2, 3, 4, 5], 2) == deque([4, 5, 1, 2, 3])
    assert list(rotate_right("abc", 1)) == ["c", "a", "b"]
""", ("d.rotate(k)", "d.rotate(-k)"), "rotates left")

A("namedtuple_midpoint", "stdlib_values", """
    from collections import namedtuple

    Point = namedtuple("Point", ["x", "y"])

    def midpoint(a, b):
        return Point((a.x + b.x) / 2, (a.y + b.y) / 2)
""", """
    m = midpoint(Point(0, 0), Point(2, 4))
    assert m.x == 1 and m.y == 2
    assert m == (1, 2)
    assert m._asdict() == {"x": 1.0, "y": 2.0}
    assert isinstance(m, tuple)
""", ("(a.y + b.y) / 2", "(a.y + b.x) / 2"), "typo: uses b.x for the y coordinate")

A("namedtuple_version", "stdlib_values", """
    from collections import namedtuple

    Version = namedtuple("Version", "major minor patch")

    def parse_version(s):
        return Version(*map(int, s.split(".")))
""", """
    v = parse_version("1.12.3")
    assert v.minor == 12
    assert v == (1, 12, 3)
    assert v > parse_version("1.2.0")
    assert repr(v) == "Version(major=1, minor=12, patch=3)"
""", ("Version(*map(int, s.split(\".\")))", "Version(*s.split(\".\"))"), "keeps the parts as strings")

A("fraction_harmonic", "stdlib_values", """
    from fractions import Fraction

    def harmonic(n):
        return sum(Fraction(1, k) for k in range(1, n + 1))
""", """
    from fractions import Fraction
    assert harmonic(1) == 1
    assert harmonic(2) == 1.5
    assert harmonic(3) == Fraction(11, 6)
    assert harmonic(4).denominator == 12
""", ("range(1, n + 1)", "range(1, n)"), "off by one: stops at 1/(n-1)")

A("fraction_simplify", "stdlib_values", """
    from fractions import Fraction

    def simplify(num, den):
        return Fraction(num, den)
""", """
    f = simplify(2, 4)
    assert f == 0.5
    assert (f.numerator, f.denominator) == (1, 2)
    assert str(f) == "1/2"
    assert simplify(6, 3) == 2
""", ("return Fraction(num, den)", "return num / den"), "returns a float: no numerator, str is '0.5'")

A("decimal_money_sum", "stdlib_values", """
    from decimal import Decimal

    def add_money(a, b):
        return Decimal(a) + Decimal(b)
""", """
    from decimal import Decimal
    assert add_money("0.1", "0.2") == Decimal("0.3")
    assert str(add_money("1.10", "2.20")) == "3.30"
""", ("Decimal(a) + Decimal(b)", "Decimal(str(float(a) + float(b)))"), "adds floats: 0.30000000000000004")

A("decimal_quantize", "stdlib_values", """
    from decimal import Decimal, ROUND_HALF_UP

    def round_price(x):
        return Decimal(x).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
""", """
    from decimal import Decimal
    assert round_price("2.665") == Decimal("2.67")
    assert str(round_price("1")) == "1.00"
    assert round_price("0.004") == Decimal("0.00")
""", (", rounding=ROUND_HALF_UP", ""), "default rounding (half even): 2.665 -> 2.66")

A("date_add_days", "stdlib_values", """
    from datetime import date, timedelta

    def add_days(d, n):
        return d + timedelta(days=n)
""", """
    from datetime import date
    assert add_days(date(2024, 2, 28), 1) == date(2024, 2, 29)
    assert add_days(date(2023, 12, 31), 1).year == 2024
    assert add_days(date(2024, 3, 1), -1) == date(2024, 2, 29)
""", ("d + timedelta(days=n)", "d.replace(day=d.day + n)"), "replaces the day: fails across month ends")

A("datetime_parse_gap", "stdlib_values", """
    from datetime import datetime

    def parse_ts(s):
        return datetime.strptime(s, "%Y-%m-%d %H:%M")
""", """
    from datetime import datetime, timedelta
    a = parse_ts("2024-01-05 09:15")
    b = parse_ts("2024-01-05 10:45")
    assert a.hour == 9 and a.day == 5 and a.month == 1
    assert b - a == timedelta(hours=1, minutes=30)
    assert a == datetime(2024, 1, 5, 9, 15)
""", ('"%Y-%m-%d %H:%M"', '"%Y-%d-%m %H:%M"'), "day and month swapped in the format")

A("timedelta_duration", "stdlib_values", """
    from datetime import datetime

    def duration(start, end):
        fmt = "%H:%M"
        return datetime.strptime(end, fmt) - datetime.strptime(start, fmt)
""", """
    from datetime import timedelta
    d = duration("09:00", "17:30")
    assert d == timedelta(hours=8, minutes=30)
    assert d.total_seconds() == 30600
""", ("datetime.strptime(end, fmt) - datetime.strptime(start, fmt)",
      "datetime.strptime(end[:2], \"%H\") - datetime.strptime(start[:2], \"%H\")"), "drops the minutes")

A("range_returned", "stdlib_values", """
    def indices(xs):
        return range(len(xs))
""", """
    assert indices("abc") == range(0, 3)
    assert list(indices([])) == []
    assert 2 in indices("abc")
    assert len(indices([7, 8])) == 2
""", ("range(len(xs))", "range(1, len(xs))"), "starts at 1")

A("dict_keys_view", "stdlib_values", """
    def vocabulary(counts):
        return counts.keys()
""", """
    v = vocabulary({"a": 1, "b": 2})
    assert v == {"a", "b"}
    assert sorted(v) == ["a", "b"]
    assert "a" in v
""", ("counts.keys()", "counts.values()"), "returns the values view")

A("dict_items_sorted", "stdlib_values", """
    def invert(d):
        out = {}
        for k, v in d.items():
            out.setdefault(v, []).append(k)
        return out
""", """
    r = invert({"a": 1, "b": 2, "c": 1})
    assert sorted(r.items()) == [(1, ["a", "c"]), (2, ["b"])]
    assert r.keys() == {1, 2}
""", ("out.setdefault(v, []).append(k)", "out[v] = [k]"), "overwrites: keeps only the last key per value")

A("array_typecode", "stdlib_values", """
    from array import array

    def to_int_array(xs):
        return array("i", xs)
""", """
    from array import array
    a = to_int_array([1, 2, 3])
    assert a.typecode == "i"
    assert a.tolist() == [1, 2, 3]
    assert a == array("i", [1, 2, 3])
    assert a.itemsize == array("i").itemsize
""", ('array("i", xs)', 'array("d", xs)'), "a float array")

A("intenum_priority", "stdlib_values", """
    from enum import IntEnum

    class Priority(IntEnum):
        LOW = 1
        MEDIUM = 2
        HIGH = 3

    def parse_priority(s):
        return Priority[s.strip().upper()]
""", """
    p = parse_priority(" high")
    assert p == 3
    assert p.name == "HIGH"
    assert p > Priority.LOW
    assert p is Priority.HIGH
    assert parse_priority("low").bit_length() == 1
""", ("s.strip().upper()", "s.upper()"), "does not strip: KeyError for ' HIGH'")

A("int_subclass_bits", "stdlib_values", """
    class Bits(int):
        def popcount(self):
            return bin(self).count("1")

    def make_bits(n):
        return Bits(n)
""", """
    b = make_bits(10)
    assert b == 10
    assert b.popcount() == 2
    assert b.bit_length() == 4
    assert b + 1 == 11
    assert isinstance(b, int)
""", ('bin(self).count("1")', 'str(self).count("1")'), "counts ones in the decimal digits")

A("heapq_heapify", "stdlib_values", """
    import heapq

    def build_heap(xs):
        h = list(xs)
        heapq.heapify(h)
        return h
""", """
    import heapq
    h = build_heap([5, 3, 8, 1])
    assert h[0] == 1
    assert heapq.heappop(h) == 1
    assert heapq.heappop(h) == 3
    assert len(h) == 2
""", ("        heapq.heapify(h)\n", ""), "forgets heapify")

A("heapq_merge_sorted", "stdlib_values", """
    import heapq

    def merge_sorted(*lists):
        return list(heapq.merge(*lists))
""", """
    assert merge_sorted([1, 4, 7], [2, 5], [3]) == [1, 2, 3, 4, 5, 7]
    assert merge_sorted([], [1]) == [1]
""", ("list(heapq.merge(*lists))", "[x for l in lists for x in l]"), "concatenates without merging")

A("itertools_combinations", "stdlib_values", """
    import itertools

    def pairs(xs):
        return itertools.combinations(xs, 2)
""", """
    assert list(pairs([1, 2, 3])) == [(1, 2), (1, 3), (2, 3)]
    assert len(list(pairs("abcd"))) == 6
""", ("itertools.combinations(xs, 2)", "itertools.permutations(xs, 2)"), "permutations: ordered pairs")

A("itertools_groupby_runs", "stdlib_values", """
    from itertools import groupby

    def run_lengths(s):
        return [(ch, len(list(g))) for ch, g in groupby(s)]
""", """
    assert run_lengths("aaabccdd") == [("a", 3), ("b", 1), ("c", 2), ("d", 2)]
    assert run_lengths("aabba") == [("a", 2), ("b", 2), ("a", 1)]
    assert run_lengths("") == []
""", ("groupby(s)", "groupby(sorted(s))"), "sorts first: merges separated runs")

A("frozenset_pairs", "stdlib_values", """
    def unique_pairs(edges):
        return {frozenset(e) for e in edges}
""", """
    r = unique_pairs([(1, 2), (2, 1), (3, 4)])
    assert len(r) == 2
    assert frozenset({1, 2}) in r
    assert r == {frozenset({1, 2}), frozenset({3, 4})}
""", ("frozenset(e)", "tuple(e)"), "tuples: (1, 2) and (2, 1) both kept")

A("bytes_xor", "stdlib_values", """
    def xor_bytes(a, b):
        return bytes(x ^ y for x, y in zip(a, b))
""", """
    assert xor_bytes(b"\\x01\\x02", b"\\x03\\x03") == b"\\x02\\x01"
    assert xor_bytes(b"key", b"key") == bytes(3)
    assert isinstance(xor_bytes(b"a", b"b"), bytes)
""", ("x ^ y", "x | y"), "or instead of xor")

A("bytearray_upper", "stdlib_values", """
    def upper_ascii(data):
        out = bytearray(data)
        for i, c in enumerate(out):
            if 97 <= c <= 122:
                out[i] = c - 32
        return out
""", """
    r = upper_ascii(b"abc-XyZ")
    assert r == b"ABC-XYZ"
    assert isinstance(r, bytearray)
    assert upper_ascii(b"xyz") == b"XYZ"
    r.append(33)
    assert bytes(r) == b"ABC-XYZ!"
""", ("97 <= c <= 122", "97 <= c < 122"), "misses 'z'")

A("complex_roots", "stdlib_values", """
    import cmath

    def roots(a, b, c):
        d = cmath.sqrt(b * b - 4 * a * c)
        return ((-b + d) / (2 * a), (-b - d) / (2 * a))
""", """
    assert roots(1, 0, 1) == (1j, -1j)
    r1, r2 = roots(1, -3, 2)
    assert (r1, r2) == (2, 1)
    assert abs(roots(1, 2, 5)[0] - complex(-1, 2)) < 1e-12
""", [("import cmath", "import math"), ("cmath.sqrt", "math.sqrt")], "math.sqrt: ValueError on a negative discriminant")

A("bigint_factorial", "stdlib_values", """
    def factorial(n):
        result = 1
        for k in range(2, n + 1):
            result *= k
        return result
""", """
    assert factorial(0) == 1
    assert factorial(30) == 265252859812191058636308480000000
    assert factorial(100) % 10 ** 24 == 0
    assert len(str(factorial(100))) == 158
""", ("range(2, n + 1)", "range(2, n)"), "off by one: (n-1)!")

A("float_nan_inf", "stdlib_values", """
    def safe_ratio(a, b):
        if b == 0:
            return float("inf") if a else float("nan")
        return a / b
""", """
    import math
    assert safe_ratio(1, 0) == float("inf")
    assert math.isinf(safe_ratio(-1, 0))
    assert math.isnan(safe_ratio(0, 0))
    assert safe_ratio(3, 4) == 0.75
""", ('float("inf") if a else float("nan")', 'float("inf")'), "0/0 is inf instead of nan")

A("enum_color", "stdlib_values", """
    from enum import Enum

    class Color(Enum):
        RED = "red"
        GREEN = "green"
        BLUE = "blue"

    def parse_color(s):
        return Color(s.lower())
""", """
    c = parse_color("RED")
    assert c is Color.RED
    assert c.value == "red"
    assert c.name == "RED"
    assert parse_color("Green") is Color.GREEN
    assert parse_color("blue") == Color.BLUE
""", ("Color(s.lower())", "Color[s]"), "looks up by name: 'Green' is not a member name")

# ============================================================================ exceptions the tests expect

A("exc_value_message", "exceptions", """
    import math

    def int_sqrt(n):
        if n < 0:
            raise ValueError("negative input")
        return math.isqrt(n)
""", """
    assert int_sqrt(17) == 4
    try:
        int_sqrt(-1)
    except ValueError as e:
        assert str(e) == "negative input"
    else:
        raise AssertionError("no ValueError")
""", ('"negative input"', '"Negative input"'), "wrong message (capitalised)")

A("exc_args_tuple", "exceptions", """
    def check_age(age):
        if not 0 <= age <= 150:
            raise ValueError("age out of range", age)
        return age
""", """
    try:
        check_age(200)
        assert False, "expected ValueError"
    except ValueError as e:
        assert e.args == ("age out of range", 200)
    assert check_age(30) == 30
""", ('raise ValueError("age out of range", age)', 'raise ValueError(f"age out of range: {age}")'),
  "one formatted message instead of two args")

A("exc_custom_subclass", "exceptions", """
    class BadInput(ValueError):
        pass

    def parse_int(s):
        s = s.strip()
        if not s.lstrip("-").isdigit():
            raise BadInput(f"not an integer: {s!r}")
        return int(s)
""", """
    assert parse_int(" -42 ") == -42
    try:
        parse_int("4x")
    except BadInput as e:
        assert "4x" in str(e)
    else:
        raise AssertionError("no BadInput")
    try:
        parse_int("")
    except ValueError:
        pass
    else:
        raise AssertionError("no ValueError")
    assert issubclass(BadInput, ValueError)
""", ('raise BadInput(f"not an integer: {s!r}")', 'raise ValueError(f"not an integer: {s!r}")'),
  "raises plain ValueError, which `except BadInput` does not catch")

A("exc_keyerror_subclass", "exceptions", """
    class MissingSetting(KeyError):
        pass

    def get_setting(settings, name):
        if name not in settings:
            raise MissingSetting(name)
        return settings[name]
""", """
    s = {"debug": True}
    assert get_setting(s, "debug") is True
    try:
        get_setting(s, "port")
    except KeyError as e:
        assert e.args[0] == "port"
        assert isinstance(e, MissingSetting)
        assert isinstance(e, LookupError)
    else:
        raise AssertionError("no KeyError")
""", ("class MissingSetting(KeyError):", "class MissingSetting(LookupError):"),
  "derives from LookupError, not KeyError")

A("exc_json_decode", "exceptions", """
    import json

    def parse_config(text):
        config = json.loads(text)
        if not isinstance(config, dict):
            raise TypeError("config must be an object")
        return config
""", """
    import json
    assert parse_config('{"a": 1}') == {"a": 1}
    try:
        parse_config("{bad")
    except ValueError as e:
        assert isinstance(e, json.JSONDecodeError)
        assert e.pos == 1
    else:
        raise AssertionError("no error")
    try:
        parse_config("[1]")
    except TypeError as e:
        assert str(e) == "config must be an object"
    else:
        raise AssertionError("no TypeError")
""", ("        config = json.loads(text)\n",
      "        try:\n            config = json.loads(text)\n"
      "        except ValueError:\n            config = {}\n"),
  "swallows the decode error and returns {}")

A("exc_zero_division", "exceptions", """
    def average(xs):
        return sum(xs) / len(xs)
""", """
    assert average([1, 2, 3]) == 2
    try:
        average([])
    except ZeroDivisionError:
        pass
    else:
        raise AssertionError("expected ZeroDivisionError")
""", ("return sum(xs) / len(xs)", "return sum(xs) / len(xs) if xs else 0"), "returns 0 for an empty list")

A("limit_stopiteration_from_a_call", "exceptions", """
    def first(iterable):
        return next(iter(iterable))
""", """
    assert first([3, 4]) == 3
    assert first("abc") == "a"
    try:
        first([])
    except StopIteration:
        pass
    else:
        raise AssertionError("expected StopIteration")
""", ("next(iter(iterable))", "next(iter(iterable), None)"), "returns None when empty",
  limit="a StopIteration a program function raises arrives as RuntimeError, as PEP 479 does for generators "
        "(it would otherwise end the tests' map() or zip() early: all(map(f, cases)) would pass)")

A("exc_custom_str", "exceptions", """
    class ParseError(Exception):
        def __init__(self, line, msg):
            super().__init__(line, msg)
            self.line, self.msg = line, msg

        def __str__(self):
            return f"line {self.line}: {self.msg}"

    def parse_lines(lines):
        for i, line in enumerate(lines, 1):
            if "=" not in line:
                raise ParseError(i, "expected '='")
        return dict(line.split("=", 1) for line in lines)
""", """
    assert parse_lines(["a=1", "b=2"]) == {"a": "1", "b": "2"}
    try:
        parse_lines(["a=1", "b=2", "oops"])
    except ParseError as e:
        assert str(e) == "line 3: expected '='"
        assert e.line == 3
    else:
        raise AssertionError("no ParseError")
""", ("enumerate(lines, 1)", "enumerate(lines)"), "0-based line numbers")

A("exc_code_attribute", "exceptions", """
    class HttpError(Exception):
        def __init__(self, code):
            super().__init__(f"HTTP {code}")
            self.code = code

    ROUTES = {"/": "home", "/about": "about"}

    def route(path):
        if path not in ROUTES:
            raise HttpError(404)
        return ROUTES[path]
""", """
    assert route("/about") == "about"
    try:
        route("/missing")
    except HttpError as e:
        assert e.code == 404
        assert str(e) == "HTTP 404"
    else:
        raise AssertionError("no HttpError")
""", ("raise HttpError(404)", 'raise HttpError("404")'), "the code is a string")

A("exc_raise_from", "exceptions", """
    class ConfigError(Exception):
        pass

    def read_port(value):
        try:
            port = int(value)
        except ValueError as e:
            raise ConfigError(f"bad port {value!r}") from e
        return port
""", """
    assert read_port("8080") == 8080
    try:
        read_port("http")
    except ConfigError as e:
        assert isinstance(e.__cause__, ValueError)
        assert "http" in str(e)
    else:
        raise AssertionError("no ConfigError")
""", ("from e", "from None"), "drops the cause (from None)")

A("exc_not_expected", "exceptions", """
    def safe_get(d, *keys, default=None):
        for k in keys:
            try:
                d = d[k]
            except (KeyError, IndexError, TypeError):
                return default
        return d
""", """
    data = {"a": [{"b": 1}]}
    assert safe_get(data, "a", 0, "b") == 1
    assert safe_get(data, "x") is None
    assert safe_get(data, "a", 5, default=0) == 0
    assert safe_get(data, "a", 0, "b", "c") is None
""", ("except (KeyError, IndexError, TypeError):", "except (KeyError, IndexError):"),
  "does not catch TypeError (indexing into an int)")

A("exc_type_error_entry_point", "exceptions", """
    def add_ints(a, b):
        if not isinstance(a, int) or not isinstance(b, int):
            raise TypeError("expected ints")
        return a + b
""", """
    def check(candidate):
        assert candidate(2, 3) == 5
        for bad in [("1", 2), (1.5, 2)]:
            try:
                candidate(*bad)
            except TypeError as e:
                assert "int" in str(e)
            else:
                raise AssertionError(f"accepted {bad}")
""", ('raise TypeError("expected ints")', 'raise ValueError("expected ints")'), "raises ValueError",
  entry_point="add_ints")

A("exc_unittest_assertraises", "exceptions", """
    def withdraw(balance, amount):
        if amount <= 0:
            raise ValueError("amount must be positive")
        if amount > balance:
            raise ValueError("insufficient funds")
        return balance - amount
""", """
    import unittest

    class TestWithdraw(unittest.TestCase):
        def test_ok(self):
            self.assertEqual(withdraw(100, 30), 70)

        def test_overdraft(self):
            with self.assertRaises(ValueError) as cm:
                withdraw(10, 30)
            self.assertEqual(str(cm.exception), "insufficient funds")

        def test_negative(self):
            with self.assertRaisesRegex(ValueError, "positive"):
                withdraw(10, -5)

    result = unittest.TextTestRunner(verbosity=0).run(unittest.defaultTestLoader.loadTestsFromTestCase(TestWithdraw))
    assert result.wasSuccessful(), result.failures + result.errors
""", ("if amount > balance:", "if amount > balance + 100:"), "allows an overdraft of 100")

A("exc_in_generator", "exceptions", """
    def parse_numbers(tokens):
        for t in tokens:
            if not t.isdigit():
                raise ValueError(f"bad token {t}")
            yield int(t)
""", """
    g = parse_numbers(["1", "2", "x", "4"])
    assert next(g) == 1
    assert next(g) == 2
    try:
        next(g)
    except ValueError as e:
        assert str(e) == "bad token x"
    else:
        raise AssertionError("no ValueError")
""", ('            raise ValueError(f"bad token {t}")\n', "            continue\n"), "skips bad tokens silently")

# ============================================================================ program classes used by the tests

A("class_repr", "classes", """
    class P:
        def __init__(self, x):
            self.x = x

        def __repr__(self):
            return f"P({self.x!r})"
""", """
    assert repr(P(1)) == "P(1)"
    assert repr(P("a")) == "P('a')"
    assert str([P(1), P(2)]) == "[P(1), P(2)]"
""", ('f"P({self.x!r})"', 'f"P(x={self.x!r})"'), "repr with a keyword")

A("class_str_money", "classes", """
    class Money:
        def __init__(self, cents):
            self.cents = cents

        def __str__(self):
            return f"${self.cents // 100}.{self.cents % 100:02d}"
""", """
    assert str(Money(150)) == "$1.50"
    assert str(Money(5)) == "$0.05"
    assert f"{Money(12345)}" == "$123.45"
""", ("{self.cents % 100:02d}", "{self.cents % 100}"), "no zero padding of the cents: $0.05 prints as $0.5")

A("class_type_name_factory", "classes", """
    import math

    class Shape:
        def area(self):
            raise NotImplementedError

    class Circle(Shape):
        def __init__(self, r):
            self.r = r

        def area(self):
            return math.pi * self.r ** 2

    class Square(Shape):
        def __init__(self, side):
            self.side = side

        def area(self):
            return self.side ** 2

    def make_shape(kind, size):
        return {"circle": Circle, "square": Square}[kind](size)
""", """
    c = make_shape("circle", 1)
    assert type(c).__name__ == "Circle"
    assert isinstance(c, Shape) and isinstance(c, Circle)
    assert abs(c.area() - 3.141592653589793) < 1e-9
    s = make_shape("square", 3)
    assert type(s) is Square and s.area() == 9
""", ('{"circle": Circle, "square": Square}', '{"circle": Square, "square": Square}'), "maps 'circle' to Square")

A("class_inheritance_override", "classes", """
    class Animal:
        def __init__(self, name):
            self.name = name

        def speak(self):
            return "..."

        def introduce(self):
            return f"{self.name} says {self.speak()}"

    class Dog(Animal):
        def speak(self):
            return "Woof"

    class Cat(Animal):
        def speak(self):
            return "Meow"
""", """
    d, c = Dog("Rex"), Cat("Tom")
    assert isinstance(d, Animal) and isinstance(c, Animal)
    assert not isinstance(d, Cat)
    assert [a.speak() for a in (d, c)] == ["Woof", "Meow"]
    assert c.introduce() == "Tom says Meow"
    assert Animal("x").speak() == "..."
""", ("    class Cat(Animal):\n        def speak(self):", "    class Cat(Animal):\n        def speek(self):"),
  "misspelt override: Cat inherits speak")

A("class_eq", "classes", """
    class Point:
        def __init__(self, x, y):
            self.x, self.y = x, y

        def __eq__(self, other):
            return isinstance(other, Point) and (self.x, self.y) == (other.x, other.y)

        def moved(self, dx, dy):
            return Point(self.x + dx, self.y + dy)
""", """
    assert Point(1, 2) == Point(1, 2)
    assert Point(1, 2) != Point(2, 1)
    assert Point(0, 0).moved(1, 2) == Point(1, 2)
    assert Point(1, 2) != (1, 2)
""", ("(other.x, other.y)", "(other.x, other.x)"), "typo: compares y with other.x")

A("class_hash_dedupe", "classes", """
    class Tag:
        def __init__(self, name):
            self.name = name

        def __eq__(self, other):
            return isinstance(other, Tag) and self.name.lower() == other.name.lower()

        def __hash__(self):
            return hash(self.name.lower())
""", """
    assert len({Tag("py"), Tag("py")}) == 1
    assert len({Tag("Py"), Tag("pY"), Tag("go")}) == 2
    assert Tag("GO") in {Tag("go")}
""", ("hash(self.name.lower())", "hash(self.name)"), "hash is case-sensitive while == is not")

A("limit_contains_a_plain_value", "classes", """
    class Interval:
        def __init__(self, lo, hi):
            self.lo, self.hi = lo, hi

        def __contains__(self, x):
            return self.lo <= x < self.hi
""", """
    r = Interval(1, 10)
    assert 5 in r
    assert 1 in r
    assert 10 not in r
    assert 2.5 in Interval(2, 3)
""", ("self.lo <= x < self.hi", "self.lo <= x <= self.hi"), "includes the upper bound",
  limit="`x in obj` with a plain value of the tests is decided in the judge by iterating obj, never by "
        "the program's __contains__ (`expected in f(x)` would let it say yes)")

A("class_vector_ops", "classes", """
    class Vec:
        def __init__(self, x, y):
            self.x, self.y = x, y

        def __add__(self, o):
            return Vec(self.x + o.x, self.y + o.y)

        def __sub__(self, o):
            return Vec(self.x - o.x, self.y - o.y)

        def __mul__(self, k):
            return Vec(self.x * k, self.y * k)

        __rmul__ = __mul__

        def __abs__(self):
            return (self.x ** 2 + self.y ** 2) ** 0.5

        def __eq__(self, o):
            return (self.x, self.y) == (o.x, o.y)

        def __repr__(self):
            return f"Vec({self.x}, {self.y})"
""", """
    assert Vec(1, 2) + Vec(3, 4) == Vec(4, 6)
    assert Vec(3, 4) - Vec(1, 1) == Vec(2, 3)
    assert abs(Vec(3, 4)) == 5
""", ("Vec(self.x - o.x, self.y - o.y)", "Vec(o.x - self.x, o.y - self.y)"), "subtracts the wrong way round")

A("limit_operator_with_a_plain_value", "classes", """
    class Vec:
        def __init__(self, x, y):
            self.x, self.y = x, y

        def __mul__(self, k):
            return Vec(self.x * k, self.y * k)

        __rmul__ = __mul__

        def __eq__(self, o):
            return (self.x, self.y) == (o.x, o.y)
""", """
    assert Vec(1, 2) * 3 == Vec(3, 6)
    assert 2 * Vec(1, 2) == Vec(2, 4)
""", ("Vec(self.x * k, self.y * k)", "Vec(self.x * k, self.y)"), "scales x only",
  limit="an operator between a program object and a plain value of the tests is never the program's "
        "(it is how tests hold a result against its expected value): Python's default, TypeError")

A("class_lt_sorted", "classes", """
    class Card:
        def __init__(self, rank):
            self.rank = rank

        def __lt__(self, other):
            return self.rank < other.rank
""", """
    cards = [Card(3), Card(1), Card(2)]
    assert [c.rank for c in sorted(cards)] == [1, 2, 3]
    assert Card(1) < Card(2)
    assert max(cards).rank == 3
    assert min(cards, key=lambda c: -c.rank).rank == 3
""", ("self.rank < other.rank", "self.rank > other.rank"), "inverted comparison")

A("class_sequence_protocol", "classes", """
    class Playlist:
        def __init__(self, *songs):
            self.songs = list(songs)

        def __len__(self):
            return len(self.songs)

        def __getitem__(self, i):
            return self.songs[i]

        def __iter__(self):
            return iter(self.songs)
""", """
    p = Playlist("a", "b", "c")
    assert len(p) == 3
    assert p[0] == "a" and p[-1] == "c"
    assert list(p) == ["a", "b", "c"]
    assert "b" in p
    assert p[1:] == ["b", "c"]
""", ("return self.songs[i]\n", "return self.songs[i - 1]\n"), "1-based indexing")

A("class_property_setter", "classes", """
    class Temperature:
        def __init__(self, celsius):
            self.celsius = celsius

        @property
        def fahrenheit(self):
            return self.celsius * 9 / 5 + 32

        @fahrenheit.setter
        def fahrenheit(self, value):
            self.celsius = (value - 32) * 5 / 9
""", """
    t = Temperature(100)
    assert t.fahrenheit == 212
    t.fahrenheit = 32
    assert t.celsius == 0
    t.celsius = 37
    assert round(t.fahrenheit, 1) == 98.6
""", ("(value - 32) * 5 / 9", "value - 32 * 5 / 9"), "operator precedence in the setter")

A("class_classmethod_staticmethod", "classes", """
    class Date:
        def __init__(self, year, month, day):
            self.year, self.month, self.day = year, month, day

        @classmethod
        def from_string(cls, s):
            return cls(*map(int, s.split("-")))

        @staticmethod
        def is_leap(year):
            return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
""", """
    d = Date.from_string("2024-01-05")
    assert (d.year, d.month, d.day) == (2024, 1, 5)
    assert isinstance(d, Date)
    assert Date.is_leap(2000) and Date.is_leap(2024)
    assert not Date.is_leap(1900) and not Date.is_leap(2023)
    assert d.is_leap(d.year)
""", (" and (year % 100 != 0 or year % 400 == 0)", " and year % 100 != 0"), "misses the 400-year rule")

A("dataclass_eq_repr", "classes", """
    from dataclasses import dataclass

    @dataclass
    class Item:
        name: str
        qty: int = 1

    def parse_item(s):
        name, _, qty = s.partition("x")
        return Item(name.strip(), int(qty) if qty else 1)
""", """
    assert parse_item("apple x3") == Item("apple", 3)
    assert parse_item("pear") == Item("pear")
    assert repr(parse_item("fig x2")) == "Item(name='fig', qty=2)"
""", ("@dataclass\n", "@dataclass(eq=False)\n"), "eq=False: equality is identity")

A("dataclass_order", "classes", """
    from dataclasses import dataclass

    @dataclass(order=True)
    class Version:
        major: int
        minor: int
""", """
    vs = [Version(1, 2), Version(0, 9), Version(1, 0)]
    assert sorted(vs) == [Version(0, 9), Version(1, 0), Version(1, 2)]
    assert max(vs) == Version(1, 2)
    assert Version(1, 0) < Version(1, 1)
""", ("@dataclass(order=True)", "@dataclass"), "forgets order=True: sorting raises TypeError")

A("dataclass_frozen", "classes", """
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Coord:
        lat: float
        lon: float
""", """
    import dataclasses
    c = Coord(1.5, 2.5)
    try:
        c.lat = 0
    except dataclasses.FrozenInstanceError:
        pass
    else:
        raise AssertionError("Coord is mutable")
    seen = {Coord(1.5, 2.5): "home"}
    assert seen[Coord(1.5, 2.5)] == "home"
""", ("@dataclass(frozen=True)", "@dataclass"), "not frozen: assignable and unhashable")

A("class_call", "classes", """
    class Multiplier:
        def __init__(self, factor):
            self.factor = factor

        def __call__(self, x):
            return x * self.factor
""", """
    double = Multiplier(2)
    assert double(5) == 10
    assert list(map(double, [1, 2, 3])) == [2, 4, 6]
    assert callable(double)
""", ("x * self.factor", "x + self.factor"), "adds instead of multiplying")

A("class_context_manager", "classes", """
    class Connection:
        def __init__(self, url):
            self.url, self.is_open, self.sent = url, False, []

        def __enter__(self):
            self.is_open = True
            return self

        def __exit__(self, exc_type, exc, tb):
            self.is_open = False
            return False

        def send(self, msg):
            if not self.is_open:
                raise RuntimeError("closed")
            self.sent.append(msg)
""", """
    with Connection("db://x") as conn:
        assert conn.is_open
        conn.send("hi")
    assert not conn.is_open
    assert conn.sent == ["hi"]
    try:
        conn.send("late")
    except RuntimeError:
        pass
    else:
        raise AssertionError("sent on a closed connection")
""", ("            self.is_open = True\n            return self\n", "            self.is_open = True\n"),
  "__enter__ does not return self: `as conn` is None")

A("class_attribute_counter", "classes", """
    class Widget:
        instances = 0

        def __init__(self):
            Widget.instances += 1
            self.id = Widget.instances
""", """
    a, b = Widget(), Widget()
    assert Widget.instances == 2
    assert (a.id, b.id) == (1, 2)
""", ("            Widget.instances += 1\n            self.id = Widget.instances\n",
      "            self.instances += 1\n            self.id = self.instances\n"),
  "increments an instance attribute: the class count stays 0")

A("class_tests_set_attribute", "classes", """
    class Doubler:
        def __init__(self, x):
            self.x = x

        def double(self):
            return self.x * 2
""", """
    obj = Doubler(1)
    assert obj.double() == 2
    obj.x = 5
    assert obj.double() == 10
    setattr(obj, "x", 7)
    assert obj.double() == 14
""", [("            self.x = x\n", "            self.x = x\n            self._twice = x * 2\n"),
      ("return self.x * 2", "return self._twice")],
  "caches the result at construction: later changes to x are ignored")

A("class_stack", "classes", """
    class Stack:
        def __init__(self):
            self.items = []

        def push(self, x):
            self.items.append(x)
            return self

        def pop(self):
            if not self.items:
                raise IndexError("pop from empty stack")
            return self.items.pop()

        def peek(self):
            return self.items[-1]

        def is_empty(self):
            return not self.items

        def size(self):
            return len(self.items)
""", """
    s = Stack()
    assert s.is_empty()
    s.push(1).push(2)
    s.push(3)
    assert s.size() == 3 and s.peek() == 3
    assert s.pop() == 3
    assert s.pop() == 2
    assert s.size() == 1
    s.pop()
    try:
        s.pop()
    except IndexError as e:
        assert str(e) == "pop from empty stack"
    else:
        raise AssertionError("popped an empty stack")
""", ("return self.items.pop()", "return self.items.pop(0)"), "pops from the bottom")

A("class_queue_two_stacks", "classes", """
    class MyQueue:
        def __init__(self):
            self.inbox, self.outbox = [], []

        def push(self, x):
            self.inbox.append(x)

        def _shift(self):
            if not self.outbox:
                while self.inbox:
                    self.outbox.append(self.inbox.pop())

        def pop(self):
            self._shift()
            return self.outbox.pop()

        def peek(self):
            self._shift()
            return self.outbox[-1]

        def empty(self):
            return not self.inbox and not self.outbox
""", """
    q = MyQueue()
    q.push(1)
    q.push(2)
    assert q.peek() == 1
    assert q.pop() == 1
    q.push(3)
    assert q.pop() == 2
    assert q.pop() == 3
    assert q.empty()
""", ("            if not self.outbox:\n                while", "            if True:\n                while"),
  "refills the outbox while it still holds items")

A("class_linked_list", "classes", """
    class Node:
        def __init__(self, val, next=None):
            self.val, self.next = val, next

    class LinkedList:
        def __init__(self):
            self.head = None
            self.size = 0

        def append(self, val):
            node = Node(val)
            if self.head is None:
                self.head = node
            else:
                cur = self.head
                while cur.next:
                    cur = cur.next
                cur.next = node
            self.size += 1

        def reverse(self):
            prev, cur = None, self.head
            while cur:
                cur.next, prev, cur = prev, cur, cur.next
            self.head = prev

        def to_list(self):
            out, cur = [], self.head
            while cur:
                out.append(cur.val)
                cur = cur.next
            return out

        def __len__(self):
            return self.size
""", """
    ll = LinkedList()
    for v in [1, 2, 3]:
        ll.append(v)
    assert ll.to_list() == [1, 2, 3]
    assert len(ll) == 3
    ll.reverse()
    assert ll.to_list() == [3, 2, 1]
    assert ll.head.val == 3 and ll.head.next.val == 2
""", ("            self.head = prev\n", "            self.head = prev.next if prev else None\n"),
  "drops the new head after reversing")

A("class_lru_cache", "classes", """
    from collections import OrderedDict

    class LRUCache:
        def __init__(self, capacity):
            self.capacity = capacity
            self.data = OrderedDict()

        def get(self, key):
            if key not in self.data:
                return -1
            self.data.move_to_end(key)
            return self.data[key]

        def put(self, key, value):
            self.data[key] = value
            self.data.move_to_end(key)
            if len(self.data) > self.capacity:
                self.data.popitem(last=False)
""", """
    cache = LRUCache(2)
    cache.put(1, 1)
    cache.put(2, 2)
    assert cache.get(1) == 1
    cache.put(3, 3)
    assert cache.get(2) == -1
    cache.put(4, 4)
    assert cache.get(1) == -1
    assert cache.get(3) == 3
    assert cache.get(4) == 4
""", ("            self.data.move_to_end(key)\n            return self.data[key]\n",
      "            return self.data[key]\n"),
  "get does not refresh recency")

A("class_solution_two_sum", "classes", """
    from typing import List

    class Solution:
        def twoSum(self, nums: List[int], target: int) -> List[int]:
            seen = {}
            for i, x in enumerate(nums):
                if target - x in seen:
                    return [seen[target - x], i]
                seen[x] = i
            return []
""", """
    sol = Solution()
    assert sol.twoSum([2, 7, 11, 15], 9) == [0, 1]
    assert sol.twoSum([3, 2, 4], 6) == [1, 2]
    assert sol.twoSum([3, 3], 6) == [0, 1]
""", ("                if target - x in seen:\n"
      "                    return [seen[target - x], i]\n"
      "                seen[x] = i\n",
      "                seen[x] = i\n"
      "                if target - x in seen:\n"
      "                    return [seen[target - x], i]\n"),
  "stores before checking: can use the same element twice")

A("class_solution_valid_parens", "classes", """
    class Solution:
        def isValid(self, s: str) -> bool:
            pairs = {")": "(", "]": "[", "}": "{"}
            stack = []
            for ch in s:
                if ch in pairs:
                    if not stack or stack.pop() != pairs[ch]:
                        return False
                else:
                    stack.append(ch)
            return not stack
""", """
    def check(candidate):
        assert candidate("()[]{}") is True
        assert candidate("(]") is False
        assert candidate("([)]") is False
        assert candidate("((") is False
        assert candidate("{[]}") is True

    check(Solution().isValid)
""", ("            return not stack\n", "            return True\n"), "ignores unclosed brackets")

A("class_unittest_bank", "classes", """
    class BankAccount:
        def __init__(self, owner, balance=0):
            self.owner, self.balance = owner, balance

        def deposit(self, amount):
            if amount <= 0:
                raise ValueError("deposit must be positive")
            self.balance += amount
            return self.balance

        def withdraw(self, amount):
            if amount > self.balance:
                raise ValueError("insufficient funds")
            self.balance -= amount
            return self.balance
""", """
    import unittest

    class TestBankAccount(unittest.TestCase):
        def setUp(self):
            self.acct = BankAccount("ann", 100)

        def test_deposit(self):
            self.assertEqual(self.acct.deposit(50), 150)
            self.assertEqual(self.acct.balance, 150)

        def test_withdraw(self):
            self.assertEqual(self.acct.withdraw(30), 70)

        def test_overdraft(self):
            with self.assertRaises(ValueError):
                self.acct.withdraw(101)
            self.assertEqual(self.acct.balance, 100)

        def test_is_account(self):
            self.assertIsInstance(self.acct, BankAccount)
            self.assertEqual(self.acct.owner, "ann")

    result = unittest.TextTestRunner(verbosity=0).run(unittest.defaultTestLoader.loadTestsFromTestCase(TestBankAccount))
    assert result.wasSuccessful(), result.failures + result.errors
""", [("            if amount > self.balance:\n"
       "                raise ValueError(\"insufficient funds\")\n"
       "            self.balance -= amount\n",
       "            self.balance -= amount\n"
       "            if self.balance < 0:\n"
       "                raise ValueError(\"insufficient funds\")\n")],
  "subtracts before checking: a refused withdrawal still changes the balance")

A("class_isinstance_returned", "classes", """
    class Token:
        def __init__(self, kind, text):
            self.kind, self.text = kind, text

    def lex(s):
        out = []
        for part in s.split():
            out.append(Token("num" if part.isdigit() else "op", part))
        return out
""", """
    toks = lex("1 + 22")
    assert len(toks) == 3
    assert all(isinstance(t, Token) for t in toks)
    assert [t.kind for t in toks] == ["num", "op", "num"]
    assert toks[2].text == "22"
""", ('"num" if part.isdigit() else "op"', '"num" if part.isalpha() else "op"'), "isalpha instead of isdigit")

# ============================================================================ builtin-named functions

A("builtin_max_plain", "builtin_names", """
    def max(xs):
        best = xs[0]
        for x in xs[1:]:
            if x > best:
                best = x
        return best
""", """
    assert max([1, 5, 3]) == 5
    assert max([-3, -1, -2]) == -1
    assert max([7]) == 7
""", ("best = xs[0]", "best = 0"), "starts from 0: wrong for all-negative lists")

A("builtin_sum_common_divisors", "builtin_names", """
    def sum(a, b):
        total = 0
        for i in range(1, min(a, b) + 1):
            if a % i == 0 and b % i == 0:
                total += i
        return total
""", """
    assert sum(10, 15) == 6
    assert sum(100, 150) == 93
    assert sum(4, 6) == 3
    assert sum(4, 8) == 7
""", ("range(1, min(a, b) + 1)", "range(1, min(a, b))"), "misses the largest common divisor when it is min(a, b)")

A("builtin_pow_entry_point", "builtin_names", """
    def pow(a, b):
        result = 1
        for _ in range(b):
            result *= a
        return result
""", """
    def check(candidate):
        assert candidate(2, 10) == 1024
        assert candidate(3, 0) == 1
        assert candidate(5, 3) == 125
""", "def pow(a, b):\n    return 0\n", "returns 0", entry_point="pow")

A("builtin_sorted_check_call", "builtin_names", """
    def sorted(xs):
        out = list(xs)
        for i in range(1, len(out)):
            j = i
            while j > 0 and out[j - 1] > out[j]:
                out[j - 1], out[j] = out[j], out[j - 1]
                j -= 1
        return out
""", """
    def check(candidate):
        assert candidate([3, 1, 2]) == [1, 2, 3]
        assert candidate([]) == []
        assert candidate([2, 2, 1]) == [1, 2, 2]
        assert candidate((5, 4)) == [4, 5]

    check(sorted)
""", ("out[j - 1] > out[j]", "out[j - 1] < out[j]"), "sorts descending")

A("builtin_round_half_up", "builtin_names", """
    import math

    def round(x):
        return math.floor(x + 0.5) if x >= 0 else -math.floor(-x + 0.5)
""", """
    assert round(2.5) == 3
    assert round(0.5) == 1
    assert round(-2.5) == -3
    assert round(1.4) == 1
""", ("math.floor(x + 0.5) if x >= 0 else -math.floor(-x + 0.5)", "int(x + 0.5)"),
  "int(x + 0.5): wrong for negatives")

A("builtin_min_of_three", "builtin_names", """
    def min(a, b, c):
        if a <= b and a <= c:
            return a
        if b <= c:
            return b
        return c
""", """
    assert min(10, 20, 0) == 0
    assert min(19, 15, 18) == 15
    assert min(-10, -20, -30) == -30
""", ("        if b <= c:\n            return b\n        return c\n", "        return b\n"), "never returns c")

A("builtin_abs_entry_point", "builtin_names", """
    def abs(x):
        return x if x >= 0 else -x
""", """
    def check(candidate):
        assert candidate(-5) == 5
        assert candidate(3) == 3
        assert candidate(-2.5) == 2.5
""", ("x if x >= 0 else -x", "x if x >= 0 else x"), "forgets to negate", entry_point="abs")

A("builtin_filter_multiples", "builtin_names", """
    def filter(xs, k):
        return [x for x in xs if x % k == 0]
""", """
    assert filter([1, 2, 3, 4, 6], 2) == [2, 4, 6]
    assert filter([5, 7], 3) == []
""", ("x % k == 0", "x % k != 0"), "keeps the non-multiples")

A("builtin_len_check_call", "builtin_names", """
    def len(s):
        count = 0
        for _ in s:
            count += 1
        return count
""", """
    def check(candidate):
        assert candidate("") == 0
        assert candidate("x") == 1
        assert candidate("asdasnakj") == 9

    check(len)
""", ("count = 0", "count = 1"), "starts counting at 1")

A("builtin_max_entry_point", "builtin_names", """
    def max(a, b):
        return a if a >= b else b
""", """
    def check(candidate):
        assert candidate(1, 2) == 2
        assert candidate(-1, -2) == -1
        assert candidate(9, 7) == 9
""", ("a if a >= b else b", "a if a <= b else b"), "returns the smaller", entry_point="max")

A("builtin_hash_polynomial", "builtin_names", """
    def hash(s, base=31, mod=10 ** 9 + 7):
        h = 0
        for ch in s:
            h = (h * base + ord(ch)) % mod
        return h
""", """
    assert hash("") == 0
    assert hash("a") == 97
    assert hash("ab") == 97 * 31 + 98
    assert hash("abc", base=10, mod=1000) == (970 + 98) * 10 % 1000 + 99
""", ("(h * base + ord(ch)) % mod", "(h + ord(ch) * base) % mod"), "multiplies the character, not the hash")

# ============================================================================ module-named functions

A("module_tokenize", "module_names", """
    def tokenize(s):
        return s.split()
""", """
    assert tokenize("hello world") == ["hello", "world"]
    assert tokenize("  a  b ") == ["a", "b"]
    assert tokenize("") == []
""", ("s.split()", 's.split(" ")'), "split on single spaces: empty tokens")

A("module_base64", "module_names", """
    from base64 import b64encode

    def base64(s):
        return b64encode(s.encode()).decode()
""", """
    assert base64("hi") == "aGk="
    assert base64("hello") == "aGVsbG8="
    assert base64("") == ""
""", ("b64encode(s.encode()).decode()", 'b64encode(s.encode()).decode().rstrip("=")'), "strips the padding")

A("module_fnmatch_check_call", "module_names", """
    def fnmatch(pattern, s):
        m, n = len(pattern), len(s)
        dp = [[False] * (n + 1) for _ in range(m + 1)]
        dp[0][0] = True
        for i in range(1, m + 1):
            if pattern[i - 1] == "*":
                dp[i][0] = dp[i - 1][0]
        for i in range(1, m + 1):
            for j in range(1, n + 1):
                p = pattern[i - 1]
                if p == "*":
                    dp[i][j] = dp[i - 1][j] or dp[i][j - 1]
                elif p == "?" or p == s[j - 1]:
                    dp[i][j] = dp[i - 1][j - 1]
        return dp[m][n]
""", """
    def check(candidate):
        assert candidate("*.py", "main.py") is True
        assert candidate("*.py", "main.pyc") is False
        assert candidate("a?c", "abc") is True
        assert candidate("a*", "a") is True
        assert candidate("*", "") is True

    check(fnmatch)
""", ("dp[i - 1][j] or dp[i][j - 1]", "dp[i - 1][j - 1] or dp[i][j - 1]"), "'*' cannot match the empty string")

A("module_string_entry_point", "module_names", """
    def string(n):
        return f"{n:,}"
""", """
    def check(candidate):
        assert candidate(1234567) == "1,234,567"
        assert candidate(12) == "12"
        assert candidate(-1000) == "-1,000"
""", ('f"{n:,}"', 'f"{n}"'), "no thousands separators", entry_point="string")

A("module_heapq_sort", "module_names", """
    import heapq as hq

    def heapq(xs):
        h = list(xs)
        hq.heapify(h)
        return [hq.heappop(h) for _ in range(len(h))]
""", """
    assert heapq([5, 1, 4, 2]) == [1, 2, 4, 5]
    assert heapq([9, 8, 7, 6, 5, 4]) == [4, 5, 6, 7, 8, 9]
    assert heapq([]) == []
""", ("[hq.heappop(h) for _ in range(len(h))]", "h"), "returns the heap, not the sorted list")

A("module_statistics", "module_names", """
    def statistics(xs):
        s = sorted(xs)
        n = len(s)
        mean = sum(s) / n
        median = s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
        return mean, median
""", """
    assert statistics([1, 2, 3, 4]) == (2.5, 2.5)
    assert statistics([3, 1, 2]) == (2.0, 2)
    assert statistics([1, 1, 10, 20]) == (8.0, 5.5)
""", ("(s[n // 2 - 1] + s[n // 2]) / 2", "s[n // 2]"), "even-length median takes the upper middle")

A("module_bisect_entry_point", "module_names", """
    def bisect(xs, x):
        lo, hi = 0, len(xs)
        while lo < hi:
            mid = (lo + hi) // 2
            if xs[mid] <= x:
                lo = mid + 1
            else:
                hi = mid
        return lo
""", """
    def check(candidate):
        assert candidate([1, 2, 4, 4, 5], 4) == 4
        assert candidate([1, 2, 3], 0) == 0
        assert candidate([1, 2, 3], 9) == 3
        assert candidate([], 1) == 0
""", ("xs[mid] <= x", "xs[mid] < x"), "bisect_left instead of bisect_right", entry_point="bisect")

A("module_operator_calc", "module_names", """
    def operator(a, b, op):
        if op == "+":
            return a + b
        if op == "-":
            return a - b
        if op == "*":
            return a * b
        if op == "/":
            return a / b
        raise ValueError(f"unknown operator {op}")
""", """
    assert operator(3, 4, "+") == 7
    assert operator(3, 4, "-") == -1
    assert operator(3, 4, "*") == 12
    assert operator(3, 4, "/") == 0.75
""", ("            return a / b\n", "            return a // b\n"), "integer division")

A("module_copy_list", "module_names", """
    def copy(xs):
        return [list(row) for row in xs]
""", """
    grid = [[1, 2], [3, 4]]
    c = copy(grid)
    assert c == grid
    c[0][0] = 99
    assert grid[0][0] == 1
""", ("[list(row) for row in xs]", "list(xs)"), "shallow copy: rows shared with the original")

A("module_time_minutes", "module_names", """
    def time(s):
        h, m = map(int, s.split(":"))
        return h * 60 + m
""", """
    def check(candidate):
        assert candidate("01:30") == 90
        assert candidate("00:00") == 0
        assert candidate("23:59") == 1439

    check(time)
""", ("h * 60 + m", "h * 60"), "drops the minutes")

# ============================================================================ printing while computing (assert jobs)

A("print_while_computing", "printing", """
    def fib(n):
        a, b = 0, 1
        for i in range(n):
            print(f"step {i}: {a}")
            a, b = b, a + b
        return a
""", """
    assert fib(10) == 55
    assert fib(1) == 1
    assert fib(0) == 0
""", ("a, b = b, a + b", "a, b = b, a + a"), "adds a to itself")

A("print_instead_of_return", "printing", """
    def greet(name):
        message = f"Hello, {name}!"
        print(message)
        return message
""", """
    assert greet("Ann") == "Hello, Ann!"
    assert greet("") == "Hello, !"
""", ("        print(message)\n        return message\n", "        print(message)\n"),
  "prints the answer and returns None")

A("print_lots", "printing", """
    def collatz_steps(n):
        steps = 0
        while n != 1:
            print(n)
            n = n // 2 if n % 2 == 0 else 3 * n + 1
            steps += 1
        return steps
""", """
    assert collatz_steps(27) == 111
    assert collatz_steps(1) == 0
    assert sum(collatz_steps(k) for k in range(1, 200)) == 8392
""", ("        steps = 0\n", "        steps = 1\n"), "counts the starting number as a step")

A("print_to_stderr", "printing", """
    import sys

    def checked_div(a, b):
        if b == 0:
            print("warning: division by zero", file=sys.stderr)
            return None
        return a / b
""", """
    assert checked_div(6, 3) == 2
    assert checked_div(1, 0) is None
""", ("            return None\n", "            return 0\n"), "returns 0 instead of None")

# ============================================================================ stdin/stdout programs

IO("io_sum_list", "io", """
    n = int(input())
    xs = list(map(int, input().split()))
    print(sum(xs[:n]))
""", [("3\n1 2 3\n", "6\n"), ("1\n-5\n", "-5\n"), ("4\n10 20 30 40\n", "100\n")],
   ("xs[:n]", "xs[:n - 1]"), "off by one: drops the last number")

IO("io_multiple_testcases", "io", """
    t = int(input())
    for _ in range(t):
        a, b = map(int, input().split())
        print(a + b)
""", [("3\n1 2\n3 4\n5 6\n", "3\n7\n11\n"), ("1\n-1 1\n", "0\n")],
   ("for _ in range(t):", "for _ in range(t - 1):"), "skips the last test case")

IO("io_stdin_read_max", "io", """
    import sys

    data = list(map(int, sys.stdin.read().split()))
    n, xs = data[0], data[1:]
    print(max(xs[:n]))
""", [("3\n1 2 3\n", "3\n"), ("5\n1 2 4 3 2\n", "4\n"), ("2\n-1 -2\n", "-1\n")],
   ("print(max(xs[:n]))", "print(max(data))"), "includes n in the maximum")

IO("io_trailing_whitespace", "io", """
    n = int(input())
    xs = input().split()
    for x in reversed(xs[:n]):
        print(x, end=" ")
    print()
""", [("3\n1 2 3\n", "3 2 1\n"), ("1\n7\n", "7\n")],
   ("reversed(xs[:n])", "xs[:n]"), "forgets to reverse")

IO("io_end_empty", "io", """
    n = int(input())
    print(" ".join(str(i * i) for i in range(1, n + 1)), end="")
""", [("4\n", "1 4 9 16\n"), ("1\n", "1\n")],
   ('" ".join', '"".join'), "no separator: the tokens run together")

IO("io_sep_time", "io", """
    total = int(input())
    h, m = divmod(total, 60)
    print(f"{h:02d}", f"{m:02d}", sep=":")
""", [("65\n", "01:05\n"), ("600\n", "10:00\n")],
   ('f"{h:02d}", f"{m:02d}"', "h, m"), "no zero padding")

IO("io_watermelon", "io", """
    w = int(input())
    print("YES" if w % 2 == 0 and w > 2 else "NO")
""", [("8\n", "YES\n"), ("2\n", "NO\n"), ("7\n", "NO\n")],
   ("w % 2 == 0 and w > 2", "w % 2 == 0"), "forgets that 2 cannot be split")

IO("io_yes_case", "io", """
    s = input().strip()
    print("YES" if s == s[::-1] else "NO")
""", [("abba\n", "YES\n"), ("abc\n", "NO\n")],
   ('"YES" if s == s[::-1] else "NO"', '"Yes" if s == s[::-1] else "No"'), "wrong case: Yes/No")

IO("io_lines_until_eof", "io", """
    import sys

    for line in sys.stdin:
        line = line.strip()
        if line:
            print(line[::-1])
""", [("abc\nhello\n", "cba\nolleh\n"), ("x\n", "x\n")],
   ("for line in sys.stdin:", "for line in sys.stdin.readlines()[:-1]:"), "drops the last line")

IO("io_print_only", "io", """
    primes = []
    n = 2
    while len(primes) < 10:
        if all(n % p for p in primes):
            primes.append(n)
        n += 1
    print(*primes)
""", [("", "2 3 5 7 11 13 17 19 23 29\n")],
   ("while len(primes) < 10:", "while len(primes) < 9:"), "prints nine primes")

IO("io_correct_output_then_crash", "io", """
    n = int(input())
    print(n * (n + 1) // 2)
""", [("10\n", "55\n"), ("1\n", "1\n")],
   ("print(n * (n + 1) // 2)\n", "print(n * (n + 1) // 2)\n    extra = input()\n"),
   "right output, then reads past the end: EOFError, exit status 1")

IO("io_float_format", "io", """
    a, b = map(float, input().split())
    print(f"{a / b:.2f}")
""", [("1 3\n", "0.33\n"), ("10 4\n", "2.50\n")],
   ('f"{a / b:.2f}"', "a / b"), "unformatted float")

IO("io_sys_exit_zero", "io", """
    import sys

    n = int(input())
    if n < 0:
        print("invalid")
        sys.exit(0)
    print(n * 2)
""", [("-3\n", "invalid\n"), ("4\n", "8\n")],
   ("sys.exit(0)", "sys.exit(1)"), "exits with status 1 after the message")

IO("io_main_guard", "io", """
    def solve(s):
        return sum(int(c) for c in s if c.isdigit())

    def main():
        s = input()
        print(solve(s))

    if __name__ == "__main__":
        main()
""", [("a1b2c3\n", "6\n"), ("none\n", "0\n")],
   ("if c.isdigit()", "if c.isalnum() and c != 'a'"), "counts letters as digits")

# ============================================================================ in-place mutation of arguments

A("mutation_sort_in_place", "mutation", """
    def sort_in_place(xs):
        xs.sort()
""", """
    a = [3, 1, 2]
    assert sort_in_place(a) is None
    assert a == [1, 2, 3]
""", ("        xs.sort()\n", "        xs = sorted(xs)\n"), "rebinds the parameter: the caller's list is unchanged")

A("mutation_dict_argument", "mutation", """
    def add_edge(graph, u, v):
        graph.setdefault(u, []).append(v)
        graph.setdefault(v, []).append(u)
""", """
    g = {}
    add_edge(g, 1, 2)
    add_edge(g, 1, 3)
    assert g == {1: [2, 3], 2: [1], 3: [1]}
""", ("    def add_edge(graph, u, v):\n", "    def add_edge(graph, u, v):\n        graph = dict(graph)\n"),
  "works on a copy: the caller's graph stays empty")

A("mutation_leaves_argument_alone", "mutation", """
    def without_negatives(xs):
        return [x for x in xs if x >= 0]
""", """
    a = [3, -1, 2, -5]
    b = without_negatives(a)
    assert b == [3, 2]
    assert a == [3, -1, 2, -5]
""", """
    def without_negatives(xs):
        for x in list(xs):
            if x < 0:
                xs.remove(x)
        return xs
""", "removes from the argument itself: the caller's list changes")

A("mutation_reverse_string_in_place", "mutation", """
    from typing import List

    class Solution:
        def reverseString(self, s: List[str]) -> None:
            i, j = 0, len(s) - 1
            while i < j:
                s[i], s[j] = s[j], s[i]
                i += 1
                j -= 1
""", """
    s = list("hello")
    assert Solution().reverseString(s) is None
    assert s == list("olleh")
    t = ["a", "b"]
    Solution().reverseString(t)
    assert t == ["b", "a"]
""", ("            i, j = 0, len(s) - 1\n"
      "            while i < j:\n"
      "                s[i], s[j] = s[j], s[i]\n"
      "                i += 1\n"
      "                j -= 1\n",
      "            s = s[::-1]\n"), "rebinds s to a reversed copy")

A("mutation_remove_duplicates", "mutation", """
    def remove_duplicates(nums):
        if not nums:
            return 0
        k = 1
        for i in range(1, len(nums)):
            if nums[i] != nums[k - 1]:
                nums[k] = nums[i]
                k += 1
        return k
""", """
    nums = [0, 0, 1, 1, 1, 2, 2, 3, 3, 4]
    k = remove_duplicates(nums)
    assert k == 5
    assert nums[:k] == [0, 1, 2, 3, 4]
    assert remove_duplicates([]) == 0
""", ("                nums[k] = nums[i]\n", ""), "counts the unique values without moving them")

A("mutation_rotate_matrix", "mutation", """
    def rotate(matrix):
        n = len(matrix)
        for i in range(n):
            for j in range(i + 1, n):
                matrix[i][j], matrix[j][i] = matrix[j][i], matrix[i][j]
        for row in matrix:
            row.reverse()
""", """
    m = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    rotate(m)
    assert m == [[7, 4, 1], [8, 5, 2], [9, 6, 3]]
""", """
    def rotate(matrix):
        matrix = [list(row) for row in zip(*matrix[::-1])]
""", "builds the rotated matrix and rebinds the parameter")

A("limit_program_keeps_the_callers_list", "mutation", """
    class Inventory:
        def __init__(self, items):
            self.items = items

        def add(self, item):
            self.items.append(item)
            return len(self.items)
""", """
    stock = ["apple"]
    inv = Inventory(stock)
    assert inv.add("pear") == 2
    assert stock == ["apple", "pear"]
    assert inv.items is stock
""", ("            self.items = items\n", "            self.items = list(items)\n"),
  "copies the list: the caller's list is unchanged",
  limit="a list the tests passed is the program's copy after the call: a change the program makes later through "
        "a reference it kept is not seen by the tests (nor is `inv.items is stock`)")

# ============================================================================ module globals read by the tests

A("global_counter_tick", "globals", """
    counter = 0

    def tick():
        global counter
        counter += 1
        return counter
""", """
    tick()
    tick()
    assert counter == 2
    assert tick() == 3
    assert counter == 3
""", ("        global counter\n", ""), "forgets `global`: UnboundLocalError")

A("global_list_history", "globals", """
    history = []

    def record(event):
        history.append(event)
        return len(history)
""", """
    record("start")
    record("stop")
    assert history == ["start", "stop"]
    assert record("again") == 3
    assert history[-1] == "again"
""", ("history.append(event)", "history.insert(0, event)"), "records newest first")

A("global_registry_decorator", "globals", """
    REGISTRY = {}

    def register(name):
        def decorator(func):
            REGISTRY[name] = func
            return func
        return decorator

    @register("add")
    def _add(a, b):
        return a + b

    @register("mul")
    def _mul(a, b):
        return a * b
""", """
    assert sorted(REGISTRY) == ["add", "mul"]
    assert REGISTRY["mul"](3, 4) == 12
    assert REGISTRY["add"](1, 2) == 3
""", ("REGISTRY[name] = func", "REGISTRY[func.__name__] = func"), "registers under the function's own name")

A("global_memo_cache_size", "globals", """
    _cache = {}

    def fib(n):
        if n in _cache:
            return _cache[n]
        result = n if n < 2 else fib(n - 1) + fib(n - 2)
        _cache[n] = result
        return result
""", """
    assert fib(30) == 832040
    assert len(_cache) == 31
    assert _cache[10] == 55
""", ("        if n in _cache:\n", "        if n < 2:\n            return n\n        if n in _cache:\n"),
  "does not cache the base cases: 29 entries")

A("global_set_reset", "globals", """
    _seen = set()

    def first_time(x):
        if x in _seen:
            return False
        _seen.add(x)
        return True

    def reset():
        _seen.clear()
""", """
    assert first_time(1)
    assert not first_time(1)
    reset()
    assert first_time(1)
    assert len(_seen) == 1
""", ("        _seen.clear()\n", "        _seen = set()\n"), "reset rebinds a local: nothing is cleared")

# ============================================================================ None, closures, decorators, generators

A("fn_none_result", "functions", """
    def find_index(xs, target):
        for i, x in enumerate(xs):
            if x == target:
                return i
        return None
""", """
    assert find_index([4, 5], 5) == 1
    assert find_index([4, 5], 9) is None
    assert find_index([], 1) is None
""", ("        return None\n", "        return -1\n"), "returns -1 for not found")

A("fn_closure_adder", "functions", """
    def make_adder(n):
        def add(x):
            return x + n
        return add
""", """
    add3 = make_adder(3)
    assert add3(4) == 7
    assert make_adder(-1)(1) == 0
    assert callable(add3)
""", ("        return add\n", "        return add(n)\n"), "calls the inner function instead of returning it")

A("fn_closure_late_binding", "functions", """
    def make_multipliers(n):
        return [lambda x, i=i: x * i for i in range(n)]
""", """
    fs = make_multipliers(4)
    assert [f(2) for f in fs] == [0, 2, 4, 6]
    assert len(fs) == 4
""", ("lambda x, i=i: x * i", "lambda x: x * i"), "late binding: every lambda sees the last i")

A("fn_closure_nonlocal_counter", "functions", """
    def make_counter():
        count = 0

        def increment():
            nonlocal count
            count += 1
            return count

        return increment
""", """
    c = make_counter()
    c()
    assert c() == 2
    d = make_counter()
    assert d() == 1
    assert c() == 3
""", """
    count = 0

    def make_counter():
        def increment():
            global count
            count += 1
            return count

        return increment
""", "one module-level count shared by every counter")

A("fn_decorator_wraps", "functions", """
    import functools

    def logged(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            print(f"calling {func.__name__}")
            return func(*args, **kwargs)
        return wrapper

    @logged
    def area(w, h):
        \"\"\"Area of a w x h rectangle.\"\"\"
        return w * h
""", """
    assert area(3, 4) == 12
    assert area.__name__ == "area"
    assert area.__doc__ == "Area of a w x h rectangle."
""", ("        @functools.wraps(func)\n", ""), "forgets functools.wraps: __name__ is 'wrapper'")

A("fn_decorator_call_count", "functions", """
    def count_calls(func):
        def wrapper(*args):
            wrapper.calls += 1
            return func(*args)
        wrapper.calls = 0
        return wrapper

    @count_calls
    def square(x):
        return x * x
""", """
    assert square(3) == 9
    square(4)
    assert square.calls == 2
""", ("wrapper.calls += 1", "wrapper.calls = 1"), "sets the count to 1 instead of incrementing")

A("fn_decorator_retry_test_function", "functions", """
    def retry(times):
        def decorator(func):
            def wrapper(*args):
                for attempt in range(times):
                    try:
                        return func(*args)
                    except ConnectionError:
                        if attempt == times - 1:
                            raise
            return wrapper
        return decorator
""", """
    attempts = []

    @retry(times=3)
    def flaky():
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionError("down")
        return "ok"

    assert flaky() == "ok"
    assert len(attempts) == 3
""", ("range(times)", "range(times - 1)"), "one attempt too few: gives up silently (returns None)")

A("fn_generator_basic", "functions", """
    def count_up(n):
        i = 0
        while i < n:
            yield i
            i += 1
""", """
    import types
    assert list(count_up(3)) == [0, 1, 2]
    g = count_up(2)
    assert next(g) == 0
    assert next(g) == 1
    assert list(g) == []
""", ("while i < n:", "while i <= n:"), "yields n too")

A("limit_generator_type", "functions", """
    def count_up(n):
        i = 0
        while i < n:
            yield i
            i += 1
""", """
    import types
    assert isinstance(count_up(1), types.GeneratorType)
    assert list(count_up(3)) == [0, 1, 2]
""", ("while i < n:", "while i <= n:"), "yields n too",
  limit="a program's generator is a handle in the tests: it iterates as the generator, but its type is not "
        "types.GeneratorType")

A("fn_generator_infinite_islice", "functions", """
    def primes():
        found = []
        n = 2
        while True:
            if all(n % p for p in found):
                found.append(n)
                yield n
            n += 1
""", """
    from itertools import islice
    assert list(islice(primes(), 6)) == [2, 3, 5, 7, 11, 13]
    g = primes()
    next(g)
    assert next(g) == 3
""", ("all(n % p for p in found)", "all(n % p for p in found[1:])"), "skips the test by 2: yields 4")

A("fn_generator_stopiteration", "functions", """
    def countdown(n):
        while n > 0:
            yield n
            n -= 1
""", """
    g = countdown(2)
    assert next(g) == 2
    assert next(g) == 1
    try:
        next(g)
    except StopIteration:
        pass
    else:
        raise AssertionError("countdown went past 1")
    assert list(countdown(3)) == [3, 2, 1]
""", ("while n > 0:", "while n >= 0:"), "yields 0 too")

A("fn_generator_send", "functions", """
    def running_average():
        total = count = 0
        average = None
        while True:
            value = yield average
            total += value
            count += 1
            average = total / count
""", """
    avg = running_average()
    next(avg)
    assert avg.send(10) == 10
    assert avg.send(15) == 12.5
    assert avg.send(5) == 10
""", ("average = total / count", "average = total // count"), "integer division")

# ============================================================================ arguments that are not plain data

A("arg_range_and_genexpr", "arguments", """
    def evens(iterable):
        return [x for x in iterable if x % 2 == 0]
""", """
    assert evens(range(7)) == [0, 2, 4, 6]
    assert evens(x * x for x in range(5)) == [0, 4, 16]
    assert evens({3, 4}) == [4]
    assert evens(map(int, "1234")) == [2, 4]
""", ("x % 2 == 0", "x % 2 == 1"), "keeps the odd numbers")

A("arg_lambda", "arguments", """
    def apply_twice(f, x):
        return f(f(x))
""", """
    assert apply_twice(lambda x: x + 1, 3) == 5
    assert apply_twice(lambda s: s + "!", "hi") == "hi!!"
""", ("f(f(x))", "f(x)"), "applies once")

A("arg_builtin_function", "arguments", """
    def my_map(f, xs):
        out = []
        for x in xs:
            out.append(f(x))
        return out
""", """
    assert my_map(len, ["a", "bb"]) == [1, 2]
    assert my_map(str.upper, ["a", "b"]) == ["A", "B"]
    assert my_map(abs, [-1, 2]) == [1, 2]
""", ("for x in xs:", "for x in xs[1:]:"), "skips the first element")

A("arg_key_str_lower", "arguments", """
    def sort_words(words, key=None):
        return sorted(words, key=key)
""", """
    assert sort_words(["b", "a", "C"], key=str.lower) == ["a", "b", "C"]
    assert sort_words(["b", "a"]) == ["a", "b"]
""", ("sorted(words, key=key)", "sorted(words)"), "ignores the key")

A("arg_test_defined_functions", "arguments", """
    def compose(f, g):
        return lambda x: f(g(x))
""", """
    def square(x):
        return x * x

    def inc(x):
        return x + 1

    assert compose(square, inc)(3) == 16
    assert compose(inc, square)(3) == 10
""", ("f(g(x))", "g(f(x))"), "composes in the wrong order")

A("arg_test_defined_class_identity", "arguments", """
    def cheapest(items):
        return min(items, key=lambda item: item.price)
""", """
    class Item:
        def __init__(self, name, price):
            self.name, self.price = name, price

    items = [Item("a", 3), Item("b", 1), Item("c", 2)]
    assert cheapest(items) is items[1]
    assert cheapest(items).name == "b"
""", ("min(items", "max(items"), "returns the most expensive")

A("arg_key_inside_program", "arguments", """
    def top_k(xs, k, key=None):
        return sorted(xs, key=key, reverse=True)[:k]
""", """
    assert top_k(["aaa", "b", "cc"], 2, key=len) == ["aaa", "cc"]
    assert top_k([("x", 3), ("y", 9)], 1, key=lambda p: p[1]) == [("y", 9)]
    assert top_k([1, 5, 2], 2) == [5, 2]
""", (", reverse=True", ""), "ascending: the k smallest")

A("arg_shared_iterator", "arguments", """
    from itertools import islice

    def take(iterator, n):
        return list(islice(iterator, n))
""", """
    it = iter([1, 2, 3, 4])
    assert take(it, 2) == [1, 2]
    assert next(it) == 3
    assert take(it, 5) == [4]
""", ("list(islice(iterator, n))", "list(iterator)[:n]"), "consumes the whole iterator")

A("arg_callback_mutates_test_state", "arguments", """
    def for_each(xs, callback):
        for i, x in enumerate(xs):
            callback(i, x)
""", """
    seen = []
    for_each("ab", lambda i, x: seen.append((i, x)))
    assert seen == [(0, "a"), (1, "b")]
""", ("enumerate(xs)", "enumerate(xs, 1)"), "1-based indices")

# ============================================================================ recursion

A("rec_depth_500", "recursion", """
    def sum_to(n):
        if n == 0:
            return 0
        return n + sum_to(n - 1)
""", """
    assert sum_to(500) == 125250
    assert sum_to(0) == 0
""", ("            return 0\n", "            return 1\n"), "wrong base case")

A("limit_value_nested_500_deep", "recursion", """
    def depth(x):
        levels = 0
        while isinstance(x, list):
            levels += 1
            x = x[0] if x else None
        return levels
""", """
    nested = []
    for i in range(500):
        nested = [nested]
    assert depth(nested) == 501
""", ("levels += 1", "levels += 2"), "counts two per level",
  limit="values nest at most 100 deep across the boundary (the codec bounds depth so that no value can "
        "overflow the judge's stack while it is decoded)")

A("rec_flatten_nested_90", "recursion", """
    def flatten(x):
        if not isinstance(x, list):
            return [x]
        out = []
        for item in x:
            out.extend(flatten(item))
        return out
""", """
    nested = []
    for i in range(90):
        nested = [i, nested]
    flat = flatten(nested)
    assert len(flat) == 90
    assert flat[:3] == [89, 88, 87]
    assert flatten([1, [2, [3, [4]]], 5]) == [1, 2, 3, 4, 5]
""", ("out.extend(flatten(item))", "out.extend(item if isinstance(item, list) else [item])"),
  "flattens one level only")

A("rec_lru_cache_fib", "recursion", """
    import functools

    @functools.lru_cache(maxsize=None)
    def fib(n):
        return n if n < 2 else fib(n - 1) + fib(n - 2)
""", """
    assert fib(100) == 354224848179261915075
    assert fib.cache_info().currsize == 101
""", ("n if n < 2", "1 if n < 2"), "fib(0) is 1")

A("rec_lru_cache_info", "recursion", """
    from functools import lru_cache

    @lru_cache(maxsize=None)
    def ways(n):
        if n <= 1:
            return 1
        return ways(n - 1) + ways(n - 2)
""", """
    assert ways(30) == 1346269
    assert ways.cache_info().currsize == 31
    ways.cache_clear()
    assert ways.cache_info().currsize == 0
""", ("maxsize=None", "maxsize=16"), "a bounded cache: currsize 16")

A("rec_mutual", "recursion", """
    def is_even(n):
        return True if n == 0 else is_odd(n - 1)

    def is_odd(n):
        return False if n == 0 else is_even(n - 1)
""", """
    assert is_even(10) and is_odd(7)
    assert not is_even(7) and not is_odd(10)
    assert is_even(400)
""", ("return False if n == 0", "return True if n == 0"), "is_odd(0) is True")

A("rec_hanoi", "recursion", """
    def hanoi(n, src="A", dst="C", via="B"):
        if n == 0:
            return []
        return hanoi(n - 1, src, via, dst) + [(src, dst)] + hanoi(n - 1, via, dst, src)
""", """
    assert hanoi(2) == [("A", "B"), ("A", "C"), ("B", "C")]
    assert len(hanoi(10)) == 1023
    assert hanoi(3)[3] == ("A", "C")
""", ("hanoi(n - 1, via, dst, src)", "hanoi(n - 1, via, src, dst)"), "moves the tower back to the source")

# ============================================================================ many small calls

A("many_calls_is_even", "many_calls", """
    def is_even(n):
        return n % 2 == 0
""", """
    assert all(is_even(i) == (i % 2 == 0) for i in range(20000))
""", ("return n % 2 == 0", 'return str(n)[-1] in "2468"'), "forgets the digit 0")

A("many_calls_generator_100k", "many_calls", """
    def squares(n):
        for i in range(n):
            yield i * i
""", """
    assert sum(squares(100000)) == 333328333350000
    assert sum(1 for _ in squares(100000)) == 100000
""", ("range(n)", "range(1, n)"), "skips 0: one item short")

A("many_calls_method_10k", "many_calls", """
    class Accumulator:
        def __init__(self):
            self.total = 0
            self.count = 0

        def add(self, x):
            self.total += x
            self.count += 1
""", """
    acc = Accumulator()
    for i in range(10000):
        acc.add(i)
    assert acc.total == 49995000
    assert acc.count == 10000
""", ("self.total += x", "self.total = x"), "overwrites the total")

A("many_calls_fizzbuzz", "many_calls", """
    def fizzbuzz(i):
        if i % 15 == 0:
            return "FizzBuzz"
        if i % 3 == 0:
            return "Fizz"
        if i % 5 == 0:
            return "Buzz"
        return str(i)
""", """
    assert [fizzbuzz(i) for i in range(1, 16)][-1] == "FizzBuzz"
    assert sum(fizzbuzz(i) == "Fizz" for i in range(1, 15001)) == 4000
""", ("        if i % 15 == 0:\n            return \"FizzBuzz\"\n        if i % 3 == 0:\n            return \"Fizz\"\n",
      "        if i % 3 == 0:\n            return \"Fizz\"\n"
      "        if i % 15 == 0:\n            return \"FizzBuzz\"\n"),
  "checks 3 before 15")

# ============================================================================ tests that use modules

A("mod_tests_import_math", "test_modules", """
    from math import pi

    def circle_area(r):
        return pi * r ** 2
""", """
    import math
    assert math.isclose(circle_area(2), 12.566370614359172)
    assert math.isclose(circle_area(0.5), math.pi / 4)
""", ("pi * r ** 2", "2 * pi * r"), "the circumference")

A("mod_math_without_import", "test_modules", """
    import math

    def hypotenuse(a, b):
        return math.sqrt(a * a + b * b)
""", """
    assert math.isclose(hypotenuse(3, 4), 5.0)
    assert math.isclose(hypotenuse(1, 1), math.sqrt(2))
""", ("a * a + b * b", "a * a + b"), "b not squared")

A("mod_counter_without_import", "test_modules", """
    from collections import Counter

    def count_letters(s):
        return Counter(c for c in s.lower() if c.isalpha())
""", """
    assert count_letters("Abca!") == Counter({"a": 2, "b": 1, "c": 1})
    assert count_letters("") == Counter()
""", ("s.lower()", "s"), "case-sensitive")

A("mod_re_without_import", "test_modules", """
    import re

    def extract_numbers(s):
        return [int(x) for x in re.findall(r"-?\\d+", s)]
""", """
    assert extract_numbers("a1b-22c333") == [1, -22, 333]
    assert extract_numbers(re.sub(r"[a-z]", " ", "x7y")) == [7]
""", ('r"-?\\d+"', 'r"\\d+"'), "drops the minus sign")

A("mod_itertools_without_import", "test_modules", """
    import itertools

    def all_orders(s):
        return ["".join(p) for p in itertools.permutations(s)]
""", """
    assert all_orders("abc") == ["".join(p) for p in itertools.permutations("abc")]
    assert len(all_orders("abcd")) == 24
""", ("itertools.permutations(s)", "itertools.combinations(s, len(s))"), "combinations: one ordering")

A("mod_sys_maxsize_without_import", "test_modules", """
    import sys

    def find_min(xs):
        best = sys.maxsize
        for x in xs:
            if x < best:
                best = x
        return best
""", """
    assert find_min([3, 1, 2]) == 1
    assert find_min([]) == sys.maxsize
""", ("best = sys.maxsize", "best = 0"), "starts from 0")

A("mod_tests_import_statistics", "test_modules", """
    def sample_stdev(xs):
        n = len(xs)
        m = sum(xs) / n
        return (sum((x - m) ** 2 for x in xs) / (n - 1)) ** 0.5
""", """
    import math
    import statistics
    for xs in ([1, 2, 3, 4], [2.5, 3.5, 10]):
        assert math.isclose(sample_stdev(xs), statistics.stdev(xs))
""", ("/ (n - 1)", "/ n"), "population standard deviation")

# ============================================================================ limits: tests change the program's world

A("limit_random_seed_in_tests", "test_modules", """
    import random

    def shuffled(xs):
        out = list(xs)
        random.shuffle(out)
        return out
""", """
    import random
    random.seed(0)
    assert shuffled(list(range(20))) == [10, 18, 16, 14, 0, 17, 11, 2, 3, 9, 5, 7, 4, 19, 6, 15, 8, 1, 13, 12]
    assert sorted(shuffled("abc")) == ["a", "b", "c"]
""", ("        random.shuffle(out)\n", ""), "does not shuffle",
  limit="the tests seed the random module of their own process; the program's is another one")

A("limit_patch_builtins_input", "test_modules", """
    def ask_age():
        age = int(input("Age? "))
        return "adult" if age >= 18 else "minor"
""", """
    import builtins
    builtins.input = lambda prompt="": "18"
    assert ask_age() == "adult"
    builtins.input = lambda prompt="": "17"
    assert ask_age() == "minor"
""", ("age >= 18", "age > 18"), "18 counts as a minor",
  limit="the tests replace builtins.input in their own process; the program's input() reads its own stdin")

A("limit_mock_patch_time", "test_modules", """
    import time

    def stamp(msg):
        return f"[{int(time.time())}] {msg}"
""", """
    from unittest import mock
    with mock.patch("time.time", return_value=1700000000.7):
        assert stamp("hi") == "[1700000000] hi"
""", ("int(time.time())", "round(time.time())"), "rounds the timestamp",
  limit="unittest.mock.patch replaces time.time in the tests' process, not in the program's")

A("limit_setrecursionlimit_in_tests", "recursion", """
    def depth(n):
        return 0 if n == 0 else 1 + depth(n - 1)
""", """
    import sys
    sys.setrecursionlimit(10000)
    assert depth(5000) == 5000
""", ("0 if n == 0", "1 if n == 0"), "wrong base case",
  limit="sys.setrecursionlimit in the tests raises the limit of their own interpreter, not the program's")

A("limit_tests_rebind_program_global", "globals", """
    TAX_RATE = 0.2

    def price_with_tax(p):
        return round(p * (1 + TAX_RATE), 2)
""", """
    assert price_with_tax(100) == 120.0
    TAX_RATE = 0.5
    assert price_with_tax(100) == 150.0
""", ("def price_with_tax(p):\n        return round(p * (1 + TAX_RATE), 2)",
      "def price_with_tax(p, rate=TAX_RATE):\n        return round(p * (1 + rate), 2)"),
  "captures the rate at definition: later changes are ignored",
  limit="the tests rebind a global of the program; with the tests in another namespace the program never sees it")

A("limit_redirect_stdout_capture", "printing", """
    def print_table(rows):
        for name, qty in rows:
            print(f"{name:<6}{qty:>3}")
""", """
    import contextlib
    import io
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        print_table([("apple", 3), ("fig", 12)])
    assert buf.getvalue() == "apple   3\\nfig    12\\n"
""", ("{qty:>3}", "{qty:>2}"), "column too narrow",
  limit="contextlib.redirect_stdout swaps sys.stdout of the tests' process; the program prints to its own")

A("limit_tests_replace_sys_stdin", "test_modules", """
    import sys

    def read_numbers():
        return [int(x) for x in sys.stdin.read().split()]
""", """
    import io
    import sys
    sys.stdin = io.StringIO("1 2\\n3\\n")
    assert read_numbers() == [1, 2, 3]
""", ("sys.stdin.read().split()", "sys.stdin.readline().split()"), "reads only the first line",
  limit="the tests replace sys.stdin of their own process; the program reads its own stdin")
