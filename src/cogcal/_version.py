"""The version of cogcal (one place: the package, the run records and the user agent read it)."""

__version__ = "0.2.0"
