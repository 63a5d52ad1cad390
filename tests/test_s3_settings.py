"""The one S3 settings type: built from source params (with AWS environment fallbacks) or a dict, and the
boto3 client and pyarrow filesystem it builds reach the same real endpoint (moto's server)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_partitions.exceptions import S3SettingsError, SnapshotError, SourceError
from airflow_partitions.objectstore import S3Settings


def test_source_params_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://env-endpoint:9000")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    from_env = S3Settings.from_source_params({})
    assert from_env.endpoint_url == "http://env-endpoint:9000"
    assert from_env.region_name == "eu-west-1"
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://s3-only:9000")
    assert S3Settings.from_source_params({}).endpoint_url == "http://s3-only:9000", "the S3-specific env wins"

    given = S3Settings.from_source_params(
        {
            "s3_endpoint": "https://minio.example:9000",
            "aws_region": "us-west-2",
            "access_key_id": "AK",
            "secret_access_key": "SECRET",
            "addressing_style": "path",
            "file_format": "parquet",  # other source params are not S3 settings and are ignored
        }
    )
    assert (given.endpoint_url, given.region_name, given.aws_access_key_id) == (
        "https://minio.example:9000",
        "us-west-2",
        "AK",
    )
    assert given.addressing_style == "path"
    assert "SECRET" not in repr(given), "secrets never print"


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"endpoint_url": "minio:9000"}, "must be an http(s) URL such as http://localhost:9000"),
        ({"aws_access_key_id": "AK"}, "must be given together"),
        ({"addressing_style": "sideways"}, "use 'path' for MinIO"),
    ],
)
def test_bad_source_settings_say_what_to_write(params: dict[str, str], message: str) -> None:
    with pytest.raises(S3SettingsError) as info:
        S3Settings.from_source_params(params)
    assert message in str(info.value)
    # Callers on either side catch their own error type.
    assert isinstance(info.value, SourceError)
    assert isinstance(info.value, SnapshotError)


def test_client_and_arrow_filesystem_reach_the_same_objects(
    s3_server: dict[str, str], s3_bucket: str
) -> None:
    settings = S3Settings.from_source_params(s3_server)
    client = settings.create_client()
    filesystem = settings.arrow_filesystem()
    table = pa.table({"id": [1, 2, 3], "name": ["a/b", "", None]})
    pq.write_table(table, f"{s3_bucket}/data/part-0.parquet", filesystem=filesystem)
    listed = client.list_objects_v2(Bucket=s3_bucket, Prefix="data/")
    assert [o["Key"] for o in listed.get("Contents", [])] == ["data/part-0.parquet"]
    body = client.get_object(Bucket=s3_bucket, Key="data/part-0.parquet")["Body"].read()
    assert pq.read_table(pa.BufferReader(body)).equals(table)
