"""Sweeps: a grid of runs (grid), the shards and executors that run it (executors), and the
driver that plans, runs, resumes and reads a sweep directory (driver)."""

from .driver import SweepSummary, expand_run_dirs, is_sweep_dir, run_sweep, sweep_run_dirs
from .grid import Execution, SweepError, SweepSpec, load_sweep, parse_sweep

__all__ = [
    "Execution",
    "SweepError",
    "SweepSpec",
    "SweepSummary",
    "expand_run_dirs",
    "is_sweep_dir",
    "load_sweep",
    "parse_sweep",
    "run_sweep",
    "sweep_run_dirs",
]
