"""Where a scan finds a dataset's partition files: the `FileLocation` protocol, and `LocalFiles`, files
under a local dataset directory read in place once their bytes are checked (`read.remote` holds the
object-storage location)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from airflow_partitions.exceptions import StorageError
from airflow_partitions.storage import integrity

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_partitions.pruning.expressions import Predicate
    from airflow_partitions.storage import DataFile


class FileLocation(Protocol):
    """Where a dataset's partition files are: a local directory (`LocalFiles`) or object storage."""

    def paths_for_call(self, files: Sequence[DataFile], releases: list[Callable[[], None]]) -> list[str]:
        """One local path per file, valid until the call runs what was appended to `releases`."""
        ...

    def parts_for_call(
        self, files: Sequence[DataFile], releases: list[Callable[[], None]], *, row_filter: RowFilter | None
    ) -> list[str | pa.Table]:
        """As `paths_for_call`; with `row_filter`, a file's part may instead be an Arrow table (or a local
        path) holding only the rows of its row groups the filter may need (the caller applies the
        filter itself to every row it reads)."""
        ...

    def local_root(self, files: Sequence[DataFile], shared: Sequence[str] = ()) -> Path:
        """A local dataset root under which `files` and the `shared` objects sit whole."""
        ...


@dataclass(frozen=True)
class RowFilter:
    """The filter a scan applies to every row it reads (a prepared predicate over `schema`): a location
    may leave out row groups whose statistics show no row can satisfy it."""

    predicate: Predicate
    schema: pa.Schema


class LocalFiles:
    """Partition files under a local dataset directory, read in place once their bytes are checked
    against the catalog's SHA-256 (`storage.integrity.verify_files`: once per process per file)."""

    def __init__(self, root: Path, dataset: str | None = None) -> None:
        self.root = root
        self.dataset = dataset or root.name

    def paths_for_call(self, files: Sequence[DataFile], releases: list[Callable[[], None]]) -> list[str]:
        del releases
        root = str(self.root)
        paths = [os.path.join(root, checked_relative(f.path)) for f in files]
        verify_local(self.root, files, self.dataset)
        return paths

    def parts_for_call(
        self, files: Sequence[DataFile], releases: list[Callable[[], None]], *, row_filter: RowFilter | None
    ) -> list[str | pa.Table]:
        del row_filter  # local files are read in place: DuckDB prunes their row groups itself
        return list(self.paths_for_call(files, releases))

    def local_root(self, files: Sequence[DataFile], shared: Sequence[str] = ()) -> Path:
        del shared  # the shared DuckDB file has no recorded digest: DuckDB checks its blocks
        verify_local(self.root, [f for f in files if f.table is None], self.dataset)
        return self.root


def verify_local(root: Path, files: Sequence[DataFile], dataset: str) -> None:
    """Each file's size and SHA-256 against the catalog before DuckDB opens it (a stat once verified)."""
    if not integrity.VERIFY_ON_READ:
        return
    for file in files:
        # A missing file: the scan that opens it reports it with its own message.
        with contextlib.suppress(FileNotFoundError):
            integrity.verify_file(root / checked_relative(file.path), file, dataset=dataset)


def checked_relative(path: str) -> str:
    """A data file path that stays inside the dataset root (refuses absolute paths and `..`)."""
    if path.startswith("/") or "\\" in path or any(part in ("", ".", "..") for part in path.split("/")):
        raise StorageError(f"data file path {path!r} must be relative and stay inside the dataset directory")
    return path
