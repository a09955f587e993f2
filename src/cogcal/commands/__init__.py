"""The commands of ``cogcal``: each module runs one (``run(args) -> int``) on the layers
below and renders what was asked (the command line itself, :mod:`cogcal.cli`, only parses
and dispatches).

* :mod:`~cogcal.commands.train`, :mod:`~cogcal.commands.tune`: train, or choose the
  learning rates (:mod:`cogcal.train`);
* :mod:`~cogcal.commands.bench`: run a suite (:mod:`cogcal.bench`) and render its report;
* :mod:`~cogcal.commands.report`: the report of a bench, run or calibration folder;
* :mod:`~cogcal.commands.predict`: a finished run's predictions on new inputs;
* :mod:`~cogcal.commands.calibrate`: a post-hoc calibrator from saved scores.
"""
