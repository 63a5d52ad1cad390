# One image for every service of docker-compose.yaml: Airflow components and Spark nodes run the same
# pinned pyspark, so the driver, the Connect server and the workers always agree on versions.
FROM python:3.11-slim-bookworm

RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless libpostgresql-jdbc-java procps curl \
    && rm -rf /var/lib/apt/lists/*

ENV AIRFLOW_HOME=/opt/airflow \
    PYTHONUNBUFFERED=1 \
    SPARK_HOME=/usr/local/lib/python3.11/site-packages/pyspark \
    TZ=UTC

WORKDIR /opt/airflow-partitions
COPY pyproject.toml README.md ./
COPY airflow_partitions ./airflow_partitions
RUN pip install --no-cache-dir uv \
    && uv pip install --system --no-cache --compile-bytecode ".[deploy]" \
    && uv pip install --system --no-cache --compile-bytecode --reinstall --no-deps pyspark==4.2.0

COPY dags /opt/airflow/dags
# Task processes fork with the refresh modules already imported (see the file).
COPY deploy/airflow_local_settings.py /opt/airflow/config/airflow_local_settings.py
COPY deploy/entrypoint.sh /usr/local/bin/ap-entrypoint
RUN chmod +x /usr/local/bin/ap-entrypoint
WORKDIR /opt/airflow
ENTRYPOINT ["/usr/local/bin/ap-entrypoint"]
