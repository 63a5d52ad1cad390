"""Architecture rules: the core imports no Airflow, and imports only point downward, in the core and in the
Airflow layer."""

from __future__ import annotations

import ast
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
