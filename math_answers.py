"""math_answers.py: how a math completion's final answer is read and graded, as the dataset's own grader
reads it (GSM8K's "#### n", MATH's \\boxed{...}, MATH-500's answer).

The verdict's reward is the training signal: a policy learns to write whatever scores 1. So an answer is
read as its dataset means it, and one that could be read as two answers is read as none: `#### 4 or 5`,
`#### 4-5`, `\\boxed{4 \\text{ or } 5}` and `\\boxed{7, 8}` score 0 whichever of their numbers is the
reference, or a policy would learn to hedge. So does an answer that qualifies itself or offers another in
words (`#### 40 or more`, `#### 4 or a couple`, `\\boxed{40 \\text{ (approx.)}}`): a qualified or
alternative answer is not the answer. The reading, in order:

  which text is the answer  what follows the last "</think>" (none while a "<think>" is open); in it the
                            last \\boxed{...} (MATH), else what follows the last "####" (GSM8K), else
                            the last number (extract_answer)
  a "####" answer           one number (hash_answers.py): the first number on the line, with the units and
                            currency around it, and nothing on the line that could be a second answer
                            or qualifies this one (hash_answers.qualifier); compared with the reference's number
                            exactly
  a boxed answer            put in one written form (_normalize, _strip_percent, _as_interval: thousands
                            separators and thin spaces, scientific notation, percent as a unit,
                            inequalities as intervals), then compared by Hugging Face's math-verify
                            (requirements-math.txt) as TRL and open-r1 compare: read into sympy as values
                            (1/2 = \\frac12 = 0.5, 90^\\circ = 90, 5\\text{ cm} = 5, intervals, sets,
                            expressions), the answer as LaTeX only (_parse), written as one answer
                            (_plain_notation: no two numbers side by side, _joined; brackets that
                            balance, _balanced; no words that qualify it or offer another, in any
                            script, _offers_more, _text_before_a_digit) and read whole
                            (_reads_every_number)
  a text reference          Yes, Monday, \\text{(C)}: compared as words (_words), since math-verify reads
                            "Yes" as the product of three symbols; several choices (\\text{A, C}) as a
                            set of letters, in any order (_letters)

Two readings are left as they are, on purpose:

  * A "####" line that does not start with the number, or holds more after it (`#### 6 x 3 = 18`,
    `#### Answer: 18`, `#### 1 000 000`, ``#### `18` ``), reads as none and scores 0, even where 18 is
    right. GSM8K's own grader (the regex `#### (\\-?[0-9\\.\\,]+)` of the dataset's reference code)
    reads the first number right after "#### ": 6, nothing, 1, nothing, never 18. A policy is rewarded
    for answering as the dataset asks, the number first and alone.
  * math-verify accepts a decimal that equals the reference once both are rounded to 6 decimal places
    (`\\boxed{1.414214}` is right for `\\sqrt2`, `1.4142` is not): that is its documented numeric
    tolerance (verify's float_rounding=6), as TRL and open-r1 use it, and a MATH answer is compared as
    they compare it. A stricter grader would refuse such approximations.

math_verdict is the verdict: "passed" (reward 1) when the answer in the format the prompt asked for is
right, "lenient" (reward 0) when only an answer found by the looser reading is, else "failed".
parse_reference reads a reference answer (the trainer reads every one at load, tasks.py) and
math_reference finds it in a GSM8K, MATH or MATH-500 row.

Every scan here is linear in the completion's length, and an answer longer than MAX_ANSWER_CHARS is
never read. math-verify's parsing can still be slow on purpose (nested parentheses take seconds in its
LaTeX grammar), so the verifier role runs math_verdict in a grading process killed at the job's time
limit (scorers.py: Scorer, _Grader). Standard library only, but for math-verify (the math extra), imported
when first needed: MathVerifyMissing, naming the extra, when it is not installed.

Run the tests:  python -m pytest -q tests/test_math_grading.py tests/test_envs.py (scorers.py)
"""
from __future__ import annotations

import dataclasses
import logging
import re
from fractions import Fraction

from hash_answers import NUMBER_WORD, UNIT_POWER, hash_number, qualifier

MATH_FORMATS = ("boxed", "hash")  # MATH's \boxed{...}; GSM8K's "#### answer"
MATH_EXTRA = "requirements-math.txt"
MAX_ANSWER_CHARS = 400  # longer final answers are refused unparsed: the completion's failure
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


class MathVerifyMissing(RuntimeError):
    """math-verify is not installed, so math rows cannot be graded."""


def math_verify_module():
    """Hugging Face's math-verify; MathVerifyMissing, naming the requirements file, when it is absent."""
    try:
        import math_verify
    except ImportError as e:
        raise MathVerifyMissing(f"math rows are graded with Hugging Face's math-verify, which is not installed "
                                f"({e}): pip install -r {MATH_EXTRA}") from None
    # its one warning says that the caller enforces the time limit, which the grading process's parent does
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    return math_verify


# ----------------------------------------------------------------------------- which text is the answer

def _final_text(completion: str) -> str | None:
    """The part of a completion that holds its answer: what follows the last "</think>" (a \\boxed{}
    in the reasoning is not the answer), or all of it when there is none; None while a "<think>" is
    open after that point (the reasoning never ended, so nothing was answered)."""
    end = completion.rfind(THINK_CLOSE)
    tail = completion if end < 0 else completion[end + len(THINK_CLOSE):]
    return None if THINK_OPEN in tail else tail


def _boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} (or \\fbox{...}), braces balanced; None if there is none."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth, j = 1, i
    while j < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        j += 1
    return text[i:j - 1].strip() if depth == 0 else None


def _after_hash(text: str) -> str | None:
    """What follows the last "####" up to the end of its line; None if there is none."""
    at = text.rfind("####")
    if at < 0:
        return None
    line = text[at + 4:].strip().split("\n")[0].strip()
    return line or None


# A number: sign (ASCII or U+2212), digits with optional thousands groups (a comma followed by exactly
# three digits), optional decimals, optional "/digits". Every part after the first digits starts with
# its own character and is optional, so the scan never backtracks: linear time. "42, done" gives 42.
_NUMBER = re.compile(r"[-\u2212]?(?:\d+(?:,\d{3}(?!\d))*(?:\.\d+)?|\.\d+)(?:/\d+)?")


def _last_number(text: str) -> str | None:
    found = None
    for found in _NUMBER.finditer(text):
        pass
    return found.group(0) if found else None


def extract_answer(text: str) -> tuple[str | None, str]:
    """(the final answer, how it was found): boxed, then "####", then the last number in the text."""
    for how, find in (("boxed", _boxed), ("hash", _after_hash), ("last_number", _last_number)):
        if (found := find(text)) is not None:
            return found, how
    return None, "none"


# ----------------------------------------------------------------------------- a boxed answer: math-verify

_SYMBOLS = str.maketrans({"\u2212": "-", "\u00d7": "\\times ", "\u00b7": "\\cdot ", "\u2264": "\\le ",
                          "\u2265": "\\ge ", "\u00b0": "^\\circ "})
# Separators that are never a list's comma: {,} ,\! \, \; \: \! "\ " ~ and the thin, narrow and
# no-break spaces. A plain comma is a thousands separator only when the reference is one number.
_THIN_SEPARATOR = r"\{,\}|,\\!|\\[,;:! ]|~|[\u2009\u202f\u00a0]"
_GROUPS = {commas: re.compile(r"(?<![\d.])\d{1,3}(?:(?:" + _THIN_SEPARATOR + ("|," if commas else "")
                              + r")\d{3})+(?!\d)") for commas in (False, True)}
_SCIENTIFIC = re.compile(r"(?<![\w.\\])(\d+(?:\.\d+)?|\.\d+)[eE]([-+]?\d{1,3})(?![\w.])")
_LOGICAL_OR = re.compile(r"\\(?:lor|vee)(?![A-Za-z])")
_PERCENT = re.compile(r"(?:\\?%|\\(?:text|mbox|mathrm)\{\s*(?:\\?%|percent)\s*\}|\bpercent)\s*\.?\s*$")
_RELATION = re.compile(r"(\\le(?:q(?:slant)?)?(?![A-Za-z])|\\ge(?:q(?:slant)?)?(?![A-Za-z])|\\[lg]t(?![A-Za-z])"
                       r"|<=?|>=?)")
_VARIABLE = re.compile(r"\s*(?:[A-DF-HJ-Za-df-hj-z]|\\(?!pi(?![A-Za-z])|infty(?![A-Za-z]))[A-Za-z]+)\s*")
_TEXT_COMMAND = re.compile(r"\\(?:text(?:bf|it|rm|sf|tt|normal|up)?|math(?:rm|bf|it|sf)|mbox|operatorname)"
                           r"\s*\{([^{}]*)\}")
_WORDS = re.compile(r"[A-Za-z]+(?:(?:\s+|['-])[A-Za-z]+)*")
# Text without a letter of any script: \text{5}, \mathrm{~}, \operatorname{ / }
_LETTERLESS_TEXT = re.compile(r"\\(?:text(?:bf|it|rm|sf|tt|normal|up)?|math(?:rm|bf|it|sf|tt)|mbox|operatorname)"
                              r"\s*\{((?:(?![^\W\d_])[^{}])*)\}")
# A number and its unit in one text: \text{5 cm}, \textbf{5 apples} (nothing numeric after the number)
_TEXT_NUMBER = re.compile(r"\\(?:text(?:bf|it|rm|sf|tt|normal|up)?|mathrm|mbox)\s*\{"
                          r"\s*([-\u2212]?(?:\d+(?:[.,]\d+)*|\.\d+))(\s*[^\W\d_](?:(?!\d)[^{}])*)\}")
_UNIT_SPACE = re.compile(r"~(?=\\(?:text|mathrm|mbox)(?![A-Za-z]))")  # 5~\text{cm}: a space before a unit
_SIZED = re.compile(r"\\[bB]igg?[lrm]?(?![A-Za-z])")  # \big/ \Big( \bigl[: the delimiter, sized
# A letter, as words are read in a boxed answer: of any script, but for the Greek letters of math (pi, theta)
_LETTER = r"[^\W\d_\u0391-\u03a9\u03b1-\u03c9]"
# A word before a digit: two or more letters, not a \command; or one letter beyond ASCII and math's Greek (the
# one-letter words of other scripts and languages: Chinese huo, Spanish o-acute, Portuguese e-acute)
_WORD = re.compile(r"(?<!\\)(?<!" + _LETTER + r")(?:" + _LETTER + r"{2,}|(?![A-Za-z])" + _LETTER + r")")
_ENVIRONMENT = re.compile(r"\\(?:begin|end)\{[A-Za-z*]*\}")  # \begin{pmatrix}: its name is no word
# "=" after a variable's or a function's name: x = 2, y = 3; x_1 = -1; \theta = 30^\circ; f(x) = 2x+3
_LABELLED_EQUALS = re.compile(r"(?<![\w\\])(?:[A-Za-z]|\\[A-Za-z]+)(?:_\{?\w{1,3}\}?)?"
                              r"(?:\(\s*[A-Za-z](?:\s*,\s*[A-Za-z])*\s*\))?\s*=")
_CONNECTIVE = re.compile(r"\\(?:text|mbox|mathrm)\{\s*(?:or|and)\s*\}|\b(?:or|and)\b")
# The notation of an answer: each \command, escaped symbol and sign (letters, digits, spaces aside).
_NOTATION_TOKEN = re.compile(r"\\(?:[A-Za-z]+|.)|[^\w\s]")
# Notation any answer may use: arithmetic, grouping, spacing, functions, constants, units and text. What
# math-verify reads by dropping all but one side (12 | 34, 12 \to 34, 12 \approx 34, 12 \\ 34,
# 12 \cup 34, 12 \dots 34 are each read as one of the two) is allowed only where the reference uses it, and
# so is \infty: math-verify's comparisons with it depend on what it compared before (\boxed{4\times\infty5}
# now and then equals 4 in a long-running grader).
_NOTATION = frozenset(["\\" + name for name in (
    "frac dfrac tfrac cfrac sqrt pi circ degree cdot times div left right big Big bigl bigr Bigl Bigr "
    "lfloor rfloor lceil rceil log ln lg exp sin cos tan sec csc cot arcsin arccos arctan sinh cosh tanh binom "
    "dbinom tbinom overline displaystyle textstyle text textbf textrm textit textsf texttt textup textnormal "
    "mathrm mathbf mathit mathbb mbox operatorname quad qquad alpha beta gamma delta epsilon varepsilon zeta "
    "eta theta vartheta iota kappa lambda mu nu xi rho sigma tau upsilon phi varphi chi psi omega Gamma Delta "
    "Theta Lambda Xi Pi Sigma Phi Psi Omega % $ , ; : !").split()]
    + ["\\ "] + list("+-*/^!()[]{}.,'~=\u221a"))  # "=": where _boxed_right allows it
# Also where the reference is no single number: sets, membership, plus-minus (compared as whole sets).
_COLLECTION_NOTATION = frozenset(["\\{", "\\}", "\\in", "\\pm", "\\mp", "\\emptyset", "\\varnothing"])


def _normalize(latex: str, commas: bool | None) -> str:
    """A boxed answer in one written form: typeset signs as LaTeX (U+2212 minus, U+00D7 times, U+2264,
    U+2265, the degree sign), text without letters as what it holds (`\\text{5}`, `\\mathrm{~}`,
    `\\operatorname{ / }`: 5, ~, /), a number and its unit in one text as the number and the unit
    (`\\text{5 cm}`: 5\\text{ cm}), a ~ before a unit as a space, a sized delimiter as the delimiter
    (`\\big/`, `\\Bigl(`: /, (), no final period, `\\lor` and `\\vee` as "or", digits in thousands
    groups as one number (12\\,300, 1{,}000, 10,\\!000: 12300, 1000, 10000; only when every group after
    the first has exactly three digits, so 12\\,30 and 1,2 stay), and scientific notation as a power of
    ten (1.5e3: 1.5\\times10^{3}; an exponent of at most three digits). commas: whether a plain comma
    between groups of three is a thousands separator (True: 12,300 is 12300, as when the reference is
    one number), a list's comma (False: 1,234 is the two numbers 1 and 234, as when the reference is a
    tuple, an interval or a set), or left as math-verify reads it (None: the reference itself)."""
    text = _SIZED.sub("", _LETTERLESS_TEXT.sub(r"\1", latex.translate(_SYMBOLS)))
    text = _LOGICAL_OR.sub(" or ", _TEXT_NUMBER.sub(r"\1\\text{\2}", text))
    text = _GROUPS[bool(commas)].sub(lambda m: re.sub(r"\D", "", m.group(0)), text)
    text = _UNIT_SPACE.sub(" ", text)
    if commas is False:
        text = re.sub(r"(?<=\d),(?=\d)", ", ", text)
    text = _SCIENTIFIC.sub(r"\1\\times10^{\2}", text).strip()
    return text[:-1].rstrip() if text.endswith(".") else text


def _strip_percent(latex: str) -> str:
    """The answer without a final percent sign (`40\\%`, `40%`, `40\\text{ percent}`: 40). A percent
    sign is read as a unit, as GSM8K and MATH write percentages: `#### 40%` answers "what percent"
    with gold 40, and `40` answers it with gold `40\\%`; so `4000\\%` is 4000 (never 40) and `0.4` is
    0.4 (never 40\\%)."""
    found = _PERCENT.search(latex)
    return latex[:found.start()].rstrip() if found else latex


def _as_interval(latex: str) -> str:
    """An inequality in one variable as the interval it describes (`2 \\le x \\le 5`: [2,5];
    `x \\ge 3`: [3,\\infty); `-1 < x \\le 2`: (-1,2]; `5 > x`: (-\\infty,5)); any other text as it is."""
    parts = _RELATION.split(latex)
    if len(parts) == 3 and _VARIABLE.fullmatch(parts[0]) and not _VARIABLE.fullmatch(parts[2]):
        low_side = parts[1].startswith(("\\g", ">"))  # x > b: b is the lower end
        bound = (parts[2], _strict(parts[1]))
        ends = (bound, None) if low_side else (None, bound)
    elif len(parts) == 3 and _VARIABLE.fullmatch(parts[2]) and not _VARIABLE.fullmatch(parts[0]):
        low_side = parts[1].startswith(("\\l", "<"))  # a < x: a is the lower end
        bound = (parts[0], _strict(parts[1]))
        ends = (bound, None) if low_side else (None, bound)
    elif len(parts) == 5 and _VARIABLE.fullmatch(parts[2]):
        a, b = (parts[0], _strict(parts[1])), (parts[4], _strict(parts[3]))
        rising = [p.startswith(("\\l", "<")) for p in (parts[1], parts[3])]
        if rising == [True, True]:
            ends = (a, b)
        elif rising == [False, False]:
            ends = (b, a)
        else:
            return latex
    else:
        return latex
    if any(end is not None and not end[0].strip() for end in ends):
        return latex
    (low, open_low), (high, open_high) = ends[0] or ("-\\infty", True), ends[1] or ("\\infty", True)
    return f"{'(' if open_low else '['}{low.strip()},{high.strip()}{')' if open_high else ']'}"


def _strict(relation: str) -> bool:
    return relation in ("<", ">", "\\lt", "\\gt")


def _words(answer: str) -> str | None:
    """A text answer as text answers are compared: `\\text{}` (and the like) unwrapped, surrounding
    spaces, punctuation and parentheses removed, lower case, one space between words (`\\text{Yes}`,
    `yes.`, `YES`: "yes"; `\\text{(C)}`, `(C)`: "c"); None if what is left is not letters and words."""
    text = answer
    for _ in range(3):  # \text{\textbf{Yes}}
        text = _TEXT_COMMAND.sub(r"\1", text)
    text = text.replace("\\ ", " ").replace("~", " ").strip(" \t\n.,;:!?()[]\"'$")
    return " ".join(text.lower().split()) if _WORDS.fullmatch(text) else None


_LETTER_LIST = re.compile(r"\(?[A-Za-z]\)?(?:\s*(?:,|;|\band\b)\s*\(?[A-Za-z]\)?)+")


def _letters(answer: str, capitals: bool = False) -> tuple[str, ...] | None:
    """The choices of a multi-select answer, two or more single letters separated by commas, semicolons or
    "and" (`\\text{A, C}`, `(A), (C)`, `A and C`), in upper case and sorted: the order in which they are
    listed is no part of the answer (`C, A` is `A, C`); None if the answer is no such list, or (capitals)
    has a lower-case letter (a reference `x, y` is math)."""
    text = answer
    for _ in range(3):  # \text{\textbf{A, C}}
        text = _TEXT_COMMAND.sub(r"\1", text)
    text = text.replace("\\ ", " ").replace("~", " ").strip(" \t\n.$")
    if not _LETTER_LIST.fullmatch(text):
        return None
    letters = re.findall(r"(?<![A-Za-z])[A-Za-z](?![A-Za-z])", text)
    if capitals and not all(letter.isupper() for letter in letters):
        return None
    return tuple(sorted(letter.upper() for letter in letters))


def _text_before_a_digit(latex: str) -> bool:
    """Whether a word of two or more letters, bare or in \\text{}, comes before a digit: `4 \\text{ or } 5`,
    `5 \\text{ (not } 4)`, `4 or maybe 5`. math-verify reads such an answer as one of its numbers (or a
    product with words), so it is two answers in one; a unit after the number (`5\\text{ cm}`,
    `25\\text{ cm}^2`) and an environment's name (`\\begin{pmatrix}`) are not."""
    text = _ENVIRONMENT.sub(" ", UNIT_POWER.sub("", latex))
    last_digit = max((i for i, ch in enumerate(text) if ch.isdigit()), default=-1)
    return _WORD.search(text, 0, max(last_digit, 0)) is not None


def _sides(latex: str) -> list[str] | None:
    """An answer written as a chain of equalities, as its sides: a first side without a digit is a label
    and is dropped (`x = 5`, `\\text{Area} = 25`: "5", "25"), else a last side that is a variable's name
    (`5 = x`: "5"); `3 + 4 = 7` is two sides, each of which must be right. None for more than three
    sides."""
    sides = latex.split("=")
    if len(sides) > 1 and not re.search(r"\d", sides[0]):
        sides = sides[1:]
    elif len(sides) > 1 and _VARIABLE.fullmatch(sides[-1]):
        sides = sides[:-1]
    return sides if len(sides) <= 3 else None


_BRACKET = re.compile(r"\\\\|\\[{}]|\\[lr](?:floor|ceil)(?![A-Za-z])|[()\[\]]")


def _balanced(latex: str) -> bool:
    """Whether an answer's brackets close as they open: "(" and "[" against ")" and "]" (so a half-open
    interval, [2,5), is balanced), \\{ against \\}, \\lfloor against \\rfloor, \\lceil against \\rceil.
    math-verify reads `4 ( 5`, `4 ] 5`, `\\frac{1}{2}(3` or `4 \\lfloor 5` as the number on one side."""
    depth = {"(": 0, "{": 0, "floor": 0, "ceil": 0}
    for found in _BRACKET.finditer(latex):
        token = found.group(0)
        if token == "\\\\":  # a matrix's row break, not a brace
            continue
        kind = "(" if token in "()[]" else "{" if len(token) == 2 else token[2:]
        depth[kind] += 1 if token in "([" or token == "\\{" or token[1:2] == "l" else -1
        if depth[kind] < 0:
            return False
    return not any(depth.values())


# An answer's tokens as _joined reads them: a number (digits, a decimal point between or before them), a
# text (its letters are words, read by hash_answers.qualifier and _text_before_a_digit), a \command, an
# escaped sign, space.
_GAP_TOKEN = re.compile(r"(?P<num>\d+(?:\.\d+)?|\.\d+)|(?P<text>\\(?:text(?:bf|it|rm|sf|tt|normal|up)?"
                        r"|math(?:rm|bf|it|sf|tt|bb|cal|frak)|mbox|operatorname)\s*\{[^{}]*\})|\\(?P<cmd>[A-Za-z]+)"
                        r"|\\(?P<esc>.)|(?P<space>\s+)|(?P<char>.)", re.DOTALL)
# What joins two numbers into one expression: an operator or a function (kind "join")...
_JOINING_SIGNS = frozenset("+-*/^_=,;:!|<>&")
# ... unlike spacing and style, which say nothing (dropped) ...
_SILENT_COMMANDS = frozenset("quad qquad displaystyle textstyle scriptstyle scriptscriptstyle left right limits "
                             "nolimits mathbb mathrm mathbf mathit mathsf mathcal mathfrak text textbf textrm textit "
                             "textsf texttt textup textnormal mbox operatorname".split())
# ... and values and marks, which stand side by side with a number (kind "value": `4 e 5`, `4 \\circ 5`).
_VALUE_COMMANDS = frozenset("pi infty circ degree prime dots ldots cdots vdots ddots ell hbar alpha beta gamma "
                            "delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu nu xi omicron rho "
                            "varrho sigma varsigma tau upsilon phi varphi chi psi omega Gamma Delta Theta Lambda Xi "
                            "Pi Sigma Upsilon Phi Psi Omega".split())
_FRACTION_COMMANDS = frozenset("frac dfrac tfrac cfrac binom dbinom tbinom".split())  # two arguments


def _gap_kind(found: re.Match) -> tuple[str, str] | None:
    """(kind, text) of a _GAP_TOKEN between two numbers: "join", "open", "close", "{", "}" or "value";
    None for what says nothing (spaces, spacing and style commands, ~)."""
    if found.group("text") is not None:
        return "value", "text"
    if (name := found.group("cmd")) is not None:
        if name in _SILENT_COMMANDS:
            return None
        if name in ("lfloor", "lceil", "langle", "rfloor", "rceil", "rangle"):
            return ("open" if name[0] == "l" else "close"), name
        return ("value" if name in _VALUE_COMMANDS else "join"), name
    if (sign := found.group("esc")) is not None:
        if sign in ",;:! ":
            return None
        return {"{": ("open", sign), "}": ("close", sign), "\\": ("join", sign)}.get(sign, ("value", sign))
    sign = found.group("char")
    if sign is None or sign == "~":
        return None
    if sign in "([":
        return "open", sign
    if sign in ")]":
        return "close", sign
    if sign in "{}":
        return sign, sign
    return ("join" if sign in _JOINING_SIGNS else "value"), sign


def _joined(latex: str) -> bool:
    """Whether every two numbers next to each other in an answer are joined into one expression, as an
    answer to a reference that is one number must be. Between them (spaces, spacing and style commands,
    ~ and empty braces aside) there must be an operator, a function or a relation (`2 \\cdot 3`,
    `2\\sqrt{3}`, `10^{3}`, `3 + 4 = 7`), an opening bracket (`2(3+1)`, `(4)(5)`), or the step from one
    argument to the next (`\\frac{1}{2}`, `\\sqrt[3]{8}`); a number in a subscript or a superscript, or a
    fraction's first argument, joins the next (`\\log_2 8`, `\\frac{\\sqrt 3}2`). Else the answer is two
    numbers side by side (`4 ~ 5`, `4 . 5`, `4 {} 5`, `4\\textstyle 5`, `4 \\circ 5`, `4 e 5`,
    `\\frac{1}{2}\\text{y}3`, `12\\,30`), which math-verify reads as one of them, their sum, or nothing."""
    gap, seen_number, joins_next, fraction = [], False, False, False
    for found in _GAP_TOKEN.finditer(latex):
        if found.group("num") is None:
            token = _gap_kind(found)
            if token is None:
                continue
            if token[0] == "}" and gap and gap[-1][0] == "{":
                gap.pop()  # {}: an empty group says nothing
            else:
                gap.append(token)
            fraction = fraction or (token[0] == "join" and token[1] in _FRACTION_COMMANDS)
            continue
        if seen_number and not joins_next and not (
                any(kind == "join" for kind, _ in gap) or (gap and gap[-1][0] == "open")
                or any(a[0] in ("}", "close") and b[0] == "{" for a, b in zip(gap, gap[1:]))):
            return False
        before = gap[-2] if gap and gap[-1][0] == "{" and len(gap) > 1 else gap[-1] if gap else None
        script = before in (("join", "_"), ("join", "^"))  # x_1, 10^{3}
        # \frac{1}{2}, \frac1{2}: the first argument; \frac12 holds both
        numerator = fraction and not (gap and gap[-1][1] in _FRACTION_COMMANDS and len(found.group("num")) > 1)
        joins_next, fraction, seen_number, gap = script or numerator, False, True, []
    return True


def _plain_notation(ref: Reference, latex: str) -> bool:
    """Whether an answer is written as one answer: no notation outside _NOTATION that the reference does
    not use (_COLLECTION_NOTATION as well for a reference that is no single number), no text before a
    digit unless the reference has some, and against a reference that is one number, no two numbers
    side by side (_joined)."""
    allowed = _NOTATION | ref.notation | (frozenset() if ref.one_number else _COLLECTION_NOTATION)
    if any(token.group(0) not in allowed for token in _NOTATION_TOKEN.finditer(latex)):
        return False
    if ref.one_number and not _joined(latex):
        return False
    return ref.prose or not _text_before_a_digit(latex)


_COMMAND_NAME = re.compile(r"\\[A-Za-z]+")


def _offers_more(latex: str) -> bool:
    """Whether the words of a boxed answer (\\commands aside) offer another answer or qualify it
    (qualifier: `40 \\text{ or more}`, `4 \\text{ o cinco}`, `40 \\text{ (approx.)}`) or name a number
    (`5 \\text{ hundred}`, `4 \\text{ or five}`)."""
    text = _COMMAND_NAME.sub(" ", latex)
    return qualifier(text) is not None or NUMBER_WORD.search(text) is not None


def _parse(latex: str, answer: bool = False) -> list:
    """A boxed answer as math-verify reads it ([] when it reads nothing). A reference is read as TRL and
    open-r1 read one; an answer (answer=True) only as LaTeX, without math-verify's fallbacks: where its
    LaTeX grammar cannot read the whole answer (`4 ( 5`, `4 \\mathbb 5`, `4 или 5`), the default
    reading falls back to a plain number found in the text (the last or the first), one of a hedge's."""
    mv = math_verify_module()
    if answer:
        return mv.parse("\\boxed{" + latex + "}", extraction_config=[mv.LatexExtractionConfig()],
                        fallback_mode="no_fallback", parsing_timeout=None)
    return mv.parse("\\boxed{" + latex + "}", parsing_timeout=None)  # the limit: scorers.Scorer


@dataclasses.dataclass(frozen=True)
class Reference:
    """A reference final answer as answers are compared with it. fmt: "hash" (GSM8K) or "boxed" (MATH);
    latex: it in normalized written form (_normalize, _strip_percent, _as_interval); parsed: that as
    math-verify reads it; number: GSM8K's number (None for MATH); words: a text answer's words (None
    unless it is one); one_number: math-verify reads it as one number (so a comma between groups of
    three digits in an answer is a thousands separator); notation: its _NOTATION_TOKENs (an answer may
    use them too); prose: it has text before a digit (so an answer may too); qualified: its own words
    qualify it or name a number (_offers_more; so an answer's may); letters: the choices of a
    multi-select reference (_letters; None unless it is one)."""
    fmt: str
    latex: str
    parsed: list
    number: Fraction | None = None
    words: str | None = None
    one_number: bool = False
    notation: frozenset = frozenset()
    prose: bool = False
    qualified: bool = False
    letters: tuple | None = None


def parse_reference(answer: str, fmt: str) -> Reference:
    """A reference final answer as answers are compared with it; ValueError if it is too long or reads
    as nothing. fmt "hash": GSM8K's "#### n", one number (hash_answers.py); "boxed": a LaTeX answer (MATH's
    \\boxed content, MATH-500's `answer`), compared as a set of choices when it lists several capital
    letters (\\text{A, C}: _letters), as words when it is text (Yes, Monday, \\text{(C)}; a bare single
    letter is math: x, e), else read by math-verify."""
    if fmt not in MATH_FORMATS:
        raise ValueError(f"math answer format must be one of {MATH_FORMATS}, got {fmt!r}")
    if not isinstance(answer, str) or not answer.strip():
        raise ValueError("the reference answer is empty")
    if len(answer) > MAX_ANSWER_CHARS:
        raise ValueError(f"the reference answer is longer than {MAX_ANSWER_CHARS} characters")
    math_verify_module()  # math rows are graded with it (a GSM8K answer's number is read here)
    if fmt == "hash":
        number = hash_number(answer)
        if number is None:
            raise ValueError(f"the reference answer {answer[:80]!r} is not read as math: a GSM8K answer is "
                             f"one number")
        latex = str(number)
        return Reference(fmt, latex, _parse(latex), number=number, one_number=True)
    answer = answer.strip()
    letters = _letters(answer, capitals=True)
    if letters is not None:
        return Reference(fmt, answer, [], letters=letters)
    words = None if re.fullmatch(r"[A-Za-z]", answer) else _words(answer)
    if words is not None:
        return Reference(fmt, answer, [], words=words)
    latex = _as_interval(_strip_percent(_normalize(answer, commas=None)))
    parsed = _parse(latex)
    if not parsed:
        raise ValueError(f"the reference answer {answer[:80]!r} is not read as math by math-verify")
    return Reference(fmt, latex, parsed, one_number=getattr(parsed[0], "is_number", False) is True,
                     notation=frozenset(t.group(0) for t in _NOTATION_TOKEN.finditer(latex)),
                     prose=_text_before_a_digit(latex), qualified=_offers_more(latex))


def _boxed_right(ref: Reference, answer: str) -> bool:
    """Whether a boxed answer equals the reference: both in one written form, each side of the answer
    (_answer_sides) written as one answer (_plain_notation) and equal to the reference as math-verify
    compares them. Against a reference that is no single number, "or" and "and" list its elements
    (`-1 \\text{ or } 3`: -1, 3), as math-verify reads them. A percent sign left inside the answer
    where the reference has none is wrong (math-verify would read 4000\\% as 40), as are brackets that do
    not balance (_balanced) and words that qualify the answer or offer another (_offers_more) where the
    reference has none."""
    latex = _as_interval(_strip_percent(_normalize(answer, commas=ref.one_number)))
    if not ref.one_number:
        latex = _CONNECTIVE.sub(",", latex)
    if "%" in latex and "%" not in ref.latex:
        return False
    if not _balanced(latex) or (not ref.qualified and _offers_more(latex)):
        return False
    sides = _answer_sides(ref, latex)
    return sides is not None and all(_plain_notation(ref, side) and _equal(ref, side) for side in sides)


def _answer_sides(ref: Reference, latex: str) -> list[str] | None:
    """What of an answer is compared with the reference: all of it where the reference is itself an
    equation or the answer has no "="; against one number, each side (_sides: `3 + 4 = 7` is right
    for 7, `12 = 34` for neither, `5 = x` for 5); against a reference that is one letter, nothing
    (`D = C` offers two letters); against anything else, all of it when each "=" follows a variable's
    or a function's name (`x = -1, x = 3`; `x = 2, y = 3`; `f(x) = 2x+3`), else nothing
    (`(1,2) = (3,4)`: None)."""
    if "=" in ref.latex or "=" not in latex:
        return [latex]
    if ref.one_number:
        return _sides(latex)
    if re.fullmatch(r"[A-Za-z]", ref.latex):
        return None  # D = C: two letters offered for one
    return [latex] if latex.count("=") == len(_LABELLED_EQUALS.findall(latex)) else None


def _equal(ref: Reference, latex: str) -> bool:
    """Whether math-verify reads the answer as equal to the reference (and, against one number, reads
    every number of it: _reads_every_number)."""
    pred = _parse(latex, answer=True)
    if not pred or not math_verify_module().verify(ref.parsed, pred, timeout_seconds=None):
        return False
    return not ref.one_number or _reads_every_number(latex, pred)


_DIGITS = re.compile(r"\d+")


def _reads_every_number(latex: str, pred: list) -> bool:
    """Whether math-verify's reading of an answer depends on every run of digits in it (a unit's power,
    as in 5\\text{ cm}^2, aside): with any one changed, the reading changes. Its LaTeX grammar recovers
    from what it cannot read by dropping the rest (`\\frac{1}{2}\\sqrt\\theta3`, `\\frac{1}{2}.\\frac3`,
    `\\frac{1}{2}/\\div3` read as 1/2), which would let one number of two stand for the answer. One
    more parse per run of digits, and only for an answer that would otherwise be right."""
    powers = [(m.start(), m.end()) for m in UNIT_POWER.finditer(latex)
              if latex[m.start() - 1] == "}" or not re.search(r"\\[A-Za-z]*$", latex[:m.start()])]  # \circ^3: no unit
    shown = str(pred[0])
    for found in _DIGITS.finditer(latex):
        if any(start <= found.start() < end for start, end in powers):
            continue
        digits = found.group(0)
        other = latex[:found.start()] + digits[:-1] + ("2" if digits[-1] == "1" else "1") + latex[found.end():]
        changed = _parse(other, answer=True)
        if changed and str(changed[0]) == shown:
            return False
    return True


def _right(ref: Reference, answer: str, how: str) -> bool:
    """Whether an answer found by `how` ("boxed", "hash", "last_number") equals the reference: a
    multi-select reference as its set of letters; a text reference as words; a boxed answer by
    _boxed_right; a "####" line or last number as one number (hash_answers.py), equal to a GSM8K
    reference exactly, to a MATH one by _boxed_right."""
    if len(answer) > MAX_ANSWER_CHARS:
        return False
    if ref.letters is not None:
        return _letters(answer) == ref.letters
    if ref.words is not None:
        return _words(answer) == ref.words
    if how == "boxed":
        return _boxed_right(ref, answer)
    number = hash_number(answer)
    if number is None:
        return False
    return number == ref.number if ref.number is not None else _boxed_right(ref, str(number))


def math_verdict(completion: str, answer: str, fmt: str) -> dict:
    """The verdict on a math completion against the reference final answer. The answer is looked for
    after the last "</think>" (none while a "<think>" is open). Strict: the answer in the requested
    format (fmt "boxed": the last \\boxed{}; "hash": after the last "####") is right; lenient: the
    first answer extract_answer finds is right. reward = 1 for strict, else 0 (a policy is rewarded for
    answering as asked). ValueError if the reference does not read."""
    ref = parse_reference(answer, fmt)
    text = _final_text(completion)
    if text is None:
        return _v("failed", 0.0, f"no answer: the reasoning ({THINK_OPEN}) is never closed")
    requested = (_boxed if fmt == "boxed" else _after_hash)(text)
    if requested is not None and _right(ref, requested, fmt):
        return _v("passed", 1.0, f"{fmt}: {requested[:80]}")
    found, how = extract_answer(text)
    if found is not None and (found, how) != (requested, fmt) and _right(ref, found, how):
        return _v("lenient", 0.0, f"right answer found by {how}, not in the {fmt} format")
    if found is not None and len(found) > MAX_ANSWER_CHARS:
        return _v("failed", 0.0, f"{how}: the answer is longer than {MAX_ANSWER_CHARS} characters, not read")
    return _v("failed", 0.0, f"{how}: {str(found)[:80]}" if found is not None else "no answer found")


def _v(status: str, reward: float, detail: str) -> dict:
    return {"passed": status == "passed", "reward": float(reward), "status": status, "detail": detail[:500],
            "fraction": 1.0 if status == "passed" else 0.0}


def math_reference(rec: dict) -> tuple[str, str, str] | None:
    """(question, final answer, format) of a GSM8K-, MATH- or MATH-500-style row; None if it is none of
    them. GSM8K: `question`, `answer` holding "#### n"; MATH-500: `problem`, `answer` (the final answer
    itself, LaTeX); MATH: `problem`, `solution` holding \\boxed{...}."""
    if isinstance(rec.get("question"), str) and isinstance(rec.get("answer"), str) and "####" in rec["answer"]:
        return rec["question"], _after_hash(rec["answer"]) or "", "hash"
    if isinstance(rec.get("problem"), str):
        if isinstance(rec.get("answer"), str) and rec["answer"].strip():
            return rec["problem"], rec["answer"].strip(), "boxed"
        if isinstance(rec.get("solution"), str):
            boxed = _boxed(rec["solution"])
            if boxed is not None:
                return rec["problem"], boxed, "boxed"
    return None
