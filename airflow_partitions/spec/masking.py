"""Hide the secrets a spec may carry (URL passwords, keys and tokens in `params:`) in anything printed.

A spec's `params:` can hold a Postgres URL with a password or an `aws_secret_access_key`; summaries and
error messages show params and quote driver errors, so every such text goes through these functions.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

MASK = "***"
# Param names whose values are secrets: passwords, secret keys, session tokens, access key ids.
_SECRET_KEY = re.compile(r"secret|passw|pwd|token|credential|private|access_key|api_key|auth", re.IGNORECASE)
# `scheme://user:password@host`: the password is whatever sits between the first `:` of the user info
# and the last `@` before the host.
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:/@\s]*:)(?P<password>[^\s/]*)@")


def is_secret_key(key: object) -> bool:
    """True for a param name whose value must never be shown (e.g. `aws_secret_access_key`)."""
    return isinstance(key, str) and bool(_SECRET_KEY.search(key))


def mask_url_passwords(text: str) -> str:
    """`text` with the password of every `scheme://user:password@host` URL replaced by `***`."""
    return _URL_PASSWORD.sub(lambda m: f"{m.group('head')}{MASK}@", text)


def masked_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `params` fit to print: secret values masked, URL passwords masked (nested too)."""
    return {key: _masked_value(key, value) for key, value in params.items()}


def _masked_value(key: object, value: Any) -> Any:
    if value is None:
        return None
    if is_secret_key(key):
        return MASK
    if isinstance(value, str):
        return mask_url_passwords(value)
    if isinstance(value, Mapping):
        return masked_params(value)
    if isinstance(value, list | tuple):
        return [_masked_value(None, item) for item in value]
    return value


def secret_values(params: Mapping[str, Any]) -> list[str]:
    """The secret strings in `params`: values of secret keys and the passwords of URLs (plain and decoded)."""
    found: list[str] = []
    for key, value in params.items():
        if isinstance(value, Mapping):
            found += secret_values(value)
        elif isinstance(value, str):
            if is_secret_key(key):
                found.append(value)
            found += url_password(value)
        elif value is not None and is_secret_key(key):
            found.append(str(value))
    return found


def url_password(url: str) -> list[str]:
    """The password of `url`, as written and percent-decoded; empty when it has none."""
    try:
        password = urlsplit(url.strip()).password
    except ValueError:
        return []
    if not password:
        return []
    return list(dict.fromkeys([password, unquote(password)]))


def mask_secrets(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with URL passwords and every one of `secrets` replaced by `***` (longest first)."""
    masked = mask_url_passwords(text)
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        masked = masked.replace(secret, MASK)
    return masked
