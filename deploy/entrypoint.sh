#!/usr/bin/env bash
# Starts one service of the compose stack: an Airflow component, a Spark node, or any command.
set -euo pipefail
SPARK_CLASS="${SPARK_HOME}/bin/spark-class"
case "${1:-}" in
  spark-master)
    exec "$SPARK_CLASS" org.apache.spark.deploy.master.Master --host 0.0.0.0 --port 7077 --webui-port 8081 ;;
  spark-worker)
    exec "$SPARK_CLASS" org.apache.spark.deploy.worker.Worker --webui-port 8082 "${SPARK_MASTER_URL:-spark://spark-master:7077}" ;;
  spark-connect)
    exec "${SPARK_HOME}/bin/spark-submit" --class org.apache.spark.sql.connect.service.SparkConnectServer \
      --master "${SPARK_MASTER_URL:-spark://spark-master:7077}" \
      --conf spark.connect.grpc.binding.port=15002 --conf spark.sql.session.timeZone=UTC \
      --jars /usr/share/java/postgresql.jar spark-internal ;;
  airflow-init)
    airflow db migrate
    exec true ;;
  airflow)
    shift
    exec airflow "$@" ;;
  *)
    exec "$@" ;;
esac
