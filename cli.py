"""Build a command line from a config dataclass, CleanRL-style: the docstring under each field is its help.

    @dataclass
    class Args:
        lr: float = 1e-4
        \"\"\"learning rate (eta)\"\"\"

    args = parse(Args)            # --lr 3e-4 ; bools get --flag / --no-flag

Every role's config is one such dataclass, validated in its __post_init__, so a bad value stops the role
at start-up with a clear message instead of failing later.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import textwrap
import typing


def field_docs(cls) -> dict[str, str]:
    """The string literal under each annotated field of a dataclass, by field name; a field a base
    dataclass defines has the base's (a subclass's own docstring wins)."""
    docs = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            docs.update(_own_field_docs(klass))
    return docs


def _own_field_docs(cls) -> dict[str, str]:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):  # defined where no source exists (a REPL): no help texts
        return {}
    body, docs = tree.body[0].body, {}
    for node, after in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def parse(*classes, argv: list[str] | None = None, description: str | None = None):
    """Parse argv into one instance of each config class (flags of all classes in one namespace; names
    must not collide). A ValueError from a class's validation becomes a usage error. Returns one
    instance for one class, else a tuple."""
    parser = argparse.ArgumentParser(description=description or (classes[0].__doc__ or "").strip(),
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    for cls in classes:
        group = parser.add_argument_group(cls.__name__, (cls.__doc__ or "").strip().splitlines()[0])
        docs, hints = field_docs(cls), typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            flag, kind = "--" + f.name.replace("_", "-"), hints[f.name]
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            if kind is bool:
                group.add_argument(flag, action=argparse.BooleanOptionalAction, default=default,
                                   help=docs.get(f.name, "").replace("%", "%%"))
                continue
            args = typing.get_args(kind)
            if type(None) in args:  # Optional[X]: take X
                kind = next(a for a in args if a is not type(None))
            group.add_argument(flag, type=kind, default=default, help=docs.get(f.name, "").replace("%", "%%"))
    namespace = parser.parse_args(argv)
    out = []
    for cls in classes:
        try:
            out.append(cls(**{f.name: getattr(namespace, f.name) for f in dataclasses.fields(cls)}))
        except ValueError as e:
            parser.error(str(e))
    return out[0] if len(out) == 1 else tuple(out)
