"""A class-data-sharing archive of a Spark JVM, for every JVM the suite starts.

A Spark JVM loads some 10,000 classes from pyspark's jars before its first job; that is most of its start
(a local session and its first job took 8.9 s on an idle 2-core machine, 4.0 s with the archive). The
suite starts dozens of them: the sessions of the xdist workers, every stage task of the Airflow stack and
of `dag.test()`, the CLI subprocesses, the Spark Connect server, spark-submit. JDK 17's dynamic archive
(`-XX:ArchiveClassesAtExit`) records the classes one representative JVM loaded; `-XX:SharedArchiveFile` in
`JAVA_TOOL_OPTIONS` maps it into every later JVM. The JVMs run the same classes from the same jars: the
archive only saves parsing and verifying them again.

The archive (about 180 MB) is kept between runs under `.pytest_jvm/`, named by what it depends on (the
JDK, pyspark's jars, the JVM options). When it is missing, the run goes on and a detached process writes
it in about 30 s (`python tests/jvm_class_archive.py TARGET`, its output in `spark-KEY.log`, renamed
`spark-KEY.failed` if it fails): JVMs started before it is in place run without it (a missing archive
file is ignored silently), later ones use it. The JVM checks the archive against its
classpath itself and runs without it when they differ (`-Xlog:cds=off,cds+dynamic=off` keeps that quiet).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
ARCHIVE_DIR = REPO_ROOT / ".pytest_jvm"
QUIET = "-Xlog:cds=off,cds+dynamic=off"


def _archive_key(java_options: str) -> str | None:
    """What the archive depends on: the JDK, pyspark's jars, the JVM options; None without java or pyspark."""
    import importlib.util

    java = shutil.which("java")
    spec = importlib.util.find_spec("pyspark")
    if java is None or spec is None or spec.origin is None:
        return None
    jars = Path(spec.origin).parent / "jars"
    digest = hashlib.sha256()
    java_binary = Path(java).resolve()
    digest.update(f"{java_binary}:{java_binary.stat().st_size}:{java_options}".encode())
    for jar in sorted(jars.glob("*.jar")):
        digest.update(f"{jar.name}:{jar.stat().st_size}".encode())
    return digest.hexdigest()[:16]


def with_class_archive(java_options: str) -> str:
    """`java_options` plus the archive of these options (started in the background when missing)."""
    key = _archive_key(java_options)
    if key is None:
        return java_options
    target = ARCHIVE_DIR / f"spark-{key}.jsa"
    # A writer that failed leaves its log as `.failed`: later runs do not try again (remove it to retry).
    if not target.exists() and not target.with_suffix(".failed").exists():
        ARCHIVE_DIR.mkdir(exist_ok=True)
        log = (ARCHIVE_DIR / f"spark-{key}.log").open("wb")
        with log:
            # Detached: it outlives a short run and finishes the cache on its own.
            subprocess.Popen(
                [sys.executable, __file__, str(target)],
                env={**os.environ, "JAVA_TOOL_OPTIONS": java_options, "PYTHONPATH": str(REPO_ROOT)},
                cwd=tempfile.gettempdir(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
    return f"{java_options} -XX:SharedArchiveFile={target} {QUIET}"


def _representative_work(spark: object, scratch: Path) -> None:
    """Jobs that load what the suite's JVMs load: Arrow in and out, Parquet/CSV/JSON, a shuffle, SQL, a
    Python UDF, a dynamic partition overwrite."""
    import pyarrow as pa
    from pyspark.sql import functions as F

    frame = spark.createDataFrame(  # type: ignore[attr-defined]
        pa.table({"id": list(range(100)), "region": [f"r{i % 7}" for i in range(100)]})
    )
    frame.withColumn("b", F.udf(lambda v: hash(v) % 4, "int")("region")).write.partitionBy("b").mode(
        "overwrite"
    ).parquet(str(scratch / "p"))
    back = spark.read.parquet(str(scratch / "p"))  # type: ignore[attr-defined]
    back.groupBy("region").agg(F.count("*"), F.sum("id")).toArrow()
    back.write.mode("overwrite").csv(str(scratch / "c"), header=True)
    back.write.mode("overwrite").json(str(scratch / "j"))
    spark.read.csv(str(scratch / "c"), header=True).union(  # type: ignore[attr-defined]
        spark.read.json(str(scratch / "j")).select("id", "region", "b")  # type: ignore[attr-defined]
    ).createOrReplaceTempView("t")
    spark.sql("SELECT region, date_trunc('day', current_timestamp()) AS d FROM t ORDER BY 1").toArrow()  # type: ignore[attr-defined]


def write_archive(target: Path) -> None:
    """Run a representative Spark JVM with `-XX:ArchiveClassesAtExit`, then put its archive at `target`
    (atomically: a JVM sees no archive or a whole one). One writer at a time per archive directory."""
    import fcntl

    from pyspark import SparkContext

    from airflow_partitions.refresh.spark_session import build_local_session

    with (target.parent / ".lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # another run is writing it
        if target.exists():
            return
        partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
        os.environ["JAVA_TOOL_OPTIONS"] += f" -XX:ArchiveClassesAtExit={partial}"
        try:
            with tempfile.TemporaryDirectory() as scratch:
                spark = build_local_session(app_name="class-archive")
                _representative_work(spark, Path(scratch))
                gateway = SparkContext._gateway
                spark.stop()
                # The JVM writes the archive as it exits: it exits once its stdin closes.
                assert gateway is not None
                gateway.proc.stdin.close()
                gateway.proc.wait(timeout=300)
            # spark-submit's launcher JVM writes a small archive of its own first (a megabyte); Spark's JVM
            # replaces it as it exits (about 180 MB).
            if partial.stat().st_size < 16 * 2**20:
                raise RuntimeError(f"Spark's JVM wrote no archive at {partial}")
            os.replace(partial, target)
        except BaseException:
            log = target.with_suffix(".log")
            if log.exists():
                os.replace(log, target.with_suffix(".failed"))
            raise
        finally:
            partial.unlink(missing_ok=True)


if __name__ == "__main__":
    write_archive(Path(sys.argv[1]))
