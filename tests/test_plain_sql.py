"""The plain SQL shapes read without sqlglot give what sqlglot's parse gives, and a cold read skips it.

`transforms.plain_sql` recognises bare column names, the built-in transforms in their plain form and
`col op value AND ...` filters. Each shape is compared here with the sqlglot path on the same text:
every identifier-like word sqlglot's DuckDB dialect knows (keywords, functions), hostile names, and the
values a filter may hold.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from sqlglot.dialects.duckdb import DuckDB

from airflow_partitions.exceptions import FilterError, PartitionExpressionError
from airflow_partitions.pruning.filters import FilterBinder
from airflow_partitions.transforms.base import canonical_identifier
from airflow_partitions.transforms.parse import parse_transform, plain_transform
from airflow_partitions.transforms.parser import parse_sql_transform
from airflow_partitions.transforms.plain_sql import RESERVED_WORDS, is_plain_name, plain_comparisons


def _sqlglot_words() -> set[str]:
    """Identifier-like words sqlglot's DuckDB dialect treats specially anywhere, lower case."""
    dialect = DuckDB()
    parser = dialect.parser_class
    names: list[object] = [
        *dialect.tokenizer_class.KEYWORDS,
        *parser.NO_PAREN_FUNCTIONS,
        *parser.NO_PAREN_FUNCTION_PARSERS,
        *parser.FUNCTIONS,
        *parser.FUNCTION_PARSERS,
    ]
    words = {str(getattr(name, "name", name)) for name in names}
    return {word.lower() for word in words if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", word)}


WORDS = sorted(_sqlglot_words() | {"date", "interval", "PULocationID", "region", "_x", "a1"})


def _sqlglot_says_plain(name: str) -> bool:
    import sqlglot
    from sqlglot import exp

    try:
        tree = sqlglot.parse_one(name, read="duckdb")
    except sqlglot.errors.SqlglotError:
        return False
    return isinstance(tree, exp.Column) and not tree.table and tree.this.this == name and not tree.this.quoted


def test_reserved_words_are_exactly_the_words_sqlglot_does_not_read_as_a_column() -> None:
    wrong = [
        spelling
        for word in WORDS
        for spelling in (word, word.upper(), word.capitalize())
        if is_plain_name(spelling) != _sqlglot_says_plain(spelling)
    ]
    assert wrong == [], f"RESERVED_WORDS disagrees with sqlglot {DuckDB.__module__} on {wrong[:20]}"
    assert {word for word in RESERVED_WORDS if not _sqlglot_says_plain(word)} == set(RESERVED_WORDS)


def _both(text: str) -> tuple[str, str]:
    """The canonical string and type of `text` parsed by sqlglot, or the error's type and message."""
    try:
        transform = parse_sql_transform(text)
    except PartitionExpressionError as err:
        return ("error", str(err))
    return (transform.canonical, type(transform).__name__)


TRANSFORM_TEXTS = (
    [
        "bucket(50, PULocationID)",
        "  BUCKET( 16 ,\tuser_id )  ",
        "bucket(1000000, id)",
        "bucket(1000001, id)",
        "bucket(0, id)",
        "bucket(007, id)",
        'bucket(8, "we""ird col")',
        "bucket(8, \"a/b=c%d 'q'\")",
        'bucket(8, "é ü 東京")',
        "truncate(1000, amount)",
        "TRUNCATE(10, name)",
        "truncate(0, amount)",
        "truncate(9223372036854775808, amount)",
        "id % 16",
        "id%1",
        "id % 0",
        '"my id" % 3',
        "date_trunc('day', ts)",
        "DATE_TRUNC('Month', ts)",
        "date_trunc('fortnight', ts)",
        "date_part('year', ts)",
        "date_part('isoweek', ts)",
        "region",
        '"Region"',
        '"select"',
        "_private",
    ]
    + [f"bucket(4, {word})" for word in WORDS]
    + [f"{word} % 4" for word in WORDS]
    + WORDS
)


def test_plain_transforms_are_what_sqlglot_parses() -> None:
    for text in TRANSFORM_TEXTS:
        _check_transform(text)


def _check_transform(text: str) -> None:
    fast = plain_transform(text)
    expected = _both(text.strip())
    if fast is None:
        # Left to sqlglot: parse_transform gives exactly the sqlglot answer.
        try:
            got = parse_transform(text)
            outcome = (got.canonical, type(got).__name__)
        except PartitionExpressionError as err:
            outcome = ("error", str(err))
        assert outcome == expected, text
        return
    assert (fast.canonical, type(fast).__name__) == expected, f"plain form of {text!r}"
    assert fast == parse_sql_transform(text.strip())


SCHEMA = pa.schema(
    [
        ("PULocationID", pa.int64()),
        ("region", pa.string()),
        ('we"ird', pa.string()),
        ("Amount", pa.int32()),
        ("day", pa.date32()),
        ("ts", pa.timestamp("us")),
        ("flag", pa.bool_()),
        *((word, pa.int64()) for word in WORDS if word not in {"pulocationid", "region", "day"}),
    ]
)

FILTERS = (
    [
        "PULocationID = 264",
        "PULocationID=264",
        "PULocationID >= -3 AND PULocationID < 10",
        "PULocationID <> 7 and region = 'EU'",
        "PULocationID != 7 AND region = ''",
        "region = 'it''s'",
        "region = 'a/b=c%d \"q\"'",
        "region = 'é 東京'",
        "region = 'back\\\\slash'",
        '"we""ird" = \'x\'',
        "Amount = 2147483648",
        "Amount = 12",
        "amount = 12",
        "nosuch = 1",
        "day = 3",
        "day = '2026-01-02'",
        "ts > '2026-01-01 00:00:00'",
        "flag = 1",
        "PULocationID = 264 AND",
        "PULocationID = 264 OR region = 'x'",
        "PULocationID = 1.5",
        "PULocationID = 99999999999999999999",
        "region = 7",
        "PULocationID = '264'",
        "  PULocationID   =   264  ",
        "PULocationID = 264 ANDregion = 'x'",
    ]
    + [f"{word} = 1" for word in WORDS]
    + [f'"{word}" < 2 AND {word} >= 0' for word in WORDS]
)


def _outcome(bind: object, where: str) -> str:
    try:
        return repr(bind(where))  # type: ignore[operator]
    except FilterError as err:
        return f"FilterError: {err}"


def test_plain_filters_bind_as_the_parsed_tree_does() -> None:
    binder = FilterBinder(SCHEMA)
    for where in FILTERS:
        assert _outcome(binder.bind_sql, where) == _outcome(binder.bind_parsed_sql, where), where


def test_plain_comparisons_takes_only_the_plain_shape() -> None:
    assert plain_comparisons("a = 1 AND \"b c\" <= 'x''y'") == [("a", "=", 1), ("b c", "<=", "x'y")]
    assert plain_comparisons("a = 1 OR b = 2") is None
    assert plain_comparisons("a = 1 AND") is None
    assert plain_comparisons("a IN (1, 2)") is None
    assert plain_comparisons("select = 1") is None
    assert plain_comparisons("a = 'x\\'") is None  # backslashes: sqlglot decides
    assert canonical_identifier("select") == '"select"'
    assert canonical_identifier("PULocationID") == "PULocationID"


SPEC_ONLY = """
import sys
from airflow_partitions.spec import load_spec
project = load_spec(sys.argv[1])
print(",".join(name for name in ("sqlglot", "pyarrow", "pandas") if name in sys.modules) or "none")
"""


COLD_READ = """
import json, sys
from airflow_partitions.read import PartitionedDatasetReader
table = PartitionedDatasetReader(sys.argv[1], "trips").read("zone = 7")
heavy = [name for name in ("sqlglot", "pandas", "pyarrow.dataset") if name in sys.modules]
print(json.dumps({"rows": table.num_rows, "heavy": heavy}))
"""


def _spec_file(tmp_path: Path, source: Path, fields: str) -> Path:
    spec_file = tmp_path / "datasets.yaml"
    spec_file.write_text(
        textwrap.dedent(
            f"""\
            accelerator_dir: {tmp_path}
            datasets:
              - name: trips
                from: file:{source}
                acceleration:
                  engine: parquet
                  partition_by:
            """
        )
        + fields
    )
    return spec_file


def test_loading_a_spec_of_built_in_transforms_imports_no_sqlglot(tmp_path: Path) -> None:
    """What a DAG file, an Airflow task or a CLI call pays for the spec: no SQL parser, no pyarrow."""
    fields = (
        '        - b: "bucket(4, zone)"\n'
        "        - d: 'date_trunc(''day'', \"pick up\")'\n"
        "        - z: '\"a/b=%\" % 7'\n"
        "        - r: region\n"
    )
    spec_file = _spec_file(tmp_path, tmp_path / "source.parquet", fields)
    done = subprocess.run(
        [sys.executable, "-c", SPEC_ONLY, str(spec_file)], check=True, capture_output=True, text=True
    )
    assert done.stdout.strip() == "none"


def test_a_cold_point_read_imports_no_sqlglot_pandas_or_dataset(tmp_path: Path) -> None:
    """A new process (a CLI call, an Airflow task: the hook reads through this reader) reading one
    partition: a plain filter needs no SQL parser, a Parquet read neither pandas nor pyarrow.dataset."""
    from airflow_partitions.catalog import Catalog, LocalStore, PartitionEntry, PartitionSpecInfo
    from airflow_partitions.keys import PartitionKey
    from airflow_partitions.storage.parquet import ParquetStorage

    transform = parse_transform("bucket(4, zone)").bind(pa.int64())
    table = pa.table({"zone": pa.array([7, 7, None, 3], pa.int64()), "name": ["a/b", "é", None, "=%'"]})
    buckets = transform.apply(table.column("zone")).to_pylist()
    spec = PartitionSpecInfo.from_fields([("b", transform.canonical)])
    storage = ParquetStorage()
    root = tmp_path / "trips"
    entries = []
    for value in sorted(set(buckets), key=lambda v: (v is None, v)):
        rows = table.filter(pa.array([b == value for b in buckets]))
        key = PartitionKey((value,))
        entries.append(PartitionEntry.from_files(key, spec, storage.write(rows, root, key.path(["b"]))))
    Catalog(LocalStore(tmp_path), "trips", storage=storage).commit(
        base_version=None, upserts=entries, partition_spec=spec
    )
    source = tmp_path / "source.parquet"
    pq.write_table(table, source)
    spec_file = _spec_file(tmp_path, source, '        - b: "bucket(4, zone)"\n')
    done = subprocess.run(
        [sys.executable, "-c", COLD_READ, str(spec_file)], check=True, capture_output=True, text=True
    )
    result = json.loads(done.stdout)
    assert result == {"rows": 2, "heavy": []}
