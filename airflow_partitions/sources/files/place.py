"""Where a file source's files live and which of them it reads: the one place `sources/` tells a local
directory from an S3 prefix, lists the files, and hands pyarrow and Spark their paths.

S3 is reached through the object-store layer: one `S3Store` over the bucket, whose resolved settings also
build the pyarrow filesystem the readers use, so listing and reading reach the same endpoint.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from airflow_partitions.exceptions import ObjectStoreError, SourceError
from airflow_partitions.objectstore import S3Location, S3Settings, S3Store, parse_s3_location

_GLOB_CHARS = frozenset("*?[")
# Spark and pyarrow agree on skipping these: job markers, checksums, hidden files.
_IGNORED_SUFFIXES = (".crc",)
# Source schemes (and URL schemes) that name an S3 location.
_S3_SCHEMES = ("s3", "s3a")


@dataclass(frozen=True, slots=True)
class SourceFile:
    """One data file: `path` as its Arrow filesystem knows it, `relative` to the source root."""

    path: str
    relative: str
    size: int
    version: str  # local: modification time in ns; S3: the ETag

    def fingerprint_line(self) -> str:
        return f"{self.relative}\t{self.size}\t{self.version}"

    @property
    def directories(self) -> tuple[str, ...]:
        return PurePosixPath(self.relative).parts[:-1]


def glob_to_regex(pattern: str) -> re.Pattern[str]:
    """Compile a path glob: `*` and `?` stay within one directory level, a whole `**` spans any depth."""
    out: list[str] = []
    segments = pattern.split("/")
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        if segment == "**":
            out.append(".*" if last else "(?:[^/]+/)*")
            continue
        out.append(_segment_regex(segment))
        if not last:
            out.append("/")
    return re.compile("".join(out))


def _segment_regex(segment: str) -> str:
    """One directory level of a glob as a regular expression (`*`, `?` and `[...]` within the level)."""
    out: list[str] = []
    i = 0
    while i < len(segment):
        ch = segment[i]
        if ch == "*":
            out.append("[^/]*")
        elif ch == "?":
            out.append("[^/]")
        elif ch == "[":
            end = segment.find("]", i + 2)
            if end == -1:
                out.append(re.escape(ch))
            else:
                body = segment[i + 1 : end]
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append(f"[{body.replace(chr(92), chr(92) * 2)}]")
                i = end
        else:
            out.append(re.escape(ch))
        i += 1
    return "".join(out)


def is_hidden(name: str, *, directory: bool) -> bool:
    if directory and "=" in name:
        return False
    return name.startswith((".", "_")) or name.endswith(_IGNORED_SUFFIXES)


def hive_segment(segment: str) -> tuple[str, str] | None:
    name, sep, value = segment.partition("=")
    if not sep or not name:
        return None
    return name, value


def hive_columns_of(files: Sequence[SourceFile]) -> tuple[str, ...]:
    """Hive partition column names shared by every file's directories, or () if the layout is not Hive."""
    names: tuple[str, ...] | None = None
    for f in files:
        segments = [hive_segment(d) for d in f.directories]
        if any(s is None for s in segments):
            return ()
        these = tuple(s[0] for s in segments if s is not None)
        if names is None:
            names = these
        elif these != names:
            return ()
    return names or ()


class FilePlace(Protocol):
    """Where the files are: a root (a directory, a file, or a bucket and prefix), an optional glob under
    it, how to list them and how pyarrow and Spark reach them."""

    location: str
    root: str
    pattern: re.Pattern[str] | None
    remote: bool
    # Threads reading per-file metadata at once (S3 requests wait on the network, local ones on disk).
    read_parallelism: int

    def files(self) -> Iterator[SourceFile]: ...

    @property
    def filesystem(self) -> Any: ...

    def hive_base(self) -> str: ...

    def spark_paths(
        self, files: Sequence[SourceFile], work_dir: str, spark_scheme: str | None
    ) -> tuple[list[str], list[str]]:
        """(paths Spark loads, each file's key as Spark's `_metadata.file_path` decodes to)."""
        ...

    def spark_whole_path(self, spark_scheme: str | None) -> str | None:
        """The root as one path Spark lists itself, or None when it must be given the files."""
        ...


def open_place(
    location: str, *, scheme: str, params: Mapping[str, Any], base_dir: str | None
) -> LocalFiles | S3Files:
    """The files of a source location: on S3 for the `s3`/`s3a` scheme or URL, else on the local disk."""
    if scheme in _S3_SCHEMES or location.partition("://")[0] in _S3_SCHEMES:
        return S3Files(location, params)
    return LocalFiles(location, base_dir)


def _root_and_pattern(path: str, location: str, *, remote: bool) -> tuple[str, re.Pattern[str] | None]:
    """(root the files live under, glob pattern relative to it or None)."""
    parts = path.split("/")
    first_glob = next((i for i, part in enumerate(parts) if _GLOB_CHARS & set(part)), None)
    if first_glob is None:
        return path, None
    if remote and first_glob == 0:
        raise SourceError(f"S3 location {location!r} has a glob in the bucket name")
    root = "/".join(parts[:first_glob]) or "/"
    return root, glob_to_regex("/".join(parts[first_glob:]))


def _matches(pattern: re.Pattern[str] | None, relative: str) -> bool:
    if pattern is None:
        return True
    if pattern.fullmatch(relative):
        return True
    # A glob that matches a directory (e.g. Hive partitions) selects every file under it.
    parts = relative.split("/")
    return any(pattern.fullmatch("/".join(parts[:n])) for n in range(1, len(parts)))


class LocalFiles:
    """Files under a local directory (or one file, or a glob), listed with their modification times."""

    remote = False
    read_parallelism = 4

    def __init__(self, location: str, base_dir: str | None) -> None:
        self.location = location
        raw = os.path.expanduser(location.removeprefix("file://"))
        if not os.path.isabs(raw):
            raw = os.path.join(base_dir or os.getcwd(), raw)
        self.root, self.pattern = _root_and_pattern(os.path.normpath(raw), location, remote=False)

    def files(self) -> Iterator[SourceFile]:
        root = self.root
        if os.path.isfile(root):
            st = os.stat(root)
            yield SourceFile(root, os.path.basename(root), st.st_size, str(st.st_mtime_ns))
            return
        if not os.path.isdir(root):
            raise SourceError(f"source path {root} does not exist (from {self.location!r})")
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if not is_hidden(d, directory=True))
            for name in filenames:
                if is_hidden(name, directory=False):
                    continue
                full = os.path.join(dirpath, name)
                relative = os.path.relpath(full, root).replace(os.sep, "/")
                if not _matches(self.pattern, relative):
                    continue
                st = os.stat(full)
                yield SourceFile(full, relative, st.st_size, str(st.st_mtime_ns))

    @cached_property
    def filesystem(self) -> Any:
        from pyarrow import fs

        return fs.LocalFileSystem()

    def hive_base(self) -> str:
        return os.path.dirname(self.root) if os.path.isfile(self.root) else self.root

    def spark_paths(
        self, files: Sequence[SourceFile], work_dir: str, spark_scheme: str | None
    ) -> tuple[list[str], list[str]]:
        paths = [f.path for f in files]
        return paths, [os.path.abspath(path) for path in paths]

    def spark_whole_path(self, spark_scheme: str | None) -> str | None:
        return self.root if os.path.isdir(self.root) else None


class S3Files:
    """Objects under an S3 prefix (or one object, or a glob), listed with their ETags; file paths are
    `bucket/key`, as the bucket's pyarrow filesystem names them."""

    remote = True
    read_parallelism = 16

    def __init__(self, location: str, params: Mapping[str, Any]) -> None:
        self.location = location
        where = _s3_path(location)
        path = f"{where.bucket}/{where.prefix}".rstrip("/")
        self.root, self.pattern = _root_and_pattern(path, location, remote=True)
        self._params = params

    @cached_property
    def settings(self) -> S3Settings:
        """The source's S3 settings: its params, then the standard AWS environment."""
        return S3Settings.from_source_params(self._params)

    @cached_property
    def store(self) -> S3Store:
        """The bucket's store: keys are the bucket's own keys."""
        return S3Store.at(S3Location(_s3_path(self.root).bucket, ""), self.settings)

    def files(self) -> Iterator[SourceFile]:
        root = _s3_path(self.root)
        bucket, key = root.bucket, root.prefix
        # Try the root as one object first: `s3://b/data.parquet` names a file, not a prefix.
        if key and self.pattern is None:
            try:
                head = self.store.head(key)
            except ObjectStoreError:
                head = None
            if head is not None:
                size, etag = int(head["ContentLength"]), str(head["ETag"]).strip('"')
                yield SourceFile(f"{bucket}/{key}", key.rsplit("/", 1)[-1], size, etag)
                return
        prefix = f"{key}/" if key else ""
        for obj in self.store.list(prefix):
            if obj.key.endswith("/"):
                continue
            relative = obj.key[len(prefix) :]
            parts = relative.split("/")
            if any(is_hidden(p, directory=True) for p in parts[:-1]) or is_hidden(parts[-1], directory=False):
                continue
            if not _matches(self.pattern, relative):
                continue
            yield SourceFile(f"{bucket}/{obj.key}", relative, obj.size, obj.etag or "")

    @cached_property
    def filesystem(self) -> Any:
        return self.store.bucket_filesystem()

    def hive_base(self) -> str:
        return self.root

    def spark_paths(
        self, files: Sequence[SourceFile], work_dir: str, spark_scheme: str | None
    ) -> tuple[list[str], list[str]]:
        if spark_scheme:
            # `bucket/key`: what Spark's `_metadata.file_path` decodes to once its scheme is removed.
            return [f"{spark_scheme}://{f.path}" for f in files], [f.path for f in files]
        # Spark has no S3 connector configured: copy the needed objects next to the staging data.
        paths = self._download(files, os.path.join(work_dir, "source"))
        return paths, [os.path.abspath(path) for path in paths]

    def spark_whole_path(self, spark_scheme: str | None) -> str | None:
        return f"{spark_scheme}://{self.root}" if spark_scheme else None

    def _download(self, files: Sequence[SourceFile], target_root: str) -> list[str]:
        out: list[str] = []
        for f in files:
            location = _s3_path(f.path)
            target = os.path.join(target_root, *f.relative.split("/"))
            Path(target).parent.mkdir(parents=True, exist_ok=True)
            self.store.client.download_file(location.bucket, location.prefix, target)
            out.append(target)
        return out


def _s3_path(path: str) -> S3Location:
    """`s3://bucket/key`, `s3a://bucket/key` or `bucket/key` (as source files are recorded) split."""
    return parse_s3_location(path, what="S3 location", error=SourceError, strict=False)
