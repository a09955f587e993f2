"""Test-session hooks for the whole repository (tests/ and the doctests of src/cogcal).

The ``slow`` marker (pyproject.toml) keeps end-to-end tests out of the fast loop,
``pytest -m "not slow"``. Tests are marked where they are defined; doctests cannot carry a
mark, so the slow ones are named here. Every collected item is also recorded, as collected
(before ``-m`` or ``-k`` deselect any), for tests/test_markers.py.
"""

from __future__ import annotations

import pytest

#: Doctests (node ids) that train a network or fit a cross-validated calibrator: seconds
#: each, so only the full suite runs them.
SLOW_DOCTESTS = (
    "src/cogcal/calibrators/dirichlet.py::cogcal.calibrators.dirichlet.Dirichlet",
    "src/cogcal/calibrators/affine.py::cogcal.calibrators.affine.TaskAffine",
    "src/cogcal/calibrators/affine.py::cogcal.calibrators.affine.VectorScaling",
    "src/cogcal/posthoc.py::cogcal.posthoc.calibrate",
    "src/cogcal/train/assemble.py::cogcal.train.assemble.load_run",
    "src/cogcal/commands/predict.py::cogcal.commands.predict.predict",
)

_COLLECTED = pytest.StashKey[list[tuple[str, str, bool]]]()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the :data:`SLOW_DOCTESTS` slow, then record ``(node id, file, is slow)`` of
    every collected item before any is deselected."""
    for item in items:
        if item.nodeid in SLOW_DOCTESTS:
            item.add_marker(pytest.mark.slow)
    config.stash[_COLLECTED] = [
        (item.nodeid, str(item.path), item.get_closest_marker("slow") is not None) for item in items
    ]


@pytest.fixture(scope="session")
def collected_tests(pytestconfig: pytest.Config) -> list[tuple[str, str, bool]]:
    """``(node id, file, is slow)`` of every test this session collected, doctests included:
    ``pytest -m "not slow"`` keeps the items whose ``is slow`` is false."""
    return pytestconfig.stash.get(_COLLECTED, [])


@pytest.fixture(scope="session")
def slow_doctests() -> tuple[str, ...]:
    """:data:`SLOW_DOCTESTS`, for the check that each still names a doctest."""
    return SLOW_DOCTESTS
