"""The partition writer: the one place partition files are written, counted back, checked and uploaded.

Every operation that writes partition files (a refresh's finalize, the Spark executors' writes and
merges, append / upsert / delete, compaction) hands its rows to `PartitionWriter.write`:

1. the dataset's storage engine writes them under `root` as new, uniquely named files (of a partition of
   an older layout, where files of that layout go: `file_key_path`);
2. their rows are counted back from the files (not taken from the writer), and must be the rows the
   partition was given and the rows the writer recorded, else `ConservationError` naming the partition
   and both counts, and nothing is uploaded or published;
3. when the data store is not on this machine (an `s3://` accelerator_dir: `root` is then private
   scratch), each file is uploaded write-once and read back (`storage.remote.upload_partition_files`).

Nothing references the files until the commit (`table.publish.CommitBuilder`); `publish` finishes them
for it (engines that stage writes, on the local disk; objects on S3 are final once uploaded).
Whether the files are local is decided here, by the store, and nowhere above.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from airflow_partitions.catalog.model import file_key_path
from airflow_partitions.exceptions import ConservationError
from airflow_partitions.objectstore import LocalStore
from airflow_partitions.storage.remote import upload_partition_files

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_partitions.objectstore import ObjectStore
    from airflow_partitions.storage import DataFile, PartitionStorage

ADVICE = "Check the storage engine and the disk, then run again."
# A key every store accepts, to ask whether it keeps its objects on this machine.
_PROBE_KEY = "part-probe"


@dataclass(frozen=True, slots=True)
class WrittenFiles:
    """A partition's new files and the rows counted back from them."""

    files: list[DataFile]
    rows: int


@dataclass(frozen=True)
class PartitionWriter:
    """Writes one dataset's partition files with `storage` under `root`, into `store`.

    `root` is the store's own directory when the store is local (the files are written in place), and a
    private scratch directory of the caller's when it is not (the files are written there, then
    uploaded). `dataset` names the dataset in errors.
    """

    storage: PartitionStorage
    store: ObjectStore
    root: Path
    dataset: str

    @classmethod
    def local(cls, storage: PartitionStorage, root: Path | str, dataset: str) -> PartitionWriter:
        """A writer of files that stay in the local directory `root`."""
        return cls(storage, LocalStore(root), Path(root), dataset)

    @property
    def uploads(self) -> bool:
        """Whether written files are uploaded (the store is not on this machine)."""
        return self.store.local_path(_PROBE_KEY) is None

    def write(
        self,
        key_path: str,
        rows: pa.Table,
        *,
        expected: int | None = None,
        expected_as: str = "rows to write",
        advice: str = ADVICE,
        check: bool = True,
        sync: bool = True,
    ) -> WrittenFiles:
        """Write `rows` as new files of partition `key_path`; they are counted back, checked, uploaded.

        `expected`: the rows the partition must hold (default: `rows`' count), described in an error as
        `expected_as`; the error's hint ends with `advice`. `check=False` leaves the comparison to the
        caller (the Spark driver compares every executor's counts at once) but still counts the files.
        No rows: no file. `sync=False` (local files only): the caller makes the files durable with
        `storage.base.sync_written` before anything references them.
        """
        if not sync and self.uploads:
            raise ValueError("sync=False is for files that stay local; uploaded files are synced here")
        key = file_key_path(key_path)
        files = self.storage.write(rows, self.root, key, sync=sync) if rows.num_rows else []
        counted = sum(self.storage.count_rows(self.root, f) for f in files)
        if check:
            want = rows.num_rows if expected is None else expected
            self.check(key_path, files, counted, want, expected_as, advice)
        if files and self.uploads:
            upload_partition_files(self.store, self.root, files)
        return WrittenFiles(list(files), counted)

    def check(
        self,
        key_path: str,
        files: Sequence[DataFile],
        counted: int,
        expected: int,
        expected_as: str = "rows to write",
        advice: str = ADVICE,
    ) -> None:
        """Refuse files that do not hold `expected` rows (counted back) or whose recorded rows differ."""
        declared = sum(f.rows for f in files)
        if counted == expected and declared == counted:
            return
        shown = counted if counted != expected else declared
        raise ConservationError(
            self.dataset,
            {key_path: (expected, shown)},
            expected=expected_as,
            actual="rows in the written files" if counted != expected else "rows the writer recorded",
            hint=f"The {self.storage.engine} writer did not write the rows it was given (files: "
            f"{', '.join(f.path for f in files) or 'none'}); they are not referenced and vacuum removes "
            f"them. {advice}",
        )

    def publish(self, files: Sequence[DataFile]) -> list[DataFile]:
        """`files` ready for a catalog commit: finished by the engine on the local disk; objects in a
        remote store are final once uploaded."""
        if not files or self.uploads:
            return list(files)
        return self.storage.publish(self.root, files)
