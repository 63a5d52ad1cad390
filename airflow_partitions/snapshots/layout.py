"""Where a dataset's snapshot objects live under a location, and the path checks that keep keys safe.

Layout under `s3://bucket/prefix`:

    <dataset>/data/<path relative to the dataset root>     partition files, immutable, write-once
    <dataset>/manifests/v<version, 20 digits>.json         one manifest per published catalog version
    <dataset>/manifests/v<version, 20 digits>.json.sha256  its SHA-256, write-once, written before it
    <dataset>/manifests/latest.json                        pointer to the newest published manifest
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from airflow_partitions.exceptions import SnapshotError
from airflow_partitions.keys import escape_component
from airflow_partitions.objectstore import S3Location, S3Store, SettingsLike, parse_s3_location

DATA_DIR = "data"
MANIFEST_DIR = "manifests"
LATEST_POINTER = "latest.json"
DIGEST_SUFFIX = ".sha256"
VERSION_DIGITS = 20
# User metadata key (sent as `x-amz-meta-sha256`) holding the whole-file SHA-256 hex of a data object.
SHA256_METADATA_KEY = "sha256"


def safe_relative_path(path: str) -> str:
    """Check that `path` stays inside the dataset root and return it in POSIX form.

    Partition files are addressed by paths relative to the dataset root; a manifest read from object
    storage is untrusted input, so an absolute path or a `..` here must never reach the filesystem.
    """
    if not isinstance(path, str) or not path:
        raise SnapshotError(f"partition file path must be a non-empty relative path, got {path!r}")
    if "\\" in path or "\x00" in path or any(ord(ch) < 32 for ch in path):
        raise SnapshotError(f"partition file path {path!r} contains a backslash or a control character")
    pure = PurePosixPath(path)
    if pure.is_absolute() or path.startswith("/"):
        raise SnapshotError(
            f"partition file path {path!r} is absolute; it must be relative to the dataset root"
        )
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise SnapshotError(
            f"partition file path {path!r} has an empty, '.' or '..' segment; it must stay inside the "
            "dataset root"
        )
    return path


def local_file(dataset_root: Path, relative_path: str) -> Path:
    """The local path of a partition file (after checking the relative path is safe)."""
    return Path(dataset_root) / safe_relative_path(relative_path)


@dataclass(frozen=True, slots=True)
class SnapshotLayout:
    """Object keys of one dataset's snapshots under a location."""

    location: S3Location
    dataset: str

    @classmethod
    def of(cls, location: str | S3Location, dataset: str) -> SnapshotLayout:
        if not isinstance(dataset, str) or not dataset:
            raise SnapshotError(f"dataset name must be a non-empty string, got {dataset!r}")
        loc = location if isinstance(location, S3Location) else parse_s3_location(location)
        return cls(loc, dataset)

    @property
    def bucket(self) -> str:
        return self.location.bucket

    def store(self, settings: SettingsLike) -> S3Store:
        """The bucket as a store; the keys of this layout are bucket keys (they include the prefix)."""
        return S3Store.at(S3Location(self.bucket, ""), settings)

    @property
    def dataset_prefix(self) -> str:
        # The one path escaping of the project, so no dataset name can break out of its folder.
        return self.location.key(escape_component(self.dataset))

    @property
    def data_prefix(self) -> str:
        return f"{self.dataset_prefix}/{DATA_DIR}/"

    @property
    def manifest_prefix(self) -> str:
        return f"{self.dataset_prefix}/{MANIFEST_DIR}/"

    def data_key(self, relative_path: str) -> str:
        return self.data_prefix + safe_relative_path(relative_path)

    def manifest_key(self, version: int) -> str:
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise SnapshotError(f"catalog version must be a non-negative integer, got {version!r}")
        return f"{self.manifest_prefix}v{version:0{VERSION_DIGITS}d}.json"

    def manifest_digest_key(self, version: int) -> str:
        """The write-once record of the manifest's SHA-256 (not a manifest key: it does not end in .json)."""
        return self.manifest_key(version) + DIGEST_SUFFIX

    @property
    def latest_key(self) -> str:
        return self.manifest_prefix + LATEST_POINTER

    def version_of_manifest_key(self, key: str) -> int | None:
        """The version a manifest key names, or None for any other key under the manifest prefix."""
        name = key.removeprefix(self.manifest_prefix)
        if name == key or not name.startswith("v") or not name.endswith(".json"):
            return None
        digits = name[1:-5]
        return int(digits) if len(digits) == VERSION_DIGITS and digits.isdigit() else None

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"
