"""Parts of the conservation matrix: pairwise combinations, hostile data, source writers, row hashes.

Everything here is independent of the package's source connectors: sources are written with pyarrow,
json, csv and psycopg, and read back ("what the source holds") with the same libraries directly, so a
bug in `airflow_partitions.sources` cannot hide itself by agreeing with its own oracle. The only package
code used is `Transform.apply` (to know which partition a row belongs to, and the value of a partition
expression such as `bucket(8, n_int)` in a filter, which DuckDB cannot compute) and `PartitionKey.path`
(the documented spelling of a key for `--partitions`).
"""

from __future__ import annotations

import csv
import datetime as dt
import hashlib
import io
import itertools
import json
import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa

from airflow_partitions.keys import PartitionKey
from airflow_partitions.transforms import Transform, parse_transform

# --- pairwise combinations --------------------------------------------------------------------------

Combination = dict[str, str]


def _valid_combinations(
    axes: Mapping[str, Sequence[str]], valid: Callable[[Combination], bool]
) -> list[Combination]:
    names = list(axes)
    return [
        dict(zip(names, values, strict=True))
        for values in itertools.product(*(axes[name] for name in names))
        if valid(dict(zip(names, values, strict=True)))
    ]


def _pairs_of(combination: Combination, names: Sequence[str]) -> set[tuple[str, str, str, str]]:
    return {(a, combination[a], b, combination[b]) for i, a in enumerate(names) for b in names[i + 1 :]}


def valid_pairs(
    axes: Mapping[str, Sequence[str]], valid: Callable[[Combination], bool]
) -> set[tuple[str, str, str, str]]:
    """Every (axis, value, axis, value) pair that at least one valid full combination contains."""
    names = list(axes)
    pairs: set[tuple[str, str, str, str]] = set()
    for combination in _valid_combinations(axes, valid):
        pairs |= _pairs_of(combination, names)
    return pairs


def all_pairs(
    axes: Mapping[str, Sequence[str]],
    valid: Callable[[Combination], bool] = lambda c: True,
    *,
    required: Sequence[Combination] = (),
) -> list[Combination]:
    """A small list of valid combinations covering every valid pair of values of two axes (greedy).

    Deterministic: `required` combinations come first; then, over the valid cross product in axis
    order, each step takes the first candidate covering the most still-uncovered pairs. The cross
    products here are a few thousand combinations, so brute force is fine and easy to trust.
    """
    names = list(axes)
    candidates = _valid_combinations(axes, valid)
    candidate_pairs = [_pairs_of(c, names) for c in candidates]
    uncovered = set().union(*candidate_pairs) if candidate_pairs else set()
    chosen: list[Combination] = []
    for combination in required:
        if not valid(combination):
            raise ValueError(f"required combination {combination} is not valid")
        chosen.append(dict(combination))
        uncovered -= _pairs_of(combination, names)
    while uncovered:
        best = max(range(len(candidates)), key=lambda i: (len(candidate_pairs[i] & uncovered), -i))
        chosen.append(candidates[best])
        uncovered -= candidate_pairs[best]
    return chosen


def uncovered_pairs(
    combinations: Sequence[Combination],
    axes: Mapping[str, Sequence[str]],
    valid: Callable[[Combination], bool],
) -> set[tuple[str, str, str, str]]:
    names = list(axes)
    covered: set[tuple[str, str, str, str]] = set()
    for combination in combinations:
        covered |= _pairs_of(combination, names)
    return valid_pairs(axes, valid) - covered


# --- hostile data --------------------------------------------------------------------------------

HOSTILE_STRINGS = [
    "",
    "a/b=c",
    "50%",
    "it's",
    "é",
    "日本語",
    "🙂",
    "none",
    "NULL",
    "NA",
    'say "hi"',
    "back\\slash",
    "a,b",
    " lead space",
    "__HIVE_DEFAULT_PARTITION__",
    "x" * 70,
    "alpha",
    "beta",
]
# Within int32 so a Hive directory of them reads back as a number (pyarrow infers int32 for Hive ints);
# the lowest is a multiple of 1000, as truncate(1000, .) of anything lower has no int32 floor (refused).
HOSTILE_INTS = [
    0,
    1,
    -1,
    2,
    3,
    7,
    -7,
    42,
    99,
    100,
    -100,
    101,
    999,
    -1000,
    12345,
    -54321,
    2**31 - 1,
    -2_147_483_000,
]
HOSTILE_DECIMALS = [
    Decimal("0.00"),
    Decimal("-0.01"),
    Decimal("0.01"),
    Decimal("999.99"),
    Decimal("1000.00"),
    Decimal("-1000.00"),
    Decimal("9999999999.99"),  # the largest decimal(12, 2)
    Decimal("-9999998000.00"),  # a multiple of 1000.00 near the bottom of decimal(12, 2)
]
# No NaN: SQL engines disagree on NaN ordering and equality, and the oracle would need its own rules.
HOSTILE_DOUBLES = [0.0, -0.0, 1.5, 0.1, 1e300, -1e-300, -2.5]
UTC = dt.UTC
HOSTILE_INSTANTS = [
    dt.datetime(2026, 1, 31, 23, 59, 59, 999_999, tzinfo=UTC),
    dt.datetime(2026, 2, 1, 0, 0, tzinfo=UTC),
    dt.datetime(1969, 12, 31, 23, 59, 59, 500_000, tzinfo=UTC),
    dt.datetime(2024, 2, 29, 12, 0, tzinfo=UTC),
    dt.datetime(2025, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
    dt.datetime(2026, 3, 29, 1, 30, tzinfo=UTC),
]
HOSTILE_DATES = [dt.date(2024, 2, 29), dt.date(1969, 12, 31), dt.date(1970, 1, 1), dt.date(2025, 12, 31)]

SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("n_int", pa.int64()),
        ("amount", pa.decimal128(12, 2)),
        ("x", pa.float64()),
        ("s", pa.string()),
        ("ts", pa.timestamp("us", "UTC")),
        ("ts_naive", pa.timestamp("us")),
        ("d", pa.date32()),
        ("flag", pa.bool_()),
    ]
)
# The same schema as a spec `schema:` block declares it (for formats that carry no types).
DECLARED_SCHEMA = {
    "id": "int64",
    "n_int": "int64",
    "amount": "decimal128(12, 2)",
    "x": "double",
    "s": "string",
    "ts": "timestamp[us, UTC]",
    "ts_naive": "timestamp[us]",
    "d": "date32",
    "flag": "bool",
}


def _row(rng: random.Random, row_id: int, *, complete: bool = False) -> dict[str, Any]:
    """One hostile row; `complete` rows have no NULL and fractional values (CSV type inference needs one)."""

    def maybe(value: Any) -> Any:
        return None if not complete and rng.random() < 0.1 else value

    def pick(specials: Sequence[Any], random_value: Callable[[], Any]) -> Any:
        return rng.choice(specials) if rng.random() < 0.35 else random_value()

    def instant() -> dt.datetime:
        return dt.datetime(2025, 11, 15, tzinfo=UTC) + dt.timedelta(
            seconds=rng.randrange(0, 150 * 86_400), microseconds=rng.randrange(1, 10**6)
        )

    ts = pick(HOSTILE_INSTANTS, instant)
    naive = pick(HOSTILE_INSTANTS, instant).replace(tzinfo=None)
    if complete:
        ts, naive = instant(), instant().replace(tzinfo=None)
    return {
        "id": 10**12 + row_id,
        "n_int": maybe(rng.choice(HOSTILE_INTS)),
        "amount": maybe(
            Decimal("1234.56")
            if complete
            else pick(HOSTILE_DECIMALS, lambda: Decimal(rng.randint(-500_000, 500_000)).scaleb(-2))
        ),
        "x": maybe(2.25 if complete else pick(HOSTILE_DOUBLES, lambda: round(rng.uniform(-1000, 1000), 3))),
        "s": maybe("alpha" if complete else rng.choice(HOSTILE_STRINGS)),
        "ts": maybe(ts),
        "ts_naive": maybe(naive),
        "d": maybe(
            pick(HOSTILE_DATES, lambda: dt.date(2025, 12, 1) + dt.timedelta(days=rng.randint(0, 120)))
        ),
        "flag": maybe(rng.random() < 0.5),
    }


def hostile_chunks(seed: int, rows: int = 360, chunks: int = 3) -> list[pa.Table]:
    """The source's first version: `rows` hostile rows in `chunks` files (the first row of each complete)."""
    rng = random.Random(seed)
    per_chunk = rows // chunks
    out = []
    for c in range(chunks):
        records = [_row(rng, c * per_chunk + i, complete=i == 0) for i in range(per_chunk)]
        out.append(pa.Table.from_pylist(records, schema=SCHEMA))
    return out


@dataclass(frozen=True)
class SourceChange:
    """The second version of a source: rows deleted and modified in chunk 1, a new chunk appended."""

    deleted_ids: tuple[int, ...]
    modified: pa.Table  # the new values of modified rows (same ids)
    appended: pa.Table
    chunks: tuple[pa.Table, ...]  # the full second version, chunk by chunk


def change_source(chunks: Sequence[pa.Table], seed: int) -> SourceChange:
    """Delete and modify rows of chunk 1 (moving rows across partitions) and append rows with new keys."""
    rng = random.Random(seed + 1)
    victim = chunks[1].to_pylist()
    order = list(range(1, len(victim)))  # row 0 stays: it keeps CSV inference stable
    rng.shuffle(order)
    deleted = {victim[i]["id"] for i in order[:12]}
    modified_rows = []
    for i in order[12:24]:
        row = dict(victim[i])
        row["s"] = rng.choice([None, "brand/new=key", "é", row["s"]])
        row["n_int"] = rng.choice([None, 77_777, -2_147_483_000, 5])
        row["amount"] = rng.choice([None, Decimal("-0.01"), Decimal("77777.77")])
        row["ts"] = rng.choice([None, dt.datetime(2026, 6, 15, 8, 30, 0, 123_456, tzinfo=UTC)])
        row["ts_naive"] = rng.choice([None, dt.datetime(2026, 7, 1)])
        row["d"] = rng.choice([None, dt.date(2027, 1, 1)])
        row["flag"] = rng.choice([None, True, False])
        modified_rows.append(row)
    by_id = {row["id"]: row for row in modified_rows}
    new_chunk1 = [by_id.get(row["id"], row) for row in victim if row["id"] not in deleted]
    appended = [_row(rng, 900_000 + i, complete=i == 0) for i in range(36)]
    for i, row in enumerate(appended[1:7]):
        row["s"] = ["brand/new=key", None, "", "🙂", "tail%", "NULL"][i]
        row["n_int"] = [77_777, None, 5, -2_147_483_000, 88_888, None][i]
    new_chunks = (chunks[0], pa.Table.from_pylist(new_chunk1, schema=SCHEMA), chunks[2])
    appended_table = pa.Table.from_pylist(appended, schema=SCHEMA)
    return SourceChange(
        deleted_ids=tuple(sorted(deleted)),
        modified=pa.Table.from_pylist(modified_rows, schema=SCHEMA),
        appended=appended_table,
        chunks=(*new_chunks, appended_table),
    )


# --- source writers ---------------------------------------------------------------------------------


def _json_instant(value: dt.datetime, style: int) -> str:
    """A tz-aware instant in one of four spellings: `+00:00`, `+05:30`, `Z`, and no offset (UTC wall time)."""
    if style == 0:
        return value.isoformat(sep=" ")
    if style == 1:
        return value.astimezone(dt.timezone(dt.timedelta(hours=5, minutes=30))).isoformat()
    if style == 2:
        return value.replace(tzinfo=None).isoformat() + "Z"
    return value.replace(tzinfo=None).isoformat(sep=" ")


def json_line(row: Mapping[str, Any], index: int) -> str:
    parts = []
    for name in SCHEMA.names:
        value = row[name]
        if value is None:
            text = "null"
        elif isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, Decimal):
            text = str(value)  # a JSON number with the exact digits
        elif isinstance(value, float):
            text = repr(value)
        elif isinstance(value, dt.datetime) and value.tzinfo is not None:
            text = json.dumps(_json_instant(value, index % 4))
        elif isinstance(value, dt.datetime):
            text = json.dumps(value.isoformat(sep=" " if index % 2 else "T"))
        elif isinstance(value, dt.date):
            text = json.dumps(value.isoformat())
        elif isinstance(value, str):
            text = json.dumps(value, ensure_ascii=index % 2 == 0)
        else:
            text = str(value)
        parts.append(f"{json.dumps(name)}: {text}")
    return "{" + ", ".join(parts) + "}"


def csv_text(table: pa.Table) -> str:
    """CSV with a header; every string quoted (so '' is `""`), instants with offsets, floats exact."""
    out = io.StringIO()
    writer = csv.writer(out, quoting=csv.QUOTE_MINIMAL, lineterminator="\n")
    writer.writerow(SCHEMA.names)
    for index, row in enumerate(table.to_pylist()):
        record = []
        for name in SCHEMA.names:
            value = row[name]
            if value is None:
                record.append("")
            elif isinstance(value, bool):
                record.append("true" if value else "false")
            elif isinstance(value, float):
                record.append(repr(value))
            elif isinstance(value, dt.datetime) and value.tzinfo is not None:
                # CSV inference needs an offset on every value of a tz-aware column.
                record.append(_json_instant(value, index % 3))
            elif isinstance(value, dt.datetime | dt.date):
                record.append(
                    value.isoformat(sep=" ") if isinstance(value, dt.datetime) else value.isoformat()
                )
            else:
                record.append(str(value))
        writer.writerow(record)
    return out.getvalue()


def csv_read_options() -> Any:
    """The documented CSV rule, applied independently: only an empty field (quoted or not) is NULL."""
    import pyarrow.csv as pacsv

    return pacsv.ConvertOptions(null_values=[""], strings_can_be_null=True, quoted_strings_can_be_null=True)


def text_timestamps_in_microseconds(table: pa.Table) -> pa.Table:
    """The documented rule for timestamps inferred from text: microseconds (Spark's precision), cast
    safely, so a source value finer than a microsecond fails here instead of being compared rounded."""
    fields = [
        pa.field(f.name, pa.timestamp("us", f.type.tz)) if pa.types.is_timestamp(f.type) else f
        for f in table.schema
    ]
    return table.cast(pa.schema(fields))


def parse_json_lines(text: str) -> list[dict[str, Any]]:
    """JSON lines parsed with Python alone, typed by `DECLARED_SCHEMA` (offsets honoured, no offset = UTC)."""
    rows = []
    for line in text.splitlines():
        record = json.loads(line, parse_float=Decimal)
        typed: dict[str, Any] = {}
        for name, value in record.items():
            if value is None:
                typed[name] = None
            elif name == "x":
                typed[name] = float(value)
            elif name == "amount":
                typed[name] = Decimal(value).quantize(Decimal("0.01"))
            elif name == "ts":
                moment = dt.datetime.fromisoformat(value)
                typed[name] = (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).astimezone(UTC)
            elif name == "ts_naive":
                typed[name] = dt.datetime.fromisoformat(value)
            elif name == "d":
                typed[name] = dt.date.fromisoformat(value)
            else:
                typed[name] = value
        rows.append(typed)
    return rows


@dataclass
class MatrixSource:
    """One source of one combination: writes versions of the data and reads back what the source holds.

    `kind` is parquet | csv | json | hive | postgres | s3. `expected()` is the source's rows as an
    independent reader sees them (pyarrow / Python json / psycopg), with the source's own types.
    """

    kind: str
    root: Path
    hive_columns: tuple[str, ...] = ()
    s3: Mapping[str, str] | None = None
    bucket: str | None = None
    pg_url: str | None = None
    version: int = 0
    _files: dict[int, list[str]] = field(default_factory=dict)

    # -- spec ----------------------------------------------------------------------------------------

    def spec_lines(self) -> list[str]:
        """The dataset's `from:`, `params:` and `schema:` lines (4-space indent)."""
        if self.kind == "postgres":
            return ["    from: postgres:public.src", f"    params: {{url: '{self.pg_url}'}}"]
        if self.kind == "s3":
            assert self.s3 is not None
            return [
                f"    from: s3://{self.bucket}/src",
                f"    params: {{file_format: parquet, endpoint_url: '{self.s3['endpoint_url']}'}}",
            ]
        fmt = {"parquet": "parquet", "hive": "parquet", "csv": "csv", "json": "json"}[self.kind]
        lines = [f"    from: file:{self.root / 'src'}", f"    params: {{file_format: {fmt}}}"]
        if self.kind == "json":
            lines.append("    schema:")
            lines += [f"      {name}: '{text}'" for name, text in DECLARED_SCHEMA.items()]
        return lines

    # -- writing ---------------------------------------------------------------------------------------

    def write(self, chunks: Sequence[pa.Table]) -> None:
        """Write the first version (chunk i -> file(s) i)."""
        if self.kind == "postgres":
            self._pg_create(pa.concat_tables(chunks))
            return
        for index, chunk in enumerate(chunks):
            self._write_chunk(index, chunk)

    def apply(self, change: SourceChange) -> None:
        """Move the source to the change's version: chunk 1 replaced (new file names), a chunk appended."""
        self.version += 1
        if self.kind == "postgres":
            import psycopg

            ids = list(change.deleted_ids) + change.modified.column("id").to_pylist()
            with psycopg.connect(self.pg_url, autocommit=True) as conn:
                conn.execute("DELETE FROM public.src WHERE id = ANY(%s)", (ids,))
                self._pg_insert(conn, pa.concat_tables([change.modified, change.appended]))
            return
        self._delete_chunk(1)
        self._write_chunk(1, change.chunks[1])
        self._write_chunk(3, change.chunks[3])

    def _name(self, index: int, ext: str) -> str:
        return f"chunk{index}-v{self.version}.{ext}"

    def _write_chunk(self, index: int, chunk: pa.Table) -> None:
        import pyarrow.dataset as pads
        import pyarrow.parquet as pq

        src = self.root / "src"
        src.mkdir(parents=True, exist_ok=True)
        if self.kind == "hive":
            partitioning = pads.partitioning(
                pa.schema([SCHEMA.field(c) for c in self.hive_columns]), flavor="hive"
            )
            template = f"chunk{index}-v{self.version}-{{i}}.parquet"
            visited: list[str] = []
            pads.write_dataset(
                chunk,
                src,
                format="parquet",
                partitioning=partitioning,
                basename_template=template,
                existing_data_behavior="overwrite_or_ignore",
                file_visitor=lambda written: visited.append(written.path),
            )
            self._files[index] = visited
            return
        if self.kind == "s3":
            import boto3

            assert self.s3 is not None
            body = io.BytesIO()
            pq.write_table(chunk, body)
            key = f"src/{self._name(index, 'parquet')}"
            boto3.client("s3", **self.s3).put_object(Bucket=self.bucket, Key=key, Body=body.getvalue())
            self._files[index] = [key]
            return
        path = src / self._name(index, {"parquet": "parquet", "csv": "csv", "json": "jsonl"}[self.kind])
        if self.kind == "parquet":
            pq.write_table(chunk, path)
        elif self.kind == "csv":
            path.write_text(csv_text(chunk), encoding="utf-8")
        else:
            lines = [json_line(row, i) for i, row in enumerate(chunk.to_pylist())]
            path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        self._files[index] = [str(path)]

    def _delete_chunk(self, index: int) -> None:
        if self.kind == "s3":
            import boto3

            assert self.s3 is not None
            client = boto3.client("s3", **self.s3)
            for key in self._files.pop(index):
                client.delete_object(Bucket=self.bucket, Key=key)
            return
        for path in self._files.pop(index):
            Path(path).unlink()

    def _pg_create(self, table: pa.Table) -> None:
        import psycopg

        with psycopg.connect(self.pg_url, autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE public.src (id bigint PRIMARY KEY, n_int bigint, amount numeric(12, 2), "
                "x double precision, s text, ts timestamptz, ts_naive timestamp, d date, flag boolean)"
            )
            # Indexes lead with partition columns, so monotonic layouts can read one partition (pushdown).
            for column in ("n_int", "amount", "s", "ts"):
                conn.execute(f"CREATE INDEX src_{column} ON public.src ({column})")
            self._pg_insert(conn, table)

    @staticmethod
    def _pg_insert(conn: Any, table: pa.Table) -> None:
        names = ", ".join(SCHEMA.names)
        with conn.cursor() as cursor, cursor.copy(f"COPY public.src ({names}) FROM STDIN") as copy:
            for row in table.to_pylist():
                copy.write_row([row[name] for name in SCHEMA.names])

    # -- reading back ----------------------------------------------------------------------------------

    def expected(self) -> pa.Table:
        """The rows the source holds now, read independently of the package's source code."""
        import pyarrow.csv as pacsv
        import pyarrow.dataset as pads
        import pyarrow.parquet as pq

        if self.kind == "postgres":
            import psycopg

            with psycopg.connect(self.pg_url) as conn:
                conn.execute("SET TIME ZONE 'UTC'")
                rows = conn.execute(f"SELECT {', '.join(SCHEMA.names)} FROM public.src").fetchall()
            return pa.Table.from_pylist(
                [dict(zip(SCHEMA.names, r, strict=True)) for r in rows], schema=SCHEMA
            )
        if self.kind == "hive":
            return pads.dataset(self.root / "src", format="parquet", partitioning="hive").to_table()
        if self.kind == "s3":
            import boto3

            assert self.s3 is not None
            client = boto3.client("s3", **self.s3)
            parts = []
            for index in sorted(self._files):
                for key in self._files[index]:
                    body = client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
                    parts.append(pq.read_table(io.BytesIO(body)))
            return pa.concat_tables(parts)
        paths = [p for index in sorted(self._files) for p in self._files[index]]
        if self.kind == "parquet":
            return pa.concat_tables([pq.read_table(p) for p in paths])
        if self.kind == "csv":
            tables = [pacsv.read_csv(p, convert_options=csv_read_options()) for p in paths]
            assert len({t.schema for t in tables}) == 1, "the CSV files must infer one schema"
            return text_timestamps_in_microseconds(pa.concat_tables(tables))
        rows = [r for p in paths for r in parse_json_lines(Path(p).read_text(encoding="utf-8"))]
        return pa.Table.from_pylist(rows, schema=SCHEMA)


# --- row hashing -------------------------------------------------------------------------------------


def _normalised_column(column: pa.ChunkedArray) -> list[Any]:
    """Python values that compare exactly: instants as integers of their unit (UTC for tz-aware ones)."""
    kind = column.type
    if pa.types.is_timestamp(kind):
        return column.cast(pa.int64()).to_pylist()
    if pa.types.is_floating(kind):
        return [None if v is None else float(v).hex() for v in column.to_pylist()]
    if pa.types.is_decimal(kind):
        return [None if v is None else str(v) for v in column.to_pylist()]
    return column.to_pylist()


def row_digests(table: pa.Table) -> list[str]:
    """One digest per row over every column (by name, with its value; NULLs and -0.0 kept distinct)."""
    names = sorted(table.column_names)
    columns = [_normalised_column(table.column(name)) for name in names]
    digests = []
    for values in zip(*columns, strict=True):
        text = repr(tuple(zip(names, values, strict=True)))
        digests.append(hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest())
    return digests


def multiset_difference(
    got: pa.Table, expected: pa.Table
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(rows missing from `got`, rows `got` has too many), each as dicts, comparing by row digest."""
    got_digests, expected_digests = row_digests(got), row_digests(expected)
    missing = Counter(expected_digests) - Counter(got_digests)
    extra = Counter(got_digests) - Counter(expected_digests)

    def rows_of(table: pa.Table, digests: list[str], wanted: Counter[str]) -> list[dict[str, Any]]:
        out = []
        budget = Counter(wanted)
        for position, digest in enumerate(digests):
            if budget[digest] > 0:
                budget[digest] -= 1
                out.append(table.slice(position, 1).to_pylist()[0])
        return out

    return rows_of(expected, expected_digests, missing), rows_of(got, got_digests, extra)


def schema_types(schema: pa.Schema) -> dict[str, str]:
    return {f.name: str(f.type) for f in schema}


# --- layouts and partition keys -----------------------------------------------------------------------


def bound_transforms(partition_by: Sequence[tuple[str, str]], schema: pa.Schema) -> list[Transform]:
    out = []
    for _, expression in partition_by:
        transform = parse_transform(expression)
        out.append(transform.bind_columns([schema.field(c).type for c in transform.source_columns]))
    return out


def partition_values(table: pa.Table, partition_by: Sequence[tuple[str, str]]) -> list[tuple[Any, ...]]:
    """Each row's partition key values, computed with the real transforms."""
    transforms = bound_transforms(partition_by, table.schema)
    columns = [t.apply_table(table).to_pylist() for t in transforms]
    return list(zip(*columns, strict=True)) if columns else [() for _ in range(table.num_rows)]


def key_path(values: tuple[Any, ...], partition_by: Sequence[tuple[str, str]]) -> str:
    return PartitionKey(values).path([name for name, _ in partition_by])


def rows_by_key(table: pa.Table, partition_by: Sequence[tuple[str, str]]) -> dict[str, pa.Table]:
    groups: dict[str, list[int]] = {}
    for row, values in enumerate(partition_values(table, partition_by)):
        groups.setdefault(key_path(values, partition_by), []).append(row)
    return {k: table.take(pa.array(rows, pa.int64())) for k, rows in groups.items()}


# --- random filters -----------------------------------------------------------------------------------


def sql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def sql_literal(value: Any, kind: pa.DataType, rng: random.Random) -> str:
    """`value` of Arrow type `kind` as a SQL literal DuckDB and the reader both cast to the column type."""
    if pa.types.is_boolean(kind):
        return "true" if value else "false"
    if pa.types.is_integer(kind):
        return str(value)
    if pa.types.is_decimal(kind):
        return str(value)
    if pa.types.is_floating(kind):
        return repr(float(value))
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return sql_string(value)
    if pa.types.is_date(kind):
        return sql_string(value.isoformat())
    if pa.types.is_timestamp(kind):
        # Normalised to microseconds (nanosecond sources are written with microsecond values).
        micros = int(value)
        moment = dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=micros)
        if kind.tz is not None:
            if rng.random() < 0.5:
                shifted = moment + dt.timedelta(hours=5, minutes=30)
                return sql_string(shifted.isoformat(sep=" ") + "+05:30")
            return sql_string(moment.isoformat(sep=" ") + "+00:00")
        return sql_string(moment.isoformat(sep=" "))
    raise TypeError(f"no literal for {kind}")


def non_null_values(column: pa.ChunkedArray) -> list[Any]:
    """The non-NULL values of `column`; instants as integer microseconds (every source here has µs values)."""
    kind = column.type
    if pa.types.is_timestamp(kind):
        micros = column.cast(pa.timestamp("us", kind.tz)).cast(pa.int64())
        return [v for v in micros.to_pylist() if v is not None]
    return [v for v in column.to_pylist() if v is not None]


def _nudge(value: Any, kind: pa.DataType, rng: random.Random) -> Any:
    """The value itself mostly, sometimes its neighbour (boundaries are where pruning goes wrong)."""
    step = rng.choice([0, 0, 0, 1, -1])
    if step == 0 or pa.types.is_boolean(kind) or pa.types.is_string(kind):
        return value
    if pa.types.is_integer(kind) or pa.types.is_timestamp(kind):
        return value + step
    if pa.types.is_decimal(kind):
        return value + Decimal(step).scaleb(-kind.scale)
    if pa.types.is_date(kind):
        return value + dt.timedelta(days=step)
    if pa.types.is_floating(kind):
        return value + step * 0.5
    return value


@dataclass(frozen=True)
class MatrixFilter:
    """One random filter: the SQL the reader gets and the SQL the DuckDB oracle runs."""

    reader_sql: str
    oracle_sql: str


class FilterGenerator:
    """Seeded random WHERE clauses over the source columns and the layout's partition expressions.

    Partition expressions (`bucket(8, n_int) = 3`) are not DuckDB functions: the oracle reads a column
    `__e<i>` computed with `Transform.apply` over the source table instead.
    """

    OPS = ("=", "!=", "<", "<=", ">", ">=")

    def __init__(self, table: pa.Table, expressions: Sequence[str], seed: int) -> None:
        self.rng = random.Random(seed)
        self.table = table
        self.columns = [n for n in table.column_names if non_null_values(table.column(n))]
        self.expressions: list[tuple[str, str, pa.ChunkedArray]] = []
        for i, expression in enumerate(expressions):
            transform = parse_transform(expression)
            types = [table.schema.field(c).type for c in transform.source_columns]
            self.expressions.append((expression, f"__e{i}", transform.bind_columns(types).apply_table(table)))

    def oracle_table(self) -> pa.Table:
        table = self.table
        for _, name, values in self.expressions:
            table = table.append_column(name, values)
        return table

    def _literal(self, column: pa.ChunkedArray) -> str:
        values = non_null_values(column)
        value = _nudge(self.rng.choice(values), column.type, self.rng)
        return sql_literal(value, column.type, self.rng)

    def _leaf(self) -> tuple[str, str]:
        rng = self.rng
        if self.expressions and rng.random() < 0.3:
            expression, alias, values = rng.choice(self.expressions)
            # Parenthesised: `NOT (x > 1) < false` reads as NOT ((x > 1) < false) in SQL.
            term = f"({expression})"
            if non_null_values(values):
                return self._comparison(term, f'"{alias}"', values)
            return f"{term} IS NULL", f'"{alias}" IS NULL'
        name = rng.choice(self.columns)
        return self._comparison(name, name, self.table.column(name))

    def _comparison(self, reader_term: str, oracle_term: str, column: pa.ChunkedArray) -> tuple[str, str]:
        rng = self.rng
        kind = rng.choice(["cmp", "cmp", "cmp", "between", "in", "null"])
        if kind == "null" or (column.null_count and rng.random() < 0.1):
            text = f"IS {'NOT ' if rng.random() < 0.5 else ''}NULL"
        elif kind == "between":
            values = non_null_values(column)
            low, high = sorted(_nudge(rng.choice(values), column.type, rng) for _ in range(2))
            low_sql, high_sql = sql_literal(low, column.type, rng), sql_literal(high, column.type, rng)
            text = f"{'NOT ' if rng.random() < 0.3 else ''}BETWEEN {low_sql} AND {high_sql}"
        elif kind == "in":
            items = ", ".join(self._literal(column) for _ in range(rng.randint(1, 4)))
            text = f"{'NOT ' if rng.random() < 0.4 else ''}IN ({items})"
        else:
            text = f"{rng.choice(self.OPS)} {self._literal(column)}"
        return f"{reader_term} {text}", f"{oracle_term} {text}"

    def _tree(self, depth: int) -> tuple[str, str]:
        roll = self.rng.random()
        if depth >= 2 or roll < 0.4:
            return self._leaf()
        if roll < 0.55:
            inner = self._tree(depth + 1)
            return f"NOT ({inner[0]})", f"NOT ({inner[1]})"
        parts = [self._tree(depth + 1) for _ in range(self.rng.randint(2, 3))]
        joiner = " AND " if self.rng.random() < 0.5 else " OR "
        return (
            "(" + joiner.join(p[0] for p in parts) + ")",
            "(" + joiner.join(p[1] for p in parts) + ")",
        )

    def filters(self, count: int) -> list[MatrixFilter]:
        out = []
        for _ in range(count):
            reader_sql, oracle_sql = self._tree(0)
            out.append(MatrixFilter(reader_sql, oracle_sql))
        return out


class DuckDBOracle:
    """DuckDB over the source rows (plus precomputed partition expressions): the expected filter results."""

    def __init__(self, table: pa.Table) -> None:
        import duckdb

        self.table = table.append_column("__row", pa.array(range(table.num_rows), pa.int64()))
        self.connection = duckdb.connect()
        self.connection.execute("SET TimeZone = 'UTC'")
        self.connection.register("source_rows", self.table)

    def rows(self, where: str) -> list[int]:
        result = self.connection.execute(f"SELECT __row FROM source_rows WHERE {where}").fetchall()
        return sorted(r[0] for r in result)

    def close(self) -> None:
        self.connection.close()
