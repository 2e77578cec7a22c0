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
    ("\\boxed{2} and a broken \\boxed{3", "2"),  # the last *complete* box
    ("\\boxed{}", ""),
])
def test_last_boxed(text, want):
    assert last_boxed(text) == want


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
