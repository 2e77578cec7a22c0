"""Grading benchmark answers: the last `\\boxed{}` of a response against the reference answer.

Math: when the optional `math-verify` package is installed and parses both answers, its verifier
decides (as in oat and lighteval, so numbers compare with theirs), under a per-item timeout; a
parse or comparison that times out is left to the normaliser. Before math-verify reads them, both
answers lose LaTeX spacing between digit groups (`3\\,000` -> `3000`) and a number in e-notation
becomes a power of ten (`1.3e-07` -> `1.3\\times10^{-7}`; math-verify reads that e as Euler's number).
Otherwise the normaliser decides: equal after normalisation (spacing, `\\left`/`\\right`, `\\dfrac`,
degrees, `\\text{}`, dollar signs, a trailing period, a leading `x =`), or numerically equal
(integers, decimals, e-notation, `\\times10^{k}`, fractions, `\\frac`, percentages). Without
math-verify, answers that need algebra to compare (e.g. `\\sqrt{8}` vs `2\\sqrt{2}`) are graded
wrong: install the `eval` extra for benchmark numbers. Each graded answer records which of the two
decided.  Multiple choice: the letter in the last box.
"""
from __future__ import annotations

import re
import threading
from fractions import Fraction

_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
# A backslash escapes the next character (`\{`, `\}`, `\\`); only bare braces nest.
_BRACE_OR_ESCAPE = re.compile(r"\\.|[{}]", re.DOTALL)


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`), its braces matched with escaped braces
    (`\\{`, `\\}`) not counted; None when there is none or the last one never closes (a truncated
    response), as the MATH reference's last_boxed_only_string. One pass over the text."""
    last = None
    for last in _BOX.finditer(text):
        pass
    if last is None:
        return None
    depth = 1
    for m in _BRACE_OR_ESCAPE.finditer(text, last.end()):
        token = m.group()
        if token == "{":
            depth += 1
        elif token == "}":
            depth -= 1
            if depth == 0:
                return text[last.end():m.start()]
    return None


def _unwrap(s: str, command: str) -> str:
    """Replace every `\\command{x}` by x, its braces matched with escaped braces not counted; one
    that never closes is kept. One pass: a response can nest or repeat the command thousands of times."""
    head = "\\" + command + "{"
    opened, cut = [], []  # the span of each open group's head (None for a bare brace); the spans to drop
    for m in re.finditer(re.escape(head) + r"|\\.|[{}]", s, re.DOTALL):
        token = m.group()
        if token in (head, "{"):
            opened.append(m.span() if token == head else None)
        elif token == "}" and opened and (start := opened.pop()) is not None:
            cut += [start, m.span()]
    kept, pos = [], 0
    for start, end in sorted(cut):
        kept.append(s[pos:start])
        pos = end
    return "".join(kept) + s[pos:]


def normalize(answer: str) -> str:
    """A canonical string form of a math answer (cosmetic differences removed)."""
    s = answer.strip()
    for command in ("text", "textbf", "mathrm", "mbox"):
        s = _unwrap(s, command)
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"\^\s*(?:\{\s*)?\\circ\s*\}?", "", s).replace("\\circ", "").replace("°", "")
    s = s.replace("\\$", "").replace("$", "")
    s = re.sub(r"\\[,;:! ]", "", s)
    s = re.sub(r"\s+", "", s)
    s = s.rstrip(".")
    s = re.sub(r"^[a-zA-Z]=(?!=)", "", s)  # "x=5" -> "5"
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)  # "\frac12" -> "\frac{1}{2}"
    return s


# A decimal (1,000 digit groups allowed), optionally times a power of ten of at most three digits:
# 1.5e3, 1.5\times10^{3}.
_DECIMAL = re.compile(r"(\d{1,3}(?:,\d{3})+(?:\.\d*)?|\d+(?:\.\d*)?|\.\d+)"
                      r"(?:[eE]([+-]?0*\d{1,3})|\\(?:times|cdot)10\^(?:\{([+-]?0*\d{1,3})\}|(\d)))?")


def _numbers(s: str) -> set[Fraction]:
    """The exact values a normalised answer can mean: one, or for a percentage p% both p and p/100."""
    percent = s.endswith("%")
    s = s.removesuffix("\\%").removesuffix("%")
    sign = -1 if s.startswith("-") else 1
    s = s.lstrip("-+")
    scale = "0"  # a power of ten: 1.5e3, 1.5\times10^{3}
    if m := re.fullmatch(r"\\frac\{(-?[\d.]+)\}\{(-?[\d.]+)\}", s):
        num, den = m.groups()
    elif m := re.fullmatch(r"(-?[\d.]+)/(-?[\d.]+)", s):
        num, den = m.groups()
    elif m := _DECIMAL.fullmatch(s):
        num, den = m.group(1).replace(",", ""), "1"
        scale = next((e for e in m.groups()[1:] if e is not None), "0")
    else:
        return set()
    try:  # a number past Python's 4,300 digits (1e-000...01 too) is a ValueError: no number
        value = sign * Fraction(num) / Fraction(den) * Fraction(10) ** int(scale)
    except (ValueError, ZeroDivisionError):
        return set()
    return {value, value / 100} if percent else {value}


# LaTeX spacing between digit groups (3\,000, 1\;000, 1\ 000, 1~000), which math-verify does not skip.
_DIGIT_GROUP_SPACE = re.compile(r"(?<=\d)(?:\s*(?:\\[,;:! ]|~))+\s*(?=\d{3}(?!\d))")
# A decimal number in e-notation (1.3e-07, 2E5), not a variable e: math-verify reads e as Euler's number.
_E_NOTATION = re.compile(r"(?<![\w.])(\d+(?:\.\d*)?|\.\d+)[eE]\+?(-?)(\d+)(?!\w|\.\d)")


def _for_math_verify(answer: str) -> str:
    """An answer as math-verify should read it: no spacing inside a number, e-notation as a power of ten."""
    answer = _DIGIT_GROUP_SPACE.sub("", answer)
    return _E_NOTATION.sub(lambda m: f"{m[1]}\\times10^{{{m[2]}{m[3].lstrip('0') or 0}}}", answer)


def _math_verify(pred: str, gold: str, timeout: float) -> bool | None:
    """math-verify's verdict, or None where it cannot judge (not installed, an answer it cannot parse,
    a parser error, or a parse or comparison that timed out)."""
    try:
        from math_verify import parse, verify
    except ImportError:
        return None
    try:
        from math_verify.errors import TimeoutException
    except ImportError:  # a math-verify without its own timeout exception
        TimeoutException = TimeoutError
    # math-verify's timeouts use SIGALRM, which only the main thread may set.
    t = max(1, round(timeout)) if threading.current_thread() is threading.main_thread() else None
    try:
        g = parse(f"${_for_math_verify(gold)}$", parsing_timeout=t)  # a timeout parses to []
        p = parse(f"${_for_math_verify(pred)}$", parsing_timeout=t)
        if not (g and p):
            return None
        # verify(g, p) is any pair of their parses equal, where a failed or timed-out comparison counts
        # as unequal; here a timed-out one leaves the verdict to the normaliser unless another pair is equal.
        timed_out = False
        for gold_form in g:
            for pred_form in p:
                try:
                    if verify(gold_form, pred_form, timeout_seconds=t, raise_on_error=True):
                        return True
                except TimeoutException:
                    timed_out = True
                except Exception:  # a failed comparison: unequal, as verify counts it
                    pass
        return None if timed_out else False
    except (Exception, TimeoutException):  # a parser failure or timeout: left to the normaliser, never a crash
        return None


def math_verify_available() -> bool:
    try:
        import math_verify  # noqa: F401
    except ImportError:
        return False
    return True


def _normalised_equal(pred: str, gold: str) -> bool:
    p, g = normalize(pred), normalize(gold)
    if not p:
        return False
    if p == g:
        return True
    pn, gn = _numbers(p), _numbers(g)
    return bool(pn and gn and pn & gn)


def judge(pred: str, gold: str, timeout: float = 5.0) -> tuple[bool, str]:
    """(whether an extracted answer equals the reference, which grader decided). math-verify decides
    where it is installed, parses both answers and times out on neither, as oat and lighteval grade;
    the normaliser (strings, then numbers) decides the rest."""
    verdict = _math_verify(pred, gold, timeout) if normalize(pred) else None
    if verdict is not None:
        return verdict, "math-verify"
    return _normalised_equal(pred, gold), "normaliser"


def is_equivalent(pred: str, gold: str, timeout: float = 5.0) -> bool:
    """Whether an extracted answer equals the reference (`judge`'s verdict)."""
    return judge(pred, gold, timeout)[0]


def grade_math(response: str, gold: str, timeout: float = 5.0) -> tuple[str | None, bool]:
    """(the last boxed answer or None, whether it is correct)."""
    pred = last_boxed(response)
    return pred, pred is not None and is_equivalent(pred, gold, timeout)


def boxed_letter(response: str) -> str | None:
    """The choice letter in the last box: `\\boxed{B}`, `\\boxed{(B)}`, `\\boxed{\\text{B}}`,
    `\\boxed{\\mathrm{B}}`, or a letter leading the choice's text: `\\boxed{(B) 12}`,
    `\\boxed{\\text{B. Paris}}`, `\\boxed{B) Paris}`."""
    pred = last_boxed(response)
    if pred is None:
        return None
    for command in ("text", "textbf", "mathrm", "mathbf"):
        pred = _unwrap(pred, command)
    s = re.sub(r"\s+", "", pred).strip("().:")
    if re.fullmatch(r"[A-Za-z]", s):
        return s.upper()
    lead = re.match(r"\s*(?:\(([A-Za-z])\)|([A-Za-z])[.):])\s", pred)
    return (lead[1] or lead[2]).upper() if lead else None


def grade_choice(response: str, gold: str) -> tuple[str | None, bool]:
    """(the boxed letter or None, whether it is the reference letter)."""
    letter = boxed_letter(response)
    return letter, letter is not None and letter == gold.strip().upper()
