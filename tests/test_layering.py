"""Architecture rules: the core imports no Airflow, and imports only point downward, in the core and in the
Airflow layer."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "airflow_partitions"
AIRFLOW_LAYER = {
    "cli",
    "hooks",
    "operators",
    "sensors",
    "triggers",
    "dag_factory",
    "demo",
    "provider_info",
    "examples",
    "plugins",
    "timetables",
}
# Lower index = lower layer; a module may import its own layer or any layer below it.
CORE_ORDER = [
    "exceptions",
    "quoting",
    "lazy_module",
    "sample_data",
    "keys",
    "objectstore",
    "transforms",
    "spec",
    "storage",
    "catalog",
    "pruning",
    "sources",
    "table",
    "read",
    "advisor",
    "snapshots",
    "write",
    "refresh",
    "spark_jobs",
]

# The Airflow layer, lowest first; one entry may hold several packages of the same layer. A module may
# import the core, its own layer or a layer before it: triggers never reach into sensors, and what both
# need lives in the core (`refresh.checks`) or in hooks.
AIRFLOW_ORDER = [
    {"hooks"},
    {"operators", "triggers"},
    {"sensors"},
    {"timetables"},
    {"dag_factory"},
    {"cli"},
    # examples/: the DAG file `airflow-partitions init` writes out (read as a file, never imported).
    {"demo", "provider_info", "examples", "plugins"},
]


def _top_level(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0].removesuffix(".py")


def _imported_modules(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def _core_files() -> list[Path]:
    return sorted(
        p for p in PACKAGE.rglob("*.py") if _top_level(p) not in AIRFLOW_LAYER and _top_level(p) != "__init__"
    )


@pytest.mark.parametrize("path", _core_files(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_core_module_imports_no_airflow(path: Path) -> None:
    offending = [m for m in _imported_modules(path) if m == "airflow" or m.startswith("airflow.")]
    assert not offending, f"{path.relative_to(PACKAGE)} is core but imports {offending}"


@pytest.mark.parametrize("path", _core_files(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_core_imports_point_downward(path: Path) -> None:
    layer = _top_level(path)
    if layer not in CORE_ORDER:
        pytest.fail(f"{layer} is not placed in CORE_ORDER; add it where it belongs")
    upward = []
    for module in _imported_modules(path):
        if not module.startswith("airflow_partitions."):
            continue
        target = module.split(".")[1]
        if target in CORE_ORDER and CORE_ORDER.index(target) > CORE_ORDER.index(layer):
            upward.append(module)
        if target in AIRFLOW_LAYER:
            upward.append(module)
    assert not upward, f"{path.relative_to(PACKAGE)} ({layer}) imports upward: {upward}"


def _airflow_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if _top_level(p) in AIRFLOW_LAYER)


def _airflow_rank(layer: str) -> int:
    return next(rank for rank, layers in enumerate(AIRFLOW_ORDER) if layer in layers)


def test_every_airflow_package_has_a_place_in_the_order() -> None:
    placed = set().union(*AIRFLOW_ORDER)
    assert placed == AIRFLOW_LAYER, f"unplaced: {AIRFLOW_LAYER - placed}, unknown: {placed - AIRFLOW_LAYER}"


@pytest.mark.parametrize("path", _airflow_files(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_airflow_layer_imports_point_downward(path: Path) -> None:
    layer = _top_level(path)
    upward = [
        module
        for module in _imported_modules(path)
        if module.startswith("airflow_partitions.")
        and module.split(".")[1] in AIRFLOW_LAYER
        and _airflow_rank(module.split(".")[1]) > _airflow_rank(layer)
    ]
    assert not upward, f"{path.relative_to(PACKAGE)} ({layer}) imports a later Airflow layer: {upward}"


# --- imports inside functions -----------------------------------------------------------------------

# Top-level packages (and modules) whose files import the package's own modules at module level. An import
# left inside a function must say why on its line: `# cycle: ...` (it would close an import loop) or
# `# lazy: ...` (it would load pyarrow, numpy, duckdb, pandas, pyspark or boto3 with a module that DAG files
# or cold starts import). Every package and top-level module is listed (a test checks it).
FUNCTION_IMPORTS_CHECKED = [
    "keys",
    "objectstore",
    "transforms",
    "spec",
    "storage",
    "catalog",
    "pruning",
    "sources",
    "snapshots",
    "advisor",
    "read",
    # The Airflow layer and the top-level modules: DAG files, task processes and the CLI import these, so
    # what stays inside a function there names the heavy library it keeps out.
    "plugins",
    "hooks",
    "operators",
    "sensors",
    "triggers",
    "cli",
    "dag_factory",
    "demo",
    "timetables",
    "provider_info",
    "examples",
    "spark_jobs",
    "table",
    "write",
    "refresh",
    # The package's small top-level modules.
    "__init__",
    "exceptions",
    "quoting",
    "lazy_module",
    "sample_data",
]
_IMPORT_REASON = re.compile(r"#\s*(cycle|lazy):\s*\S")


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports_own_package(node: ast.Import | ast.ImportFrom) -> bool:
    if isinstance(node, ast.ImportFrom):
        return node.level > 0 or (node.module or "").split(".")[0] == "airflow_partitions"
    return any(alias.name.split(".")[0] == "airflow_partitions" for alias in node.names)


def unexplained_function_imports(source: str) -> list[int]:
    """Lines of imports of the package's own modules inside a function (outside `if TYPE_CHECKING:`)
    whose statement carries no `# cycle:` or `# lazy:` reason."""
    lines = source.splitlines()
    found: list[int] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for branch in child.orelse:
                    visit_one(branch, in_function)
                continue
            visit_one(child, in_function)

    def visit_one(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, ast.Import | ast.ImportFrom):
            statement = lines[node.lineno - 1 : node.end_lineno or node.lineno]
            explained = any(_IMPORT_REASON.search(line) for line in statement)
            if in_function and _imports_own_package(node) and not explained:
                found.append(node.lineno)
            return
        visit(node, in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda))

    visit(ast.parse(source), False)
    return found


def _function_import_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if _top_level(p) in FUNCTION_IMPORTS_CHECKED)


def test_the_function_import_scan_tells_explained_from_unexplained() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "from airflow_partitions.keys import PartitionKey\n"
        "def f():\n"
        "    from airflow_partitions.catalog import Catalog\n"
        "    from airflow_partitions.storage.parquet import ParquetStorage  # lazy: loads pyarrow\n"
        "    from airflow_partitions.catalog.catalog import (  # cycle: catalog imports this module\n"
        "        Catalog as C,\n"
        "    )\n"
        "    import json\n"
        "    if TYPE_CHECKING:\n"
        "        from airflow_partitions.spec import DatasetSpec\n"
        "    class Inner:\n"
        "        def g(self):\n"
        "            from . import sibling\n"
        "            import airflow_partitions.read\n"
    )
    assert unexplained_function_imports(source) == [4, 14, 15]


def test_every_checked_package_exists() -> None:
    present = {_top_level(p) for p in PACKAGE.rglob("*.py")}
    assert set(FUNCTION_IMPORTS_CHECKED) <= present, set(FUNCTION_IMPORTS_CHECKED) - present


def test_every_module_is_under_the_function_import_rule() -> None:
    """The rule covers the whole package: a new package or module joins the list when it is added."""
    present = {_top_level(p) for p in PACKAGE.rglob("*.py")}
    assert present <= set(FUNCTION_IMPORTS_CHECKED), sorted(present - set(FUNCTION_IMPORTS_CHECKED))


@pytest.mark.parametrize("path", _function_import_files(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_own_modules_are_imported_at_module_level(path: Path) -> None:
    unexplained = unexplained_function_imports(path.read_text(encoding="utf-8"))
    assert not unexplained, (
        f"{path.relative_to(PACKAGE)} imports the package's own modules inside functions at lines "
        f"{unexplained}: import them at module level, or say why not on the line (`# cycle: ...` when it "
        "would close an import loop, `# lazy: ...` when it would load a heavy library)"
    )


# Where bytes live (the local disk or object storage) is decided in objectstore/ (stores, locations, the
# pyarrow filesystems) and table/ (the dataset handle), from what spec/ loaded; every other module asks
# them (`DatasetHandle.local_data`, `.data_store`, `objectstore.remote_filesystem`, ...) instead of
# testing a URL or the project.
DECIDE_WHERE_BYTES_LIVE = ("objectstore", "spec", "table")


def _branches_on_location(path: Path) -> list[str]:
    """`x.startswith("s3://")`, `is_s3_url(...)`, `project.remote`, `accelerator_url` (attribute or
    getattr name) in one module, as `line: what`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[str] = []

    def is_project(node: ast.expr) -> bool:
        return (isinstance(node, ast.Name) and node.id.endswith("project")) or (
            isinstance(node, ast.Attribute) and node.attr.endswith("project")
        )

    def names_s3(node: ast.expr) -> bool:
        values = node.elts if isinstance(node, ast.Tuple) else [node]
        return any(isinstance(v, ast.Constant) and v.value in ("s3://", "s3a://") for v in values)

    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            function = node.func
            name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", None)
            if name == "startswith" and node.args and names_s3(node.args[0]):
                found.append(f"{node.lineno}: startswith('s3://')")
            elif name == "is_s3_url":
                found.append(f"{node.lineno}: is_s3_url()")
            elif (
                name == "getattr"
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and node.args[1].value in ("remote", "accelerator_url")
            ):
                found.append(f"{node.lineno}: getattr(..., {node.args[1].value!r})")
        elif isinstance(node, ast.Attribute):
            if node.attr == "accelerator_url":
                found.append(f"{node.lineno}: .accelerator_url")
            elif node.attr == "remote" and is_project(node.value):
                found.append(f"{node.lineno}: project.remote")
    return sorted(found, key=lambda text: int(text.split(":")[0]))


def _located_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if _top_level(p) not in DECIDE_WHERE_BYTES_LIVE)


@pytest.mark.parametrize("path", _located_files(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_only_objectstore_and_table_decide_where_bytes_live(path: Path) -> None:
    relative = path.relative_to(PACKAGE).as_posix()
    found = _branches_on_location(path)
    assert not found, (
        f"{relative} decides itself where bytes live ({'; '.join(found)}); ask the dataset handle "
        "(table/) or the object store (objectstore/) instead"
    )


def test_the_location_check_sees_each_form(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "def f(project, url, spec):\n"
        "    a = url.startswith('s3://')\n"
        "    b = url.startswith(('s3://', 's3a://'))\n"
        "    c = is_s3_url(url)\n"
        "    d = project.remote\n"
        "    e = self.project.remote\n"
        "    g = spec.accelerator_url\n"
        "    h = getattr(project, 'remote', False)\n"
        "    i = args.remote  # a Spark Connect URL, not a location\n",
        encoding="utf-8",
    )
    found = _branches_on_location(sample)
    assert [line.split(":")[0] for line in found] == ["2", "3", "4", "5", "6", "7", "8"], found


def _catalog_commit_calls() -> list[str]:
    """`module:function` of every call of `Catalog.commit` in the package: a `.commit(...)` call passing
    `base_version=` (keyword-only there; database `commit()` calls pass nothing)."""
    calls = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr != "commit" or not any(k.arg == "base_version" for k in node.keywords):
                continue
            owner = min(
                (f for f in functions if f.lineno <= node.lineno <= (f.end_lineno or f.lineno)),
                key=lambda f: (f.end_lineno or f.lineno) - f.lineno,
                default=None,
            )
            calls.append(f"{path.relative_to(PACKAGE)}:{owner.name if owner else '<module>'}")
    return calls


def test_catalog_commit_has_one_caller() -> None:
    # Every version is assembled by the commit builder (entries, row counts, commit id, operation name).
    assert _catalog_commit_calls() == ["table/publish.py:commit"]


# --- function length ------------------------------------------------------------------------------------

MAX_FUNCTION_LINES = 100
# Functions still longer than MAX_FUNCTION_LINES, by `path::qualified name`. The list only shrinks: a
# function split below the limit must leave it (the test fails until it does).
# Functions still over the limit (empty: none). The list can only shrink: a listed function that is gone
# or back under the limit fails the test.
LONG_FUNCTIONS_ALLOWED: set[str] = set()


def _function_lengths(source: str) -> dict[str, int]:
    """Lines (decorators excluded) of every function and method of `source`, by qualified name."""
    lengths: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    assert child.end_lineno is not None
                    lengths[name] = child.end_lineno - child.lineno + 1
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return lengths


def _package_function_lengths() -> dict[str, int]:
    lengths: dict[str, int] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        for name, length in _function_lengths(path.read_text(encoding="utf-8")).items():
            lengths[f"{rel}::{name}"] = length
    return lengths


def test_no_function_is_longer_than_the_limit() -> None:
    lengths = _package_function_lengths()
    too_long = {
        name: length
        for name, length in lengths.items()
        if length > MAX_FUNCTION_LINES and name not in LONG_FUNCTIONS_ALLOWED
    }
    assert not too_long, (
        f"functions over {MAX_FUNCTION_LINES} lines (split them into named helpers): {too_long}"
    )
    stale = {
        name: lengths.get(name)
        for name in LONG_FUNCTIONS_ALLOWED
        if lengths.get(name, 0) <= MAX_FUNCTION_LINES
    }
    assert not stale, (
        f"allowed as long but gone or no longer over {MAX_FUNCTION_LINES} lines, drop them: {stale}"
    )


def test_the_length_scan_measures_nested_functions_and_methods() -> None:
    source = (
        "@decorated\n"
        "def outer():\n"
        "    def inner():\n"
        "        return 1\n"
        "\n"
        "    return inner\n"
        "class Box:\n"
        "    async def method(self):\n"
        "        if True:\n"
        "            pass\n"
    )
    assert _function_lengths(source) == {"outer": 5, "outer.inner": 2, "Box.method": 3}
