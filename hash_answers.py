"""hash_answers.py: a GSM8K answer ("#### n", format "hash" of math_answers.py) read as the one number it is.

The first number on the "####" line, with the units and currency around it, and nothing on the line
that could be a second answer or qualifies this one (`#### 40 or more`, `#### 4-5`, `#### about 40`):
hash_number gives it as an exact Fraction, or None, and math_answers.py compares it with the
reference's number exactly. math_answers.py's docstring says why an answer that could be read as two
is read as none. qualifier, NUMBER_WORD and UNIT_POWER are shared with math_answers.py's reading of a
boxed answer. Standard library only; every scan is linear in the line's length.
"""
from __future__ import annotations

import decimal
import re
from fractions import Fraction

# An unsigned number as GSM8K writes one: digits, with commas only between groups of exactly three
# (1,200; 1,2 is not one number), decimals (2.5, .5), an exponent of at most three digits (1.5e3), a
# denominator (3/4: a fraction is one number). Each optional part starts with its own character.
_PLAIN = r"(?:(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d{1,3}(?!\d))?(?:/\d+)?"
_PLAIN_NUMBER = re.compile(_PLAIN)
# What may stand before the answer's number: spaces, markup, currency and one minus sign.
_HASH_PREFIX = re.compile(r"(?:\s|\*|\\[(\[]|\\boxed\{|\{|\\?\$|[\u20ac\u00a3\u00a5\u20b9]|[-\u2212])*")
NUMBER_WORD = re.compile(
    r"\b(?:zero|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen|"
    r"sixteen|seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety|hundred|"
    r"thousand|million|billion|trillion|dozen|half"
    # the small numbers of the languages a policy most often drifts into (Spanish, Portuguese, French,
    # German, Italian, Russian), less those that are English words (un, une, due, once, elf, null)
    r"|cero|uno|dos|tres|cuatro|cinco|seis|siete|ocho|nueve|diez|dois|duas|tr\u00eas|quatro|sete|oito|nove|dez"
    r"|deux|trois|quatre|cinq|sept|huit|neuf|dix|eins|zwei|drei|vier|f\u00fcnf|fuenf|sechs|sieben|acht|neun"
    r"|zehn|tre|quattro|cinque|sei|sette|otto|dieci|\u043e\u0434\u0438\u043d|\u0434\u0432\u0430|\u0442\u0440\u0438"
    r"|\u0447\u0435\u0442\u044b\u0440\u0435|\u043f\u044f\u0442\u044c|\u0434\u0435\u0441\u044f\u0442\u044c)\b",
    re.IGNORECASE)
# What qualifies an answer or offers another one (qualifier). A word is a run of letters of any script
# (an apostrophe inside it, as in o'clock, keeps it one word).
_LETTER_WORD = re.compile(r"[^\W\d_]+(?:['\u2019][^\W\d_]+)*")
# "or" in English and in the languages a policy drifts into: an alternative answer follows. Escaped: Spanish
# o-acute; Russian ili, libo; Ukrainian abo, chy; Greek eta-tonos; Arabic aw (two spellings); Hebrew o; Hindi
# ya, athava; Vietnamese hoac; Korean ttoneun, hogeun, animyeon.
_ALTERNATIVE_WORDS = frozenset(
    "or either otherwise alternatively ou oder bzw beziehungsweise o \u00f3 oppure ovvero ossia eller lub albo "
    "nebo anebo alebo vagy veya yahut yoksa sau ili atau tai vai arba ho\u1eb7c "
    "\u0438\u043b\u0438 \u043b\u0438\u0431\u043e \u0430\u0431\u043e \u0447\u0438 \u03ae \u0623\u0648 \u0627\u0648 "
    "\u05d0\u05d5 \u092f\u093e \u0905\u0925\u0935\u093e \ub610\ub294 \ud639\uc740 \uc544\ub2c8\uba74".split())
# An estimate or a bound: the answer is not stated as the answer. Escaped: German ungefaehr; Russian okolo,
# primerno, pochti; Korean yak, jeongdo.
_APPROXIMATE_WORDS = frozenset(
    "about approximately approx approximate approximated around roughly nearly almost circa ish maybe perhaps "
    "probably possibly likely presumably estimated estimate least most guess ballpark environ etwa aproximadamente "
    "cerca casi quasi ungef\u00e4hr \u043e\u043a\u043e\u043b\u043e \u043f\u0440\u0438\u043c\u0435\u0440\u043d\u043e "
    "\u043f\u043e\u0447\u0442\u0438 \uc57d \uc815\ub3c4".split())
# A bound when it ends the answer (`40 over`, `40 plus`, `40 max`) ...
_FINAL_BOUND_WORDS = frozenset("over under above below beyond plus upward upwards onward onwards max maximum "
                               "minimum".split())
# ... or after "and", "no", "not" (`40 and up`, `40 and more`, `no less`); alone, `5 more` answers
# "how many more", so more, less and fewer are units there.
_BOUND_WORDS = _FINAL_BOUND_WORDS | frozenset("more less fewer up higher lower greater smaller bigger larger".split())
# The same in scripts written without spaces between words, found anywhere: Chinese huo, haishi (two
# spellings), yue (two), dagai, zuoyou, yishang, yixia, zhishao, zuiduo, chabuduo, jihu; Japanese matawa,
# moshikuwa, aruiwa, kurai, gurai, teido, zengo; Korean isang, iha.
_CJK_QUALIFIER = re.compile(
    "\u6216|\u8fd8\u662f|\u9084\u662f|\u7ea6|\u7d04|\u5927\u6982|\u5de6\u53f3|\u4ee5\u4e0a|\u4ee5\u4e0b|\u81f3\u5c11|"
    "\u6700\u591a|\u5dee\u4e0d\u591a|\u51e0\u4e4e|\u307e\u305f\u306f|\u3082\u3057\u304f\u306f|"
    "\u3042\u308b\u3044\u306f|\u304f\u3089\u3044|\u3050\u3089\u3044|\u7a0b\u5ea6|\u524d\u5f8c|"
    "\uc774\uc0c1|\uc774\ud558")
_HYPHEN_ESTIMATE = re.compile(r"(?<![^\W\d_])[-\u2010-\u2015]\s*(?:odd|some)(?![^\W\d_])",  # 40-odd
                              re.IGNORECASE)
# A unit's power is part of the unit: m^2, \text{cm}^{3}, m followed by a superscript two or three.
UNIT_POWER = re.compile(r"(?<=[A-Za-z}])(?:\^\{?[23]\}?|[\u00b2\u00b3])(?!\d)")
_YEAR = re.compile(r"\b(?:in|by|since|during|until|before|after)\s+(?:1\d{3}|20\d{2})\b", re.IGNORECASE)
_TOKEN = re.compile(r"\s*(?:(?P<num>" + _PLAIN + r")|(?P<op>[-+*/\u00d7\u00f7\u00b7\u2212]|\\times|\\cdot|\\div"
                    r"|[xX](?![A-Za-z]))|(?P<paren>[()])|(?P<cur>\\?\$))")
_OPERATORS = {"\u00d7": "*", "\\times": "*", "x": "*", "X": "*", "\u00b7": "*", "\\cdot": "*",
              "\u00f7": "/", "\\div": "/", "\u2212": "-"}
# Units a restatement may convert between: (what it measures, its size in that measure's unit here).
_UNITS = {
    "second": ("time", 1), "sec": ("time", 1), "minute": ("time", 60), "min": ("time", 60),
    "hour": ("time", 3600), "hr": ("time", 3600), "day": ("time", 86400), "week": ("time", 604800),
    "month": ("months", 1), "year": ("months", 12), "yr": ("months", 12),
    "cent": ("money", 1), "dollar": ("money", 100),
    "inch": ("inches", 1), "foot": ("inches", 12), "feet": ("inches", 12), "ft": ("inches", 12),
    "yard": ("inches", 36), "mile": ("inches", 63360),
    "millimeter": ("mm", 1), "mm": ("mm", 1), "centimeter": ("mm", 10), "cm": ("mm", 10),
    "meter": ("mm", 1000), "metre": ("mm", 1000), "m": ("mm", 1000), "kilometer": ("mm", 10 ** 6),
    "km": ("mm", 10 ** 6),
    "ounce": ("ounces", 1), "oz": ("ounces", 1), "pound": ("ounces", 16), "lb": ("ounces", 16),
    "gram": ("grams", 1), "g": ("grams", 1), "kilogram": ("grams", 1000), "kg": ("grams", 1000),
    "milliliter": ("ml", 1), "ml": ("ml", 1), "liter": ("ml", 1000), "litre": ("ml", 1000),
}


def hash_number(line: str) -> Fraction | None:
    """The number a "####" line answers with; None when it offers none, or more than one.

    A policy is rewarded for this reading, so a line that could be read as two answers reads as none:
      * The answer is the first number on the line: `72`, `1,234` (commas only before groups of
        exactly three digits), `2.5`, `.5`, `3/4` (a fraction is one number), `1.5e3`, negative with
        one minus sign (ASCII or U+2212) before it or before its currency sign (`-$5`, `$-5`).
      * Before it only spaces, markup and currency: `$1,200`, `\\$5`, `**42**`, `\\(42\\)`, `\\boxed{42}`.
        A word there changes what is meant (`about 40`, `at least 40`, `x = 40`): the line reads as none.
      * After it, anything that names no number: a unit (`18 dollars`, `18 eggs per day`, `40%`,
        `25 m^2`, `5 more`), markup, a period. A digit, another numeric character (a superscript, a
        vulgar fraction, a Chinese numeral) or a number word, English or in a few other languages
        (`4 or 5`, `10, not 42`, `28 out of 40`, `4-5`, `4 or five`, `5 thousand`, `4 und fuenf`), makes
        a second candidate: the line reads as none, whichever number is meant.
      * Except a restatement of the answer, in parentheses or after "=": arithmetic equal to it
        (`15 (5 + 10)`, `15 = 3 x 5`), or the same quantity in another unit of a fixed conversion
        (`120 minutes = 2 hours`, `$1.50 (150 cents)`). A restatement that is not equal to the answer
        (`4 (or 5)`, `4 = 5`, `120 minutes = 3 hours`, `3 boxes = 36 crayons`) reads as none.
      * And a year after in, by, since, during, until, before or after (`$1,200 in 2023`): a date
        is context, never another answer.
      * And nothing after it, restatements included, that offers another answer in words or
        qualifies this one: a qualified or alternative answer is not the answer, as `about 40` is
        not. So no "or" in any language (`4 or a couple`, `4 or twice that`, `4 or V`, `4 o cinco`,
        `4 ou cinq`), no estimate or bound (`40 or so`, `40ish`, `40-odd`, `40 approximately`,
        `40 at least`, `40 at most`, `40 and up`, `40 plus`, `up to`; qualifier lists the words), no
        sign of one (`40?`, `40 \\approx`, `40 \\pm`, U+2248, U+00B1, `<=`), and outside a
        restatement no `+` and no `~` that is no LaTeX space (`40+`, `40 ~`)."""
    found = _PLAIN_NUMBER.search(line)
    if found is None:
        return None
    prefix = line[:found.start()]
    value = _plain_value(found.group(0))
    minus = prefix.count("-") + prefix.count("\u2212")
    if value is None or not _HASH_PREFIX.fullmatch(prefix) or minus > 1:
        return None
    value = -value if minus else value
    parts = _restatement_parts(_YEAR.sub(" ", line[found.end():]))
    if parts is None:
        return None
    own, restatements = parts
    unit = _unit(own) or ("dollar" if "$" in prefix else None)
    tail = line[found.end():]
    if _holds_a_number(own) or qualifier(tail) or _QUALIFYING_SIGN.search(tail) or _OWN_QUALIFYING_SIGN.search(own):
        return None
    return value if all(_restates(text, value, unit) for text in restatements) else None


def qualifier(text: str) -> str | None:
    """The first word in a text that offers another answer or qualifies the answer; None if there is none.
    Such a word: "or" in any of _ALTERNATIVE_WORDS (`4 or a couple`, `4 o cinco`, `4 ou cinq`; a one-letter
    one only as a word of its own, between spaces, braces or parentheses, so `90^o` is a degree); an
    estimate or a bound, _APPROXIMATE_WORDS (`40 approximately`, `40ish`, `40 at least`, `40 at most`);
    _FINAL_BOUND_WORDS as the last word (`40 over`, `40 plus`), _BOUND_WORDS after "and", "no" or
    "not" (`40 and up`, `no less`); "up to"; a hyphen then "odd" or "some" (`40-odd`); and
    _CJK_QUALIFIER anywhere."""
    found = _CJK_QUALIFIER.search(text) or _HYPHEN_ESTIMATE.search(text)
    if found:
        return found.group(0)
    words = [(m.group(0).lower(), m.start(), m.end()) for m in _LETTER_WORD.finditer(text)]
    for k, (word, start, end) in enumerate(words):
        if word in _ALTERNATIVE_WORDS and (len(word) > 1 or (
                text[start - 1:start] in ("", " ", "{", "(") and text[end:end + 1] in ("", " ", "}", ")"))):
            return word
        previous, following = words[k - 1][0] if k else "", words[k + 1][0] if k + 1 < len(words) else ""
        if (word in _APPROXIMATE_WORDS or (word in _FINAL_BOUND_WORDS and not following)
                or (word in _BOUND_WORDS and previous in ("and", "no", "not")) or (word, following) == ("up", "to")):
            return word
    return None


# Signs that qualify a "####" answer wherever they stand after it (approximately, plus or minus, at most, at
# least, a question mark; not a bare < or >, which close a tag: `<answer>#### 72</answer>`), and, outside
# a restatement, a "+" (`40+`) and a "~" that is no LaTeX space.
_QUALIFYING_SIGN = re.compile(r"[\u2248\u2243\u00b1\u2213\u2272\u2273\u2264\u2265?]|<=|>="
                              r"|\\(?:approx|simeq|sim|pm|mp|lesssim|gtrsim|leq?|geq?|lt|gt)(?![A-Za-z])")
_OWN_QUALIFYING_SIGN = re.compile(r"\+|~(?![A-Za-z\\])")


def _plain_value(token: str) -> Fraction | None:
    """The exact value of a _PLAIN number; None when its denominator is 0."""
    mantissa, _, denominator = token.replace(",", "").partition("/")
    value = Fraction(decimal.Decimal(mantissa))
    if denominator:
        return None if int(denominator) == 0 else value / int(denominator)
    return value


def _restatement_parts(tail: str) -> tuple[str, list[str]] | None:
    """The text after the answer's number, split: (the text outside parentheses before any "=", [each
    parenthesized group's text and each "=" clause, split at "=" themselves]); None if the
    parentheses do not balance."""
    tail = re.sub(r"\\[()\[\]]", " ", tail)  # \( \) \[ \]: math delimiters, not groups
    outside, groups, depth, start = [], [], 0, 0
    for i, ch in enumerate(tail):
        if ch == "(":
            if depth == 0:
                outside.append(tail[start:i])
                start = i + 1
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                return None
            if depth == 0:
                groups.append(tail[start:i])
                start = i + 1
    if depth:
        return None
    outside.append(tail[start:])
    own, *clauses = " ".join(outside).split("=")
    return own, [part for group in groups for part in group.split("=")] + clauses


def _holds_a_number(text: str) -> bool:
    """Whether the text names a number: any numeric character (digits in any script, superscripts,
    vulgar fractions; a unit's power, m^2, aside) or a number word."""
    return any(ch.isnumeric() for ch in UNIT_POWER.sub("", text)) or NUMBER_WORD.search(text) is not None


def _unit(text: str) -> str | None:
    """The unit a text after a number starts with ("%" or its first word, singular, lower case); None."""
    found = re.match(r"[^\w%]*(%|[A-Za-z]+)", text)
    if found is None:
        return None
    word = found.group(1).lower()
    for name in (word, word[:-1] if word.endswith("s") else "", word[:-2] if word.endswith("es") else ""):
        if name in _UNITS:
            return name
    return word[:-1] if word.endswith("s") else word


def _restates(text: str, value: Fraction, unit: str | None) -> bool:
    """Whether a parenthesized group or "=" clause after the answer restates it (or names no number)."""
    if not _holds_a_number(text):
        return True
    quantity = _quantity(text)
    if quantity is None:
        return False
    amount, its_unit = quantity
    if unit is None or its_unit is None or unit == its_unit:
        return amount == value
    (measure, size), (its_measure, its_size) = _UNITS.get(unit, (unit, 0)), _UNITS.get(its_unit, (its_unit, 0))
    return bool(size) and measure == its_measure and amount * its_size == value * size


def _quantity(text: str) -> tuple[Fraction, str | None] | None:
    """(value, unit) of arithmetic followed by a unit (`5 + 10`, `2 hours`, `$1.50`, `3 x 5 dollars`);
    None if the text is no such thing, or names a number after the arithmetic."""
    tokens, pos, dollars = [], 0, False
    while (token := _TOKEN.match(text, pos)) is not None:
        pos = token.end()
        if token.group("cur"):
            dollars = True
        elif token.group("num"):
            tokens.append(_plain_value(token.group("num")))
        else:
            symbol = token.group(0).strip()
            tokens.append(_OPERATORS.get(symbol, symbol))
    rest = text[pos:]
    if _holds_a_number(rest) or None in tokens:
        return None
    amount = _evaluate(tokens)
    return None if amount is None else (amount, _unit(rest) or ("dollar" if dollars else None))


class _NotArithmetic(Exception):
    pass


def _evaluate(tokens: list) -> Fraction | None:
    """The exact value of numbers (Fractions) joined by "+", "-", "*", "/" and parentheses (nested at
    most 10 deep); None if the tokens are not one such expression or divide by 0. No powers, so no
    value grows past the size of the text."""
    pos = 0

    def peek():
        return tokens[pos] if pos < len(tokens) else None

    def take():
        nonlocal pos
        if pos == len(tokens):
            raise _NotArithmetic
        pos += 1
        return tokens[pos - 1]

    def expression(depth):
        value = term(depth)
        while peek() in ("+", "-"):
            sign = 1 if take() == "+" else -1
            value += sign * term(depth)
        return value

    def term(depth):
        value = factor(depth)
        while peek() in ("*", "/"):
            if take() == "*":
                value *= factor(depth)
            else:
                divisor = factor(depth)
                if divisor == 0:
                    raise _NotArithmetic
                value /= divisor
        return value

    def factor(depth):
        token = take()
        sign = 1
        while token == "-":  # a run of unary minus signs, read in a loop, not by recursion
            sign, token = -sign, take()
        if isinstance(token, Fraction):
            return sign * token
        if token == "(" and depth < 10:
            value = expression(depth + 1)
            if take() != ")":
                raise _NotArithmetic
            return sign * value
        raise _NotArithmetic

    try:
        value = expression(0)
    except _NotArithmetic:
        return None
    return value if pos == len(tokens) else None
