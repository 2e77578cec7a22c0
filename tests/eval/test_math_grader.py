"""The math grader on hand-written answer pairs: equivalent forms, wrong answers, malformed boxes."""
import pytest

from spiral_jax.eval.math_grader import (boxed_letter, grade_choice, grade_math, is_equivalent,
                                         last_boxed, math_verify_available, normalize)

needs_math_verify = pytest.mark.skipif(not math_verify_available(),
                                       reason="math-verify (optional `eval` extra) not installed")


@pytest.mark.parametrize("text, want", [
    ("so \\boxed{42}.", "42"),
    ("first \\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("nested \\boxed{\\sqrt{\\frac{a}{b}}} end", "\\sqrt{\\frac{a}{b}}"),
    ("\\fbox{7}", "7"),
    ("\\boxed {3}", "3"),
    ("no box at all: 5", None),
    ("unclosed \\boxed{3", None),
    ("\\boxed{2} and a truncated \\boxed{3", None),  # the last box, never an earlier one
    ("\\boxed{}", ""),
    ("so \\boxed{2}, then \\boxed{\\{1,2\\} \\cup \\{3\\}}", "\\{1,2\\} \\cup \\{3\\}"),  # escaped braces
    ("\\boxed{1}. \\boxed{f(x)=\\left\\{\\begin{array}{ll}x & x>0\\\\ 0 & \\text{else}\\end{array}\\right.}",
     "f(x)=\\left\\{\\begin{array}{ll}x & x>0\\\\ 0 & \\text{else}\\end{array}\\right."),  # piecewise
    ("\\boxed{2} then \\boxed{\\{1, 2", None),
    ("\\boxed{a \\\\}", "a \\\\"),  # a LaTeX line break before the closing brace
    ("\\boxed{1} \\fbox{\\{x\\}}", "\\{x\\}"),
])
def test_last_boxed(text, want):
    assert last_boxed(text) == want


@pytest.mark.timeout(60)
def test_last_boxed_is_one_pass():
    """Many unclosed boxes (a degenerate response) are read in one pass, not once per box."""
    import time

    start = time.perf_counter()
    assert last_boxed("\\boxed{" * 5000) is None
    assert last_boxed("\\boxed{x" * 5000 + "}") == "x"
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize("pred, gold", [
    ("\\dfrac{1}{2}", "\\frac{1}{2}"),
    ("\\frac12", "\\frac{1}{2}"),
    ("0.5", "\\frac{1}{2}"),
    ("1/2", "0.5"),
    ("\\left( 1, 2 \\right)", "(1,2)"),
    ("30^\\circ", "30"),
    ("30^{\\circ}", "30"),
    ("\\text{(B)}", "(B)"),
    ("\\$5.00", "5"),
    ("12.", "12"),
    ("x = 3", "3"),
    ("1,000", "1000"),
    ("50\\%", "50"),
    ("50\\%", "0.5"),
    ("-\\frac{3}{4}", "-0.75"),
    ("\\text{Monday}", "Monday"),
])
def test_equivalent_forms(pred, gold):
    assert is_equivalent(pred, gold)


@pytest.mark.parametrize("pred, gold", [
    ("3", "4"), ("\\frac{1}{3}", "0.33"), ("-2", "2"), ("", "0"), ("(1,2)", "(2,1)"),
    ("Tuesday", "Monday"), ("1/0", "0"),
])
def test_wrong_answers(pred, gold):
    assert not is_equivalent(pred, gold)


@needs_math_verify
@pytest.mark.parametrize("pred, gold", [
    ("2\\sqrt{2}", "\\sqrt{8}"), ("\\frac{\\pi}{2}", "\\pi/2"), ("x^2+2x+1", "(x+1)^2"),
])
def test_symbolic_with_math_verify(pred, gold):
    assert is_equivalent(pred, gold, timeout=5)
    assert not is_equivalent(pred + "+1", gold, timeout=5)


def test_grade_math_responses():
    assert grade_math("Thus the answer is $\\boxed{\\dfrac{3}{4}}$.", "3/4") == ("\\dfrac{3}{4}", True)
    assert grade_math("The answer is 3/4.", "3/4") == (None, False)     # no box: wrong
    assert grade_math("\\boxed{3/4", "3/4") == (None, False)            # malformed box: wrong
    assert grade_math("\\boxed{5}", "3/4") == ("5", False)
    assert normalize(" \\left[ 1 ,2\\right]. ") == "[1,2]"


@pytest.mark.parametrize("text, letter", [
    ("\\boxed{B}", "B"), ("\\boxed{(c)}", "C"), ("\\boxed{\\text{D}}", "D"), ("\\boxed{A.}", "A"),
    ("\\boxed{A} no, \\boxed{E}", "E"), ("\\boxed{AB}", None), ("\\boxed{12}", None), ("B", None),
    # A letter leading the choice's text, and other wrappers.
    ("\\boxed{(B) 12}", "B"), ("\\boxed{\\text{B. Paris}}", "B"), ("\\boxed{C) 3/4}", "C"),
    ("\\boxed{\\mathrm{D}}", "D"), ("\\boxed{\\mathbf{(a)}}", "A"),
    # Not a choice: a word or an expression that starts with a letter.
    ("\\boxed{I think B}", None), ("\\boxed{a+b}", None), ("\\boxed{x.y}", None),
])
def test_boxed_letter(text, letter):
    assert boxed_letter(text) == letter


def test_grade_choice():
    assert grade_choice("I pick \\boxed{C}", "c") == ("C", True)
    assert grade_choice("I pick C", "C") == (None, False)


@needs_math_verify
def test_math_verify_decides_and_the_normaliser_takes_the_rest(monkeypatch):
    from spiral_jax.eval import math_grader
    from spiral_jax.eval.math_grader import judge

    assert judge("2\\sqrt{2}", "\\sqrt{8}") == (True, "math-verify")
    assert judge("3", "4") == (False, "math-verify")
    assert judge("", "0") == (False, "normaliser")  # nothing to parse
    monkeypatch.setattr(math_grader, "_math_verify", lambda pred, gold, timeout: None)  # cannot parse
    assert judge("50\\%", "0.5") == (True, "normaliser")


@needs_math_verify
@pytest.mark.parametrize("pred, gold", [
    ("3\\,000", "3000"), ("3000", "3\\,000"), ("1\\;000", "1000"), ("1\\ 000", "1000"), ("1~000", "1000"),
    ("1\\,234\\,567", "1234567"), ("\\$1\\,000", "1000"),
])
def test_digit_group_spacing_is_not_graded_wrong(pred, gold):
    from spiral_jax.eval.math_grader import judge

    assert judge(pred, gold) == (True, "math-verify")
    assert judge(pred, "3001")[0] is False


@needs_math_verify
@pytest.mark.parametrize("pred, gold, want", [
    ("1\\times10^{-7}", "1e-07", True), ("0.0000001", "1e-07", True), ("1e-07", "1 \\times 10^{-7}", True),
    ("4.5\\times10^{33}", "4.5e+33", True), ("1.5E3", "1500", True),
    ("2e-7", "1.3e-07", False), ("1\\times10^{-8}", "1e-07", False),
    ("2e", "2e", True), ("2e", "2", False), ("3e^{2}", "3e^2", True),  # e the constant stays e
])
def test_e_notation_with_math_verify(pred, gold, want):
    from spiral_jax.eval.math_grader import judge

    assert judge(pred, gold) == (want, "math-verify")


@pytest.mark.parametrize("pred, gold, want", [
    ("1e-07", "0.0000001", True), ("1.3\\times 10^{-7}", "1.3e-7", True), ("1.5e3", "1,500", True),
    ("1.5\\cdot10^3", "1500", True), ("2e-7", "1.3e-7", False), ("2e", "2", False), ("1e9999999", "1", False),
])
def test_e_notation_in_the_normaliser(monkeypatch, pred, gold, want):
    from spiral_jax.eval import math_grader

    monkeypatch.setattr(math_grader, "_math_verify", lambda pred, gold, timeout: None)
    assert math_grader.judge(pred, gold) == (want, "normaliser")


@needs_math_verify
def test_a_math_verify_timeout_leaves_the_verdict_to_the_normaliser(monkeypatch):
    import math_verify
    from math_verify.errors import TimeoutException

    from spiral_jax.eval.math_grader import judge

    def timing_out(gold, target, timeout_seconds=5, raise_on_error=False, **kwargs):
        if raise_on_error:
            raise TimeoutException("Timeout during comparison")
        return False  # what math-verify returns for a timeout unless asked to raise

    monkeypatch.setattr(math_verify, "verify", timing_out)
    assert judge("50\\%", "0.5") == (True, "normaliser")
    assert judge("3", "4") == (False, "normaliser")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("call", [
    lambda mg: mg._normalised_equal("7" * 20000 + "x", "1"),             # a long number then a letter
    lambda mg: mg._for_math_verify("7" * 20000),                          # e-notation search
    lambda mg: mg.normalize("\\text{" * 20000 + "a" + "}" * 20000),       # nested \text
    lambda mg: mg.normalize("\\text{a}" * 50000),                          # repeated \text
    lambda mg: mg.boxed_letter("\\boxed{" + "\\text{" * 20000 + "B" + "}" * 20000 + "}"),
    lambda mg: mg.normalize("^" + " " * 100000 + "x"),                    # degree sign search
], ids=["digits", "e-notation", "nested-text", "many-text", "choice-text", "caret-spaces"])
def test_hostile_answers_are_normalised_in_linear_time(call):
    """Long answers (a model's degenerate output) are read in one pass each: these took seconds to
    minutes (quadratic regular expressions and unwrapping) where they take milliseconds."""
    import time

    from spiral_jax.eval import math_grader

    start = time.perf_counter()
    call(math_grader)
    assert time.perf_counter() - start < 1.0


def test_unwrap_nested_and_unclosed():
    assert normalize("\\text{\\text{b}}c") == "bc"
    assert normalize("\\text{a} \\text{b") == "a\\text{b"   # one that never closes is kept
    assert normalize("\\text{a{b}c}") == "a{b}c"
    assert normalize("\\text{\\{}x") == "\\{x"               # an escaped brace is not counted


def test_an_exponent_past_the_int_digit_limit_is_no_number(monkeypatch):
    """1e-000...01 with 5,000 zeros was a ValueError out of the grader (Python's 4,300-digit limit)."""
    from spiral_jax.eval import math_grader

    monkeypatch.setattr(math_grader, "_math_verify", lambda pred, gold, timeout: None)
    assert math_grader.judge("1e-" + "0" * 5000 + "1", "0.1") == (False, "normaliser")
