"""spark-submit entry point of a refresh, for running a stage or finalize by hand.

    spark-submit spark_jobs/refresh_partitions.py stage --spec SPEC --dataset NAME --plan plan.json \\
        --location /shared/staging/run-1 [--output stage.json] [--strategy auto|spark|pushdown] \\
        [--repartition] [--finalize]
    spark-submit spark_jobs/refresh_partitions.py finalize --spec SPEC --dataset NAME \\
        --stage stage.json --items items.json [--output results.json]

The application itself ships inside the package (`airflow_partitions/spark_jobs/refresh_partitions.py`,
what the `spark` connection submits), so a pip-installed deployment has it too; this file runs the same
`main`. `python spark_jobs/refresh_partitions.py ... --master local[2]` or `--remote sc://host:15002`
runs it without spark-submit.
"""

from __future__ import annotations

import sys

from airflow_partitions.spark_jobs.refresh_partitions import main

if __name__ == "__main__":
    sys.exit(main())
