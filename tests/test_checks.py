"""The one-line validators: accepted values, and the exact one-line errors for the rest."""
import math

import pytest

from workbench import ParameterError, checks


@pytest.mark.parametrize("call,message", [
    (lambda: checks.check_int("n", True), "n: must be an integer"),
    (lambda: checks.check_int("n", 0, 1), "n: must be an integer >= 1 (got 0)"),
    (lambda: checks.check_int("n", 9, 1, 8), "n: must be an integer in [1, 8] (got 9)"),
    (lambda: checks.check_float("x", "0.5"), "x: must be a number"),
    (lambda: checks.check_float("x", math.nan), "x: must be a finite number"),
    (lambda: checks.check_float("x", math.inf, 0), "x: must be a finite number"),
    (lambda: checks.check_float("x", 0, 0, lo_open=True), "x: must be > 0 (got 0)"),
    (lambda: checks.check_int_list("xs", []), "xs: must be a non-empty list"),
    (lambda: checks.check_int_list("xs", [1, 1]), "xs: duplicate value 1"),
    (lambda: checks.check_int_list("xs", [1, 0], lo=1), "xs: every value must be an integer >= 1 (got 0)"),
    (lambda: checks.check_float_list("xs", [0.1, math.nan]), "xs: every value must be a finite number"),
    (lambda: checks.check_choice("c", "z", ("a", "b")), "c: must be one of a, b (got 'z')"),
    (lambda: checks.check_choice_list("cs", ["a", "q"], ("a", "b")), "cs: every value must be one of a, b"),
    (lambda: checks.check_bool("b", 1), "b: must be true or false"),
    (lambda: checks.check_seed("seed", 2**64), "seed: must be an integer in [0, "),
    (lambda: checks.check_str_list("s", ["a", ""]), "s: every value must be a non-empty string"),
])
def test_bad_values_give_one_line_errors(call, message):
    with pytest.raises(ParameterError) as err:
        call()
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_good_values_pass_through():
    assert checks.check_int("n", 3, 1) == 3
    assert checks.check_float("x", 2, 0) == 2.0 and isinstance(checks.check_float("x", 2), float)
    assert checks.check_int_list("xs", [1, 2], lo=1) == [1, 2]
    assert checks.check_choice_list("cs", ["a"], ("a", "b")) == ["a"]
    assert checks.check_int_list("xs", [], allow_empty=True) == []


def test_int_or_takes_a_table_cell_with_nan_for_missing():
    """A DataFrame row's missing cell is NaN (truthy): ``int(x or 1)`` raised on it in a streaming finding."""
    import math

    from workbench.checks import int_or

    assert int_or(math.nan, 1) == 1 and int_or(None, 2) == 2 and int_or(0, 3) == 3
    assert int_or(4.0, 1) == 4 and int_or(7, 1) == 7
