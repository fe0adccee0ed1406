"""The held-out fidelity corpus: 151 more honest programs and their planted-bug twins, written apart
from tests/fidelity_corpus.py (by someone who had not seen the verifier's fixes) the way MBPP,
HumanEval, APPS, LiveCodeBench and BigCodeBench write them, to find what the first corpus missed.

Same entry format as tests/fidelity_corpus.py, plus `feature` (what two processes must get right).
The pairs on which the verifier still differs from one process carry, at the end of this file
(DIFFERENCES), one of:
  limit  the honest program fails in the verifier, for the reason given;
  gap    the twin (a wrong program) PASSES in the verifier: one process's tests can see something the
         verifier's two processes cannot, for the reason given. docs/verifier.md lists these.
tests/test_fidelity.py checks both stay true, so a fixed difference shows up as a failing test.
"""
from fidelity_corpus import _src, _twin  # the same (old, new) edits

FAMILIES = ("mbpp", "humaneval", "apps_io", "livecodebench", "bigcodebench")
CORPUS: list = []


def A(name, family, feature, program, tests, edit, bug, entry_point=None):
    assert family in FAMILIES, family
    e = {"name": name, "family": family, "feature": feature, "kind": "assert", "program": _src(program),
         "twin": _twin(program, edit), "bug": bug, "tests": _src(tests)}
    if entry_point:
        e["entry_point"] = entry_point
    CORPUS.append(e)


def IO(name, family, feature, program, cases, edit, bug):
    assert family in FAMILIES, family
    CORPUS.append({"name": name, "family": family, "feature": feature, "kind": "io", "program": _src(program),
                   "twin": _twin(program, edit), "bug": bug, "cases": [list(c) for c in cases]})


# =============================================================================================== MBPP style

A("mbpp_lru_cache_identity", "mbpp", "the same cached list returned twice", r"""
    from functools import lru_cache

    @lru_cache(maxsize=None)
    def primes_upto(n):
        sieve = [True] * (n + 1)
        out = []
        for i in range(2, n + 1):
            if sieve[i]:
                out.append(i)
                for j in range(i * i, n + 1, i):
                    sieve[j] = False
        return out
""", r"""
    assert primes_upto(30) == [2, 3, 5, 7, 11, 13, 17, 19, 23, 29]
    assert primes_upto(30) is primes_upto(30)
    assert len(primes_upto(100)) == 25
""", ("    @lru_cache(maxsize=None)\n", ""), "no cache: every call builds a new list")

A("mbpp_dict_subclass_missing", "mbpp", "dict subclass with __missing__ returned", r"""
    class ZeroDict(dict):
        def __missing__(self, key):
            return 0

    def char_count(s):
        d = ZeroDict()
        for c in s:
            d[c] += 1
        return d
""", r"""
    r = char_count("hello")
    assert r["l"] == 2
    assert r["z"] == 0
    assert isinstance(r, dict)
""", ("            return 0\n", "            return 1\n"), "missing keys start at 1")

A("mbpp_counter_subclass", "mbpp", "Counter subclass returned (hybrid dict)", r"""
    from collections import Counter

    class Bag(Counter):
        def distinct(self):
            return len(self)

    def make_bag(s):
        return Bag(s.lower())
""", r"""
    b = make_bag("aAbc")
    assert b["a"] == 2
    assert b["z"] == 0
    assert b.distinct() == 3
    assert b.most_common(1) == [("a", 2)]
""", ("Bag(s.lower())", "Bag(s)"), "case-sensitive")

A("mbpp_list_subclass_stack", "mbpp", "list subclass mutated by its own methods", r"""
    class Stack(list):
        def push(self, x):
            self.append(x)

        def peek(self):
            return self[-1]

    def new_stack():
        return Stack()
""", r"""
    s = new_stack()
    s.push(1)
    s.push(2)
    assert len(s) == 2
    assert s.peek() == 2
    assert s == [1, 2]
""", ("            self.append(x)\n", "            self.insert(0, x)\n"), "pushes at the bottom")

A("mbpp_intflag_contains", "mbpp", "IntFlag combination: `in` and .name", r"""
    from enum import IntFlag

    class Perm(IntFlag):
        R = 4
        W = 2
        X = 1

    def parse_perm(s):
        p = Perm(0)
        for ch in s:
            p |= Perm[ch.upper()]
        return p
""", r"""
    p = parse_perm("rw")
    assert p == 6
    assert Perm.R in p
    assert Perm.X not in p
""", ("p |= Perm[ch.upper()]", "p = Perm[ch.upper()]"), "keeps only the last flag")

A("mbpp_intenum_arithmetic", "mbpp", "IntEnum arithmetic and sorting", r"""
    from enum import IntEnum

    class Level(IntEnum):
        LOW = 1
        MID = 5
        HIGH = 10

    def levels_sorted(names):
        return sorted(Level[n] for n in names)
""", r"""
    r = levels_sorted(["HIGH", "LOW", "MID"])
    assert r == [1, 5, 10]
    assert [x.name for x in r] == ["LOW", "MID", "HIGH"]
    assert r[0] + r[2] == 11
    assert sum(r) == 16
    assert max(r) is Level.HIGH
""", ("sorted(Level[n] for n in names)", "[Level[n] for n in names]"), "not sorted")

A("mbpp_tuple_arg_mutation", "mbpp", "in-place change of lists inside a tuple argument", r"""
    def sort_pair(pair):
        pair[0].sort()
        pair[1].sort(reverse=True)
""", r"""
    a = [3, 1, 2]
    b = [1, 3, 2]
    sort_pair((a, b))
    assert a == [1, 2, 3]
    assert b == [3, 2, 1]
""", ("pair[1].sort(reverse=True)", "pair[1].sort()"), "second list ascending")

A("mbpp_array_arg_mutation", "mbpp", "in-place change of an array.array argument", r"""
    def reverse_in_place(arr):
        i, j = 0, len(arr) - 1
        while i < j:
            arr[i], arr[j] = arr[j], arr[i]
            i += 1
            j -= 1
""", r"""
    from array import array
    a = array("i", [1, 2, 3, 4, 5, 6])
    reverse_in_place(a)
    assert a.tolist() == [6, 5, 4, 3, 2, 1]
""", ("while i < j:", "while i < j - 1:"), "stops one swap early")

A("mbpp_mutation_then_raise", "mbpp", "argument mutated, then the program raises", r"""
    def pop_until_negative(stack):
        total = 0
        while stack:
            x = stack.pop()
            if x < 0:
                raise ValueError(f"negative: {x}")
            total += x
        return total
""", r"""
    s = [5, -2, 3, 4]
    try:
        pop_until_negative(s)
    except ValueError as e:
        assert str(e) == "negative: -2"
    else:
        raise AssertionError("no ValueError")
    assert s == [5]
    assert pop_until_negative([1, 2]) == 3
""", """
    def pop_until_negative(stack):
        total = 0
        while stack:
            x = stack[-1]
            if x < 0:
                raise ValueError(f"negative: {x}")
            stack.pop()
            total += x
        return total
""", "checks before popping: the negative stays on the stack")

A("mbpp_tests_mutate_global_dict", "mbpp", "tests add to a program's module-level dict", r"""
    UNITS = {"km": 1000, "m": 1}

    def to_meters(value, unit):
        return value * UNITS[unit]
""", r"""
    UNITS["cm"] = 0.01
    assert to_meters(2, "km") == 2000
    assert to_meters(250, "cm") == 2.5
""", ('"km": 1000', '"km": 100'), "wrong factor for km")

A("mbpp_tests_mutate_attribute_list", "mbpp", "tests change a program object's list attribute in place", r"""
    class Queue:
        def __init__(self):
            self.items = []

        def enqueue(self, x):
            self.items.append(x)

        def dequeue(self):
            return self.items.pop(0)
""", r"""
    q = Queue()
    q.items.extend([1, 2, 3])
    assert q.dequeue() == 1
    q.enqueue(4)
    assert q.items == [2, 3, 4]
""", ("return self.items.pop(0)", "return self.items.pop()"), "dequeues from the back")

A("mbpp_cyclic_dicts", "mbpp", "a self-referential structure of plain dicts", r"""
    def make_ring(values):
        nodes = [{"val": v} for v in values]
        for a, b in zip(nodes, nodes[1:] + nodes[:1]):
            a["next"] = b
        return nodes[0]
""", r"""
    head = make_ring([1, 2, 3])
    assert head["val"] == 1
    assert head["next"]["val"] == 2
    assert head["next"]["next"]["next"] is head
""", ("zip(nodes, nodes[1:] + nodes[:1])", "zip(nodes, nodes[1:])"), "the last node has no next")

A("mbpp_decimal_isinstance_program_import", "mbpp", "tests use a class only the program imported (decimal)", r"""
    from decimal import Decimal

    def to_money(s):
        return Decimal(s).quantize(Decimal("0.01"))
""", r"""
    r = to_money("2.345")
    assert isinstance(r, Decimal)
    assert str(r) == "2.34"
""", ('return Decimal(s).quantize(Decimal("0.01"))', 'return round(float(s), 2)'), "returns a float")

A("mbpp_recursion_near_limit", "mbpp", "plain recursion near the default limit", r"""
    def count_down(n):
        if n == 0:
            return 0
        return 1 + count_down(n - 1)
""", r"""
    assert count_down(10) == 10
    assert count_down(985) == 985
""", ("            return 0\n", "            return 1\n"), "wrong base case")

A("mbpp_generator_return_value", "mbpp", "StopIteration.value of a program generator", r"""
    def running_total(xs):
        total = 0
        for x in xs:
            total += x
            yield total
        return total
""", r"""
    g = running_total([1, 2, 3])
    assert [next(g) for _ in range(3)] == [1, 3, 6]
    try:
        next(g)
    except StopIteration as e:
        assert e.value == 6
    else:
        raise AssertionError("not exhausted")
""", ("        return total\n", "        return None\n"), "returns None at the end")

A("mbpp_yield_from_result", "mbpp", "tests delegate to a program generator with yield from", r"""
    def read_block(lines):
        count = 0
        for line in lines:
            if not line:
                break
            count += 1
            yield line.upper()
        return count
""", r"""
    def collect(lines, out):
        n = yield from read_block(lines)
        out.append(n)

    out = []
    got = list(collect(["a", "b", "", "c"], out))
    assert got == ["A", "B"]
    assert out == [2]
""", ("            count += 1\n", ""), "never counts")

A("mbpp_main_guard_tests", "mbpp", "tests guarded by if __name__ == '__main__'", r"""
    def second_largest(xs):
        s = sorted(set(xs))
        return s[-2] if len(s) > 1 else None
""", r"""
    if __name__ == "__main__":
        assert second_largest([1, 5, 3, 5]) == 3
        assert second_largest([2, 2]) is None
        assert second_largest([-1, -7]) == -7
""", ("sorted(set(xs))", "sorted(xs)"), "duplicates not removed")

A("mbpp_big_module_table", "mbpp", "a module-level table too big for the hello (handle)", r"""
    SQUARES = [i * i for i in range(200001)]
    SQUARE_SET = set(SQUARES)

    def is_square(n):
        return n in SQUARE_SET
""", r"""
    assert is_square(144) and not is_square(145)
    assert len(SQUARES) == 200001
    assert SQUARES[12] == 144
    assert SQUARES[:4] == [0, 1, 4, 9]
    assert 10 ** 10 in SQUARE_SET
    assert isinstance(SQUARES, list)
""", ("range(200001)", "range(1, 200001)"), "omits 0: off by one")

A("mbpp_counter_arithmetic", "mbpp", "Counter arithmetic on results", r"""
    from collections import Counter

    def letter_counts(s):
        return Counter(c for c in s if c.isalpha())
""", r"""
    a = letter_counts("hello, world!")
    b = letter_counts("lol")
    assert a - b == Counter({"h": 1, "e": 1, "w": 1, "r": 1, "d": 1, "l": 1, "o": 1})
    assert (a & b)["l"] == 2
    assert (a + b)["o"] == 3
    assert a.total() == 10
""", ("if c.isalpha()", "if c != ' '"), "keeps every non-space char")

# =============================================================================================== HumanEval style

A("he_generator_send_after_many_next", "humaneval", "program generator: send() after >8 next()", r"""
    def counter(start=0):
        i = start
        while True:
            cmd = yield i
            i = start if cmd == "reset" else i + 1
""", r"""
    def check(candidate):
        c = candidate()
        assert [next(c) for _ in range(12)] == list(range(12))
        assert c.send("reset") == 0
        assert next(c) == 1
        assert next(c) == 2
""", ('i = start if cmd == "reset" else i + 1', 'i = start + 1 if cmd == "reset" else i + 1'),
  "reset goes to start + 1", entry_point="counter")

A("he_inplace_permutations", "humaneval", "program generator yields the same list object each time", r"""
    def permutations_inplace(xs):
        a = list(xs)
        n = len(a)
        c = [0] * n
        yield a
        i = 0
        while i < n:
            if c[i] < i:
                if i % 2 == 0:
                    a[0], a[i] = a[i], a[0]
                else:
                    a[c[i]], a[i] = a[i], a[c[i]]
                yield a
                c[i] += 1
                i = 0
            else:
                c[i] = 0
                i += 1
""", r"""
    import itertools

    def check(candidate):
        got = [tuple(p) for p in candidate([1, 2, 3])]
        assert sorted(got) == sorted(itertools.permutations([1, 2, 3]))
        got = [tuple(p) for p in candidate([1, 2, 3, 4])]
        assert len(set(got)) == 24
""", ("                    a[c[i]], a[i] = a[i], a[c[i]]\n", "                    a[0], a[i] = a[i], a[0]\n"),
  "always swaps with index 0: repeats permutations", entry_point="permutations_inplace")

A("he_groupby_returned", "humaneval", "program returns an itertools.groupby object", r"""
    import itertools

    def group_runs(s):
        return itertools.groupby(s)
""", r"""
    def check(candidate):
        runs = [(k, len(list(g))) for k, g in candidate("aabbbccaddeeffgghhiijj")]
        assert runs == [("a", 2), ("b", 3), ("c", 2), ("a", 1), ("d", 2), ("e", 2), ("f", 2), ("g", 2),
                        ("h", 2), ("i", 2), ("j", 2)]
""", ("itertools.groupby(s)", "itertools.groupby(sorted(s))"), "sorts first: merges runs", entry_point="group_runs")

A("he_memoize_decorator_on_tests_fn", "humaneval", "program decorator wraps a recursive tests' function", r"""
    import functools

    def memoize(func):
        cache = {}

        @functools.wraps(func)
        def wrapper(*args):
            if args not in cache:
                cache[args] = func(*args)
            return cache[args]
        return wrapper
""", r"""
    def check(candidate):
        @candidate
        def fib(n):
            return n if n < 2 else fib(n - 1) + fib(n - 2)
        assert fib.__name__ == "fib"
        assert fib(30) == 832040
        assert fib(200) == 280571172992510140037611932413038677189525
""", ("        @functools.wraps(func)\n", ""), "forgets functools.wraps", entry_point="memoize")

A("he_bytes_dunder", "humaneval", "bytes(obj) on a program object with __bytes__", r"""
    class Packet:
        def __init__(self, kind, payload):
            self.kind, self.payload = kind, payload

        def __bytes__(self):
            return bytes([self.kind, len(self.payload)]) + self.payload

    def make_packet(kind, payload):
        return Packet(kind, payload)
""", r"""
    def check(candidate):
        assert bytes(candidate(1, b"hi")) == b"\x01\x02hi"
        assert bytes(candidate(7, b"")) == b"\x07\x00"
""", ("bytes([self.kind, len(self.payload)])", "bytes([self.kind, len(self.payload) + 1])"),
  "length byte off by one", entry_point="make_packet")

A("he_iterator_state_after_break", "humaneval", "a program iterator's state after the tests break out", r"""
    class Countdown:
        def __init__(self, n):
            self.current = n

        def __iter__(self):
            return self

        def __next__(self):
            if self.current <= 0:
                raise StopIteration
            self.current -= 1
            return self.current + 1

        def remaining(self):
            return self.current
""", r"""
    def check(candidate):
        it = candidate(30)
        for x in it:
            if x == 18:
                break
        assert it.remaining() == 17
        assert next(it) == 17
""", ("            return self.current\n", "            return self.current - 1\n"), "remaining off by one",
  entry_point="Countdown")

A("he_exception_class_attribute", "humaneval", "class attribute of a program exception", r"""
    class HTTPError(Exception):
        status = 500

    class NotFound(HTTPError):
        status = 404

    def fetch(path, pages={"/": "home"}):
        if path not in pages:
            raise NotFound(path)
        return pages[path]
""", r"""
    def check(candidate):
        assert candidate("/") == "home"
        try:
            candidate("/missing")
        except HTTPError as e:
            assert e.status == 404
            assert e.args == ("/missing",)
        else:
            raise AssertionError("no error")
""", ("            raise NotFound(path)\n", "            raise HTTPError(path)\n"), "raises the base class",
  entry_point="fetch")

A("he_exception_method", "humaneval", "a method of a program exception", r"""
    class ValidationError(ValueError):
        def __init__(self, field, problem):
            super().__init__(f"{field}: {problem}")
            self.field, self.problem = field, problem

        def to_dict(self):
            return {"field": self.field, "problem": self.problem}

    def validate_age(age):
        if not isinstance(age, int):
            raise ValidationError("age", "not an int")
        if age < 0:
            raise ValidationError("age", "negative")
        return age
""", r"""
    def check(candidate):
        assert candidate(3) == 3
        try:
            candidate(-1)
        except ValueError as e:
            assert str(e) == "age: negative"
            assert e.to_dict() == {"field": "age", "problem": "negative"}
        else:
            raise AssertionError("no error")
""", ('raise ValidationError("age", "negative")', 'raise ValidationError("negative", "age")'),
  "arguments swapped", entry_point="validate_age")

A("he_tests_construct_program_exception", "humaneval", "tests construct a program exception themselves", r"""
    class InsufficientFunds(Exception):
        def __init__(self, need, have):
            super().__init__(f"need {need}, have {have}")
            self.need, self.have = need, have

        @property
        def shortfall(self):
            return self.need - self.have

    def withdraw(balance, amount):
        if amount > balance:
            raise InsufficientFunds(amount, balance)
        return balance - amount
""", r"""
    def check(candidate):
        assert candidate(100, 30) == 70
        e = InsufficientFunds(100, 30)
        assert str(e) == "need 100, have 30"
        assert e.shortfall == 70
        try:
            candidate(10, 25)
        except InsufficientFunds as err:
            assert err.shortfall == 15
        else:
            raise AssertionError("no error")
""", ("return self.need - self.have", "return self.have - self.need"), "sign of the shortfall",
  entry_point="withdraw")

A("he_lambda_entry_point", "humaneval", "entry point bound to a lambda and a partial", r"""
    import functools

    def _scale(factor, xs):
        return [x * factor for x in xs]

    double_all = functools.partial(_scale, 2)
""", r"""
    def check(candidate):
        assert candidate([1, 2, 3]) == [2, 4, 6]
        assert candidate([]) == []
        assert list(map(candidate, [[1], [5]])) == [[2], [10]]
""", ("functools.partial(_scale, 2)", "functools.partial(_scale, 3)"), "triples", entry_point="double_all")

A("he_returns_closure_called_many", "humaneval", "closure with nonlocal state, many calls and reduce", r"""
    def make_accumulator(start):
        total = start

        def add(x):
            nonlocal total
            total += x
            return total
        return add
""", r"""
    import functools

    def check(candidate):
        acc = candidate(10)
        assert [acc(i) for i in range(5)] == [10, 11, 13, 16, 20]
        acc2 = candidate(0)
        assert functools.reduce(lambda _, x: acc2(x), range(1, 101), None) == 5050
        assert list(filter(lambda v: v % 2 == 0, map(candidate(1), [1, 1, 1, 1]))) == [2, 4]
""", ("            total += x\n", "            total = total + x if x else total + 1\n"), "adds 1 for x == 0",
  entry_point="make_accumulator")

A("he_sorted_key_program_objects", "humaneval", "sorted(result, key=...), heapq, bisect with program objects", r"""
    from dataclasses import dataclass, field

    @dataclass(order=True)
    class Task:
        priority: int
        name: str = field(compare=False)

    def make_tasks(spec):
        return [Task(p, n) for n, p in spec.items()]
""", r"""
    import bisect
    import heapq

    def check(candidate):
        tasks = candidate({"write": 2, "read": 1, "exec": 3})
        assert [t.name for t in sorted(tasks, key=lambda t: -t.priority)] == ["exec", "write", "read"]
        h = []
        for t in tasks:
            heapq.heappush(h, (t.priority, t))
        assert heapq.heappop(h)[1].name == "read"
        ordered = sorted(tasks)
        assert bisect.bisect_left(ordered, 2, key=lambda t: t.priority) == 1
        assert min(tasks).name == "read"
""", ("return [Task(p, n) for n, p in spec.items()]", "return [Task(-p, n) for n, p in spec.items()]"),
  "negated priorities", entry_point="make_tasks")

# =============================================================================================== APPS / Codeforces stdin-stdout

IO("io_thread_no_join", "apps_io", "threading.Thread(target=main).start() without join", r"""
    import sys
    import threading

    def main():
        n = int(sys.stdin.readline())
        adj = [[] for _ in range(n + 1)]
        for _ in range(n - 1):
            u, v = map(int, sys.stdin.readline().split())
            adj[u].append(v)
            adj[v].append(u)

        def depth(u, p):
            best = 0
            for w in adj[u]:
                if w != p:
                    best = max(best, 1 + depth(w, u))
            return best

        print(depth(1, 0))

    sys.setrecursionlimit(1 << 20)
    threading.stack_size(1 << 26)
    threading.Thread(target=main).start()
""", [("5\n1 2\n2 3\n3 4\n1 5\n", "3\n"),
      ("20000\n" + "".join(f"{i} {i + 1}\n" for i in range(1, 20000)), "19999\n")],
   ("best = max(best, 1 + depth(w, u))", "best = max(best, depth(w, u))"), "never adds the edge")

IO("io_thread_with_join", "apps_io", "threading with stack_size and join", r"""
    import sys
    import threading

    def main():
        data = sys.stdin.read().split()
        n = int(data[0])
        print(sum(int(x) for x in data[1:n + 1]))

    threading.stack_size(1 << 27)
    t = threading.Thread(target=main)
    t.start()
    t.join()
""", [("3\n1 2 3\n", "6\n"), ("2\n-5 5\n", "0\n")],
   ("data[1:n + 1]", "data[1:n]"), "drops the last number")

IO("io_atexit_flush_template", "apps_io", "fast-output template flushed by an atexit hook", r"""
    import atexit
    import io
    import sys

    _buf = io.StringIO()
    _real_stdout = sys.stdout
    sys.stdout = _buf

    @atexit.register
    def _flush():
        _real_stdout.write(_buf.getvalue())
        _real_stdout.flush()

    t = int(input())
    for _ in range(t):
        a, b = map(int, input().split())
        print(a * b)
""", [("2\n2 3\n4 5\n", "6\n20\n"), ("1\n-1 7\n", "-7\n")],
   ("print(a * b)", "print(a + b)"), "adds instead of multiplying")

IO("io_dunder_stdout_no_flush", "apps_io", "writes to sys.__stdout__ without flushing", r"""
    import io
    import sys

    out = io.StringIO()
    sys.stdout = out
    n = int(input())
    for i in range(1, n + 1):
        print(i * i)
    sys.__stdout__.write(out.getvalue())
""", [("3\n", "1\n4\n9\n"), ("1\n", "1\n")],
   ("for i in range(1, n + 1):", "for i in range(1, n):"), "one square short")

IO("io_os_write_fd1", "apps_io", "os.write(1, ...) for output", r"""
    import os
    import sys

    nums = list(map(int, sys.stdin.buffer.read().split()))
    os.write(1, (" ".join(map(str, sorted(nums[1:]))) + "\n").encode())
""", [("4\n3 1 4 1\n", "1 1 3 4\n"), ("1\n9\n", "9\n")],
   ("sorted(nums[1:])", "sorted(nums)"), "sorts n in as well")

IO("io_open0", "apps_io", "reading with open(0)", r"""
    lines = open(0).read().split("\n")
    n = int(lines[0])
    words = lines[1].split()
    print(max(words[:n], key=len))
""", [("3\nab abc a\n", "abc\n"), ("2\nxyz uv\n", "xyz\n")],
   ("max(words[:n], key=len)", "min(words[:n], key=len)"), "shortest word")

IO("io_os_read0", "apps_io", "reading with os.read(0, ...)", r"""
    import os

    data = os.read(0, 1 << 20).split()
    n = int(data[0])
    xs = list(map(int, data[1:1 + n]))
    print(max(xs) - min(xs))
""", [("4\n3 9 1 4\n", "8\n"), ("1\n5\n", "0\n")],
   ("max(xs) - min(xs)", "max(xs) - xs[0]"), "subtracts the first, not the minimum")

IO("io_sys_argv_local_switch", "apps_io", "a local-testing switch on len(sys.argv)", r"""
    import sys

    if len(sys.argv) > 1:
        sys.stdin = open(sys.argv[1])

    n = int(input())
    print("Even" if n % 2 == 0 else "Odd")
""", [("4\n", "Even\n"), ("7\n", "Odd\n")],
   ('"Even" if n % 2 == 0 else "Odd"', '"Even" if n % 2 else "Odd"'), "inverted test")

IO("io_argparse_defaults", "apps_io", "argparse parse_args() with no command-line arguments", r"""
    import argparse
    import sys

    parser = argparse.ArgumentParser()
    parser.add_argument("--debug", action="store_true")
    args = parser.parse_args()

    a, b = map(int, sys.stdin.read().split())
    if args.debug:
        print("debug", file=sys.stderr)
    print(a // b, a % b)
""", [("17 5\n", "3 2\n"), ("-7 2\n", "-4 1\n")],
   ("print(a // b, a % b)", "print(int(a / b), a % b)"), "truncates toward zero")

IO("io_unicode_output", "apps_io", "non-ASCII output", r"""
    n = int(input())
    print("✓" * n if n > 0 else "café")
""", [("3\n", "✓✓✓\n"), ("0\n", "café\n"), ("1\n", "✓\n")],
   ('"✓" * n if n > 0 else "café"', '"✓" * n if n > 1 else "café"'), "n == 1 prints café")

IO("io_unicode_input", "apps_io", "non-ASCII input", r"""
    s = input().strip()
    print(len(s), s.upper())
""", [("naïve\n", "5 NAÏVE\n"), ("straße\n", "6 STRASSE\n")],
   ("print(len(s), s.upper())", "print(len(s.encode()), s.upper())"), "counts bytes")

IO("io_input_prompt", "apps_io", "input() with a prompt (prompt goes to stdout)", r"""
    n = int(input("Enter n: "))
    print(n * (n + 1) // 2)
""", [("4\n", "Enter n: 10\n"), ("1\n", "Enter n: 1\n")],
   ("n * (n + 1) // 2", "n * (n - 1) // 2"), "off by one")

IO("io_exit_builtin", "apps_io", "exit() in a branch after printing", r"""
    n = int(input())
    if n == 0:
        print("zero")
        exit()
    print(100 // n)
""", [("0\n", "zero\n"), ("7\n", "14\n")],
   ("print(100 // n)", "print(100 / n)"), "float division")

IO("io_quit_builtin", "apps_io", "quit() in a loop", r"""
    import sys

    for line in sys.stdin:
        x = int(line)
        if x == 42:
            quit()
        print(x)
""", [("1\n2\n42\n5\n", "1\n2\n"), ("7\n", "7\n")],
   ("if x == 42:", "if x == 24:"), "wrong stop value")

IO("io_sys_exit_main", "apps_io", "sys.exit(main()) where main returns None", r"""
    import sys

    def main():
        s = sys.stdin.readline().strip()
        print(s.count("a"))

    if __name__ == "__main__":
        sys.exit(main())
""", [("banana\n", "3\n"), ("xyz\n", "0\n")],
   ('s.count("a")', 's.count("n")'), "counts n")

IO("io_os_exit_after_flush", "apps_io", "sys.stdout.flush(); os._exit(0)", r"""
    import os
    import sys

    n = int(sys.stdin.readline())
    sys.stdout.write(" ".join(str(i) for i in range(n, 0, -1)) + "\n")
    sys.stdout.flush()
    os._exit(0)
""", [("3\n", "3 2 1\n"), ("1\n", "1\n")],
   ("range(n, 0, -1)", "range(n, 1, -1)"), "stops at 2")

IO("io_stderr_debug_flood", "apps_io", "lots of debug output on stderr", r"""
    import sys

    n = int(input())
    total = 0
    for i in range(n):
        total += i
        print("debug", i, total, "x" * 40, file=sys.stderr)
    print(total)
""", [("60000\n", "1799970000\n"), ("3\n", "3\n")],
   ("for i in range(n):", "for i in range(n - 1):"), "one term short")

IO("io_resource_stack_unlimited", "apps_io", "resource.setrlimit(RLIMIT_STACK, unlimited) template", r"""
    import resource
    import sys

    resource.setrlimit(resource.RLIMIT_STACK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    sys.setrecursionlimit(10 ** 6)

    def f(n):
        return 0 if n == 0 else n + f(n - 1)

    print(f(int(input())))
""", [("10\n", "55\n"), ("5000\n", "12502500\n")],
   ("0 if n == 0", "1 if n == 0"), "wrong base case")

IO("io_deep_recursion_no_threads", "apps_io", "deep recursion with setrecursionlimit only", r"""
    import sys

    sys.setrecursionlimit(300000)

    def depth(i, nxt):
        return 0 if nxt[i] == -1 else 1 + depth(nxt[i], nxt)

    n = int(input())
    nxt = list(range(1, n)) + [-1]
    print(depth(0, nxt))
""", [("100000\n", "99999\n"), ("1\n", "0\n")],
   ("return 0 if nxt[i] == -1", "return 1 if nxt[i] == -1"), "wrong base case")

IO("io_blank_lines_input", "apps_io", "blank lines between test cases", r"""
    import sys

    data = sys.stdin.read().split()
    t = int(data[0])
    pos = 1
    for _ in range(t):
        n = int(data[pos])
        xs = list(map(int, data[pos + 1:pos + 1 + n]))
        pos += 1 + n
        print(sum(x for x in xs if x > 0))
""", [("2\n\n3\n1 -2 3\n\n2\n-1 -1\n", "4\n0\n"), ("1\n\n1\n5\n\n", "5\n")],
   ("if x > 0", "if x >= -1"), "counts -1 as positive")

IO("io_crlf_input", "apps_io", "CRLF line endings in the input", r"""
    t = int(input())
    for _ in range(t):
        s = input().strip()
        print(s[::-1])
""", [("2\r\nabc\r\nxy\r\n", "cba\nyx\n"), ("1\r\nq\r\n", "q\n")],
   ("s = input().strip()", "s = input().strip()[1:]"), "drops the first char")

IO("io_large_output", "apps_io", "200,000 numbers on one line", r"""
    n = int(input())
    print(*range(n, 0, -1))
""", [("200000\n", " ".join(str(i) for i in range(200000, 0, -1)) + "\n"), ("2\n", "2 1\n")],
   ("range(n, 0, -1)", "range(n - 1, 0, -1)"), "starts at n - 1")

IO("io_sys_stdout_write_template", "apps_io", "input = sys.stdin.readline; sys.stdout.write joins", r"""
    import sys

    input = sys.stdin.readline
    q = int(input())
    out = []
    seen = set()
    for _ in range(q):
        op, x = input().split()
        if op == "add":
            seen.add(x)
        else:
            out.append("YES" if x in seen else "NO")
    sys.stdout.write("\n".join(out) + "\n")
""", [("4\nadd a\nask a\nask b\nadd b\n", "YES\nNO\n"), ("2\nadd z\nask z\n", "YES\n")],
   ('out.append("YES" if x in seen else "NO")', 'out.append("YES" if x not in seen else "NO")'), "inverted")

# =============================================================================================== LiveCodeBench style

IO("lcb_solution_class_stdin", "livecodebench", "class Solution driven by a stdin main", r"""
    import sys
    from typing import List

    class Solution:
        def maxProfit(self, prices: List[int]) -> int:
            best, low = 0, float("inf")
            for p in prices:
                low = min(low, p)
                best = max(best, p - low)
            return best

    def main():
        data = sys.stdin.read().split()
        n = int(data[0])
        print(Solution().maxProfit(list(map(int, data[1:1 + n]))))

    main()
""", [("6\n7 1 5 3 6 4\n", "5\n"), ("5\n7 6 4 3 1\n", "0\n")],
   ("best = max(best, p - low)", "best = max(best, low - p)"), "subtracts the wrong way round")

A("lcb_listnode_functional", "livecodebench", "tests build linked lists with the program's ListNode", r"""
    from typing import Optional

    class ListNode:
        def __init__(self, val=0, next=None):
            self.val = val
            self.next = next

    class Solution:
        def reverseList(self, head: Optional[ListNode]) -> Optional[ListNode]:
            prev = None
            while head:
                head.next, prev, head = prev, head, head.next
            return prev
""", r"""
    def build(vals):
        head = None
        for v in reversed(vals):
            head = ListNode(v, head)
        return head

    def to_list(node):
        out = []
        while node:
            out.append(node.val)
            node = node.next
        return out

    assert to_list(Solution().reverseList(build([1, 2, 3, 4, 5]))) == [5, 4, 3, 2, 1]
    assert Solution().reverseList(None) is None
    assert to_list(Solution().reverseList(build([7]))) == [7]
""", ("            return prev\n", "            return prev.next if prev else None\n"), "drops the new head")

A("lcb_design_ops_driver", "livecodebench", "LeetCode design problem driven by ops/args lists", r"""
    class MinStack:
        def __init__(self):
            self.st = []

        def push(self, val: int) -> None:
            m = val if not self.st else min(val, self.st[-1][1])
            self.st.append((val, m))

        def pop(self) -> None:
            self.st.pop()

        def top(self) -> int:
            return self.st[-1][0]

        def getMin(self) -> int:
            return self.st[-1][1]
""", r"""
    ops = ["MinStack", "push", "push", "push", "getMin", "pop", "top", "getMin"]
    args = [[], [-2], [0], [1], [], [], [], []]
    expected = [None, None, None, None, -2, None, 0, -2]
    obj = None
    out = []
    for op, a in zip(ops, args):
        if op == "MinStack":
            obj = MinStack(*a)
            out.append(None)
        else:
            out.append(getattr(obj, op)(*a))
    assert out == expected
""", ("min(val, self.st[-1][1])", "min(val, self.st[-1][0])"), "compares with the top, not the running min")

A("lcb_concurrency_print_in_order", "livecodebench", "LeetCode 1114: tests start threads that call program methods", r"""
    import threading

    class Foo:
        def __init__(self):
            self.first_done = threading.Event()
            self.second_done = threading.Event()

        def first(self, printFirst):
            printFirst()
            self.first_done.set()

        def second(self, printSecond):
            self.first_done.wait()
            printSecond()
            self.second_done.set()

        def third(self, printThird):
            self.second_done.wait()
            printThird()
""", r"""
    import threading
    import time

    out = []
    foo = Foo()
    calls = [(foo.third, lambda: out.append("third")), (foo.second, lambda: out.append("second")),
             (foo.first, lambda: out.append("first"))]
    threads = []
    for method, cb in calls:
        t = threading.Thread(target=method, args=(cb,))
        t.start()
        threads.append(t)
        time.sleep(0.05)
    for t in threads:
        t.join(timeout=3)
    assert "".join(out) == "firstsecondthird", out
""", ("            self.second_done.wait()\n            printThird()\n", "            printThird()\n"),
  "third does not wait")

A("lcb_tree_isinstance_roundtrip", "livecodebench", "TreeNode built by tests, returned node compared by identity", r"""
    class TreeNode:
        def __init__(self, val=0, left=None, right=None):
            self.val, self.left, self.right = val, left, right

    class Solution:
        def lowestCommonAncestor(self, root, p, q):
            while root:
                if p.val < root.val and q.val < root.val:
                    root = root.left
                elif p.val > root.val and q.val > root.val:
                    root = root.right
                else:
                    return root
""", r"""
    n2, n8 = TreeNode(2, TreeNode(0), TreeNode(4, TreeNode(3), TreeNode(5))), TreeNode(8, TreeNode(7), TreeNode(9))
    root = TreeNode(6, n2, n8)
    assert Solution().lowestCommonAncestor(root, n2, n8) is root
    assert Solution().lowestCommonAncestor(root, n2, n2.right) is n2
    assert Solution().lowestCommonAncestor(root, n8.left, n8.right) is n8
    assert isinstance(root.left, TreeNode)
""", ("q.val > root.val:", "q.val < root.val:"), "wrong comparison in the right branch")

A("lcb_many_method_calls_trie", "livecodebench", "a Trie exercised with 3,000 method calls", r"""
    class Trie:
        def __init__(self):
            self.root = {}

        def insert(self, word):
            node = self.root
            for ch in word:
                node = node.setdefault(ch, {})
            node["$"] = True

        def search(self, word):
            node = self.root
            for ch in word:
                if ch not in node:
                    return False
                node = node[ch]
            return "$" in node

        def startsWith(self, prefix):
            node = self.root
            for ch in prefix:
                if ch not in node:
                    return False
                node = node[ch]
            return True
""", r"""
    t = Trie()
    words = [format(i, "b") + "." for i in range(1000)]
    for w in words:
        t.insert(w)
    assert all(t.search(w) for w in words)
    assert sum(t.startsWith(format(i, "b") + "0") for i in range(500)) == 499
    assert not t.search("101")
    assert not t.search("2")
""", ('            return "$" in node\n', "            return True\n"), "prefixes count as words")

IO("lcb_stdin_grid", "livecodebench", "grid problem read from stdin", r"""
    import sys
    from collections import deque

    def main():
        it = iter(sys.stdin.read().split())
        r, c = int(next(it)), int(next(it))
        g = [next(it) for _ in range(r)]
        seen = [[False] * c for _ in range(r)]
        islands = 0
        for i in range(r):
            for j in range(c):
                if g[i][j] == "1" and not seen[i][j]:
                    islands += 1
                    dq = deque([(i, j)])
                    seen[i][j] = True
                    while dq:
                        x, y = dq.popleft()
                        for dx, dy in ((1, 0), (-1, 0), (0, 1), (0, -1)):
                            a, b = x + dx, y + dy
                            if 0 <= a < r and 0 <= b < c and g[a][b] == "1" and not seen[a][b]:
                                seen[a][b] = True
                                dq.append((a, b))
        print(islands)

    main()
""", [("4 5\n11000\n11000\n00100\n00011\n", "3\n"), ("1 1\n0\n", "0\n"), ("3 3\n010\n110\n000\n", "1\n")],
   ("for dx, dy in ((1, 0), (-1, 0), (0, 1), (0, -1)):", "for dx, dy in ((1, 0), (0, 1)):"),
   "only explores down and right")

# =============================================================================================== BigCodeBench style (unittest)

_RUNNER = """
import unittest as _unittest
_r = _unittest.TextTestRunner(verbosity=0).run(_unittest.defaultTestLoader.loadTestsFromTestCase(TestCases))
_why = " | ".join(next((_l for _l in _t.splitlines()[1:] if _l and not _l.startswith(" ")), "?") for _, _t in _r.failures + _r.errors)
assert _r.wasSuccessful(), _why
"""


def U(name, feature, program, tests, edit, bug):
    """A BigCodeBench-style pair: `tests` defines class TestCases(unittest.TestCase); a runner is appended."""
    A(name, "bigcodebench", feature, program, _src(tests) + _RUNNER, edit, bug)
    CORPUS[-1]["tests"] = _src(tests) + _RUNNER


U("bcb_dataclass_asdict", "dataclasses.asdict / astuple on a program dataclass", r"""
    from dataclasses import dataclass

    @dataclass
    class Record:
        name: str
        score: float

    def task_func(rows):
        return [Record(n, float(s)) for n, s in rows]
""", r"""
    import dataclasses
    import unittest

    class TestCases(unittest.TestCase):
        def test_asdict(self):
            r = task_func([("a", "1.5"), ("b", "2")])
            self.assertEqual([dataclasses.asdict(x) for x in r], [{"name": "a", "score": 1.5}, {"name": "b", "score": 2.0}])

        def test_astuple(self):
            self.assertEqual(dataclasses.astuple(task_func([("c", "3")])[0]), ("c", 3.0))
""", ("Record(n, float(s))", "Record(n, float(s) / 2)"), "halves the score")

U("bcb_dataclass_replace_fields", "dataclasses.replace / fields / is_dataclass on a program object", r"""
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Config:
        host: str
        port: int = 8080
        debug: bool = False

    def task_func(s):
        host, _, port = s.partition(":")
        return Config(host, int(port) if port else 8080)
""", r"""
    import dataclasses
    import unittest

    class TestCases(unittest.TestCase):
        def test_fields(self):
            c = task_func("example.com:81")
            self.assertTrue(dataclasses.is_dataclass(c))
            self.assertEqual([f.name for f in dataclasses.fields(c)], ["host", "port", "debug"])

        def test_replace(self):
            c = task_func("h")
            d = dataclasses.replace(c, debug=True)
            self.assertEqual((d.host, d.port, d.debug), ("h", 8080, True))
            self.assertFalse(c.debug)
""", ("int(port) if port else 8080", "int(port) if port else 80"), "wrong default port")

U("bcb_vars_and_dict", "vars(obj) / obj.__dict__ / json.dumps(default=vars) on program objects", r"""
    class Point:
        def __init__(self, x, y):
            self.x = x
            self.y = y

    def task_func(pairs):
        return [Point(a, b) for a, b in pairs]
""", r"""
    import json
    import unittest

    class TestCases(unittest.TestCase):
        def test_vars(self):
            pts = task_func([(1, 2), (3, 4)])
            self.assertEqual(vars(pts[0]), {"x": 1, "y": 2})
            self.assertEqual(pts[1].__dict__, {"x": 3, "y": 4})

        def test_json(self):
            self.assertEqual(json.dumps(task_func([(5, 6)]), default=vars), '[{"x": 5, "y": 6}]')
""", ("return [Point(a, b) for a, b in pairs]", "return [Point(b, a) for a, b in pairs]"), "swaps x and y")

U("bcb_deepcopy_program_object", "copy.deepcopy / copy.copy of a program object in the tests", r"""
    class Inventory:
        def __init__(self):
            self.items = {}

        def add(self, name, qty=1):
            self.items[name] = self.items.get(name, 0) + qty
            return self

        def count(self, name):
            return self.items.get(name, 0)

    def task_func(names):
        inv = Inventory()
        for n in names:
            inv.add(n)
        return inv
""", r"""
    import copy
    import unittest

    class TestCases(unittest.TestCase):
        def test_copy_is_independent(self):
            inv = task_func(["apple", "apple", "pear"])
            snapshot = copy.deepcopy(inv)
            inv.add("apple", 5)
            self.assertEqual(inv.count("apple"), 7)
            self.assertEqual(snapshot.count("apple"), 2)
            self.assertIsNot(snapshot, inv)
""", ("self.items[name] = self.items.get(name, 0) + qty", "self.items[name] = qty"), "overwrites the count")

U("bcb_pickle_roundtrip_in_tests", "tests pickle a program object", r"""
    from dataclasses import dataclass

    @dataclass
    class Settings:
        theme: str
        size: int

    def task_func(theme, size):
        return Settings(theme.lower(), max(8, size))
""", r"""
    import pickle
    import unittest

    class TestCases(unittest.TestCase):
        def test_roundtrip(self):
            s = task_func("Dark", 4)
            t = pickle.loads(pickle.dumps(s))
            self.assertEqual((t.theme, t.size), ("dark", 8))
""", ("max(8, size)", "min(8, size)"), "min instead of max")

U("bcb_pickle_in_program", "the program pickles its own class's instances", r"""
    import pickle
    from dataclasses import dataclass

    @dataclass
    class Point:
        x: int
        y: int

    def task_func(points):
        blob = pickle.dumps([Point(x, y) for x, y in points])
        restored = pickle.loads(blob)
        return len(blob) > 0, [(p.x, p.y) for p in restored]
""", r"""
    import unittest

    class TestCases(unittest.TestCase):
        def test_roundtrip(self):
            ok, pts = task_func([(1, 2), (3, 4)])
            self.assertTrue(ok)
            self.assertEqual(pts, [(1, 2), (3, 4)])
""", ("[(p.x, p.y) for p in restored]", "[(p.y, p.x) for p in restored]"), "swaps coordinates")

U("bcb_multiprocessing_pool", "program uses multiprocessing.Pool with its own function", r"""
    import multiprocessing

    def _square(x):
        return x * x

    def task_func(xs):
        with multiprocessing.Pool(2) as pool:
            return pool.map(_square, xs)
""", r"""
    import unittest

    class TestCases(unittest.TestCase):
        def test_map(self):
            self.assertEqual(task_func([1, 2, 3, 4]), [1, 4, 9, 16])
""", ("return x * x", "return x + x"), "doubles")

U("bcb_thread_pool_executor", "program uses concurrent.futures.ThreadPoolExecutor", r"""
    from concurrent.futures import ThreadPoolExecutor

    def _word_len(w):
        return len(w)

    def task_func(words):
        with ThreadPoolExecutor(max_workers=4) as ex:
            return dict(zip(words, ex.map(_word_len, words)))
""", r"""
    import unittest

    class TestCases(unittest.TestCase):
        def test_lengths(self):
            self.assertEqual(task_func(["a", "bcd", "ef"]), {"a": 1, "bcd": 3, "ef": 2})
""", ("return len(w)", "return len(w.strip('a'))"), "strips a's")

U("bcb_sys_modules_dispatch", "program dispatches through sys.modules[__name__]", r"""
    import sys

    def cmd_add(a, b):
        return a + b

    def cmd_mul(a, b):
        return a * b

    def task_func(cmd, a, b):
        return getattr(sys.modules[__name__], f"cmd_{cmd}")(a, b)
""", r"""
    import unittest

    class TestCases(unittest.TestCase):
        def test_dispatch(self):
            self.assertEqual(task_func("add", 2, 3), 5)
            self.assertEqual(task_func("mul", 2, 3), 6)
""", ("return a * b", "return a ** b"), "power instead of product")

U("bcb_file_tests_write_program_reads", "tests write a CSV in a temp dir; the program reads the path", r"""
    import csv

    def task_func(path):
        with open(path, newline="") as f:
            return sum(int(row["qty"]) for row in csv.DictReader(f))
""", r"""
    import os
    import tempfile
    import unittest

    class TestCases(unittest.TestCase):
        def setUp(self):
            self.dir = tempfile.mkdtemp()
            self.path = os.path.join(self.dir, "data.csv")
            with open(self.path, "w") as f:
                f.write("name,qty\na,3\nb,4\n")

        def test_sum(self):
            self.assertEqual(task_func(self.path), 7)
""", ('sum(int(row["qty"]) for row in csv.DictReader(f))', 'sum(1 for row in csv.DictReader(f))'),
  "counts rows")

U("bcb_file_program_writes_tests_read", "the program writes a file in the tests' temp dir", r"""
    import json
    import os

    def task_func(data, out_dir):
        path = os.path.join(out_dir, "out.json")
        with open(path, "w") as f:
            json.dump(sorted(data), f)
        return path
""", r"""
    import json
    import os
    import shutil
    import tempfile
    import unittest

    class TestCases(unittest.TestCase):
        def setUp(self):
            self.dir = tempfile.mkdtemp()

        def tearDown(self):
            shutil.rmtree(self.dir, ignore_errors=True)

        def test_written(self):
            path = task_func([3, 1, 2], self.dir)
            self.assertTrue(os.path.exists(path))
            with open(path) as f:
                self.assertEqual(json.load(f), [1, 2, 3])
""", ("json.dump(sorted(data), f)", "json.dump(list(data), f)"), "not sorted")

U("bcb_file_relative_cwd", "the program writes a relative path; the tests read it", r"""
    def task_func(lines):
        with open("report.txt", "w") as f:
            for i, line in enumerate(lines, 1):
                f.write(f"{i}: {line}\n")
        return "report.txt"
""", r"""
    import os
    import unittest

    class TestCases(unittest.TestCase):
        def tearDown(self):
            if os.path.exists("report.txt"):
                os.remove("report.txt")

        def test_report(self):
            path = task_func(["a", "b"])
            with open(path) as f:
                self.assertEqual(f.read(), "1: a\n2: b\n")
""", ("enumerate(lines, 1)", "enumerate(lines)"), "0-based numbering")

U("bcb_program_uses_dunder_file", "the program uses __file__", r"""
    import os

    BASE_DIR = os.path.dirname(os.path.abspath(__file__))

    def task_func(name):
        return os.path.join(BASE_DIR, "data", name + ".csv")
""", r"""
    import os
    import unittest

    class TestCases(unittest.TestCase):
        def test_path(self):
            p = task_func("x")
            self.assertTrue(os.path.isabs(p))
            self.assertTrue(p.endswith(os.path.join("data", "x.csv")))
""", ('name + ".csv"', 'name + ".txt"'), "wrong extension")

U("bcb_program_tempfile", "the program uses tempfile internally", r"""
    import os
    import tempfile

    def task_func(text):
        with tempfile.NamedTemporaryFile("w+", suffix=".txt", delete=False) as f:
            f.write(text)
            name = f.name
        with open(name) as f:
            words = f.read().split()
        os.remove(name)
        return len(words)
""", r"""
    import unittest

    class TestCases(unittest.TestCase):
        def test_count(self):
            self.assertEqual(task_func("a b\tc\nd e"), 5)
""", ("words = f.read().split()", "words = f.read().split(' ')"), "splits on single spaces")

U("bcb_stringio_passed_json_load", "tests pass an io.StringIO; the program calls .read() (json.load)", r"""
    import json

    def task_func(fp):
        data = json.load(fp)
        return {k: v for k, v in data.items() if v is not None}
""", r"""
    import io
    import unittest

    class TestCases(unittest.TestCase):
        def test_filter(self):
            self.assertEqual(task_func(io.StringIO('{"a": 1, "b": null, "c": 0}')), {"a": 1, "c": 0})
""", ("if v is not None", "if v"), "drops falsy values too (0)")

U("bcb_stringio_passed_write", "tests pass an io.StringIO; the program writes into it", r"""
    def task_func(rows, out):
        for name, qty in rows:
            print(f"{name},{qty}", file=out)
        return len(rows)
""", r"""
    import io
    import unittest

    class TestCases(unittest.TestCase):
        def test_write(self):
            buf = io.StringIO()
            self.assertEqual(task_func([("a", 1), ("b", 2)], buf), 2)
            self.assertEqual(buf.getvalue(), "a,1\nb,2\n")
""", ('f"{name},{qty}"', 'f"{name};{qty}"'), "wrong separator")

U("bcb_stringio_passed_csv_reader", "tests pass an io.StringIO; the program iterates it with csv", r"""
    import csv

    def task_func(fp):
        return [row for row in csv.reader(fp) if row]
""", r"""
    import io
    import unittest

    class TestCases(unittest.TestCase):
        def test_rows(self):
            self.assertEqual(task_func(io.StringIO("a,b\n\n1,2\n")), [["a", "b"], ["1", "2"]])
""", ("if row]", "]"), "keeps empty rows")

U("bcb_mock_passed", "tests pass a unittest.mock.Mock as a dependency", r"""
    def task_func(client, ids):
        results = {}
        for i in ids:
            results[i] = client.fetch(i)
        client.close()
        return results
""", r"""
    import unittest
    from unittest.mock import MagicMock

    class TestCases(unittest.TestCase):
        def test_fetch(self):
            client = MagicMock()
            client.fetch.side_effect = lambda i: i * 10
            self.assertEqual(task_func(client, [1, 2]), {1: 10, 2: 20})
            client.close.assert_called_once()
            self.assertEqual(client.fetch.call_count, 2)
""", ("        client.close()\n", ""), "never closes the client")

U("bcb_simplenamespace_passed", "tests pass types.SimpleNamespace records", r"""
    def task_func(items):
        return round(sum(it.price * it.qty for it in items), 2)
""", r"""
    import unittest
    from types import SimpleNamespace

    class TestCases(unittest.TestCase):
        def test_total(self):
            items = [SimpleNamespace(price=2.5, qty=2), SimpleNamespace(price=1.0, qty=3)]
            self.assertEqual(task_func(items), 8.0)
""", ("it.price * it.qty", "it.price + it.qty"), "adds price and qty")

U("bcb_random_instance_passed", "tests pass a seeded random.Random instance", r"""
    def task_func(rng, n):
        return [rng.randint(1, 6) for _ in range(n)]
""", r"""
    import random
    import unittest

    class TestCases(unittest.TestCase):
        def test_rolls(self):
            ref = random.Random(42)
            expected = [ref.randint(1, 6) for _ in range(5)]
            self.assertEqual(task_func(random.Random(42), 5), expected)
""", ("rng.randint(1, 6)", "rng.randint(0, 6)"), "range starts at 0")

U("bcb_regex_pattern_passed", "tests pass a compiled re.Pattern", r"""
    def task_func(lines, pattern):
        return [ln for ln in lines if pattern.search(ln)]
""", r"""
    import re
    import unittest

    class TestCases(unittest.TestCase):
        def test_filter(self):
            self.assertEqual(task_func(["a1", "bb", "c22"], re.compile(r"\d")), ["a1", "c22"])
""", ("if pattern.search(ln)", "if pattern.match(ln)"), "match anchors at the start")

U("bcb_pathlib_passed", "tests pass a pathlib.Path (no I/O)", r"""
    def task_func(path):
        return path.stem, path.suffix, path.parent.name
""", r"""
    import unittest
    from pathlib import Path

    class TestCases(unittest.TestCase):
        def test_parts(self):
            self.assertEqual(task_func(Path("data/raw/report.final.csv")), ("report.final", ".csv", "raw"))
""", ("path.parent.name", "path.parent.parent.name"), "grandparent")

U("bcb_path_returned", "program returns a pathlib.Path compared with ==", r"""
    from pathlib import Path

    def task_func(base, name):
        return Path(base) / f"{name.lower()}.json"
""", r"""
    import unittest
    from pathlib import Path

    class TestCases(unittest.TestCase):
        def test_path(self):
            self.assertEqual(task_func("out", "Data"), Path("out/data.json"))
            self.assertIsInstance(task_func("a", "b"), Path)
""", ('f"{name.lower()}.json"', 'f"{name}.json"'), "does not lowercase")

U("bcb_chainmap_returned", "program returns a collections.ChainMap compared with ==", r"""
    from collections import ChainMap

    def task_func(overrides, defaults):
        return ChainMap(overrides, defaults)
""", r"""
    import unittest

    class TestCases(unittest.TestCase):
        def test_merge(self):
            r = task_func({"a": 1}, {"a": 0, "b": 2})
            self.assertEqual(r["a"], 1)
            self.assertEqual(r, {"a": 1, "b": 2})
            self.assertEqual(dict(r), {"a": 1, "b": 2})
""", ("ChainMap(overrides, defaults)", "ChainMap(defaults, overrides)"), "defaults win")

U("bcb_simplenamespace_returned", "program returns a types.SimpleNamespace compared with ==", r"""
    import statistics
    from types import SimpleNamespace

    def task_func(xs):
        return SimpleNamespace(mean=statistics.mean(xs), n=len(xs))
""", r"""
    import unittest
    from types import SimpleNamespace

    class TestCases(unittest.TestCase):
        def test_summary(self):
            r = task_func([1, 2, 3])
            self.assertEqual(r.mean, 2)
            self.assertEqual(r, SimpleNamespace(mean=2, n=3))
""", ("n=len(xs)", "n=len(xs) - 1"), "n off by one")

U("bcb_normaldist_returned", "program returns a statistics.NormalDist compared with ==", r"""
    from statistics import NormalDist

    def task_func(xs):
        return NormalDist.from_samples(xs)
""", r"""
    import unittest
    from statistics import NormalDist

    class TestCases(unittest.TestCase):
        def test_fit(self):
            d = task_func([1.0, 2.0, 3.0])
            self.assertAlmostEqual(d.mean, 2.0)
            self.assertEqual(d, NormalDist(2.0, 1.0))
""", ("NormalDist.from_samples(xs)", "NormalDist.from_samples(xs[1:])"), "drops a sample")

U("bcb_zoneinfo_datetime", "program returns a datetime with a zoneinfo tzinfo", r"""
    from datetime import datetime, timezone
    from zoneinfo import ZoneInfo

    def task_func(ts):
        return datetime.fromtimestamp(ts, tz=timezone.utc).astimezone(ZoneInfo("Asia/Tokyo"))
""", r"""
    import unittest
    from datetime import timedelta

    class TestCases(unittest.TestCase):
        def test_tokyo(self):
            r = task_func(0)
            self.assertEqual(r.hour, 9)
            self.assertEqual(r.utcoffset(), timedelta(hours=9))
""", ('ZoneInfo("Asia/Tokyo")', 'ZoneInfo("Asia/Shanghai")'), "wrong zone (UTC+8)")

U("bcb_stringio_returned_isinstance", "program returns an io.StringIO; tests check its type and read it", r"""
    import csv
    import io

    def task_func(rows):
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(["name", "qty"])
        w.writerows(rows)
        buf.seek(0)
        return buf
""", r"""
    import csv
    import io
    import unittest

    class TestCases(unittest.TestCase):
        def test_csv(self):
            r = task_func([("a", 1)])
            self.assertIsInstance(r, io.StringIO)
            self.assertEqual(list(csv.reader(r)), [["name", "qty"], ["a", "1"]])
""", ("        buf.seek(0)\n", ""), "does not rewind")

U("bcb_async_function", "program defines async def; tests asyncio.run() it", r"""
    import asyncio

    async def _fetch(i):
        await asyncio.sleep(0.001)
        return i * i

    async def task_func(ids):
        return await asyncio.gather(*(_fetch(i) for i in ids))
""", r"""
    import asyncio
    import unittest

    class TestCases(unittest.TestCase):
        def test_gather(self):
            self.assertEqual(asyncio.run(task_func([1, 2, 3])), [1, 4, 9])
""", ("return i * i", "return i + i"), "doubles")

U("bcb_asyncio_internal", "program runs asyncio internally (sync entry)", r"""
    import asyncio

    async def _work(x):
        await asyncio.sleep(0.001)
        return x.upper()

    def task_func(words):
        async def main():
            return await asyncio.gather(*(_work(w) for w in words))
        return asyncio.run(main())
""", r"""
    import unittest

    class TestCases(unittest.TestCase):
        def test_upper(self):
            self.assertEqual(task_func(["a", "bc"]), ["A", "BC"])
""", ("return x.upper()", "return x.title()[0]"), "keeps only the first letter")

U("bcb_tests_threads_call_program", "tests call a thread-safe program class from 8 threads", r"""
    import threading

    class Counter:
        def __init__(self):
            self._lock = threading.Lock()
            self.value = 0

        def increment(self):
            with self._lock:
                self.value += 1
""", r"""
    import threading
    import unittest

    class TestCases(unittest.TestCase):
        def test_threads(self):
            c = Counter()
            threads = [threading.Thread(target=lambda: [c.increment() for _ in range(50)]) for _ in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            self.assertEqual(c.value, 400)
""", ("                self.value += 1\n", "                self.value = self.value + 1 if self.value < 399 else self.value\n"),
  "saturates at 399")

U("bcb_abc_subclassed_in_tests", "tests subclass a program abc.ABC and instantiate the abstract base", r"""
    from abc import ABC, abstractmethod

    class Shape(ABC):
        @abstractmethod
        def area(self):
            ...

        def describe(self):
            return f"{type(self).__name__} with area {self.area():.2f}"
""", r"""
    import unittest

    class TestCases(unittest.TestCase):
        def test_abstract(self):
            with self.assertRaises(TypeError):
                Shape()

        def test_subclass(self):
            class Square(Shape):
                def __init__(self, s):
                    self.s = s

                def area(self):
                    return self.s ** 2

            self.assertEqual(Square(2).describe(), "Square with area 4.00")
""", ('f"{type(self).__name__} with area {self.area():.2f}"', 'f"{type(self).__name__} with area {self.area():.1f}"'),
  "one decimal")

U("bcb_init_subclass_registry", "tests subclass a program class with __init_subclass__", r"""
    class Plugin:
        registry = {}

        def __init_subclass__(cls, name=None, **kwargs):
            super().__init_subclass__(**kwargs)
            Plugin.registry[name or cls.__name__.lower()] = cls

        def run(self, x):
            raise NotImplementedError

    class Upper(Plugin):
        def run(self, x):
            return x.upper()

    def create(name):
        return Plugin.registry[name]()
""", r"""
    import unittest

    class TestCases(unittest.TestCase):
        def test_builtin_plugin(self):
            self.assertEqual(create("upper").run("ab"), "AB")

        def test_tests_plugin(self):
            class Reverse(Plugin, name="rev"):
                def run(self, x):
                    return x[::-1]

            self.assertIn("rev", Plugin.registry)
            self.assertEqual(create("rev").run("abc"), "cba")
""", ("Plugin.registry[name or cls.__name__.lower()] = cls", "Plugin.registry[cls.__name__.lower()] = cls"),
  "ignores the name keyword")

U("bcb_subclasses_listed", "tests list a program class's __subclasses__()", r"""
    class Animal:
        sound = "..."

    class Dog(Animal):
        sound = "woof"

    class Cat(Animal):
        sound = "meow"

    def task_func():
        return {c.__name__: c.sound for c in Animal.__subclasses__()}
""", r"""
    import unittest

    class TestCases(unittest.TestCase):
        def test_subclasses(self):
            self.assertEqual({c.__name__ for c in Animal.__subclasses__()}, {"Dog", "Cat"})
            self.assertEqual(task_func(), {"Dog": "woof", "Cat": "meow"})
""", ('sound = "meow"', 'sound = "mew"'), "wrong sound")

U("bcb_descriptor_in_tests_class", "tests use a program descriptor in their own class", r"""
    class Positive:
        def __set_name__(self, owner, name):
            self.name = "_" + name

        def __get__(self, obj, objtype=None):
            return getattr(obj, self.name)

        def __set__(self, obj, value):
            if value <= 0:
                raise ValueError(f"{self.name[1:]} must be positive")
            setattr(obj, self.name, value)
""", r"""
    import unittest

    class TestCases(unittest.TestCase):
        def test_descriptor(self):
            class Account:
                balance = Positive()

            a = Account()
            a.balance = 10
            self.assertEqual(a.balance, 10)
            with self.assertRaises(ValueError) as cm:
                a.balance = -5
            self.assertEqual(str(cm.exception), "balance must be positive")
""", ("            if value <= 0:\n", "            if value < -10:\n"), "accepts negatives")

U("bcb_class_decorator_on_tests_class", "a program class decorator applied to a tests' class", r"""
    def auto_repr(cls):
        def __repr__(self):
            fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
            return f"{type(self).__name__}({fields})"
        cls.__repr__ = __repr__
        return cls
""", r"""
    import unittest

    class TestCases(unittest.TestCase):
        def test_repr(self):
            @auto_repr
            class P:
                def __init__(self, x, y):
                    self.x, self.y = x, y

            self.assertEqual(repr(P(1, "a")), "P(x=1, y='a')")
""", ('f"{k}={v!r}"', 'f"{k}={v}"'), "str instead of repr of the values")

U("bcb_metaclass_singleton_in_tests", "tests use a program metaclass for their own class", r"""
    class Singleton(type):
        _instances = {}

        def __call__(cls, *args, **kwargs):
            if cls not in cls._instances:
                cls._instances[cls] = super().__call__(*args, **kwargs)
            return cls._instances[cls]
""", r"""
    import unittest

    class TestCases(unittest.TestCase):
        def test_singleton(self):
            class Config(metaclass=Singleton):
                def __init__(self):
                    self.values = {}

            a, b = Config(), Config()
            self.assertIs(a, b)
            a.values["k"] = 1
            self.assertEqual(b.values, {"k": 1})
""", ("            if cls not in cls._instances:\n", "            if True:\n"), "always a new instance")

U("bcb_weakset_instance_tracking", "program tracks live instances with a WeakSet; tests del + gc", r"""
    import weakref

    class Session:
        _live = weakref.WeakSet()

        def __init__(self, user):
            self.user = user
            Session._live.add(self)

        @classmethod
        def active(cls):
            return len(cls._live)
""", r"""
    import gc
    import unittest

    class TestCases(unittest.TestCase):
        def test_tracking(self):
            a = Session("ann")
            b = Session("bob")
            self.assertEqual(Session.active(), 2)
            del a
            gc.collect()
            self.assertEqual(Session.active(), 1)
""", ("    _live = weakref.WeakSet()\n", "    _live = set()\n"), "strong references: never shrinks")

U("bcb_weakref_to_program_object", "tests take weakref.ref of a program object", r"""
    class Node:
        def __init__(self, val):
            self.val = val
            self.children = []

        def add(self, val):
            child = Node(val)
            self.children.append(child)
            return child
""", r"""
    import unittest
    import weakref

    class TestCases(unittest.TestCase):
        def test_weakref(self):
            root = Node(1)
            child = root.add(2)
            r = weakref.ref(child)
            self.assertIs(r(), child)
            self.assertEqual([c.val for c in root.children], [2])
""", ("            self.children.append(child)\n", ""), "forgets to attach the child")

U("bcb_assertlogs", "tests capture the program's logging with assertLogs", r"""
    import logging

    logger = logging.getLogger("inventory")

    def task_func(stock, threshold=5):
        low = [k for k, v in stock.items() if v < threshold]
        for k in low:
            logger.warning("low stock: %s", k)
        return low
""", r"""
    import unittest

    class TestCases(unittest.TestCase):
        def test_logs(self):
            with self.assertLogs("inventory", level="WARNING") as cm:
                self.assertEqual(task_func({"a": 1, "b": 9}), ["a"])
            self.assertEqual(cm.output, ["WARNING:inventory:low stock: a"])
""", ('logger.warning("low stock: %s", k)', 'logger.info("low stock: %s", k)'), "logs at INFO")

U("bcb_assertwarns", "tests expect a DeprecationWarning from the program", r"""
    import warnings

    def old_api(x):
        warnings.warn("old_api is deprecated", DeprecationWarning, stacklevel=2)
        return x * 2
""", r"""
    import unittest

    class TestCases(unittest.TestCase):
        def test_warns(self):
            with self.assertWarns(DeprecationWarning):
                self.assertEqual(old_api(2), 4)
""", ("DeprecationWarning, stacklevel=2", "UserWarning, stacklevel=2"), "wrong warning class")

A("bcb_unittest_main_guard", "bigcodebench", "tests end with if __name__ == '__main__': unittest.main(exit=False)", r"""
    def task_func(s):
        return " ".join(w.capitalize() for w in s.split())
""", r"""
    import unittest

    class TestCases(unittest.TestCase):
        def test_title(self):
            self.assertEqual(task_func("hello  world"), "Hello World")

        def test_empty(self):
            self.assertEqual(task_func(""), "")

    if __name__ == "__main__":
        program = unittest.main(argv=["tests"], exit=False)
        assert program.result.wasSuccessful()
""", ('" ".join(w.capitalize() for w in s.split())', '" ".join(w.capitalize() for w in s.split(" "))'),
  "keeps empty words: two spaces")

A("bcb_unittest_main_no_guard", "bigcodebench", "tests call unittest.main(exit=False) unguarded", r"""
    def task_func(xs):
        return [x for x in xs if x % 2 == 0]
""", r"""
    import unittest

    class TestCases(unittest.TestCase):
        def test_evens(self):
            self.assertEqual(task_func([1, 2, 3, 4]), [2, 4])

    program = unittest.main(argv=["tests"], exit=False)
    assert program.result.wasSuccessful()
""", ("x % 2 == 0", "x % 2 == 1"), "keeps odds")

A("bcb_doctest_testmod", "bigcodebench", "tests run doctest.testmod() on the program's docstrings", r'''
    def add_vat(price, rate=0.2):
        """Price with VAT, rounded to cents.

        >>> add_vat(10)
        12.0
        >>> add_vat(9.99, 0.1)
        10.99
        """
        return round(price * (1 + rate), 2)
''', r"""
    import doctest
    results = doctest.testmod()
    assert results.failed == 0, results
""", ("round(price * (1 + rate), 2)", "round(price * (1 + rate), 1)"), "rounds to one decimal")

U("bcb_inspect_signature", "tests inspect the program function's signature", r"""
    def task_func(data, column="value", ascending=True):
        return sorted(data, key=lambda r: r[column], reverse=not ascending)
""", r"""
    import inspect
    import unittest

    class TestCases(unittest.TestCase):
        def test_signature(self):
            sig = inspect.signature(task_func)
            self.assertEqual(list(sig.parameters), ["data", "column", "ascending"])
            self.assertEqual(sig.parameters["column"].default, "value")

        def test_sort(self):
            self.assertEqual(task_func([{"value": 2}, {"value": 1}]), [{"value": 1}, {"value": 2}])
""", ("reverse=not ascending", "reverse=ascending"), "reversed order")

U("bcb_dir_lists_methods", "tests check dir(obj) for the program's methods", r"""
    class Shape:
        def area(self):
            return 0

    class Circle(Shape):
        def __init__(self, r):
            self.r = r

        def area(self):
            return 3.14159 * self.r ** 2

        def perimeter(self):
            return 2 * 3.14159 * self.r
""", r"""
    import unittest

    class TestCases(unittest.TestCase):
        def test_api(self):
            c = Circle(1)
            self.assertIn("perimeter", dir(c))
            self.assertIn("r", dir(c))
            self.assertAlmostEqual(c.perimeter(), 6.28318)
""", ("return 2 * 3.14159 * self.r", "return 3.14159 * self.r"), "half the perimeter")

U("bcb_exception_group", "program raises an ExceptionGroup; tests use except*", r"""
    def task_func(records):
        errors = []
        for i, r in enumerate(records):
            if "id" not in r:
                errors.append(KeyError(f"record {i}: no id"))
            elif not isinstance(r["id"], int):
                errors.append(TypeError(f"record {i}: id not int"))
        if errors:
            raise ExceptionGroup("invalid records", errors)
        return len(records)
""", r"""
    import unittest

    class TestCases(unittest.TestCase):
        def test_group(self):
            seen = []
            try:
                task_func([{"id": 1}, {}, {"id": "x"}, {}])
            except* KeyError as eg:
                seen.append(len(eg.exceptions))
            except* TypeError as eg:
                seen.append(str(eg.exceptions[0]))
            self.assertEqual(seen, [2, "record 2: id not int"])
            self.assertEqual(task_func([{"id": 3}]), 1)
""", ("            elif not isinstance(r[\"id\"], int):\n", "            elif not isinstance(r[\"id\"], (int, str)):\n"),
  "accepts string ids")

U("bcb_oserror_filename", "tests inspect FileNotFoundError.filename", r"""
    def task_func(path):
        with open(path) as f:
            return f.read().count("\n")
""", r"""
    import unittest

    class TestCases(unittest.TestCase):
        def test_missing(self):
            with self.assertRaises(FileNotFoundError) as cm:
                task_func("/nonexistent/dir/data.txt")
            self.assertEqual(cm.exception.filename, "/nonexistent/dir/data.txt")
            self.assertEqual(cm.exception.errno, 2)
""", ("        with open(path) as f:\n            return f.read().count(\"\\n\")\n",
      "        try:\n            with open(path) as f:\n                return f.read().count(\"\\n\")\n"
      "        except OSError:\n            raise FileNotFoundError(\"missing\")\n"), "re-raises without the filename")

U("bcb_systemexit_argparse", "tests catch argparse's SystemExit and read .code", r"""
    import argparse

    def main(argv):
        parser = argparse.ArgumentParser(prog="sq")
        parser.add_argument("--n", type=int, required=True)
        args = parser.parse_args(argv)
        return args.n ** 2
""", r"""
    import unittest

    class TestCases(unittest.TestCase):
        def test_ok(self):
            self.assertEqual(main(["--n", "3"]), 9)

        def test_bad(self):
            with self.assertRaises(SystemExit) as cm:
                main(["--n", "x"])
            self.assertEqual(cm.exception.code, 2)
""", ("type=int, required=True", "type=str, required=True"), "n is a string: '3' ** 2 raises TypeError")

U("bcb_tests_exception_through_program", "a tests' exception class raised by a callback through the program", r"""
    def retry(fn, times):
        last = None
        for _ in range(times):
            try:
                return fn()
            except Exception as e:
                last = e
        raise last
""", r"""
    import unittest

    class Flaky(Exception):
        pass

    class TestCases(unittest.TestCase):
        def test_gives_up(self):
            calls = []

            def always_fail():
                calls.append(1)
                raise Flaky("down")

            with self.assertRaises(Flaky):
                retry(always_fail, 3)
            self.assertEqual(len(calls), 3)

        def test_succeeds(self):
            calls = []

            def second_time():
                calls.append(1)
                if len(calls) < 2:
                    raise Flaky("once")
                return "ok"

            self.assertEqual(retry(second_time, 3), "ok")
""", ("for _ in range(times):", "for _ in range(times - 1):"), "one attempt too few")

U("bcb_tests_exception_inside_program_cm", "tests raise their own exception inside a program context manager", r"""
    class ErrorCollector:
        def __init__(self):
            self.errors = []

        def __enter__(self):
            return self

        def __exit__(self, exc_type, exc, tb):
            if exc is not None:
                self.errors.append(f"{exc_type.__name__}: {exc}")
            return True
""", r"""
    import unittest

    class ParseError(Exception):
        pass

    class TestCases(unittest.TestCase):
        def test_collect(self):
            with ErrorCollector() as ec:
                raise ParseError("bad line 3")
            with ec:
                raise KeyError("k")
            self.assertEqual(ec.errors, ["ParseError: bad line 3", "KeyError: 'k'"])
""", ("            return True\n", "            return exc_type is KeyError\n"), "only suppresses KeyError")

U("bcb_stub_object_mutated_by_program", "the program sets an attribute on a tests' stub object", r"""
    def apply_fee(account, fee):
        if account.balance < fee:
            raise ValueError("insufficient")
        account.balance -= fee
        return account.balance
""", r"""
    import unittest

    class FakeAccount:
        def __init__(self, balance):
            self.balance = balance

    class TestCases(unittest.TestCase):
        def test_fee(self):
            acct = FakeAccount(100)
            self.assertEqual(apply_fee(acct, 30), 70)
            self.assertEqual(acct.balance, 70)
""", ("        account.balance -= fee\n        return account.balance\n", "        return account.balance - fee\n"),
  "does not update the account")

U("bcb_tests_dataclass_objects_passed", "the program hashes/compares/sorts tests' dataclass instances", r"""
    def task_func(points):
        unique = set(points)
        return len(unique), sorted(unique)[0]
""", r"""
    import unittest
    from dataclasses import dataclass

    @dataclass(frozen=True, order=True)
    class P:
        x: int
        y: int

    class TestCases(unittest.TestCase):
        def test_unique(self):
            n, first = task_func([P(2, 1), P(1, 2), P(2, 1)])
            self.assertEqual(n, 2)
            self.assertEqual(first, P(1, 2))
""", ("sorted(unique)[0]", "sorted(unique)[-1]"), "takes the largest")

U("bcb_queue_passed", "tests pass a queue.Queue to a producer", r"""
    def produce(q, n):
        for i in range(n):
            q.put(i * i)
        q.put(None)
""", r"""
    import queue
    import unittest

    class TestCases(unittest.TestCase):
        def test_produce(self):
            q = queue.Queue()
            produce(q, 3)
            out = []
            while (item := q.get()) is not None:
                out.append(item)
            self.assertEqual(out, [0, 1, 4])
""", ("q.put(i * i)", "q.put(i * 2)"), "doubles")

U("bcb_event_emitter_stored_callbacks", "program stores tests' callbacks and calls them later", r"""
    class Emitter:
        def __init__(self):
            self.handlers = {}

        def on(self, event, fn):
            self.handlers.setdefault(event, []).append(fn)

        def emit(self, event, *args):
            for fn in self.handlers.get(event, []):
                fn(*args)
            return len(self.handlers.get(event, []))
""", r"""
    import unittest

    class TestCases(unittest.TestCase):
        def test_emit(self):
            seen = []
            em = Emitter()
            em.on("x", lambda v: seen.append(("a", v)))
            em.on("x", lambda v: seen.append(("b", v)))
            self.assertEqual(em.emit("x", 1), 2)
            self.assertEqual(seen, [("a", 1), ("b", 1)])
""", ("self.handlers.setdefault(event, []).append(fn)", "self.handlers[event] = [fn]"), "keeps only the last handler")

U("bcb_sqlite_in_memory", "program uses sqlite3 in memory and returns rows", r"""
    import sqlite3

    def task_func(rows):
        con = sqlite3.connect(":memory:")
        con.execute("CREATE TABLE t (name TEXT, score INT)")
        con.executemany("INSERT INTO t VALUES (?, ?)", rows)
        out = con.execute("SELECT name, SUM(score) FROM t GROUP BY name ORDER BY 2 DESC").fetchall()
        con.close()
        return out
""", r"""
    import unittest

    class TestCases(unittest.TestCase):
        def test_group(self):
            self.assertEqual(task_func([("a", 1), ("b", 5), ("a", 7)]), [("a", 8), ("b", 5)])
""", ("ORDER BY 2 DESC", "ORDER BY 2"), "ascending")

U("bcb_subprocess_echo", "program runs a subprocess (echo)", r"""
    import subprocess

    def task_func(words):
        r = subprocess.run(["echo", *words], capture_output=True, text=True, check=True)
        return r.stdout.strip().split()
""", r"""
    import unittest

    class TestCases(unittest.TestCase):
        def test_echo(self):
            self.assertEqual(task_func(["a", "b"]), ["a", "b"])
""", ("return r.stdout.strip().split()", "return r.stdout.strip().split()[::-1]"), "reversed")

U("bcb_hash_b64_struct", "hashlib, base64, struct and zlib values", r"""
    import base64
    import hashlib
    import struct
    import zlib

    def task_func(text):
        raw = text.encode()
        return {
            "sha": hashlib.sha256(raw).hexdigest()[:12],
            "b64": base64.b64encode(zlib.compress(raw)),
            "head": struct.unpack(">HB", raw[:3]),
        }
""", r"""
    import base64
    import unittest
    import zlib

    class TestCases(unittest.TestCase):
        def test_values(self):
            r = task_func("hello")
            self.assertEqual(r["sha"], "2cf24dba5fb0")
            self.assertEqual(zlib.decompress(base64.b64decode(r["b64"])), b"hello")
            self.assertEqual(r["head"], (0x6865, 0x6c))
""", ('struct.unpack(">HB", raw[:3])', 'struct.unpack("<HB", raw[:3])'), "little-endian")

U("bcb_csv_on_strings", "csv.DictReader/DictWriter on strings", r"""
    import csv
    import io

    def task_func(text):
        rows = list(csv.DictReader(io.StringIO(text)))
        for r in rows:
            r["total"] = str(int(r["a"]) + int(r["b"]))
        out = io.StringIO()
        w = csv.DictWriter(out, fieldnames=["a", "b", "total"], lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
        return out.getvalue()
""", r"""
    import unittest

    class TestCases(unittest.TestCase):
        def test_csv(self):
            self.assertEqual(task_func("a,b\n1,2\n3,4\n"), "a,b,total\n1,2,3\n3,4,7\n")
""", ('str(int(r["a"]) + int(r["b"]))', 'r["a"] + r["b"]'), "concatenates strings")

U("bcb_namedtuple_with_methods", "typing.NamedTuple with a method and a property", r"""
    from typing import NamedTuple

    class Point(NamedTuple):
        x: float
        y: float

        def dist(self, other):
            return ((self.x - other.x) ** 2 + (self.y - other.y) ** 2) ** 0.5

        @property
        def norm(self):
            return (self.x ** 2 + self.y ** 2) ** 0.5

    def task_func(pairs):
        return [Point(*p) for p in pairs]
""", r"""
    import unittest

    class TestCases(unittest.TestCase):
        def test_points(self):
            a, b = task_func([(0, 0), (3, 4)])
            self.assertEqual(b, (3, 4))
            self.assertEqual(b.x, 3)
            self.assertAlmostEqual(a.dist(b), 5.0)
            self.assertAlmostEqual(b.norm, 5.0)
            self.assertEqual(b._replace(x=0), (0, 4))
            self.assertEqual(b._asdict(), {"x": 3, "y": 4})
""", ("(self.y - other.y) ** 2) ** 0.5\n", "(self.y - other.x) ** 2) ** 0.5\n"), "typo: other.x")

U("bcb_flag_enum_combos", "enum.Flag combinations", r"""
    from enum import Flag, auto

    class Perm(Flag):
        READ = auto()
        WRITE = auto()
        EXEC = auto()

    def task_func(mode):
        p = Perm(0)
        if "r" in mode:
            p |= Perm.READ
        if "w" in mode:
            p |= Perm.WRITE
        if "x" in mode:
            p |= Perm.EXEC
        return p
""", r"""
    import unittest

    class TestCases(unittest.TestCase):
        def test_flags(self):
            p = task_func("rw")
            self.assertEqual(p, Perm.READ | Perm.WRITE)
            self.assertIn(Perm.READ, p)
            self.assertNotIn(Perm.EXEC, p)
            self.assertFalse(task_func(""))
            self.assertEqual(p.value, 3)
""", ('if "w" in mode:', 'if "W" in mode:'), "case-sensitive w")

U("bcb_str_subclass", "a str subclass with extra methods", r"""
    class Slug(str):
        def words(self):
            return self.split("-")

    def task_func(title):
        return Slug("-".join(title.lower().split()))
""", r"""
    import unittest

    class TestCases(unittest.TestCase):
        def test_slug(self):
            s = task_func("Hello Big World")
            self.assertEqual(s, "hello-big-world")
            self.assertIsInstance(s, str)
            self.assertEqual(s.words(), ["hello", "big", "world"])
            self.assertTrue(s.startswith("hello"))
            self.assertEqual(s.upper(), "HELLO-BIG-WORLD")
""", ("title.lower().split()", "title.split()"), "does not lowercase")

U("bcb_userdict_named_class", "a UserDict subclass the tests name", r"""
    from collections import UserDict

    class CaseInsensitiveDict(UserDict):
        def __setitem__(self, key, value):
            super().__setitem__(key.lower(), value)

        def __getitem__(self, key):
            return super().__getitem__(key.lower())

        def __contains__(self, key):
            return key.lower() in self.data
""", r"""
    import unittest

    class TestCases(unittest.TestCase):
        def test_ci(self):
            d = CaseInsensitiveDict()
            d["Content-Type"] = "json"
            self.assertEqual(d["content-type"], "json")
            self.assertIn("CONTENT-TYPE", d)
            self.assertEqual(len(d), 1)
            self.assertEqual(dict(d), {"content-type": "json"})
""", ("            return key.lower() in self.data\n", "            return key in self.data\n"),
  "case-sensitive membership")

U("bcb_slots_property_classmethod", "__slots__, a raising property and a classmethod constructor", r"""
    class Temperature:
        __slots__ = ("kelvin",)

        def __init__(self, kelvin):
            if kelvin < 0:
                raise ValueError("below absolute zero")
            self.kelvin = kelvin

        @classmethod
        def from_celsius(cls, c):
            return cls(c + 273.15)

        @property
        def celsius(self):
            return self.kelvin - 273.15

        @property
        def boiling(self):
            if self.kelvin > 1000:
                raise OverflowError("too hot to tell")
            return self.kelvin >= 373.15
""", r"""
    import unittest

    class TestCases(unittest.TestCase):
        def test_all(self):
            t = Temperature.from_celsius(100)
            self.assertIsInstance(t, Temperature)
            self.assertAlmostEqual(t.celsius, 100)
            self.assertTrue(t.boiling)
            with self.assertRaises(AttributeError):
                t.color = "red"
            with self.assertRaises(OverflowError):
                Temperature(5000).boiling
            with self.assertRaises(ValueError):
                Temperature.from_celsius(-300)
""", ("return cls(c + 273.15)", "return cls(c + 273)"), "wrong offset")

U("bcb_redirect_stdout_in_program", "the program captures its own prints", r"""
    import contextlib
    import io

    def _report(items):
        for k, v in items:
            print(f"{k}={v}")

    def task_func(items):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            _report(items)
        return buf.getvalue().splitlines()
""", r"""
    import unittest

    class TestCases(unittest.TestCase):
        def test_capture(self):
            self.assertEqual(task_func([("a", 1), ("b", 2)]), ["a=1", "b=2"])
""", ('print(f"{k}={v}")', 'print(f"{k}:{v}")'), "wrong separator")

U("bcb_print_unicode_assert", "the program prints non-ASCII while computing (assert job)", r"""
    def task_func(names):
        for n in names:
            print(f"→ processing {n} ✓")
        return [n.title() for n in names]
""", r"""
    import unittest

    class TestCases(unittest.TestCase):
        def test_names(self):
            self.assertEqual(task_func(["zoë", "ann"]), ["Zoë", "Ann"])
""", ("return [n.title() for n in names]", "return [n.capitalize() for n in names][::-1]"), "reversed")

U("bcb_struct_time", "time.strptime's struct_time returned", r"""
    import time

    def task_func(s):
        return time.strptime(s, "%Y-%m-%d")
""", r"""
    import unittest

    class TestCases(unittest.TestCase):
        def test_parse(self):
            t = task_func("2024-03-01")
            self.assertEqual(t.tm_yday, 61)
            self.assertEqual(t[:3], (2024, 3, 1))
""", ('"%Y-%m-%d"', '"%Y-%d-%m"'), "day and month swapped")

U("bcb_generator_handed_back", "tests take items from a program generator, then hand it to the program", r"""
    def numbers():
        n = 0
        while True:
            yield n
            n += 1

    def take(it, k):
        return [next(it) for _ in range(k)]
""", r"""
    import unittest

    class TestCases(unittest.TestCase):
        def test_resume(self):
            g = numbers()
            first = [next(g) for _ in range(11)]
            self.assertEqual(first, list(range(11)))
            self.assertEqual(take(g, 3), [11, 12, 13])
""", ("            n += 1\n", "            n += 1 if n < 12 else 2\n"), "skips 13")

U("bcb_generator_side_effect_counter", "a program generator's side effect read after 11 next()", r"""
    produced = 0

    def ticker():
        global produced
        i = 0
        while True:
            produced += 1
            yield i
            i += 1

    def produced_count():
        return produced
""", r"""
    import unittest

    class TestCases(unittest.TestCase):
        def test_count(self):
            g = ticker()
            got = [next(g) for _ in range(11)]
            self.assertEqual(got, list(range(11)))
            self.assertEqual(produced_count(), 11)
""", ("            produced += 1\n", "            produced += 1 if i else 2\n"), "counts the first twice")

U("bcb_memo_dict_passed", "tests pass a memo dict the program fills recursively", r"""
    def ways(n, memo):
        if n <= 1:
            return 1
        if n not in memo:
            memo[n] = ways(n - 1, memo) + ways(n - 2, memo)
        return memo[n]
""", r"""
    import unittest

    class TestCases(unittest.TestCase):
        def test_memo(self):
            memo = {}
            self.assertEqual(ways(40, memo), 165580141)
            self.assertEqual(len(memo), 39)
            self.assertEqual(memo[10], 89)
""", ("        if n <= 1:\n", "        if n <= 2:\n"), "wrong base case")

U("bcb_assert_count_equal_objects", "assertCountEqual / assertEqual on lists of program objects", r"""
    from dataclasses import dataclass

    @dataclass
    class Edge:
        u: int
        v: int

    def task_func(adj):
        return [Edge(u, v) for u, vs in adj.items() for v in vs if u < v]
""", r"""
    import unittest

    class TestCases(unittest.TestCase):
        def test_edges(self):
            r = task_func({1: [2, 3], 2: [1], 3: [1]})
            self.assertCountEqual(r, [Edge(1, 3), Edge(1, 2)])
            self.assertEqual(r, [Edge(1, 2), Edge(1, 3)])
""", ("if u < v", "if u > v"), "keeps the reversed edges")

# =============================================================================================== round 2: twins that may pass

A("mbpp_defensive_copy_method", "mbpp", "tests mutate a returned list to check it is a copy", r"""
    class Playlist:
        def __init__(self):
            self._songs = []

        def add(self, song):
            self._songs.append(song)

        def songs(self):
            return list(self._songs)
""", r"""
    p = Playlist()
    p.add("a")
    lst = p.songs()
    lst.append("b")
    assert p.songs() == ["a"]
""", ("return list(self._songs)", "return self._songs"), "returns the internal list: callers can corrupt it")

A("mbpp_global_config_copy", "mbpp", "tests mutate a returned module-level dict to check it is a copy", r"""
    DEFAULTS = {"retries": 3, "timeout": 10}

    def get_config(**overrides):
        cfg = dict(DEFAULTS)
        cfg.update(overrides)
        return cfg
""", r"""
    c = get_config(timeout=5)
    assert c == {"retries": 3, "timeout": 5}
    c["retries"] = 99
    assert get_config() == {"retries": 3, "timeout": 10}
""", ("        cfg = dict(DEFAULTS)\n", "        cfg = DEFAULTS\n"), "updates the shared defaults in place")

A("mbpp_grid_row_aliasing", "mbpp", "the classic [[0] * n] * n aliasing bug in a returned grid", r"""
    def make_grid(rows, cols, fill=0):
        return [[fill] * cols for _ in range(rows)]
""", r"""
    g = make_grid(3, 2)
    assert g == [[0, 0], [0, 0], [0, 0]]
    g[0][0] = 1
    assert g[1][0] == 0
    assert make_grid(1, 3, ".") == [[".", ".", "."]]
""", ("[[fill] * cols for _ in range(rows)]", "[[fill] * cols] * rows"), "every row is the same list")

A("mbpp_no_mutation_inside_tuple", "mbpp", "tests check lists inside a tuple argument are left alone", r"""
    def sorted_pair(pair):
        return (sorted(pair[0]), sorted(pair[1]))
""", r"""
    a, b = [3, 1, 2], [9, 7]
    r = sorted_pair((a, b))
    assert r == ([1, 2, 3], [7, 9])
    assert a == [3, 1, 2] and b == [9, 7]
""", """
    def sorted_pair(pair):
        pair[0].sort()
        pair[1].sort()
        return (pair[0], pair[1])
""", "sorts the caller's lists in place")

A("mbpp_array_not_mutated", "mbpp", "tests check an array.array argument is left alone", r"""
    def median(arr):
        s = sorted(arr)
        n = len(s)
        return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
""", r"""
    from array import array
    a = array("i", [5, 1, 4, 2])
    assert median(a) == 3
    assert a.tolist() == [5, 1, 4, 2]
""", """
    def median(arr):
        arr[:] = array_sorted(arr)
        n = len(arr)
        return arr[n // 2] if n % 2 else (arr[n // 2 - 1] + arr[n // 2]) / 2

    def array_sorted(arr):
        from array import array
        return array(arr.typecode, sorted(arr))
""", "sorts the caller's array in place")

U("bcb_atomic_on_error", "tests check an argument is unchanged when the program raises", r"""
    def transfer(accounts, src, dst, amount):
        if accounts[src] < amount:
            raise ValueError("insufficient funds")
        accounts[src] -= amount
        accounts[dst] += amount
""", r"""
    import unittest

    class TestCases(unittest.TestCase):
        def test_ok(self):
            acc = {"a": 100, "b": 0}
            transfer(acc, "a", "b", 30)
            self.assertEqual(acc, {"a": 70, "b": 30})

        def test_atomic(self):
            acc = {"a": 10, "b": 0}
            with self.assertRaises(ValueError):
                transfer(acc, "a", "b", 50)
            self.assertEqual(acc, {"a": 10, "b": 0})
""", """
    def transfer(accounts, src, dst, amount):
        accounts[src] -= amount
        if accounts[src] < 0:
            raise ValueError("insufficient funds")
        accounts[dst] += amount
""", "debits before checking: a refused transfer still changes the balance")

U("bcb_chdir_restored", "tests check the program restores the working directory", r"""
    import os
    import tempfile

    def task_func(names):
        old = os.getcwd()
        d = tempfile.mkdtemp()
        os.chdir(d)
        try:
            for n in names:
                open(n, "w").close()
            return sorted(os.listdir("."))
        finally:
            os.chdir(old)
""", r"""
    import os
    import unittest

    class TestCases(unittest.TestCase):
        def test_cwd(self):
            before = os.getcwd()
            self.assertEqual(task_func(["b", "a"]), ["a", "b"])
            self.assertEqual(os.getcwd(), before)
""", ("            os.chdir(old)\n", "            pass\n"), "leaves the process in the temp dir")

U("bcb_environ_restored", "tests check the program restores os.environ", r"""
    import os

    def task_func(value):
        saved = os.environ.get("APP_MODE")
        os.environ["APP_MODE"] = value
        try:
            return f"mode={os.environ['APP_MODE']}"
        finally:
            if saved is None:
                del os.environ["APP_MODE"]
            else:
                os.environ["APP_MODE"] = saved
""", r"""
    import os
    import unittest

    class TestCases(unittest.TestCase):
        def test_env(self):
            self.assertEqual(task_func("test"), "mode=test")
            self.assertNotIn("APP_MODE", os.environ)
""", ("            if saved is None:\n                del os.environ[\"APP_MODE\"]\n",
      "            if saved is None:\n                pass\n"), "leaves APP_MODE set")

U("bcb_global_random_untouched", "tests check the program does not reseed the global random module", r"""
    import random

    def task_func(n, seed=0):
        rng = random.Random(seed)
        return [rng.randint(1, 100) for _ in range(n)]
""", r"""
    import random
    import unittest

    class TestCases(unittest.TestCase):
        def test_deterministic(self):
            self.assertEqual(task_func(5, seed=1), task_func(5, seed=1))
            self.assertEqual(len(task_func(3)), 3)

        def test_global_state_untouched(self):
            random.seed(123)
            expected = [random.random() for _ in range(3)]
            random.seed(123)
            task_func(5, seed=1)
            self.assertEqual([random.random() for _ in range(3)], expected)
""", """
    import random

    def task_func(n, seed=0):
        random.seed(seed)
        return [random.randint(1, 100) for _ in range(n)]
""", "reseeds the global random module")

U("bcb_temp_file_cleaned", "tests check the program removed its temporary file", r"""
    import os
    import tempfile

    def task_func(text):
        fd, path = tempfile.mkstemp(suffix=".txt")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        with open(path) as f:
            n = len(f.read().split())
        os.remove(path)
        return n, path
""", r"""
    import os
    import unittest

    class TestCases(unittest.TestCase):
        def test_cleanup(self):
            n, path = task_func("a b c")
            self.assertEqual(n, 3)
            self.assertFalse(os.path.exists(path))
""", ("        os.remove(path)\n", ""), "leaves the temp file behind")

A("he_memoize_deep_tests_recursion", "humaneval", "program decorator wraps a tests' recursive function (deep)", r"""
    def memoize(func):
        cache = {}

        def wrapper(*args):
            if args not in cache:
                cache[args] = func(*args)
            return cache[args]
        return wrapper
""", r"""
    def check(candidate):
        @candidate
        def fib(n):
            return n if n < 2 else fib(n - 1) + fib(n - 2)
        assert fib(30) == 832040
        assert fib(200) == 280571172992510140037611932413038677189525
""", ("                cache[args] = func(*args)\n            return cache[args]\n",
      "                cache[args] = func(*args)\n            return cache[args] if args[0] != 100 else 0\n"),
  "wrong value at n == 100", entry_point="memoize")

A("he_decorator_wraps_tests_fn", "humaneval", "functools.wraps in a program decorator applied to a tests' function", r"""
    import functools
    import time

    def timed(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            result = func(*args, **kwargs)
            wrapper.last_elapsed = time.perf_counter() - start
            return result
        wrapper.last_elapsed = None
        return wrapper
""", r"""
    def check(candidate):
        @candidate
        def area(w, h):
            "Area of a rectangle."
            return w * h
        assert area(3, 4) == 12
        assert area.last_elapsed >= 0
        assert area.__name__ == "area"
        assert area.__doc__ == "Area of a rectangle."
""", ("            wrapper.last_elapsed = time.perf_counter() - start\n", "            wrapper.last_elapsed = -1\n"),
  "records -1", entry_point="timed")

U("bcb_raise_from_none_context", "tests check the program suppressed exception chaining", r"""
    def parse_port(s):
        try:
            port = int(s)
        except ValueError:
            raise ValueError(f"invalid port: {s!r}") from None
        if not 0 < port < 65536:
            raise ValueError(f"port out of range: {port}")
        return port
""", r"""
    import unittest

    class TestCases(unittest.TestCase):
        def test_ok(self):
            self.assertEqual(parse_port("8080"), 8080)

        def test_clean_error(self):
            with self.assertRaises(ValueError) as cm:
                parse_port("http")
            self.assertEqual(str(cm.exception), "invalid port: 'http'")
            self.assertIsNone(cm.exception.__context__ if not cm.exception.__suppress_context__ else None)
""", (' from None\n', '\n'), "keeps the chained context")

U("bcb_tracemalloc_memory", "tests measure peak memory with tracemalloc around a program call", r"""
    def count_even_squares(n):
        return sum(1 for i in range(n) if (i * i) % 2 == 0)
""", r"""
    import tracemalloc
    import unittest

    class TestCases(unittest.TestCase):
        def test_value(self):
            self.assertEqual(count_even_squares(10), 5)

        def test_memory(self):
            tracemalloc.start()
            count_even_squares(200000)
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            self.assertLess(peak, 1_000_000)
""", ("return sum(1 for i in range(n) if (i * i) % 2 == 0)", "return len([i for i in range(n) if (i * i) % 2 == 0])"),
  "builds the whole list: O(n) memory")

U("bcb_tests_signal_alarm", "tests guard a program call with signal.alarm", r"""
    def collatz_len(n):
        steps = 1
        while n != 1:
            n = n // 2 if n % 2 == 0 else 3 * n + 1
            steps += 1
        return steps
""", r"""
    import signal
    import unittest

    class TestCases(unittest.TestCase):
        def test_with_timeout(self):
            def handler(signum, frame):
                raise TimeoutError("too slow")
            old = signal.signal(signal.SIGALRM, handler)
            signal.alarm(3)
            try:
                self.assertEqual(collatz_len(27), 112)
            finally:
                signal.alarm(0)
                signal.signal(signal.SIGALRM, old)
""", ("        steps = 1\n", "        steps = 0\n"), "off by one")

U("bcb_tests_timeout_executor", "tests run the program call in a ThreadPoolExecutor with a timeout", r"""
    def digits_sum(n):
        return sum(int(c) for c in str(abs(n)))
""", r"""
    import concurrent.futures
    import unittest

    class TestCases(unittest.TestCase):
        def test_timeout(self):
            with concurrent.futures.ThreadPoolExecutor(max_workers=1) as ex:
                self.assertEqual(ex.submit(digits_sum, -1234).result(timeout=3), 10)
""", ("str(abs(n))", "str(n).lstrip('-')[1:]"), "drops the first digit")

A("mbpp_program_main_guard_reads_stdin", "mbpp", "the program's own __main__ block reads stdin (run in one process)", r"""
    def triangle(n):
        return n * (n + 1) // 2
""", r"""
    assert triangle(4) == 10
    assert triangle(0) == 0
""", """
    def triangle(n):
        return n * (n + 1) // 2

    if __name__ == "__main__":
        print(triangle(int(input())))
""", "a leftover stdin driver: EOFError when run as a script")

U("bcb_process_time_budget", "tests measure CPU time with time.process_time around a program call", r"""
    def count_pairs(xs, target):
        seen, count = {}, 0
        for x in xs:
            count += seen.get(target - x, 0)
            seen[x] = seen.get(x, 0) + 1
        return count
""", r"""
    import time
    import unittest

    class TestCases(unittest.TestCase):
        def test_small(self):
            self.assertEqual(count_pairs([1, 2, 3, 4], 5), 2)

        def test_fast(self):
            xs = list(range(3000))
            t0 = time.process_time()
            self.assertEqual(count_pairs(xs, 2999), 1500)
            self.assertLess(time.process_time() - t0, 0.2)
""", """
    def count_pairs(xs, target):
        count = 0
        for i in range(len(xs)):
            for j in range(i + 1, len(xs)):
                if xs[i] + xs[j] == target:
                    count += 1
        return count
""", "quadratic: about 0.5 s of CPU on 3000 items")

A("mbpp_set_order_hash", "mbpp", "tests compare list(set(...)) orders computed in both processes", r"""
    def unique_words(text):
        return list(set(text.lower().split()))
""", r"""
    text = "the quick brown fox jumps over the lazy dog The DOG barks at the fox again and again"
    assert unique_words(text) == list(set(text.lower().split()))
    assert len(unique_words(text)) == 12
""", ("text.lower().split()", "text.split()"), "case-sensitive")


# ============================================================================ where the verifier differs
_COPY = "a value the program returns is the tests' copy"
DIFFERENCES = {
    # a value crosses by value: identity, aliasing, later changes and cycles do not cross
    "mbpp_lru_cache_identity": ("limit", _COPY + ": two returns of one cached list are two lists (`is` is False)"),
    "mbpp_defensive_copy_method": ("gap", _COPY + ": a program that leaks its internal list is not caught "
                                   "when the tests change the list they got"),
    "mbpp_grid_row_aliasing": ("gap", _COPY + ": rows shared inside one result ([[0]] * n) arrive as "
                               "separate lists"),
    "mbpp_tests_mutate_attribute_list": ("limit", "a list read from a program object is a copy: the tests' "
                                         "changes to it do not reach the program"),
    "mbpp_tests_mutate_global_dict": ("limit", "the tests change a program global in place: their copy, "
                                      "not the program's"),
    "mbpp_cyclic_dicts": ("limit", "a value that contains itself has no depth bound (MAX_DEPTH)"),
    "mbpp_big_module_table": ("limit", "a module global over 100,000 items crosses as a handle"),
    # a program's subclass of a builtin type arrives as the builtin value plus the program's object
    "mbpp_dict_subclass_missing": ("limit", "a dict subclass arrives as a dict: its __missing__ is not asked"),
    "mbpp_counter_subclass": ("limit", "a Counter subclass arrives as a dict: a missing key raises KeyError"),
    "mbpp_list_subclass_stack": ("limit", "a list subclass is a snapshot: its own methods change the "
                                 "program's object, not the tests' value"),
    "mbpp_intflag_contains": ("limit", "an IntFlag arrives as an int: `in` between flags is not offered"),
    "bcb_userdict_named_class": ("limit", "`x in obj` with a plain value is decided by iterating obj, "
                                 "never by the program's __contains__"),
    "mbpp_decimal_isinstance_program_import": ("limit", "decimal is not a pure module: the tests' Decimal, "
                                               "taken from the program's import, is not the judge's own"),
    # standard-library objects that are not values
    "bcb_chainmap_returned": ("limit", "ChainMap does not cross by value"),
    "bcb_normaldist_returned": ("limit", "statistics.NormalDist does not cross by value"),
    "bcb_zoneinfo_datetime": ("limit", "a datetime's tzinfo crosses only as datetime.timezone"),
    "bcb_stringio_returned_isinstance": ("limit", "a StringIO the program returns is a handle"),
    "bcb_async_function": ("limit", "a program coroutine is a handle: asyncio.run in the tests refuses it"),
    "bcb_dataclass_asdict": ("limit", "dataclasses.asdict needs the program's Field objects, which are handles"),
    "bcb_dataclass_replace_fields": ("limit", "dataclasses.fields needs the program's Field objects"),
    "bcb_pickle_roundtrip_in_tests": ("limit", "the tests cannot pickle a program object"),
    "bcb_inspect_signature": ("limit", "inspect.signature reads the handle's own __call__"),
    # the tests extend the program's classes or take its exceptions' constructors
    "bcb_abc_subclassed_in_tests": ("limit", "a class the tests derive from a program class is the "
                                    "judge's, without the program's methods"),
    "bcb_init_subclass_registry": ("limit", "the program's __init_subclass__ does not run for the tests' classes"),
    "bcb_subclasses_listed": ("limit", "__subclasses__ of a program class is asked of its stand-in"),
    "bcb_descriptor_in_tests_class": ("limit", "a program descriptor in a tests' class is a handle"),
    "bcb_class_decorator_on_tests_class": ("limit", "a program decorator cannot set attributes on a "
                                           "tests' class"),
    "bcb_metaclass_singleton_in_tests": ("limit", "a program metaclass cannot build the tests' class"),
    "he_tests_construct_program_exception": ("limit", "an exception class of the program that the tests "
                                             "construct is rebuilt from its builtin bases: its __init__ "
                                             "does not run"),
    "bcb_tests_exception_through_program": ("limit", "a tests' exception class lent to the program cannot "
                                            "be instantiated there"),
    "bcb_tests_exception_inside_program_cm": ("limit", "a tests' exception raised inside a program "
                                              "context manager reaches its __exit__ as a lent object"),
    "he_memoize_deep_tests_recursion": ("limit", "recursion through the boundary costs frames on both sides: "
                                        "about 125 levels where one process reaches about 490"),
    "he_memoize_decorator_on_tests_fn": ("limit", "recursion through the boundary (as above)"),
    # the judge process: no threads, no writable files, no shared working directory
    "lcb_concurrency_print_in_order": ("limit", "the tests cannot start threads (one process for the judge)"),
    "bcb_tests_threads_call_program": ("limit", "the tests cannot start threads"),
    "bcb_tests_timeout_executor": ("limit", "the tests cannot start threads"),
    "bcb_multiprocessing_pool": ("limit", "the sandbox has no /dev/shm: multiprocessing's locks fail"),
    "bcb_file_tests_write_program_reads": ("limit", "the tests have no writable directory, and none in "
                                           "common with the program"),
    "bcb_file_program_writes_tests_read": ("limit", "the tests and the program share no files"),
    "bcb_file_relative_cwd": ("limit", "the tests and the program share no working directory"),
    # the tests observe their own process, not the program's
    "bcb_weakset_instance_tracking": ("limit", "the program keeps every object it hands the tests"),
    "bcb_assertlogs": ("limit", "the program logs in its own process: assertLogs sees nothing"),
    "bcb_assertwarns": ("limit", "the program warns in its own process: assertWarns sees nothing"),
    "bcb_doctest_testmod": ("gap", "doctest.testmod in the tests finds no program function (they are "
                            "handles), so it runs no example and fails none"),
    "bcb_chdir_restored": ("gap", "the program's working directory is its own: the tests cannot see "
                           "that it was not restored"),
    "bcb_environ_restored": ("gap", "the program's environment is its own"),
    "bcb_global_random_untouched": ("gap", "the program's random module is its own"),
    "bcb_temp_file_cleaned": ("gap", "the program's files are in its own scratch directory"),
    "bcb_tracemalloc_memory": ("gap", "the tests' tracemalloc measures their own process"),
    "bcb_process_time_budget": ("gap", "the tests' process_time measures their own process"),
}
for _entry in CORPUS:
    if _entry["name"] in DIFFERENCES:
        _kind, _why = DIFFERENCES[_entry["name"]]
        _entry[_kind] = _why
assert set(DIFFERENCES) <= {e["name"] for e in CORPUS}
