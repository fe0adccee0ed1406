"""Math answers read as the dataset's own grader reads them (math_answers.py: _hash_number,
_boxed_right, _final_text): a table of answer forms, right, wrong and hedged, each graded by
math_answers.math_verdict, and property checks that no hedge of two numbers scores for either and
that GSM8K golds read back.

Run: python -m pytest -q tests/test_math_grading.py
"""
import itertools
import time

import pytest

import hash_answers
import math_answers


def _either(completion: str, a: str, b: str) -> list:
    """Rows for a boxed hedge of a and b: it scores 0 whichever of the two is the gold."""
    return [(completion, a, "boxed", 0), (completion, b, "boxed", 0)]


# (completion, gold, fmt, expected reward). fmt "hash": GSM8K's "#### n"; "boxed": MATH's \boxed{}.
TABLE = [
    # --- GSM8K: plain numbers
    ("#### 72", "72", "hash", 1),
    ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nShe sold 48+24 = <<48+24=72>>72 clips.\n#### 72", "72",
     "hash", 1),
    ("#### 72.", "72", "hash", 1),
    ("#### 72\nHope that helps!", "72", "hash", 1),
    ("#### 71", "72", "hash", 0),
    ("#### 720", "72", "hash", 0),
    ("#### 5\nWait, I made a mistake.\n#### 6", "6", "hash", 1),    # the last "####" line is the answer
    ("#### 5\nWait, I made a mistake.\n#### 6", "5", "hash", 0),
    ("#### **42**", "42", "hash", 1),
    ("#### \\boxed{42}", "42", "hash", 1),
    ("#### about 40", "40", "hash", 0),                              # a word before the number
    ("#### x = 40", "40", "hash", 0),
    ("#### forty", "40", "hash", 0),
    # --- GSM8K: units
    ("#### 18 dollars", "18", "hash", 1),
    ("#### 5 apples", "5", "hash", 1),
    ("#### 25 m^2", "25", "hash", 1),
    ("#### 25 cm^{2}", "25", "hash", 1),
    ("#### 25 m\u00b2", "25", "hash", 1),
    ("#### 60 km/h", "60", "hash", 1),
    ("#### 40%", "40", "hash", 1),                                   # percent is a unit: "what percent", gold 40
    ("#### 4000%", "40", "hash", 0),
    ("#### 0.4", "40", "hash", 0),
    # --- GSM8K: currency
    ("#### $1,200", "1200", "hash", 1),
    ("#### \\$5", "5", "hash", 1),
    ("#### $18.90", "18.90", "hash", 1),
    ("#### $18.9", "18.90", "hash", 1),
    ("#### -$5", "-5", "hash", 1),
    ("#### $-5", "-5", "hash", 1),
    ("#### \u20ac40", "40", "hash", 1),
    ("#### $42$", "42", "hash", 1),
    # --- GSM8K: commas
    ("#### 1,234", "1234", "hash", 1),
    ("#### 1234", "1,234", "hash", 1),
    ("#### 1,000,000", "1000000", "hash", 1),
    ("#### 1,2", "12", "hash", 0),                                   # a list (or 1.2), never 12
    ("#### 12,34", "1234", "hash", 0),
    ("#### 1,2345", "12345", "hash", 0),
    # --- GSM8K: decimals and fractions
    ("#### 2.5", "2.5", "hash", 1),
    ("#### .5", "0.5", "hash", 1),
    ("#### 0.50", "0.5", "hash", 1),
    ("#### 1234.0", "1,234", "hash", 1),
    ("#### 3/4", "0.75", "hash", 1),                                 # a fraction is one number
    ("#### 3/4", "3", "hash", 0),
    ("#### 3/4", "4", "hash", 0),
    ("#### 1.5e3", "1500", "hash", 1),
    ("#### 1/0", "1", "hash", 0),
    # --- GSM8K: negatives
    ("#### -7", "-7", "hash", 1),
    ("#### \u22127", "-7", "hash", 1),
    ("#### 7", "-7", "hash", 0),
    ("#### --7", "-7", "hash", 0),
    ("#### -7 degrees", "-7", "hash", 1),
    # --- GSM8K: hedges (two candidate numbers: right for neither)
    ("#### 4 or 5", "5", "hash", 0),
    ("#### 4 or 5", "4", "hash", 0),
    ("#### 10, not 42", "42", "hash", 0),
    ("#### 10, not 42", "10", "hash", 0),
    ("#### 28 out of 40", "40", "hash", 0),
    ("#### 28 out of 40", "28", "hash", 0),
    ("#### 4 (or 5)", "4", "hash", 0),
    ("#### 4-5", "5", "hash", 0),
    ("#### 4 to 5", "4", "hash", 0),
    ("#### 4 or five", "4", "hash", 0),
    ("#### 5 thousand", "5", "hash", 0),
    ("#### 4 = 5", "4", "hash", 0),
    ("#### 1200 in 5 years", "1200", "hash", 0),
    ("#### 3 hours and 20 minutes", "3", "hash", 0),
    ("#### 3 boxes = 36 crayons", "3", "hash", 0),                   # no known conversion: unverifiable
    ("#### 5 (", "5", "hash", 0),                                    # unbalanced: read as nothing
    ("#### 12 or \u00bd", "12", "hash", 0),                          # a vulgar fraction is a number
    ("#### 12 \u2076", "12", "hash", 0),                              # so is a superscript
    # --- GSM8K: a qualified answer, or another offered in words (not the answer, as "about 40" is not)
    ("#### 40 or more", "40", "hash", 0),
    ("#### 40 or fewer", "40", "hash", 0),
    ("#### 40+", "40", "hash", 0),
    ("#### 40 at least", "40", "hash", 0),
    ("#### 40 at most", "40", "hash", 0),
    ("#### 40 or so", "40", "hash", 0),
    ("#### 40ish", "40", "hash", 0),
    ("#### 40-odd", "40", "hash", 0),
    ("#### 40 approximately", "40", "hash", 0),
    ("#### 40 (approx.)", "40", "hash", 0),
    ("#### 40 and up", "40", "hash", 0),
    ("#### 40 plus", "40", "hash", 0),
    ("#### 40?", "40", "hash", 0),
    ("#### 40 \u5de6\u53f3", "40", "hash", 0),                        # Chinese "or so"
    ("#### 4 (= 4) or more", "4", "hash", 0),                       # a restatement, then a bound
    ("#### 4 (4 + 0) or so", "4", "hash", 0),
    ("#### 4 or a couple", "4", "hash", 0),
    ("#### 4 or a pair", "4", "hash", 0),
    ("#### 4 or double that", "4", "hash", 0),
    ("#### 4 or twice that", "4", "hash", 0),
    ("#### 4 or the next integer", "4", "hash", 0),
    ("#### 4 or a few more", "4", "hash", 0),
    ("#### 4 or^3", "4", "hash", 0),
    ("#### 4 or x^3", "4", "hash", 0),
    ("#### 4 o cinco", "4", "hash", 0),                             # "or" in other languages
    ("#### 4 ou cinq", "4", "hash", 0),
    ("#### 4 oder f\u00fcnf", "4", "hash", 0),
    ("#### 4 or f\u00fcnf", "4", "hash", 0),
    ("#### 4 or V", "4", "hash", 0),
    ("#### 4 or IV", "4", "hash", 0),
    ("#### 4 y cinco", "4", "hash", 0),                             # a number word in Spanish
    ("#### 4 \u0438\u043b\u0438 \u043f\u044f\u0442\u044c", "4", "hash", 0),          # Russian "4 or five"
    ("#### 18 eggs per day", "18", "hash", 1),                      # units stay honest
    ("#### 5 hours.", "5", "hash", 1),
    ("#### 5 o'clock", "5", "hash", 1),                             # one word, not "o"
    ("#### 5 more apples", "5", "hash", 1),                         # answers "how many more"
    ("#### 500 feet above sea level", "500", "hash", 1),            # "above" ends no answer here
    # --- GSM8K: the number not first and alone (GSM8K's own regex reads 6, nothing, 1, nothing)
    ("#### 6 x 3 = 18", "18", "hash", 0),
    ("#### Answer: 18", "18", "hash", 0),
    ("#### 1 000 000", "1000000", "hash", 0),
    ("#### `18`", "18", "hash", 0),
    # --- GSM8K: restatements
    ("#### 15 (5 + 10)", "15", "hash", 1),
    ("#### 15 = 5 + 10", "15", "hash", 1),
    ("#### 15 (= 3 x 5)", "15", "hash", 1),
    ("#### 15 (5 + 10 = 15)", "15", "hash", 1),
    ("#### 16 (5 + 10)", "16", "hash", 0),                           # the restatement disagrees
    ("#### 120 minutes = 2 hours", "120", "hash", 1),
    ("#### 120 minutes = 2 hours", "2", "hash", 0),                  # the answer is the first number
    ("#### 120 minutes = 3 hours", "120", "hash", 0),
    ("#### 90 minutes (1.5 hours)", "90", "hash", 1),
    ("#### 36 inches = 3 feet", "36", "hash", 1),
    ("#### $1.50 (150 cents)", "1.5", "hash", 1),
    ("#### 18 dollars (9 \u00d7 2)", "18", "hash", 1),
    ("#### $1,200 in 2023", "1200", "hash", 1),                      # a year is context, not an answer
    ("#### 2 (3 - 1)", "2", "hash", 1),
    ("#### 6 ((1 + 2) * 2)", "6", "hash", 1),
    # --- boxed: numbers and fractions
    ("The answer is $\\boxed{42}$.", "42", "boxed", 1),
    ("$\\boxed{41}$", "42", "boxed", 0),
    ("$\\boxed{-\\frac{1}{2}}$", "-\\frac{1}{2}", "boxed", 1),
    ("$\\boxed{0.5}$", "\\frac{1}{2}", "boxed", 1),
    ("$\\boxed{\\frac{2}{4}}$", "\\frac12", "boxed", 1),
    ("$\\boxed{\\dfrac{3}{2}}$", "\\frac{3}{2}", "boxed", 1),
    ("$\\boxed{1.5}$", "\\frac{3}{2}", "boxed", 1),
    ("$\\boxed{\\frac{1}{3}}$", "\\frac{1}{2}", "boxed", 0),
    ("$\\boxed{2\\sqrt{3}}$", "\\sqrt{12}", "boxed", 1),
    ("$\\boxed{x = 5}$", "5", "boxed", 1),
    ("$\\boxed{5\\text{ cm}}$", "5", "boxed", 1),
    ("$\\boxed{25\\text{ cm}^2}$", "25", "boxed", 1),
    ("$\\boxed{\\$1,200}$", "1200", "boxed", 1),
    ("$\\boxed{\\text{5}}$", "5", "boxed", 1),
    ("$\\boxed{90\u00b0}$", "90", "boxed", 1),
    ("$\\boxed{5.}$", "5", "boxed", 1),
    ("$\\boxed{3 + 4 = 7}$", "7", "boxed", 1),                      # each side of "=" is right
    ("$\\boxed{12 = 34}$", "34", "boxed", 0),
    ("$\\boxed{12 = 34}$", "12", "boxed", 0),
    ("$\\boxed{12 | 34}$", "34", "boxed", 0),                       # math-verify would read 34
    ("$\\boxed{12 \\approx 34}$", "12", "boxed", 0),               # math-verify would read 12
    ("$\\boxed{12 \\\\ 34}$", "34", "boxed", 0),
    ("$\\boxed{12 \\text{ (} 34\\text{)}}$", "12", "boxed", 0),
    # --- boxed: thin spaces and thousands separators
    ("$\\boxed{12\\,300}$", "12300", "boxed", 1),
    ("$\\boxed{12\\,300}$", "312", "boxed", 0),
    ("$\\boxed{12\\;300}$", "12300", "boxed", 1),
    ("$\\boxed{12\\ 300}$", "12300", "boxed", 1),
    ("$\\boxed{12\u2009300}$", "12300", "boxed", 1),
    ("$\\boxed{1{,}000}$", "1000", "boxed", 1),
    ("$\\boxed{10,\\!000}$", "10000", "boxed", 1),
    ("$\\boxed{12,300}$", "12300", "boxed", 1),
    ("$\\boxed{12\\,300}$", "12,\\!300", "boxed", 1),
    ("$\\boxed{1,000,000}$", "10^6", "boxed", 1),
    ("$\\boxed{12\\,30}$", "1230", "boxed", 0),                      # not groups of three: not one number
    ("$\\boxed{1,2}$", "12", "boxed", 0),
    ("$\\boxed{1,234}$", "(1,234)", "boxed", 1),                     # the gold is a pair: so is the answer
    ("$\\boxed{1,234}$", "1234", "boxed", 1),                        # the gold is a number: so is the answer
    # --- boxed: percent
    ("$\\boxed{40\\%}$", "40\\%", "boxed", 1),
    ("$\\boxed{40}$", "40\\%", "boxed", 1),
    ("$\\boxed{0.4}$", "40\\%", "boxed", 0),
    ("$\\boxed{4000\\%}$", "40", "boxed", 0),
    ("$\\boxed{40\\%}$", "40", "boxed", 1),
    ("$\\boxed{40\\%}$", "0.4", "boxed", 0),
    ("$\\boxed{40 \\text{ percent}}$", "40", "boxed", 1),
    ("$\\boxed{\\frac{1}{4}}$", "25\\%", "boxed", 0),             # a fraction is not a percent
    ("$\\boxed{\\frac{40\\%}{1}}$", "40", "boxed", 0),              # a percent inside: the gold has none
    # --- boxed: scientific notation
    ("$\\boxed{1.5e3}$", "1500", "boxed", 1),
    ("$\\boxed{1.5E3}$", "1500", "boxed", 1),
    ("$\\boxed{1.5 \\times 10^3}$", "1500", "boxed", 1),
    ("$\\boxed{1.5\\cdot10^{3}}$", "1500", "boxed", 1),
    ("$\\boxed{1.5 \u00d7 10^3}$", "1500", "boxed", 1),
    ("$\\boxed{3e-2}$", "0.03", "boxed", 1),
    ("$\\boxed{1.5e3}$", "150", "boxed", 0),
    ("$\\boxed{2e}$", "2e", "boxed", 1),                            # Euler's e, not an exponent
    # --- boxed: intervals and inequalities
    ("$\\boxed{[2,5]}$", "[2,5]", "boxed", 1),
    ("$\\boxed{2 \\le x \\le 5}$", "[2,5]", "boxed", 1),
    ("$\\boxed{2 \\leq x \\leq 5}$", "[2,5]", "boxed", 1),
    ("$\\boxed{2 < x \\le 5}$", "(2,5]", "boxed", 1),
    ("$\\boxed{2 < x \\le 5}$", "[2,5]", "boxed", 0),
    ("$\\boxed{5 \\ge x \\ge 2}$", "[2,5]", "boxed", 1),
    ("$\\boxed{x \\ge 3}$", "[3, \\infty)", "boxed", 1),
    ("$\\boxed{x > 3}$", "[3, \\infty)", "boxed", 0),
    ("$\\boxed{x < 3}$", "(-\\infty,3)", "boxed", 1),
    ("$\\boxed{3 \\geq x}$", "(-\\infty,3]", "boxed", 1),
    ("$\\boxed{x \\leq -\\frac{1}{2}}$", "(-\\infty,-\\frac{1}{2}]", "boxed", 1),
    ("$\\boxed{[2,5]}$", "2 \\le x \\le 5", "boxed", 1),           # a gold written as an inequality
    ("$\\boxed{(-\\infty, 3)}$", "(-\\infty,3]", "boxed", 0),
    ("$\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}$", "\\left( 3, \\frac{\\pi}{2} \\right)", "boxed", 1),
    # --- boxed: text golds
    ("$\\boxed{Sey}$", "Yes", "boxed", 0),                          # not a product of symbols
    ("$\\boxed{yes}$", "Yes", "boxed", 1),
    ("$\\boxed{\\text{Yes}}$", "Yes", "boxed", 1),
    ("$\\boxed{YES.}$", "Yes", "boxed", 1),
    ("$\\boxed{No}$", "Yes", "boxed", 0),
    ("$\\boxed{\\textbf{No}}$", "\\text{No}", "boxed", 1),
    ("$\\boxed{Yes, No}$", "Yes", "boxed", 0),
    ("$\\boxed{\\text{Monday}}$", "\\text{Monday}", "boxed", 1),
    ("$\\boxed{Tuesday}$", "\\text{Monday}", "boxed", 0),
    ("$\\boxed{\\text{(C)}}$", "\\text{(C)}", "boxed", 1),
    ("$\\boxed{C}$", "\\text{(C)}", "boxed", 1),
    ("$\\boxed{(D)}$", "\\text{(C)}", "boxed", 0),
    ("$\\boxed{\\text{C or D}}$", "\\text{(C)}", "boxed", 0),
    ("$\\boxed{odd}$", "\\text{odd}", "boxed", 1),
    ("$\\boxed{dod}$", "\\text{odd}", "boxed", 0),
    ("$\\boxed{\\text{Evelyn}}$", "Evelyn", "boxed", 1),
    ("#### Yes", "Yes", "boxed", 0),                                  # right, not as asked (lenient)
    # --- boxed: matrices, tuples, sets
    ("$\\boxed{\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}}$", "\\begin{pmatrix}1\\\\2\\end{pmatrix}", "boxed", 1),
    ("$\\boxed{\\begin{pmatrix} 2 \\\\ 1 \\end{pmatrix}}$", "\\begin{pmatrix}1\\\\2\\end{pmatrix}", "boxed", 0),
    ("$\\boxed{(3, \\frac{\\pi}{2})}$", "\\left( 3, \\frac{\\pi}{2} \\right)", "boxed", 1),
    ("$\\boxed{(\\frac{\\pi}{2}, 3)}$", "\\left( 3, \\frac{\\pi}{2} \\right)", "boxed", 0),
    ("$\\boxed{1,2}$", "(1,2)", "boxed", 1),
    ("$\\boxed{2, 1}$", "\\{1,2\\}", "boxed", 1),
    ("$\\boxed{\\{1, 2, 3\\}}$", "\\{1,2\\}", "boxed", 0),
    ("$\\boxed{x = -1 \\text{ or } x = 3}$", "-1, 3", "boxed", 1),  # "or" lists the solutions
    ("$\\boxed{x = 2, y = 3}$", "(2,3)", "boxed", 1),
    ("$\\boxed{(1,2) = (3,4)}$", "(3,4)", "boxed", 0),
    ("$\\boxed{\\pm 2}$", "2, -2", "boxed", 1),
    ("$\\boxed{\\begin{bmatrix} 1 \\\\ 2 \\end{bmatrix}}$", "\\begin{pmatrix}1\\\\2\\end{pmatrix}", "boxed", 1),
    ("$\\boxed{\\begin{pmatrix}1\\\\2\\end{pmatrix} \\text{ (not } \\begin{pmatrix}3\\\\4\\end{pmatrix}}$",
     "\\begin{pmatrix}1\\\\2\\end{pmatrix}", "boxed", 0),
    # --- boxed: hedges
    ("$\\boxed{4 \\text{ or } 5}$", "5", "boxed", 0),
    ("$\\boxed{5 \\text{ (not } 4)}$", "4", "boxed", 0),
    ("$\\boxed{5 \\text{ (not } 4)}$", "5", "boxed", 0),
    ("$\\boxed{4 \\lor 5}$", "5", "boxed", 0),
    ("$\\boxed{4, 5}$", "4", "boxed", 0),
    ("$\\boxed{4 \\text{ (or } 5\\text{)}}$", "4", "boxed", 0),
    ("$\\boxed{\\text{Area} = 25}$", "25", "boxed", 1),              # a label, not a hedge
    # --- boxed: "or", "and", "to" in another language or script, or a one-letter word, between numbers
    *_either("\\boxed{4 \\text{\u6216} 5}", "4", "5"),                     # Chinese "or"
    *_either("\\boxed{4 \\text{ \u6216 } 5}", "4", "5"),
    *_either("\\boxed{\\text{4 \u6216 5}}", "4", "5"),
    *_either("\\boxed{4 \\mathrm{\u6216} 5}", "4", "5"),
    *_either("\\boxed{4 \u0438\u043b\u0438 5}", "4", "5"),                   # Russian "or"
    *_either("\\boxed{4 \\text{\u0438\u043b\u0438} 5}", "4", "5"),
    *_either("\\boxed{4 \\textrm{ \ub610\ub294 } 5}", "4", "5"),            # Korean
    *_either("\\boxed{4 \\text{ \u307e\u305f\u306f } 5}", "4", "5"),        # Japanese
    *_either("\\boxed{4 \\text{ \u0623\u0648 } 5}", "4", "5"),              # Arabic
    *_either("\\boxed{4 \\text{\u00f3} 5}", "4", "5"),                    # Spanish
    *_either("\\boxed{4 \\text{\u00e9} 5}", "4", "5"),                    # Portuguese
    *_either("\\boxed{4 \\text{ (o } 5)}", "4", "5"),
    *_either("\\boxed{4 \\operatorname{ o } 5}", "4", "5"),
    *_either("\\boxed{4 e 5}", "4", "5"),
    *_either("\\boxed{4 a 5}", "4", "5"),
    *_either("\\boxed{\\frac{1}{2}\\textsf{y}3}", "\\frac12", "3"),
    *_either("\\boxed{\\frac{1}{2}\\text{\u6216}3}", "\\frac12", "3"),
    ("$\\boxed{2x+1}$", "2x+1", "boxed", 1),                       # a one-letter variable is no word
    ("$\\boxed{y = 2x+1}$", "2x+1", "boxed", 1),
    # --- boxed: a range or a malformed separator between numbers (math-verify reads one of them)
    *_either("\\boxed{4 ~ 5}", "4", "5"),
    *_either("\\boxed{4 \\text{ ~ } 5}", "4", "5"),
    *_either("\\boxed{4 \\mathrm{~} 5}", "4", "5"),
    *_either("\\boxed{4 ... 5}", "4", "5"),
    *_either("\\boxed{4 \\text{ ... } 5}", "4", "5"),
    *_either("\\boxed{4 .. 5}", "4", "5"),
    *_either("\\boxed{4 . 5}", "4", "5"),
    *_either("\\boxed{4 ( 5}", "4", "5"),
    *_either("\\boxed{4 ) 5}", "4", "5"),
    *_either("\\boxed{4 [ 5}", "4", "5"),
    *_either("\\boxed{4 ] 5}", "4", "5"),
    *_either("\\boxed{4 {} 5}", "4", "5"),
    *_either("\\boxed{4\\textstyle 5}", "4", "5"),
    *_either("\\boxed{4 \\text{ [ } 5}", "4", "5"),
    *_either("\\boxed{4 \\text{ ) } 5}", "4", "5"),
    *_either("\\boxed{4 \\operatorname{ , } 5}", "4", "5"),
    *_either("\\boxed{4 \\operatorname{ / } 5}", "4", "5"),
    *_either("\\boxed{4 \\mathbb 5}", "4", "5"),
    *_either("\\boxed{4 \\circ 5}", "4", "5"),
    *_either("\\boxed{4 \\lfloor 5}", "4", "5"),
    *_either("\\boxed{\\frac{1}{2}(3}", "\\frac12", "3"),
    *_either("\\boxed{\\frac{1}{2}{}3}", "\\frac12", "3"),
    *_either("\\boxed{\\frac{1}{2}\\text{[}3}", "\\frac12", "3"),
    *_either("\\boxed{\\frac{1}{2}\\sqrt\\theta3}", "\\frac12", "3"),     # math-verify reads 1/2 and drops the rest
    *_either("\\boxed{\\frac{1}{2}.\\frac3}", "\\frac12", "3"),
    *_either("\\boxed{\\frac{1}{2}/\\div3}", "\\frac12", "3"),
    *_either("\\boxed{\\frac{1}{2}\\mathbb^3}", "\\frac12", "3"),          # ^3 after a command is no unit's power
    *_either("\\boxed{4\\times\\infty5}", "4", "5"),                   # \infty only where the gold has it
    *_either("\\boxed{4 \\big/ 5}", "4", "5"),                         # it is 4/5
    *_either("\\boxed{4 \\Big/ 5}", "4", "5"),
    ("$\\boxed{4 \\big/ 5}$", "\\frac{4}{5}", "boxed", 1),
    ("$\\boxed{\\log_2 8}$", "3", "boxed", 1),                       # a subscript joins the next number
    ("$\\boxed{\\sqrt[3]{8}}$", "2", "boxed", 1),
    ("$\\boxed{\\frac{\\sqrt 3}2}$", "\\frac{\\sqrt{3}}{2}", "boxed", 1),
    ("$\\boxed{1\\frac{1}{2}}$", "\\frac{3}{2}", "boxed", 1),
    # --- boxed: words after the number that qualify it or offer another
    ("$\\boxed{4 \\text{ or V}}$", "4", "boxed", 0),
    ("$\\boxed{4 \\text{ or a couple}}$", "4", "boxed", 0),
    ("$\\boxed{4 \\text{ o cinco}}$", "4", "boxed", 0),
    ("$\\boxed{4 \\text{ or twice that}}$", "4", "boxed", 0),
    ("$\\boxed{40 \\text{ or more}}$", "40", "boxed", 0),
    ("$\\boxed{40 \\text{ at least}}$", "40", "boxed", 0),
    ("$\\boxed{40 \\text{ or so}}$", "40", "boxed", 0),
    ("$\\boxed{40 \\text{ (approx.)}}$", "40", "boxed", 0),
    ("$\\boxed{5 \\text{ hundred}}$", "5", "boxed", 0),              # a number word
    ("$\\boxed{\\text{5 or so}}$", "5", "boxed", 0),
    ("$\\boxed{5 \\text{ cm}}$", "5", "boxed", 1),                   # units stay honest
    ("$\\boxed{5\\text{ cm}^2}$", "5", "boxed", 1),
    ("$\\boxed{18 \\text{ dollars}}$", "18", "boxed", 1),
    ("$\\boxed{5 \\text{ more}}$", "5", "boxed", 1),
    ("$\\boxed{5~\\text{cm}}$", "5", "boxed", 1),
    # --- boxed: a number and its unit in one \text{}
    ("$\\boxed{\\text{5 cm}}$", "5", "boxed", 1),
    ("$\\boxed{\\text{5 apples}}$", "5", "boxed", 1),
    ("$\\boxed{\\textbf{5 cm}}$", "5", "boxed", 1),
    ("$\\boxed{\\mbox{5 cm}}$", "5", "boxed", 1),
    ("$\\boxed{\\text{5 cm}}$", "5\\text{ cm}", "boxed", 1),
    ("$\\boxed{\\text{5 or 6}}$", "5", "boxed", 0),
    # --- boxed: equations whose one side is a label
    ("$\\boxed{5 = x}$", "5", "boxed", 1),
    ("$\\boxed{f(x) = 2x+3}$", "2x+3", "boxed", 1),
    ("$\\boxed{f(x) = 2x+4}$", "2x+3", "boxed", 0),
    ("$\\boxed{D = C}$", "C", "boxed", 0),                          # two letters offered for one
    ("$\\boxed{D = C}$", "D", "boxed", 0),
    ("$\\boxed{C}$", "C", "boxed", 1),
    # --- boxed: several choices, in any order
    ("$\\boxed{A, C}$", "\\text{A, C}", "boxed", 1),
    ("$\\boxed{\\text{C, A}}$", "\\text{A, C}", "boxed", 1),
    ("$\\boxed{(C), (A)}$", "\\text{A, C}", "boxed", 1),
    ("$\\boxed{A, C, D}$", "\\text{A, C}", "boxed", 0),
    ("$\\boxed{A}$", "\\text{A, C}", "boxed", 0),
    ("$\\boxed{A, A, C}$", "\\text{A, C}", "boxed", 0),
    # --- boxed: math-verify's numeric tolerance (6 decimal places), left as TRL and open-r1 use it
    ("$\\boxed{1.414214}$", "\\sqrt2", "boxed", 1),
    ("$\\boxed{1.4142}$", "\\sqrt2", "boxed", 0),
    # --- reasoning blocks
    ("<think>maybe \\boxed{3}</think> The answer is \\boxed{4}.", "4", "boxed", 1),
    ("<think>maybe \\boxed{3}</think> The answer is \\boxed{4}.", "3", "boxed", 0),
    ("<think>it is \\boxed{4}</think> I am not sure.", "4", "boxed", 0),     # the box in the reasoning
    ("<think>a long reasoning, so \\boxed{4}", "4", "boxed", 0),               # never closed: no answer
    ("so the total is 4.</think>\n#### 4", "4", "hash", 1),                    # the prompt opened the block
    ("<think>#### 5</think>\n#### 4", "5", "hash", 0),
    ("<think>#### 5</think>\n#### 4", "4", "hash", 1),
    ("<think>a</think> then <think>b \\boxed{4}", "4", "boxed", 0),
    ("<think>a</think> b <think>c \\boxed{3}</think> \\boxed{4}", "4", "boxed", 1),
]


@pytest.mark.parametrize("completion, gold, fmt, reward", TABLE)
def test_each_answer_form_is_graded(completion, gold, fmt, reward):
    v = math_answers.math_verdict(completion, gold, fmt)
    assert v["reward"] == reward and v["passed"] == (reward == 1), v


@pytest.mark.parametrize("completion, gold, fmt, status, detail", [
    ("<think>so it is \\boxed{4}", "4", "boxed", "failed", "never closed"),
    ("<think>\\boxed{3}</think> so 4", "4", "boxed", "lenient", "last_number"),   # after the block, unboxed
    ("#### Yes", "Yes", "boxed", "lenient", "hash"),
    ("#### 4 or 5", "5", "hash", "failed", "4 or 5"),
])
def test_statuses_say_what_was_found(completion, gold, fmt, status, detail):
    v = math_answers.math_verdict(completion, gold, fmt)
    assert v["status"] == status and detail in v["detail"], v


def test_the_table_covers_the_families():
    assert len(TABLE) >= 100
    assert {fmt for _, _, fmt, _ in TABLE} == {"hash", "boxed"}
    assert {r for _, _, _, r in TABLE} == {0, 1}


# ----------------------------------------------------------------------------- properties

NUMBERS = ["4", "5", "12", "-3", "0.5", "2.75", "1,200", "40"]
HASH_HEDGES = ["#### {a} or {b}", "#### {a}, not {b}", "#### {a} out of {b}", "#### {a} (or {b})",
               "#### {a} to {b}", "#### {a} and {b}", "#### {a}-{b}", "#### {a} = {b}", "#### {a} ({b})",
               "#### {a}; {b}", "#### {a} {b}", "#### {a} or maybe {b}", "#### either {a} or {b}",
               "#### {a} or {b}.", "#### {a} dollars or {b} dollars", "#### {a}, {b}"]
BOXED_HEDGES = ["\\boxed{{{a}, {b}}}", "\\boxed{{{a} \\text{{ or }} {b}}}", "\\boxed{{{a} \\lor {b}}}",
                "\\boxed{{{a} \\vee {b}}}", "\\boxed{{{a} \\text{{ (or }} {b})}}",
                "\\boxed{{{a} \\text{{, not }} {b}}}",
                "\\boxed{{{a} \\text{{ out of }} {b}}}", "\\boxed{{{a} \\; \\text{{or}} \\; {b}}}",
                "\\boxed{{{a} \\text{{ and }} {b}}}", "\\boxed{{{a} \\text{{ or maybe }} {b}}}",
                "\\boxed{{{a} \\text{{ (not }} {b})}}", "\\boxed{{{a} \\text{{ to }} {b}}}",
                "\\boxed{{\\text{{{a} or {b}}}}}", "\\boxed{{{a} \\text{{ or }} {b}\\%}}",
                "\\boxed{{{a} | {b}}}", "\\boxed{{{a} \\mid {b}}}", "\\boxed{{{a} \\\\ {b}}}",
                "\\boxed{{{a} \\approx {b}}}", "\\boxed{{{a} = {b}}}", "\\boxed{{x = {a} = {b}}}",
                "\\boxed{{{a} \\to {b}}}", "\\boxed{{{a} \\Rightarrow {b}}}", "\\boxed{{{a} \\sim {b}}}",
                "\\boxed{{{a}; {b}}}", "\\boxed{{{a} \\dots {b}}}", "\\boxed{{{a} \\cup {b}}}",
                "\\boxed{{{a} \\equiv {b}}}", "\\boxed{{{a} \\colon {b}}}", "\\boxed{{{a} \\& {b}}}",
                "\\boxed{{{a} \\text{{ (}} {b}\\text{{)}}}}", "\\boxed{{{a} \\quad {b}}}", "\\boxed{{{a} \\pm {b}}}"]


def _latex(number: str) -> str:
    return number.replace(",", "{,}")  # a boxed gold of one number, its thousands separator as LaTeX writes it


@pytest.mark.parametrize("fmt, templates", [("hash", HASH_HEDGES), ("boxed", BOXED_HEDGES)])
def test_no_hedge_of_two_numbers_scores_for_either(fmt, templates):
    """Every pair of different numbers in every hedge form scores 0 against either number as the gold."""
    scored = []
    for a, b in itertools.permutations(NUMBERS, 2):
        for template in templates:
            completion = template.format(a=a, b=b)
            for gold in (a, b):
                v = math_answers.math_verdict(completion, gold if fmt == "hash" else _latex(gold), fmt)
                if v["reward"] != 0:
                    scored.append((completion, gold))
    assert not scored, scored[:10]


# What may stand between two numbers and still leave two answers: "or", "and", "to" in other languages and
# scripts, one-letter words, ranges, spacing, style, unbalanced brackets, marks (math-verify falls back to
# the last or the first number where it cannot read the whole).
SEPARATORS = [
    " \\text{\u6216} ", "\\text{\u6216}", " \\mathrm{\u6216} ", " \u0438\u043b\u0438 ", " \\text{\u0438\u043b\u0438} ",
    " \\textrm{ \ub610\ub294 } ", " \\text{ \u307e\u305f\u306f } ", " \\text{ \u0623\u0648 } ", " \\text{\u00f3} ",
    " \\text{\u00e9} ", " \\operatorname{ o } ", " o ", " ou ", " oder ", " e ", " a ", " y ", "\\textsf{y}",
    " ~ ", " \\text{ ~ } ", " \\mathrm{~} ", " ... ", " \\text{ ... } ", " .. ", " . ", " ( ", " ) ",
    " [ ", " ] ", " {} ", "{}", "\\textstyle ", "\\displaystyle ", " \\text{ [ } ", "\\text{[}",
    " \\text{ ) } ", " \\operatorname{ , } ", " \\operatorname{ / } ", " \\mathbb ", " \\circ ",
    " \\lfloor ", " \\rceil ", " \\big/ ", " \\Big/ ", " \\, ", " \\; ", " \\quad ", " \\% ",
    " \\text{ (o } ", " \\text{ a } ", " \\pi ", "\\sqrt\\theta", ".\\frac", "/\\div", "\\times\\infty", "\\infty^"]


@pytest.mark.parametrize("fmt", ["hash", "boxed"])
def test_no_two_numbers_around_a_separator_score_for_either(fmt):
    """`\\boxed{a SEP b}` and `#### a SEP b` score 0 against a and against b, for every pair of different
    numbers and every separator."""
    scored = []
    for (a, b), sep in itertools.product(itertools.permutations(NUMBERS, 2), SEPARATORS):
        completion = f"\\boxed{{{a}{sep}{b}}}" if fmt == "boxed" else f"#### {a}{sep}{b}"
        for gold in (a, b):
            if math_answers.math_verdict(completion, gold if fmt == "hash" else _latex(gold), fmt)["reward"] != 0:
                scored.append((completion, gold))
    assert not scored, scored[:10]


# What may follow the number and leave no answer: a bound, an estimate, another answer offered in words.
QUALIFIERS = [" or more", " or fewer", " or less", "+", " at least", " at most", " or so", "ish", "-odd",
              " approximately", " (approx.)", " roughly", " or a couple", " or twice that", " or V", " or IV",
              " or the next integer", " or a few more", " o cinco", " ou cinq", " oder f\u00fcnf", " and up",
              " and over", " plus", " max", " maybe", " give or take", " more or less", " \u6216", " \u5de6\u53f3",
              " \u0438\u043b\u0438 \u043f\u044f\u0442\u044c", " y cinco", " or^3"]
# What may follow it and leave the answer: units, as people write them.
UNITS = [" dollars", " eggs per day", " cm", " m^2", " hours.", " more apples", " feet above sea level",
         " km/h", " square units"]


@pytest.mark.parametrize("fmt", ["hash", "boxed"])
def test_a_qualified_answer_scores_0_and_a_unit_keeps_it_right(fmt):
    """`#### n Q` and `\\boxed{n \\text{Q}}` score 0 against n for every qualifier Q; the same with a unit
    instead scores 1."""
    wrong = []
    for n, (words, reward) in itertools.product(NUMBERS, [(q, 0) for q in QUALIFIERS] + [(u, 1) for u in UNITS]):
        if fmt == "hash":
            completion, gold = f"#### {n}{words}", n
        else:
            unit, power = words.split("^") if "^" in words else (words, "")
            completion = f"\\boxed{{{n}\\text{{{unit}}}{'^' + power if power else ''}}}"
            gold = _latex(n)
        if math_answers.math_verdict(completion, gold, fmt)["reward"] != reward:
            wrong.append((completion, gold, reward))
    assert not wrong, wrong[:10]


# Answers that are not one number: tuples, intervals, sets, matrices, expressions.
COLLECTIONS = [("(1, 2)", "(3, 4)"), ("[1, 2]", "(3, 4]"), ("\\{1, 2\\}", "\\{3\\}"), ("x+1", "x+2"),
               ("\\begin{pmatrix}1\\\\2\\end{pmatrix}", "\\begin{pmatrix}3\\\\4\\end{pmatrix}")]
COLLECTION_HEDGES = [" | ", " \\mid ", " \\\\ ", " \\approx ", " = ", " \\to ", " \\sim ", "; ", " \\dots ",
                     " \\text{ (not } ", " \\text{, not } ", " \\text{ maybe } ", " \\equiv ", " \\colon ",
                     " \\Rightarrow ", " \\setminus ", " \\oplus "]


def test_no_hedge_of_two_collections_scores_for_either():
    """Two tuples, intervals, sets, expressions or matrices joined by what math-verify reads as one of
    them (or by words) score 0 against either."""
    scored = []
    for (a, b), sep in itertools.product(COLLECTIONS, COLLECTION_HEDGES):
        for first, second in ((a, b), (b, a)):
            completion = "\\boxed{" + first + sep + second + "}"
            scored += [(completion, gold) for gold in (first, second)
                       if math_answers.math_verdict(completion, gold, "boxed")["reward"] != 0]
    assert not scored, scored[:10]


# Final answers as GSM8K's own solutions write them after "####" (its golds are whole numbers, some
# negative, some with thousands separators; a few GSM8K-style sets write decimals).
GSM8K_GOLDS = ["72", "10", "5", "42", "624", "35", "48", "16", "1,200", "-3", "0", "2.25", "125000",
               "1,000,000", "18", "3", "460", "70000", "0.5", "366"]


@pytest.mark.parametrize("gold", GSM8K_GOLDS)
def test_every_gsm8k_gold_reads_back(gold):
    """`#### {gold}` scores 1 against the gold as read from a GSM8K row, as does the row's own solution,
    the gold with a unit, and the gold restated; `#### {gold} or {other}` scores 0."""
    row = {"question": "q", "answer": f"Work it out step by step.\n#### {gold}"}
    _, answer, fmt = math_answers.math_reference(row)
    assert fmt == "hash"
    for completion in (f"#### {gold}", row["answer"], f"The total is:\n#### {gold} dollars",
                       f"#### {gold} ({gold} + 0)", f"<think>maybe 7</think>\n#### {gold}"):
        assert math_answers.math_verdict(completion, answer, fmt)["reward"] == 1, completion
    other = "7" if gold != "7" else "8"
    assert math_answers.math_verdict(f"#### {gold} or {other}", answer, fmt)["reward"] == 0


# ----------------------------------------------------------------------------- the readers themselves

@pytest.mark.parametrize("line, value", [
    ("72", 72), ("$1,200 in 2023", 1200), ("120 minutes = 2 hours", 120), ("15 (5 + 10)", 15),
    ("-$5", -5), ("$-5", -5), ("\u22127", -7), ("3/4 cup", 0.75), ("1.5e3", 1500), ("18 dollars.", 18),
    ("4 or 5", None), ("10, not 42", None), ("28 out of 40", None), ("many", None), ("", None),
    ("5 ((((", None), ("5 (1 / 0)", None), ("5 = )(", None),
])
def test_hash_number_reads_one_number_or_none(line, value):
    assert hash_answers.hash_number(line) == value


@pytest.mark.parametrize("latex, interval", [
    ("2 \\le x \\le 5", "[2,5]"), ("x \\ge 3", "[3,\\infty)"), ("x < 3", "(-\\infty,3)"), ("5 > x", "(-\\infty,5)"),
    ("-1 < t \\leq 2", "(-1,2]"), ("5 \\geq y > 1", "(1,5]"), ("\\left( 3, \\frac{\\pi}{2} \\right)", None),
    ("2 < x > 5", None), ("x \\le y", None), ("\\pi < 4", None),
])
def test_inequalities_read_as_intervals(latex, interval):
    assert math_answers._as_interval(latex) == (interval or latex)


def test_reading_is_linear_in_the_answer_length():
    """Crafted "####" lines and boxed answers near MAX_ANSWER_CHARS read in well under a second each:
    parentheses, restatements, separators, qualifiers, brackets and the numbers side by side are single
    scans."""
    n = math_answers.MAX_ANSWER_CHARS
    lines = ["1" + " (" * (n // 2 - 1), "1 (" + "(" * (n // 2 - 4) + "1" + ")" * (n // 2 - 4) + ")",
             "1 = " + "1 * " * (n // 4 - 2) + "1", "1" + ",000" * (n // 4 - 1), "1" + " " * (n - 2) + "x"]
    lines += ["1 " + "o " * (n // 2 - 1), "1" + "-" * (n - 4) + "odd", "1 " + "and " * (n // 4 - 1) + "up"]
    boxed = ["1" + "\\,000" * (n // 5 - 1), "1" + "e" * (n - 1), "x \\le " * (n // 6)]
    crafted = ["4 ~ " * (n // 4), "\\text{" * (n // 6), "\\text{5 " + "a" * (n - 8), "(" * n, "A, " * (n // 3),
               " o" * (n // 2), "}{1" * (n // 3), "_" * (n - 3) + "1 2", "\\frac{1}" * (n // 8), "\\lfloor" * (n // 7)]
    for text in crafted:  # the readers of one answer: each a single scan
        for reader in (math_answers._joined, math_answers._balanced, math_answers._offers_more,
                       math_answers._letters, math_answers._text_before_a_digit):
            t0 = time.monotonic()
            reader(text)
            assert time.monotonic() - t0 < 0.1, (reader.__name__, text[:40])
    for line in lines:
        t0 = time.monotonic()
        math_answers.math_verdict("#### " + line, "1", "hash")
        assert time.monotonic() - t0 < 1.0, line[:40]
    for text in boxed:
        t0 = time.monotonic()
        math_answers._as_interval(math_answers._strip_percent(math_answers._normalize(text, commas=True)))
        assert time.monotonic() - t0 < 0.1, text[:40]
