"""Remembers the partitions whose last refresh failed, beside the catalog, so runs, CLI and UI agree.

One small JSON object per failed partition under `<dataset>/_state/failures/` in the catalog's object store
(the accelerator directory, or the catalog's S3 location): a refresh task that fails writes its partition's
record, a commit that publishes the partition deletes it. One object per partition, not one shared file,
so mapped tasks failing at the same time never overwrite each other's records.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_partitions.catalog.model import format_time, parse_time
from airflow_partitions.keys import escape_component
from airflow_partitions.spec.masking import mask_secrets

if TYPE_CHECKING:
    from airflow_partitions.catalog import Catalog
    from airflow_partitions.objectstore import ObjectStore

STATE_DIRECTORY = "_state"
# Enough of a traceback's last line to say what went wrong; the task log holds the rest.
MAX_ERROR_CHARS = 2000


@dataclass(frozen=True)
class PartitionFailure:
    """The last failed refresh of one partition: the (masked) error and, from Airflow, the task instance."""

    key_path: str
    error: str
    failed_at: dt.datetime
    dag_id: str | None = None
    run_id: str | None = None
    task_id: str | None = None
    map_index: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "key_path": self.key_path,
            "error": self.error,
            "failed_at": format_time(self.failed_at),
            "dag_id": self.dag_id,
            "run_id": self.run_id,
            "task_id": self.task_id,
            "map_index": self.map_index,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PartitionFailure:
        map_index = data.get("map_index")
        return cls(
            key_path=str(data["key_path"]),
            error=str(data.get("error", "")),
            failed_at=parse_time(data["failed_at"]),
            dag_id=data.get("dag_id"),
            run_id=data.get("run_id"),
            task_id=data.get("task_id"),
            map_index=int(map_index) if map_index is not None else None,
        )


def describe_error(err: BaseException) -> str:
    """`Type: message`, secrets masked and cut to a readable length: what a failure record keeps."""
    text = mask_secrets(f"{type(err).__name__}: {err}")
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


class FailureStore:
    """The failure records of one dataset in an object store (`for_catalog` puts them beside its catalog)."""

    def __init__(self, store: ObjectStore, dataset: str) -> None:
        self.store = store
        self.dataset = dataset
        self.prefix = f"{escape_component(dataset)}/{STATE_DIRECTORY}/failures/"

    @classmethod
    def for_catalog(cls, catalog: Catalog) -> FailureStore:
        return cls(catalog.store, catalog.dataset)

    def _key(self, key_path: str) -> str:
        # Key paths can be long and hold `/`: a digest names the object, the record holds the path.
        return self.prefix + hashlib.sha256(key_path.encode("utf-8")).hexdigest()[:40] + ".json"

    def record(self, failure: PartitionFailure) -> None:
        failure = PartitionFailure(**{**failure.__dict__, "error": mask_secrets(failure.error)})
        self.store.put(self._key(failure.key_path), json.dumps(failure.to_json()).encode("utf-8"))

    def clear(self, key_paths: Iterable[str]) -> None:
        """Forget the failures of `key_paths` (committed partitions); paths without one are ignored."""
        keys = [self._key(path) for path in key_paths]
        if keys:
            self.store.delete(keys)

    def failures(self) -> dict[str, PartitionFailure]:
        """Every remembered failure by key path."""
        found: dict[str, PartitionFailure] = {}
        for info in self.store.list(self.prefix):
            data = self.store.get(info.key)
            if data is None:
                continue  # cleared between the listing and the read
            try:
                failure = PartitionFailure.from_json(json.loads(data))
            except (ValueError, KeyError, TypeError):
                continue  # a damaged record says nothing reliable; the next failure or commit replaces it
            found[failure.key_path] = failure
        return found
