"""cogcal._constraints: each rule accepts and refuses the same values everywhere, in one
template, naming the argument in Python and the flag on the command line."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cogcal._constraints import (
    COUNT,
    CV_FOLDS,
    LR_GRID,
    NON_NEGATIVE,
    POSITIVE,
    SEED,
    SEED_MAX,
    Boolean,
    Integer,
    Options,
    Real,
    check,
    parse_numbers,
    violation,
)
from cogcal._errors import ArgumentError
from cogcal.cli import main
from cogcal.train.config import TrainConfig
from cogcal.train.tuning import Grid, GridSearch

NOT_NUMBERS = [True, False, None, "3", b"3", [3], {3: 3}]


@pytest.mark.parametrize(
    ("rule", "good", "bad"),
    [
        (COUNT, [1, 2, 10**12, np.int64(3), np.uint8(1)], [0, -1, 1.0, 2.5, np.float64(2)]),
        (NON_NEGATIVE, [0, 5, np.int32(0)], [-1, 0.0, np.int8(-1)]),
        (SEED, [0, SEED_MAX, np.uint32(SEED_MAX)], [-1, SEED_MAX + 1, 2**40, 1.0]),
        (CV_FOLDS, [2, 10, np.int16(5)], [1, 0, -3, 2.0]),
        (Integer(1, 3), [1, 3], [0, 4]),
        (POSITIVE, [1e-9, 1, 2.5, np.float32(0.5), np.int64(2)], [0, -1.0, math.inf, math.nan]),
        (Real(0, 1), [0, 1, 0.5], [-0.1, 1.1, math.nan, -math.inf]),
        (Real(0, 1, closed="neither"), [0.5], [0, 1]),
        (Options(("a", "b")), ["a", "b"], ["c", "A", 1]),
        (Boolean(), [True, False, np.bool_(True).item()], [0, 1, "true", None, np.int64(1)]),
    ],
)
def test_each_rule_accepts_and_refuses(rule, good, bad):
    for value in good:
        assert rule.problem(value) is None, value
        check(value, rule, "x")
    for value in [*bad, *(v for v in NOT_NUMBERS if rule.problem(v) is not None)]:
        assert violation(value, rule, "x") is not None, value
        with pytest.raises(ArgumentError, match=r"^`x` must be "):
            check(value, rule, "x")
    if not isinstance(rule, Boolean | Options):
        assert rule.problem(True) is not None and rule.problem(None) is not None


def test_check_returns_the_canonical_type():
    assert type(check(np.int64(3), COUNT, "n")) is int
    assert type(check(np.float32(0.5), POSITIVE, "lr")) is float
    assert check([1e-2, 1e-3], LR_GRID, "lrs") == (1e-3, 1e-2)


def test_a_grid_refuses_empty_repeated_and_non_positive_values():
    for value, said in [
        ([], "must be a non-empty list"),
        ("1e-3", "must be a non-empty list"),
        ([1e-3, 1e-3 * (1 + 1e-12)], "lists 0.001 twice"),
        ([1e-3, 0], "values must be positive finite numbers, got 0"),
        ([1e-3, math.nan], "values must be positive finite numbers"),
        ([True], "values must be positive finite numbers"),
    ]:
        with pytest.raises(ArgumentError, match=said):
            check(value, LR_GRID, "lrs", flag="--lrs")


def test_the_message_names_the_argument_in_python_and_the_flag_on_the_command_line():
    err = violation(0, COUNT, "batch_size", flag="--batch-size")
    assert str(err) == "`batch_size` must be an integer >= 1, got 0."
    assert err.cli_message == "--batch-size must be an integer >= 1, got 0."
    assert str(violation(-1, NON_NEGATIVE, "tune.max_extensions")).startswith(
        "tune.max_extensions must be"
    )


def test_parse_numbers_reads_ints_and_floats_and_refuses_text():
    assert parse_numbers("1,1e-3,0.5", "--lrs") == [1, 1e-3, 0.5]
    with pytest.raises(ArgumentError, match="--lrs expects comma-separated numbers"):
        parse_numbers("1e-3,abc", "--lrs")


def _python_words(call) -> str:
    with pytest.raises(ArgumentError) as exc:
        call()
    return str(exc.value).split("` ", 1)[1]


def _cli_words(capsys, argv: list[str], flag: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err.split(f"{flag} ", 1)[1].strip()


@pytest.mark.parametrize(
    ("argv", "flag", "call"),
    [
        (["train", "--seed", "-1"], "--seed", lambda: TrainConfig(seed=-1)),
        (["train", "--seed", str(2**40)], "--seed", lambda: TrainConfig(seed=2**40)),
        (["train", "--batch-size", "0"], "--batch-size", lambda: TrainConfig(batch_size=0)),
        (["train", "--devices", "0"], "--devices", lambda: TrainConfig(devices=0)),
        (["train", "--lr", "-0.1"], "--lr", lambda: TrainConfig(lr=-0.1)),
        (["train", "--lr", "inf"], "--lr", lambda: TrainConfig(lr=math.inf)),
        (["tune", "--lrs", "1e-3,1e-3"], "--lrs", lambda: Grid((1e-3, 1e-3))),
        (["tune", "--lrs", "1e-3,0"], "--lrs", lambda: Grid((1e-3, 0))),
        (
            ["tune", "--lrs", "1e-3", "--max-extensions", "-1"],
            "--max-extensions",
            lambda: GridSearch(Grid((1e-3,)), max_extensions=-1),
        ),
    ],
)
def test_a_flag_and_its_python_argument_refuse_the_same_values_with_the_same_words(
    tmp_path, capsys, argv, flag, call
):
    out = tmp_path / "out"
    said = _cli_words(capsys, [*argv, "--method", "ce", "--out", str(out)], flag)
    assert said == _python_words(call)
    assert not out.exists()
