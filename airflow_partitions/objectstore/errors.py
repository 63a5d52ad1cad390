"""What a failed S3 call means: its error code, and an `ObjectStoreError` that says how to fix it."""

from __future__ import annotations

import re

from airflow_partitions.exceptions import ObjectStoreError

_NOT_FOUND_CODES = frozenset({"404", "NoSuchKey", "NotFound"})
# The condition of a conditional write did not hold: the key exists (If-None-Match) or changed (If-Match).
_PRECONDITION_CODES = frozenset({"412", "PreconditionFailed"})
# Another conditional write of the same key was in flight: the outcome is unknown until it finishes.
_CONFLICT_CODES = frozenset({"409", "ConditionalRequestConflict"})
# The server failed or throttled this one request; the same request may well succeed a moment later.
_TRANSIENT_CODES = frozenset(
    {"500", "502", "503", "504", "InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout"}
)
# The same failures as pyarrow's S3 client reports them, once its own retries ran out: an `OSError` whose
# text names the AWS error (`AWS Error SLOW_DOWN during GetObject operation: ...`) or the HTTP status.
_ARROW_TRANSIENT = re.compile(
    r"AWS Error (NETWORK_CONNECTION|SLOW_DOWN|INTERNAL_FAILURE|SERVICE_UNAVAILABLE|REQUEST_TIMEOUT"
    r"|THROTTLING)\b"
    r"|AWS Error \w+ \(HTTP status 5\d\d\)"
)


class ShortReadError(OSError):
    """A read returned fewer bytes than the object holds from its offset (a body cut short): transient."""


def error_code(err: BaseException) -> str | None:
    """The S3 error code of a botocore ClientError (also when wrapped by boto3's transfer errors).

    Falls back to the HTTP status when the error carries no code.
    """
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        response = getattr(current, "response", None)
        if isinstance(response, dict):
            code = response.get("Error", {}).get("Code")
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            return str(code) if code else (str(status) if status else None)
        current = current.__cause__ or current.__context__
    # boto3's upload_file re-raises the ClientError as a message-only S3UploadFailedError.
    text = str(err)
    for code in ("PreconditionFailed", "ConditionalRequestConflict"):
        if code in text:
            return code
    return None


def is_not_found(err: BaseException) -> bool:
    return error_code(err) in _NOT_FOUND_CODES


def is_precondition_failed(err: BaseException) -> bool:
    """HTTP 412: the key exists (`If-None-Match: *`) or no longer has the expected ETag (`If-Match`)."""
    return error_code(err) in _PRECONDITION_CODES


def is_write_conflict(err: BaseException) -> bool:
    """HTTP 409 `ConditionalRequestConflict`: a concurrent conditional write of the key was in flight."""
    return error_code(err) in _CONFLICT_CODES


def is_transient(err: BaseException) -> bool:
    """A failure of this one request, not of the request itself: worth sending again after a pause.

    The connection broke (reset, closed, timed out while reading, a body cut short) or the server
    answered 5xx / `SlowDown`, as boto3 or pyarrow reports it. An unreachable endpoint or refused
    credentials are not transient.
    """
    from http.client import HTTPException

    from botocore.exceptions import HTTPClientError, IncompleteReadError
    from urllib3.exceptions import ProtocolError

    # botocore reads an error response's body outside its own error handling: a body cut short there
    # surfaces as urllib3's ProtocolError, not as a botocore exception.
    if isinstance(
        err, HTTPClientError | IncompleteReadError | ProtocolError | HTTPException | ShortReadError
    ):
        return True
    if isinstance(err, OSError) and _ARROW_TRANSIENT.search(str(err)):
        return True
    return error_code(err) in _TRANSIENT_CODES


def store_error(err: BaseException, action: str, uri: str) -> ObjectStoreError:
    """An `ObjectStoreError` for a failed S3 call that says what failed and how to fix it."""
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
        hint = "the bucket does not exist: create it or fix the location"
    elif is_transient(err):
        hint = (
            f"{code or type(err).__name__}: {err}; the request kept failing when sent again (a network or "
            "endpoint fault): check the endpoint's health and retry later"
        )
    elif isinstance(err, BotoCoreError):
        hint = str(err)
    else:
        hint = f"{code or type(err).__name__}: {err}"
    return ObjectStoreError(f"cannot {action} {uri}: {hint}")
