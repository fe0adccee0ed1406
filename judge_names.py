"""The tests' namespace in the judge: which name the tests see is the program's, and which the judge's own.

The judge (judge.py) runs the tests in a namespace it builds itself: its own builtins, its own
imports of standard modules, and the program's top-level names as values or handles. The program's
names shadow builtins and module names as in one process, except where that would let a program
redefine what the tests use to judge it:
  bind_program_names  a builtin-named function is the tests' only when it is the function under test;
                      a module-named one only when the tests do not use it as a module; a name the
                      tests both need and the program shadows with no way to tell which is meant is
                      AmbiguousName, and a standard object bound under another standard name the
                      tests use (`from operator import truth as Counter`) is ForgedName: both the
                      program's failure.
  judge_imports       the judge imports a module the program imported only if it is pure
                      (boundary.PURE_MODULES), by name, itself.
  TestNames           what the tests' code does with names (read, called, used as a module), read
                      from their AST once, and only when a program name shadows a builtin or module.
trusted_names (and standard_names, under it) tells curate.py which standard names a dataset's tests
use without importing them, trusting the program to supply them.
"""
import ast
import builtins
import importlib
import sys
import types

from boundary import PURE_MODULES, resolve_named
from verdicts import BoundaryError

BUILTIN_NAMES = frozenset(dir(builtins))


class AmbiguousName(Exception):
    """The program shadows a builtin the tests may use to judge it, and nothing says which it is."""


class ForgedName(Exception):
    """The program binds a standard object under a name the standard library uses for another one
    (`from operator import truth as Counter`), and the tests use that name: refused (_forged_name)."""


class TestNames:
    """What the tests' code does with names: every name it reads (loads), the names it reads an
    attribute of (attr_hosts: `math.isclose` uses math as a module), and the names it calls on
    another call of the program (helpers: `abs(f(x) - y)`, `sorted(g(x))` judge f's and g's results)."""

    @classmethod
    def from_superset(cls, names: set) -> "TestNames":
        """Without parsing: when the program has no name of a builtin or a module, the names the
        tests' code mentions are enough (judge_imports)."""
        used = cls.__new__(cls)
        used.loads, used.attr_hosts, used.helpers = names, set(), set()
        return used

    def __init__(self, tree: ast.AST, program_names: set):
        self.loads, self.attr_hosts, self.helpers = set(), set(), set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                self.loads.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                self.attr_hosts.add(node.value.id)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and any(_calls_program(arg, program_names) for arg in [*node.args, *node.keywords]):
                self.helpers.add(node.func.id)


def _calls_program(tree: ast.AST, program_names: set) -> bool:
    """Whether an expression calls one of the program's names (`f(3)`, `obj.area()` on a program name)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            root = node.func
            while isinstance(root, (ast.Attribute, ast.Call, ast.Subscript)):
                root = root.func if isinstance(root, ast.Call) else root.value
            if isinstance(root, ast.Name) and root.id in program_names:
                return True
    return False


def bound_by_tests(tree: ast.AST) -> set:
    """Every name the tests bind anywhere: assigned, a loop or with or except target, imported,
    defined, declared global: the tests' own, never updated from the program (_Channel.update_globals)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).partition(".")[0] for a in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            names.update(node.names)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            names.add(node.name)
    return names


def checked_name(tree: ast.AST) -> str | None:
    """NAME in the tests' top-level `check(NAME)`: HumanEval's tests as training jobs send them (the
    entry point called at the end), read as the job's entry point."""
    for node in getattr(tree, "body", []):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name) \
                and node.value.func.id == "check" and len(node.value.args) == 1 \
                and isinstance(node.value.args[0], ast.Name):
            return node.value.args[0].id
    return None


def code_names(code: types.CodeType) -> set:
    """Every name the compiled tests mention (globals, attributes, locals' names aside)."""
    names, stack = set(), [code]
    while stack:
        c = stack.pop()
        names.update(c.co_names)
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return names


def judge_imports(imports, wanted: set) -> dict:
    """What the tests may use of the program's imports ({name: [module, attribute]} from its hello),
    as the usual harnesses allow (`math.isclose`, `Counter`), built by the judge alone: it imports
    each module itself, by name: a standard-library module under its own name (`import sys`) or, under
    any name, a module of PURE_MODULES (`import re as regex`) or a public name of one
    (resolve_named). Only the names the tests use (wanted) are imported. Malformed or disallowed
    entries are skipped (a test using one gets NameError: the program's failure)."""
    out = {}
    if type(imports) is not dict:
        return out
    for name, origin in list(imports.items())[:256]:
        if name not in wanted or type(name) is not str or not name.isidentifier() or name.startswith("__") \
                or type(origin) is not list or len(origin) != 2 or not all(type(s) is str for s in origin):
            continue
        module, attr = origin
        try:
            if not attr:
                if module in PURE_MODULES or (name == module.partition(".")[0] and module in sys.stdlib_module_names
                                              and module.isidentifier()):
                    out[name] = importlib.import_module(name if name == module.partition(".")[0] else module)
            else:
                out[name] = resolve_named([module, attr], True)
        except (BoundaryError, ImportError):
            continue
    return out


# Modules whose public names tests commonly use without importing them (`Counter`, `isclose`,
# `defaultdict`): a standard object the program binds under one of those names must be that object.
_TRUSTED_HOMES = (*sorted(PURE_MODULES), "decimal", "random", "typing")
_standard: tuple[dict, dict] | None = None


def standard_names() -> tuple[dict[str, tuple[list, set]], dict[int, str]]:
    """({name: (where it is defined, ids of the objects it stands for)}, {id: a name} of every
    standard object): each public name of _TRUSTED_HOMES and each of those modules' own name (for the
    module), and among the objects also every builtin."""
    global _standard
    if _standard is None:
        names: dict[str, tuple[list, set]] = {}
        objects = {id(v): n for n, v in vars(builtins).items()}
        for home in _TRUSTED_HOMES:
            module = importlib.import_module(home)
            names.setdefault(home, ([], set()))[0].append(home)
            names[home][1].add(id(module))
            for name, value in vars(module).items():
                if not name.startswith("_") and (callable(value) or isinstance(value, types.ModuleType)):
                    names.setdefault(name, ([], set()))[0].append(f"{home}.{name}")
                    names[name][1].add(id(value))
                    objects.setdefault(id(value), f"{home}.{name}")
        _standard = names, objects
    return _standard


def _forged_name(name: str, value) -> str | None:
    """Why binding `value` under `name` forges a name the tests may rely on, or None: a standard
    object (one the judge resolved: a builtin, a pure module's function or class, a module) under
    the name of a different standard object. A program's own function under such a name is its own,
    as in one process (`python curate.py check` warns about tests that trust it). Builtins' names
    have their own rule (bind_program_names)."""
    names, objects = standard_names()
    if name not in names or name in BUILTIN_NAMES or id(value) in names[name][1]:
        return None
    if not isinstance(value, types.ModuleType) and id(value) not in objects:
        return None  # the program's own object (a Handle, a value): never asked anything here
    what = value.__name__ if isinstance(value, types.ModuleType) else objects[id(value)]
    return (f"the program binds {what} under the name {name}, which stands for "
            f"{' or '.join(names[name][0])}: a name the tests use must be what it says")


def trusted_names(tests: str) -> list[str]:
    """The standard names (standard_names: `Counter`, `isclose`, `math`) the tests judge with but
    neither import nor define: applied to another call's result (`Counter(words(s))`) or used as a
    module (`math.sqrt`). They take the program's, whatever it binds there (`python curate.py check`
    warns). The function under test (`add(2, 3)`, the NAME of `check(NAME)`) is the program's by design."""
    tree = ast.parse(tests)
    judging = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and any(
                isinstance(sub, ast.Call) for arg in [*node.args, *(k.value for k in node.keywords)]
                for sub in ast.walk(arg)):
            judging.add(node.func.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            judging.add(node.value.id)
    judging -= bound_by_tests(tree) | {checked_name(tree)}
    return sorted(n for n in judging if n in standard_names()[0] and n not in BUILTIN_NAMES)


def bind_program_names(ns: dict, values: dict, imports: dict, used: TestNames, entry_point) -> None:
    """Bind the program's names for the tests as one process would, except where that would let the
    program redefine what the tests use to judge it:
      a builtin's name (`def max`, `from math import pow`) is the program's when it is the entry
      point or, without one, when the tests never call it on a result of the program (the function
      under test: `assert pow(2, 3) == 8`); a name the tests apply to another call of the program
      (`abs(f(x) - y)`, `sorted(g(x))`, `len(h())`) stays Python's, since there it judges that
      call's result and the program could replace it with one that always agrees;
      a standard-library module's name (`def tokenize`, `check(fnmatch)`) is the program's callable
      unless the tests use it as a module (`math.isclose`: then it is the judge's import of that
      module, if the program imported it, or undefined);
      every other name is the program's (a value, a name the judge resolves, or a Handle), and the
      program's imports of standard modules are the judge's own imports (judge_imports);
      but a standard object under the name of another (`from operator import truth as Counter`,
      `import cmath as math`) that the tests use, other than the function under test, is refused:
      ForgedName, the program's failure (_forged_name)."""
    program = {**values, **imports}
    for name in sorted(program.keys() & used.loads - {entry_point}):
        if (why := _forged_name(name, program[name])) is not None:
            raise ForgedName(why)
    under_test = {n for n, v in program.items() if n in used.loads and n not in used.helpers and callable(v)
                  and not isinstance(v, types.ModuleType)}
    shadowing = {n for n in under_test if n in BUILTIN_NAMES}
    if entry_point is None and shadowing and len(under_test) > 1:
        raise AmbiguousName(f"the program defines {', '.join(sorted(shadowing))}, named like a builtin, and the "
                            f"tests use other functions of it too ({', '.join(sorted(under_test - shadowing))}): "
                            "the judge cannot tell the function under test from a builtin the tests apply "
                            "(name the entry point, or rename it)")
    for name, value in program.items():
        if name in BUILTIN_NAMES:
            if name != entry_point and (entry_point is not None or name not in shadowing):
                continue
        elif name in sys.stdlib_module_names and name != entry_point and not isinstance(value, types.ModuleType):
            if name in used.attr_hosts or not callable(value):
                continue
        ns[name] = value
