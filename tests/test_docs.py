"""The documentation points at things that exist: README.md and every docs/*.md.

Run: python -m pytest -q tests/test_docs.py        (under a second; no jax, nothing started)

What must hold, for each page:
  - every relative markdown link [text](path) or [text](path#anchor) (images too) names a file or
    folder of the repository, and an #anchor into a .md page names one of its headings (GitHub's slugs);
  - every `file.py:name` (or `file.py:Class.method`) names a file that exists and, in it, a function, a
    class or a module-level assignment (read with ast, nothing imported); every `file.py::test_name`
    (a pytest node id) names a test function of that file;
  - every path in backticks that looks like a repository file (.py, .sh, .md, .txt, .json, .png), and
    every .py/.sh path in a fenced code block, exists, except the generated outputs listed in GENERATED;
  - README.md starts with the two commands and has at most README_MAX_LINES lines, and its two
    `MODEL=... bash launch.sh` lines (which tests/test_real_model.py runs) equal docs/real-models.md's.
The checks are functions of a root directory, so test_a_broken_reference_fails runs them on a scratch
tree with one broken reference of each kind and checks that each is reported.
"""
import ast
import functools
import glob
import os
import re

from conftest import ROOT

README_MAX_LINES = 260
FIRST_LINES = ["```bash",
               "pip install -r requirements.txt && bash launch.sh",
               "pip install -r requirements-test.txt && python -m pytest -q tests"]
# Names the docs mention that a run writes, or that belong to other software: never in the repository.
GENERATED = {
    "commands.sh",               # $RUN_DIR/commands.sh, written by launch.sh
    "restarts.json",             # $RUN_DIR/restarts.json, written by launch.sh
    "accelerator_check.json",    # written by bench/accelerator_check.sh
    "curves.png",                # written by plot.py next to metrics.jsonl
    "config.json",               # any Hugging Face checkpoint's (the docs name the file, not one path)
    "tokenizer.json",            # likewise
    "keep.txt",                  # written by curate.py into its --out folder
    "model.safetensors.index.json",  # likewise, for sharded checkpoints
}
GENERATED_PREFIXES = ("$RUN_DIR/", "runs/", "out/", "DIR/", "keys/")  # a run's outputs; user-made folders

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
REF = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w-]+\.py):(:?)([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
FENCE = re.compile(r"^(```+|~~~+).*?^\1[ \t]*$", re.M | re.S)
PATH_SUFFIXES = (".py", ".sh", ".md", ".txt", ".json", ".png")
PATH_TOKEN = re.compile(r"^[\w.$/<>*-]+$")


def pages(root: str) -> list[str]:
    found = [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "*.md")))
    return [p for p in found if os.path.isfile(p)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())  # a link keeps its text
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: str) -> set[str]:
    text = FENCE.sub("", open(path, encoding="utf-8").read())
    seen, out = {}, set()
    for line in text.splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            out.add(s if n == 0 else f"{s}-{n}")
            seen[s] = n + 1
    return out


@functools.lru_cache(maxsize=None)
def definitions(path: str) -> tuple[frozenset, dict]:
    """Module-level names of a Python file (functions, classes, assignments, also under if/try), and
    each class's own names (methods, class attributes)."""
    tree = ast.parse(open(path, encoding="utf-8").read(), filename=path)

    def names(body) -> set:
        out = set()
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.add(node.name)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    out |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                out.add(node.target.id)
            elif isinstance(node, (ast.If, ast.Try)):
                out |= names(node.body) | names(node.orelse)
                out |= names(getattr(node, "finalbody", []))
                for handler in getattr(node, "handlers", []):
                    out |= names(handler.body)
        return out

    classes = {n.name: names(n.body) for n in tree.body if isinstance(n, ast.ClassDef)}
    return frozenset(names(tree.body)), classes


def resolve(root: str, page: str, target: str) -> str | None:
    """The file a path names: relative to the page's folder (links), else to the repository root."""
    for base in (os.path.dirname(page), root):
        path = os.path.normpath(os.path.join(base, target))
        if os.path.exists(path):
            return path
    return None


def check_links(root: str, page: str) -> list[str]:
    errors = []
    text = FENCE.sub("", open(page, encoding="utf-8").read())
    text = CODE_SPAN.sub("", text)
    for m in LINK.finditer(text):
        target = m.group(1)
        if re.match(r"^(https?:|mailto:)", target):
            continue
        path, _, anchor = target.partition("#")
        found = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if not os.path.exists(found):
            errors.append(f"link to {target}: no such file")
        elif anchor and found.endswith(".md") and anchor not in anchors(found):
            errors.append(f"link to {target}: no heading with the anchor #{anchor}")
    return errors


def check_refs(root: str, page: str) -> list[str]:
    errors = []
    text = open(page, encoding="utf-8").read()
    for m in REF.finditer(text):
        file, pytest_id, name = m.groups()
        user_file = file in ("file.py", "path/to/file.py") or \
            re.search(r"(REWARD=|--reward )$", text[max(0, m.start() - 9):m.start()])
        if user_file:  # a reward function's file.py:function names the user's file, not one of ours
            continue
        path = resolve(root, page, file)
        if path is None:
            errors.append(f"{m.group(0)}: no file {file}")
            continue
        top, classes = definitions(path)
        if pytest_id:
            ok = name in top and name.startswith("test")
        elif "." in name:
            cls, attr = name.split(".", 1)
            ok = attr in classes.get(cls, ())
        else:
            ok = name in top
        if not ok:
            errors.append(f"{m.group(0)}: {file} defines no {name}")
    return errors


def path_tokens(text: str) -> list[str]:
    """What looks like a repository file: in code spans, any token ending in one of PATH_SUFFIXES; in
    fenced blocks, .py and .sh tokens (the scripts a command runs)."""
    tokens = []
    for block in FENCE.finditer(text):
        for token in re.split(r"[\s\"'=();|&<>]+", block.group(0)):
            if token.endswith((".py", ".sh")) and PATH_TOKEN.match(token):
                tokens.append(token)
    for span in CODE_SPAN.finditer(FENCE.sub("", text)):
        for token in re.split(r"[\s\"'=(),;|&]+", span.group(2)):
            token = token.rstrip(".:,")
            if token.endswith(PATH_SUFFIXES) and PATH_TOKEN.match(token):
                tokens.append(token)
    return tokens


def check_paths(root: str, page: str) -> list[str]:
    errors = []
    for token in path_tokens(open(page, encoding="utf-8").read()):
        if (token in GENERATED or token.startswith(GENERATED_PREFIXES) or "*" in token or "<" in token
                or token.startswith(("/", "$"))):
            continue
        if resolve(root, page, token) is None:
            errors.append(f"`{token}`: no such file")
    return errors


def readme_model_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("MODEL=") and "bash launch.sh" in line]


def check_readme(root: str) -> list[str]:
    text = open(os.path.join(root, "README.md"), encoding="utf-8").read()
    lines, errors = text.splitlines(), []
    if lines[:3] != FIRST_LINES or lines[3:4] != ["```"]:
        errors.append(f"README.md must start with the two commands, exactly: {FIRST_LINES}")
    if len(lines) > README_MAX_LINES:
        errors.append(f"README.md has {len(lines)} lines, more than {README_MAX_LINES}")
    real = os.path.join(root, "docs", "real-models.md")
    if os.path.exists(real) and readme_model_lines(text) != readme_model_lines(open(real, encoding="utf-8").read()):
        errors.append("README.md's MODEL=... lines differ from docs/real-models.md's")
    return errors


def all_errors(root: str) -> list[str]:
    errors = [f"README.md: {e}" for e in check_readme(root)]
    for page in pages(root):
        name = os.path.relpath(page, root)
        for check in (check_links, check_refs, check_paths):
            errors += [f"{name}: {e}" for e in check(root, page)]
    return errors


def test_docs_point_at_things_that_exist():
    errors = all_errors(ROOT)
    assert not errors, "\n".join(errors)


def test_a_broken_reference_fails(tmp_path):
    """The negative control: one broken reference of each kind in a scratch tree, each reported."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "mod.py").write_text("X = 1\n\nclass C:\n    def m(self):\n        pass\n\ndef f():\n    pass\n")
    (tmp_path / "test_x.py").write_text("def test_one():\n    pass\n")
    (tmp_path / "launch.sh").write_text("")  # the README's first command runs it
    (tmp_path / "docs" / "a.md").write_text("# Title\n\n## A section\n")
    good = ("[ok](docs/a.md#a-section) [web](https://example.com) `mod.py:X` mod.py:f `mod.py:C.m` "
            "`test_x.py::test_one` `$RUN_DIR/metrics.json` `commands.sh`")
    bad = ("[gone](docs/missing.md) [anchor](docs/a.md#no-such-section) ![img](docs/figures/none.png) "
           "`mod.py:g` `mod.py:C.n` `nofile.py:f` `test_x.py::test_two` `bench/nothing.py`\n"
           "```bash\npython tools/absent.py\n```\n")
    readme = "\n".join(FIRST_LINES + ["```", "", good, ""])
    (tmp_path / "README.md").write_text(readme)
    assert all_errors(str(tmp_path)) == []
    (tmp_path / "README.md").write_text(readme + bad + "\n" * README_MAX_LINES)
    errors = "\n".join(all_errors(str(tmp_path)))
    for what in ("docs/missing.md", "#no-such-section", "docs/figures/none.png", "mod.py:g", "mod.py:C.n",
                 "nofile.py:f", "test_x.py::test_two", "bench/nothing.py", "tools/absent.py", "more than"):
        assert what in errors, (what, errors)
    (tmp_path / "README.md").write_text("\n".join(["# No commands first"] + FIRST_LINES))
    assert "must start with the two commands" in "\n".join(all_errors(str(tmp_path)))
