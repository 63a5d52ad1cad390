"""Small S3 calls shared by upload and bootstrap, with botocore errors turned into `SnapshotError`s."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import SnapshotError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

_NOT_FOUND_CODES = frozenset({"404", "NoSuchKey", "NotFound"})
_PRECONDITION_CODES = frozenset({"412", "PreconditionFailed"})
# S3 answers 409 when two conditional writes of one key race; the loser re-reads and decides.
_CONFLICT_CODES = frozenset({"409", "ConditionalRequestConflict"})


def error_code(err: BaseException) -> str | None:
    """The S3 error code of a botocore ClientError (also when wrapped by boto3's transfer errors)."""
    from botocore.exceptions import ClientError

    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ClientError):
            code = current.response.get("Error", {}).get("Code")
            status = current.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            return str(code) if code else (str(status) if status else None)
        current = current.__cause__ or current.__context__
    return None


def is_not_found(err: BaseException) -> bool:
    return error_code(err) in _NOT_FOUND_CODES


def is_write_conflict(err: BaseException) -> bool:
    """True when a conditional write lost: the key exists (412) or a concurrent write raced it (409)."""
    code = error_code(err)
    if code in _PRECONDITION_CODES or code in _CONFLICT_CODES:
        return True
    # boto3's upload_file re-raises the ClientError as a message-only S3UploadFailedError.
    text = str(err)
    return "PreconditionFailed" in text or "ConditionalRequestConflict" in text


def snapshot_error(err: BaseException, action: str, uri: str) -> SnapshotError:
    """A `SnapshotError` for a failed S3 call that says what failed and how to fix it."""
    from botocore.exceptions import (
        BotoCoreError,
        EndpointConnectionError,
        NoCredentialsError,
        PartialCredentialsError,
    )

    code = error_code(err)
    if isinstance(err, NoCredentialsError | PartialCredentialsError):
        hint = "no usable AWS credentials: set them in the AWS connection (login/password) or the environment"
    elif isinstance(err, EndpointConnectionError):
        hint = f"cannot reach the S3 endpoint ({err}); check endpoint_url and that the store is running"
    elif code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
        hint = f"access denied ({code}): check the access key, secret and the bucket policy"
    elif code == "NoSuchBucket":
        hint = "the bucket does not exist: create it or fix the snapshot location"
    elif isinstance(err, BotoCoreError):
        hint = str(err)
    else:
        hint = f"{code or type(err).__name__}: {err}"
    return SnapshotError(f"could not {action} {uri}: {hint}")


def head_object(client: S3Client, bucket: str, key: str) -> dict[str, Any] | None:
    """HEAD with checksums enabled; None when the object does not exist."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return dict(client.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED"))
    except ClientError as err:
        if is_not_found(err):
            return None
        raise snapshot_error(err, "inspect", f"s3://{bucket}/{key}") from err
    except BotoCoreError as err:
        raise snapshot_error(err, "inspect", f"s3://{bucket}/{key}") from err


def get_object_bytes(client: S3Client, bucket: str, key: str) -> tuple[bytes, str] | None:
    """The body and ETag of a small object; None when it does not exist."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        response = client.get_object(Bucket=bucket, Key=key)
        return response["Body"].read(), str(response["ETag"])
    except ClientError as err:
        if is_not_found(err):
            return None
        raise snapshot_error(err, "read", f"s3://{bucket}/{key}") from err
    except BotoCoreError as err:
        raise snapshot_error(err, "read", f"s3://{bucket}/{key}") from err


def list_objects(client: S3Client, bucket: str, prefix: str) -> Iterator[dict[str, Any]]:
    """Every object under `prefix` (all pages), as listed by ListObjectsV2."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                yield dict(item)
    except (ClientError, BotoCoreError) as err:
        raise snapshot_error(err, "list", f"s3://{bucket}/{prefix}") from err
