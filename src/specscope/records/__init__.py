"""Records: what a run records (schema), the run directory's one reader and writer (rundir),
and the checks every read passes (checks)."""

from .checks import certificate_bound, check_records
from .rundir import (
                     LOCK_FILE,
                     RUN_DIRS,
                     RUN_FILES,
                     RunDir,
                     check_writable_dir,
                     check_writable_file,
                     is_lock_file,
                     json_bytes,
                     load_run,
                     open_location,
                     read_json,
                     read_manifest,
                     remove_run,
                     run_lock,
                     write_file,
)
from .schema import (
                     ALL_DOMAINS,
                     SCHEMA_VERSION,
                     SCHEMAS,
                     TABLES,
                     TIMING_COLUMNS,
                     Run,
                     RunDirError,
                     TreePaths,
                     position_bin,
                     to_table,
                     tree_paths,
)

__all__ = ["ALL_DOMAINS", "LOCK_FILE", "RUN_DIRS", "RUN_FILES", "SCHEMAS", "SCHEMA_VERSION",
           "TABLES", "TIMING_COLUMNS", "Run", "RunDir", "RunDirError", "TreePaths",
           "certificate_bound", "check_records", "check_writable_dir", "check_writable_file",
           "is_lock_file", "json_bytes", "load_run", "open_location", "position_bin", "read_json",
           "read_manifest", "remove_run", "run_lock", "to_table", "tree_paths", "write_file"]
