"""Findings from the catalog alone: skewed partitions, tiny and huge files and partitions.

Cheap (no data read): the Partitions page calls `size_findings` on every load.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

# The file size to aim for unless told otherwise: compaction's default target.
DEFAULT_TARGET_FILE_BYTES = 128 * 1024 * 1024
# A partition holding more than SKEW_FACTOR times the median partition's rows is skewed.
SKEW_FACTOR = 10
# Top keys listed by share of the rows.
TOP_KEYS = 5
# Files under target / TINY_DIVISOR bytes are tiny; over HUGE_FACTOR * target they are huge.
TINY_DIVISOR = 16
HUGE_FACTOR = 2
EXAMPLES = 10


def size_findings(
    partitions: Sequence[tuple[str, int, int, Sequence[int]]], *, target_file_bytes: int
) -> dict[str, Any]:
    """Findings over `(key_path, rows, bytes, file sizes)` of every partition of a version.

    `skewed`: partitions with more than `SKEW_FACTOR` times the median rows of the non-empty partitions;
    `top_keys`: the largest partitions by rows with their share; tiny / huge files and partitions
    against `target_file_bytes`.
    """
    non_empty = [rows for _key, rows, _bytes, _files in partitions if rows > 0]
    total_rows = sum(non_empty)
    median = statistics.median(non_empty) if non_empty else 0
    skewed: list[dict[str, Any]] = [
        {
            "key_path": key,
            "rows": rows,
            "share": round(rows / total_rows, 4),
            "times_median": round(rows / median, 1),
        }
        for key, rows, _bytes, _files in sorted(partitions, key=lambda p: -p[1])
        if median and len(non_empty) > 1 and rows > SKEW_FACTOR * median
    ]
    largest = sorted(partitions, key=lambda p: -p[1])[:TOP_KEYS]
    top_keys = [
        {"key_path": key, "rows": rows, "share": round(rows / total_rows, 4) if total_rows else 0.0}
        for key, rows, _bytes, _files in largest
        if rows > 0
    ]
    tiny_limit = max(1, target_file_bytes // TINY_DIVISOR)
    huge_limit = target_file_bytes * HUGE_FACTOR
    sizes = [size for _key, _rows, _bytes, files in partitions for size in files]
    tiny_files = sum(1 for size in sizes if size < tiny_limit)
    huge_files = sum(1 for size in sizes if size > huge_limit)
    tiny_partitions = [key for key, rows, size, _files in partitions if rows > 0 and size < tiny_limit]
    huge_partitions = [key for key, _rows, size, _files in partitions if size > huge_limit]
    return {
        "median_rows": median,
        "skew_factor": SKEW_FACTOR,
        "skewed": skewed,
        "top_keys": top_keys,
        "target_file_bytes": target_file_bytes,
        "tiny_file_bytes": tiny_limit,
        "huge_file_bytes": huge_limit,
        "files": len(sizes),
        "tiny_files": tiny_files,
        "huge_files": huge_files,
        "tiny_partitions": len(tiny_partitions),
        "tiny_partition_examples": tiny_partitions[:EXAMPLES],
        "huge_partitions": len(huge_partitions),
        "huge_partition_examples": huge_partitions[:EXAMPLES],
    }


def snapshot_partitions(snapshot: Any) -> list[tuple[str, int, int, tuple[int, ...]]]:
    """`(key_path, rows, bytes, file sizes)` of every partition of a catalog version."""
    return [
        (key_path, entry.rows, entry.bytes, tuple(f.bytes for f in entry.files))
        for key_path, entry in sorted(snapshot.partitions.items())
    ]
