"""The fast loop, ``pytest -m "not slow"``: no test module is left out of it.

The ``slow`` marker (pyproject.toml) takes end-to-end tests out of the fast loop; CI runs
everything. Marking a whole module slow by mistake would drop it from the fast loop
without a sign, so every test module a session collects must keep fast tests, except the
few listed below with their reason. The checks read what the session collected before
``-m`` deselected anything (the repository's conftest.py), so they hold in the fast loop as
in the full suite, over the files the session collected.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Test modules whose every test is slow, and why (none can be made fast).
ALL_SLOW = {
    "tests/test_distributed.py": "two-process DDP training runs",
    "tests/test_bench_ray.py": "a local Ray cluster running a bench",
    "tests/test_export_methods.py": "one training run and one ONNX export per method",
    "tests/test_readme.py": "the README's examples, each a training run or a report",
}

#: The fewest fast tests (doctests included) of a session that collected the whole suite.
MIN_FAST = 400


def _by_module(collected: list[tuple[str, str, bool]]) -> dict[str, list[bool]]:
    """``{file relative to the repository: [is slow, per item]}``."""
    modules: dict[str, list[bool]] = defaultdict(list)
    for _, path, slow in collected:
        p = Path(path).resolve()
        modules[p.relative_to(ROOT).as_posix() if p.is_relative_to(ROOT) else str(p)].append(slow)
    return modules


def test_every_test_module_keeps_fast_tests(collected_tests):
    modules = _by_module(collected_tests)
    assert "tests/test_markers.py" in modules  # the record is this session's collection
    tests = {m: slow for m, slow in modules.items() if m.startswith("tests/")}
    only_slow = sorted(m for m, slow in tests.items() if all(slow) and m not in ALL_SLOW)
    assert not only_slow, (
        f"every test of {', '.join(only_slow)} is marked slow, so `pytest -m 'not slow'` "
        "never runs them: keep the fast ones unmarked (or list the module in ALL_SLOW, "
        "with its reason)"
    )
    stale = sorted(m for m in ALL_SLOW if m in tests and not all(tests[m]))
    assert not stale, f"{', '.join(stale)} now has fast tests: remove it from ALL_SLOW"
    assert all((ROOT / m).is_file() for m in ALL_SLOW), ALL_SLOW


def test_each_slow_doctest_names_a_doctest(collected_tests, slow_doctests):
    """A renamed function would silently bring its doctest back into the fast loop."""
    ids = {nodeid for nodeid, _, _ in collected_tests}
    files = {nodeid.split("::")[0] for nodeid in ids}
    gone = [d for d in slow_doctests if d.split("::")[0] in files and d not in ids]
    assert not gone, f"conftest.py SLOW_DOCTESTS names no collected doctest: {gone}"
    assert all(slow for nodeid, _, slow in collected_tests if nodeid in slow_doctests)


def test_the_whole_suite_keeps_a_real_fast_loop(collected_tests):
    modules = _by_module(collected_tests)
    whole = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").glob("test_*.py")}
    if not whole <= modules.keys():
        pytest.skip("this session collected part of the suite; the count is the whole suite's")
    fast = sum(not slow for slows in modules.values() for slow in slows)
    assert fast >= MIN_FAST, f"only {fast} fast tests; the fast loop needs {MIN_FAST}"
