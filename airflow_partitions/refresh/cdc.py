"""`refresh_mode: changes` with `refresh.change_detection: cdc`: refreshes fed by a replication slot.

Exactly once (docs/ARCHITECTURE.md, "Change data capture"):
1. plan: check the server (`wal_level = logical`), find the WAL position the newest catalog version
   recorded (`conservation.cdc_lsn`) and the slot's confirmed position. No slot and a recorded position:
   the slot was dropped, changes are lost, `SlotLostError` (`--full` copies again). No slot, nothing
   recorded: create it. The recorded position ahead of the slot (a refresh died between its commit and
   the advance): advance the slot to it first. Then take `upto`, a flushed WAL position, and peek the
   changes committed before it (or, for a first refresh, `--full`, a TRUNCATE in the stream, a changed
   spec: copy every partition, read after `upto`).
2. stage + finalize: the same peek (the slot has not moved) gives the same changes; each touched
   partition is merged (rows upserted by primary key, keys deleted), conservation checked per partition.
3. commit: the catalog version records `upto`; only then is the slot advanced to `upto`.
A crash before 3 loses nothing (the slot still holds every change); a crash between the commit and the
advance replays changes the commit holds already, which the merge by primary key applies idempotently.

Consistent start: a new slot is created over a replication connection that exports its snapshot, and the
first copy (discovery and every ADBC read of the stage in this process: the Arrow path, pushdown, Spark's
local ADBC export) joins that snapshot, so it holds exactly the transactions committed before the slot's
start, which the plan records as its position: no change is both copied and streamed, none is neither.
The snapshot lives while this process holds the connection (until `after_commit`, or the end of
`refresh_dataset`). A copy read elsewhere (a stage task in another process, Spark JDBC, a user without the
REPLICATION privilege) is read after the slot's start; replaying the stream from the start over it
converges, since every change is the full row to upsert, or the key to delete, by primary key.
"""

from __future__ import annotations

import collections
import os
import signal
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import ChangeCaptureError, RefreshError, SlotLostError
from airflow_partitions.keys import PartitionKey
from airflow_partitions.refresh.modes import changes_fallback, changes_items, changes_touched
from airflow_partitions.refresh.plan import DiscoveryKind, Reason, RefreshPlan, key_digest
from airflow_partitions.sources import open_dataset_source
from airflow_partitions.sources.base import schema_tag, tagged_fingerprint
from airflow_partitions.sources.pg_cdc import (
    DELETED_COLUMN,
    ChangeStream,
    deleted_mask,
    lsn_to_int,
    release_snapshot,
    slot_name_for,
)
from airflow_partitions.sources.postgres import PostgresSource
from airflow_partitions.sources.renamed import RenamedSource
from airflow_partitions.spec.model import ChangeDetection, RefreshMode

# During a re-partitioning: (base version, changed and deleted keys) -> (the newest version after the
# old partitions holding them moved, the exact "does this old partition hold one" check, a note).
# Whether an old-layout partition holds one of some first-key values (`refresh.layouts.key_holder`).
OldHolds = Callable[[Any, Sequence[Any]], bool]

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_partitions.catalog import Catalog, Snapshot
    from airflow_partitions.refresh.plan import RefreshPlan
    from airflow_partitions.sources.base import Source
    from airflow_partitions.sources.pg_cdc import ChangeStream
    from airflow_partitions.spec.model import DatasetSpec, ProjectSpec
    from airflow_partitions.transforms import Transform

# Tests stop a refresh with SIGKILL at a named point of the protocol (see the module docstring).
KILL_AT_ENV = "AIRFLOW_PARTITIONS_TEST_KILL_AT"
POSITION_KEY = "cdc_lsn"  # where a commit record's conservation holds the WAL position it reached
SLOT_PARAM = "cdc_slot"  # acceleration.params.cdc_slot: the replication slot's name, when not derived
NOTE = "change data capture: "  # how the plan's notes on the stream start (the CLI prints them)


def kill_point(name: str) -> None:
    """Die here (SIGKILL, no cleanup) when the kill-point environment variable names this point."""
    if os.environ.get(KILL_AT_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


def uses_cdc(dataset: DatasetSpec, source: Source | None = None) -> bool:
    """Whether the dataset's changes come from a replication slot (changes mode, cdc, Postgres)."""
    refresh = dataset.acceleration.refresh
    if refresh.mode is not RefreshMode.CHANGES or refresh.detection is not ChangeDetection.CDC:
        return False
    if source is not None:
        return getattr(source, "kind", None) == "postgres"
    return str(dataset.source.uri).startswith("postgres:")


def change_stream(project: ProjectSpec, dataset: DatasetSpec, source: Source | None = None) -> ChangeStream:
    """The dataset's replication slot and publication (`acceleration.params.cdc_slot`, or a name derived
    from the dataset, where its acceleration lives and the table it reads)."""

    source = source or open_dataset_source(dataset)
    postgres = _postgres(source)
    if postgres is None:
        raise RefreshError(
            f"dataset {dataset.name!r}: change data capture reads Postgres sources only; "
            f"{source.describe()} is not one"
        )
    configured = dataset.acceleration.params.get(SLOT_PARAM)
    slot = (
        str(configured)
        if configured
        else slot_name_for(dataset.name, f"{project.accelerator_dir}|{postgres.table}")
    )
    return _stream(source, slot)


def _postgres(source: Source) -> PostgresSource | None:
    """The Postgres table under `source` (a dataset with `renamed_columns` wraps it), or None."""
    inner = source.inner if isinstance(source, RenamedSource) else source
    return inner if isinstance(inner, PostgresSource) else None


def _stream(source: Source, slot: str) -> ChangeStream:
    """`slot` on `source`'s table; with `renamed_columns`, it hands out rows in the stored names."""
    postgres = _postgres(source)
    if postgres is None:
        raise RefreshError(f"{source.describe()} cannot stream changes; plan again")
    renames = source.renames if isinstance(source, RenamedSource) else None
    return ChangeStream(postgres, slot, renames)


def committed_position(catalog: Catalog) -> str | None:
    """The WAL position the newest catalog version fed by the stream recorded (None: none was)."""
    for limit in (20, None):
        versions = catalog.versions(limit=limit)
        for info in reversed(versions):
            recorded = (info.conservation or {}).get(POSITION_KEY)
            if recorded:
                return str(recorded)
        if limit is not None and len(versions) < limit:
            break
    return None


def plan_cdc(
    dataset: DatasetSpec,
    source: Source,
    snapshot: Snapshot | None,
    catalog: Catalog,
    stream: ChangeStream,
    *,
    full: bool,
    copy: Callable[[], RefreshPlan],
    old_holds: OldHolds | None = None,
) -> RefreshPlan:
    """Step 1 of the module docstring: the changes plan, or `copy()` (a full plan) marked with the
    position it is read after. `old_holds`: during a re-partitioning, whether an old partition holds a
    changed or deleted key (`refresh.layouts.key_holder`; the plan's `migrate`, moved in the refresh's
    commit); without it a re-partitioning in progress copies every partition (`changes_fallback`)."""

    keys = list(dataset.acceleration.primary_key)
    notes: list[str] = []
    with stream.connect() as conn:
        stream.check_server(conn)
        committed = committed_position(catalog) if snapshot is not None else None
        info = stream.info(conn)
        if info is None:
            if committed is not None and not full:
                raise SlotLostError(
                    f"dataset {dataset.name!r}: replication slot {stream.slot!r} on "
                    f"{stream.source.describe()} is gone (dropped, or invalidated by "
                    f"max_slot_wal_keep_size), and the acceleration continues from WAL position {committed}: "
                    "the changes since then cannot be recovered. Run `airflow-partitions refresh SPEC "
                    f"{dataset.name} --full` to copy the table again and re-create the slot"
                )
            start, exported = stream.create(conn)
            notes.append(f"{NOTE}replication slot {stream.slot} created at WAL position {start}")
            if exported is not None:
                notes.append(
                    f"{NOTE}the first copy reads the table at the slot's exported snapshot {exported}"
                )
        elif not stream.publishes(conn):
            if not full:
                raise ChangeCaptureError(
                    f"dataset {dataset.name!r}: {stream.source.table} is no longer in publication "
                    f"{stream.publication!r} with REPLICA IDENTITY FULL (the table was dropped and "
                    "re-created, or the publication or the table's replica identity was changed), so its "
                    "changes may not have reached the slot. Run `airflow-partitions refresh SPEC "
                    f"{dataset.name} --full` to copy the table again and publish it"
                )
            stream.publish(conn)
            notes.append(f"{NOTE}{stream.source.table} published again in {stream.publication}")
        elif committed is not None and (
            info.confirmed_flush_lsn is None or lsn_to_int(committed) > lsn_to_int(info.confirmed_flush_lsn)
        ):
            # The last refresh committed but died before advancing the slot.
            stream.advance(conn, committed)
            notes.append(
                f"{NOTE}replication slot {stream.slot} advanced to the committed WAL position {committed} "
                "(the last refresh stopped between its commit and the slot's advance)"
            )
        # A new slot: the copy is read at its snapshot (or after it), the stream continues from its start.
        upto = start if info is None else stream.position(conn)
        reason = changes_fallback(
            dataset, source, snapshot, selecting=False, full=full, migration=old_holds is not None
        )
        if reason is None and committed is None:
            reason = "no version records a position in the change stream: the table is copied to start it"
        changes = None
        if reason is None:
            changes = stream.peek(conn, upto, source.schema().names, keys)
            if changes.truncated:
                reason = (
                    f"TRUNCATE of {stream.source.table} in the change stream: a full refresh copies every "
                    "partition again"
                )
        cdc = {"slot": stream.slot, "upto": upto}
        if reason is not None:
            plan = copy()
            return replace(plan, cdc=cdc, notes=(*plan.notes, *notes, f"{NOTE}{reason}"))
        assert changes is not None
        assert snapshot is not None
        if changes.empty:
            # Nothing of this table committed before `upto`: the slot may skip to it at once.
            stream.advance(conn, upto)
            return RefreshPlan(
                dataset=dataset.name,
                spec_id=dataset.acceleration.partition_spec_id,
                partition_names=dataset.acceleration.partition_names,
                base_version=snapshot.version,
                items=(),
                removed=(),
                unchanged=len(snapshot.partitions),
                discovered=len(snapshot.partitions),
                discovery=DiscoveryKind.DYNAMIC,
                fingerprint_granularity="partition",
                notes=(*notes, f"{NOTE}no change of {stream.source.table} up to {upto}"),
                refresh_mode=str(RefreshMode.CHANGES),
                changed_rows=0,
                changed_partitions=0,
            )
        typed = stream.typed(conn, changes, source.schema(), keys)
    counts = (len(changes.upserts), len(changes.deletes))
    return _changes_plan(dataset, snapshot, typed, counts, cdc, notes, old_holds)


def _changes_plan(
    dataset: DatasetSpec,
    snapshot: Snapshot,
    typed: pa.Table,
    counts: tuple[int, int],
    cdc: dict[str, str],
    notes: list[str],
    old_holds: OldHolds | None = None,
) -> RefreshPlan:
    """The partitions the changed rows land in, and those whose files may hold a changed or deleted key
    (`counts`: rows to upsert, keys to delete). `old_holds`: during a re-partitioning, whether an old
    partition holds one of them; the refresh's commit moves those (`RefreshPlan.migrate`), their rows of
    changed or deleted keys dropped."""

    acceleration = dataset.acceleration
    keys = list(acceleration.primary_key)
    upserts, deletes = counts
    moving: set[str] = set()
    if old_holds is not None:
        notes = [
            *notes,
            f"{NOTE}re-partitioning in progress: the old partitions holding a changed or deleted key move "
            "into the current layout in the refresh's commit",
        ]
    names = acceleration.partition_names
    landing = _landing([f.transform for f in acceleration.partition_by], typed)
    # Keys matched as the merge matches them (IS NOT DISTINCT FROM): NULL, NaN and -0.0 included.
    touched = changes_touched(
        snapshot,
        names,
        landing,
        keys[0],
        typed.column(keys[0]).to_pylist(),
        spec_id=acceleration.partition_spec_id if old_holds is not None else None,
        old_holds=old_holds,
        moving=moving if old_holds is not None else None,
    )
    schema = typed.schema.remove(typed.schema.get_field_index(DELETED_COLUMN))
    fingerprint = tagged_fingerprint(schema_tag(schema), f"cdc-{cdc['upto']}")
    items = changes_items(snapshot, touched, fingerprint)
    return RefreshPlan(
        dataset=dataset.name,
        spec_id=acceleration.partition_spec_id,
        partition_names=names,
        base_version=snapshot.version,
        items=items,
        removed=(),
        unchanged=len(snapshot.partitions) - sum(1 for i in items if i.reason is Reason.CHANGED),
        discovered=len(set(snapshot.partitions) | set(touched)),
        discovery=DiscoveryKind.DYNAMIC,
        fingerprint_granularity="partition",
        notes=(
            *notes,
            f"{NOTE}{upserts} row(s) to upsert, {deletes} key(s) to delete, from the "
            f"transactions committed before WAL position {cdc['upto']}",
        ),
        refresh_mode=str(RefreshMode.CHANGES),
        changed_rows=typed.num_rows,
        changed_partitions=len(items),
        changed_keys=key_digest(typed, keys),
        cdc=cdc,
        migrate=tuple(sorted(moving)),
    )


def _landing(transforms: Sequence[Transform], typed: pa.Table) -> collections.Counter[tuple[Any, ...]]:
    """Upserted rows per partition key they land in (keys to delete land nowhere); `transforms` bound
    (a custom expression's values depend on its column's type)."""
    import pyarrow.compute as pc

    mask = deleted_mask(typed)
    rows = typed if mask is None else typed.filter(pc.invert(mask))
    if not rows.num_rows:
        return collections.Counter()
    values = [t.apply_table(rows).to_pylist() for t in transforms]
    return collections.Counter(zip(*values, strict=True))


def stage_cdc_changes(
    dataset: DatasetSpec, source: Source, transforms: Sequence[Transform], plan: RefreshPlan
) -> tuple[pa.Table, dict[int, int]]:
    """The stage's read of a cdc plan: the same peek (the slot has not moved), the same changes.
    Returns the change table (rows to upsert and keys to delete, marked) and upserted rows per item."""

    assert plan.cdc is not None
    stream = _stream(source, plan.cdc["slot"])
    keys = list(dataset.acceleration.primary_key)
    with stream.connect() as conn:
        changes = stream.peek(conn, plan.cdc["upto"], source.schema().names, keys)
        typed = stream.typed(conn, changes, source.schema(), keys)
    if changes.truncated or typed.num_rows != plan.changed_rows:
        raise RefreshError(
            f"the change stream of {source.describe()} (slot {stream.slot}) holds {typed.num_rows} change(s) "
            f"up to {plan.cdc['upto']}, the plan {plan.changed_rows}: another refresh advanced the slot "
            "meanwhile. Nothing was written: plan again"
        )
    planned = {tuple(PartitionKey.from_json(item.key).values): i for i, item in enumerate(plan.items)}
    per_key = _landing(transforms, typed)
    whole_plan = plan.changed_partitions is None or len(plan.items) == plan.changed_partitions
    if whole_plan and not per_key.keys() <= planned.keys():
        raise RefreshError(
            f"changed rows of {source.describe()} land in partitions the plan does not hold; plan again"
        )
    return typed, {planned[key]: rows for key, rows in per_key.items() if key in planned}


def after_commit(plan: RefreshPlan, dataset: DatasetSpec, source: Source | None, *, committed: bool) -> None:
    """Step 3 of the module docstring, after the catalog commit (or when there was nothing to commit):
    advance the slot to the plan's position."""

    if plan.cdc is None:
        return
    if committed:
        kill_point("cdc-after-commit")
    stream = _stream(source or open_dataset_source(dataset), plan.cdc["slot"])
    with stream.connect() as conn:
        stream.advance(conn, plan.cdc["upto"])
    release_snapshot(stream.slot)
    kill_point("cdc-after-advance")
