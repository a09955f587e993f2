"""The on-disk contracts: the rules of the folders cogcal writes, in one place.

* run folders (:class:`RunDir`): their layout, mark and lock (:mod:`cogcal.runs.layout`),
  their record (:class:`RunRecord`), when two runs are the same and the digests that bind
  a run's files to its configuration (:mod:`cogcal.runs.identity`,
  :mod:`cogcal.runs.integrity`), when a run may start or resume (:mod:`cogcal.runs.resume`)
  and the checkpoint files (:mod:`cogcal.runs.checkpoints`);
* bench folders (:mod:`cogcal.runs.bench`) and the columns of their tables
  (:mod:`cogcal.runs.columns`);
* calibration folders (:mod:`cogcal.runs.calibration`);
* the methods a run may name (:mod:`cogcal.runs.methods`).

It sits above the core and ``cogcal.data`` and below ``cogcal.train``: the trainer, the
bench, the report and the commands read and write folders only through it.
"""

from __future__ import annotations

from cogcal.runs.bench import BENCH_FORMAT, BENCH_MARK, is_bench_folder, write_bench_meta
from cogcal.runs.checkpoints import CHECKPOINT_FORMAT, CheckpointError, load_checkpoint
from cogcal.runs.folder import RunDir
from cogcal.runs.identity import (
    MARK,
    config_diff,
    config_digest,
    file_digest,
    resolved_config,
    result_fields,
)
from cogcal.runs.layout import (
    BOUND_FILES,
    FORMAT,
    LOCK_NAME,
    RUN_DIRS,
    RUN_FILES,
    RunFolderError,
    lock_folder,
)
from cogcal.runs.record import RunRecord

__all__ = [
    "BENCH_FORMAT",
    "BENCH_MARK",
    "BOUND_FILES",
    "CHECKPOINT_FORMAT",
    "FORMAT",
    "LOCK_NAME",
    "MARK",
    "RUN_DIRS",
    "RUN_FILES",
    "CheckpointError",
    "RunDir",
    "RunFolderError",
    "RunRecord",
    "config_diff",
    "config_digest",
    "file_digest",
    "is_bench_folder",
    "load_checkpoint",
    "lock_folder",
    "resolved_config",
    "result_fields",
    "write_bench_meta",
]
