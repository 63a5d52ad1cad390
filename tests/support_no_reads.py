"""A guard proving this process reads no partition or stage data: every way the project opens data files
(pyarrow Parquet / IPC / datasets / memory maps, DuckDB databases, Python file opens, the S3 stage fetch) is
wrapped while the guard is on, and an open of a data file (`is_data_path`) under one of the guarded roots
is recorded and refused. Metadata stays allowed: stat and listing, the catalog and the stage manifest.

    with no_data_reads([data_root, staging_root]) as guard:
        ...                      # finalize / commit
    guard.check()                # fails, naming each read, if any happened

Spark's Python workers are separate processes: the guard does not see them (it is meant not to).
"""

from __future__ import annotations

import builtins
import contextlib
import io
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Partition files (`part-<uuid>-<n>.<ext>`), Spark's staged files and anything in a data format; the
# catalog, the stage manifest and other JSON records under the same roots are metadata and stay readable.
DATA_SUFFIXES = (".parquet", ".arrow", ".feather", ".ipc", ".duckdb")


def is_data_path(path: str) -> bool:
    name = os.path.basename(path)
    return (
        name.startswith(("part-", ".tmp-part-"))
        or name.endswith(DATA_SUFFIXES)
        or f"{os.sep}__ap_item=" in path
        or os.path.isdir(path)  # a directory handed to a reader is a dataset of files
    )


class DataReadError(AssertionError):
    """A guarded process opened partition or stage data."""


@dataclass
class DataReadGuard:
    roots: tuple[str, ...]
    reads: list[str] = field(default_factory=list)
    active: bool = True

    def guarded(self, target: Any) -> str | None:
        """The path of `target` when it lies under a guarded root (else None)."""
        if isinstance(target, int) or target is None:
            return None
        try:
            text = os.fspath(target)
        except TypeError:
            return None
        if isinstance(text, bytes):
            text = os.fsdecode(text)
        if "://" in text:
            return text if any(text.startswith(root) for root in self.roots if "://" in root) else None
        resolved = os.path.realpath(text)
        if not any(resolved == root or resolved.startswith(root + os.sep) for root in self.roots):
            return None
        return resolved if is_data_path(resolved) else None

    def refuse(self, what: str, path: str) -> None:
        self.reads.append(f"{what}({path})")
        raise DataReadError(f"this process must not read partition or stage data: {what}({path})")

    def check(self) -> None:
        if self.reads:
            raise DataReadError("partition or stage data read in this process: " + "; ".join(self.reads))


def _wrap_path_call(
    guard: DataReadGuard, name: str, original: Callable[..., Any], *, mode_argument: bool = False
) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if guard.active:
            target = args[0] if args else kwargs.get("source", kwargs.get("file", kwargs.get("database")))
            path = guard.guarded(target)
            if path is not None:
                mode = (args[1] if len(args) > 1 else kwargs.get("mode", "r")) if mode_argument else "r"
                # Writing is not reading; only reads are refused.
                if not isinstance(mode, str) or "r" in mode or "+" in mode:
                    guard.refuse(name, path)
        return original(*args, **kwargs)

    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    return wrapper


@contextlib.contextmanager
def no_data_reads(roots: Sequence[str | os.PathLike[str]]) -> Iterator[DataReadGuard]:
    """Refuse (and record) every read of a file under `roots` in this process while the block runs."""
    import duckdb
    import pyarrow as pa
    import pyarrow.dataset as pads
    import pyarrow.ipc as ipc
    import pyarrow.parquet as pq

    from airflow_partitions.refresh import remote

    resolved = tuple(str(root) if "://" in str(root) else os.path.realpath(Path(root)) for root in roots)
    guard = DataReadGuard(resolved)
    targets: list[tuple[Any, str, bool]] = [
        (pq, "ParquetFile", False),
        (pq, "read_table", False),
        (pq, "read_metadata", False),
        (pq, "read_schema", False),
        (pq, "ParquetDataset", False),
        (ipc, "open_file", False),
        (ipc, "open_stream", False),
        (pa, "memory_map", False),
        (pa, "OSFile", True),
        (pads, "dataset", False),
        (duckdb, "connect", False),
        (builtins, "open", True),
        (io, "open", True),
    ]
    saved: list[tuple[Any, str, Any]] = []
    try:
        for module, name, has_mode in targets:
            original = getattr(module, name)
            saved.append((module, name, original))
            qualified = f"{getattr(module, '__name__', module)}.{name}"
            setattr(module, name, _wrap_path_call(guard, qualified, original, mode_argument=has_mode))
        original_fetch = remote.fetch_stage

        def fetch_stage(url: str, *args: Any, **kwargs: Any) -> Any:
            if guard.active:
                guard.refuse("refresh.remote.fetch_stage", url)
            return original_fetch(url, *args, **kwargs)

        saved.append((remote, "fetch_stage", original_fetch))
        remote.fetch_stage = fetch_stage  # type: ignore[assignment]
        yield guard
    finally:
        guard.active = False
        for module, name, original in reversed(saved):
            setattr(module, name, original)
