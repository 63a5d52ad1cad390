"""Hide the secrets a spec may carry (URL passwords, keys and tokens in `params:`) in anything printed.

A spec's `params:` can hold a Postgres URL with a password or an `aws_secret_access_key`; summaries and
error messages show params and quote driver errors, so every such text goes through these functions.
Loading a spec remembers its secrets for the life of the process (`remember_secrets`), so `mask_secrets`
hides them even in a message that quotes one without its key or URL (a driver error, a stack of
wrapped exceptions), as Airflow's secrets masker does for connections.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

MASK = "***"
# Param names whose values are secrets: passwords, secret keys, session tokens, access key ids.
_SECRET_KEY = re.compile(r"secret|passw|pwd|token|credential|private|access_key|api_key|auth", re.IGNORECASE)
# `scheme://user:password@host`, any scheme: the password is whatever sits between the first `:` after
# the user and the last `@` of the word. A password may hold `/` or `@` unencoded (AWS secret keys in
# Hadoop's `s3a://key:secret@bucket`): URL parsers then cut it short, so the word decides, ending at
# whitespace or a quote. Masking up to a later `@` (one in a query string) hides more, never less.
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:/@\s'\"`]*:)(?P<password>[^\s'\"`]*)@")
# Shorter remembered secrets are not masked everywhere: a two-letter password would blank out every word
# holding those letters. Their keys and URLs still hide them.
MIN_REMEMBERED_LENGTH = 4
_remembered: set[str] = set()
_remembered_lock = threading.Lock()
# Told every secret remembered, past and future (Airflow's secrets masker, so task logs hide them too).
_listeners: list[Callable[[str], None]] = []


def is_secret_key(key: object) -> bool:
    """True for a param name whose value must never be shown (e.g. `aws_secret_access_key`)."""
    return isinstance(key, str) and bool(_SECRET_KEY.search(key))


def mask_url_passwords(text: str) -> str:
    """`text` with the password of every `scheme://user:password@host` URL replaced by `***`."""
    return _URL_PASSWORD.sub(lambda m: f"{m.group('head')}{MASK}@", text)


def unencoded_password_problem(url: str) -> str | None:
    """Why `url` cannot be used as written when its password holds an unencoded `@` or `#`; else None.

    A driver (libpq) ends the password at its first `@` and takes the rest for the host, a URL parser
    ends it at `#` and takes the rest for a fragment: either then prints a piece of the password in
    every error (`could not translate host name "tail@127.0.0.1"`), where no mask can recognise it. The
    message shows the URL with its password masked.
    """
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        return None
    if parts.netloc.count("@") <= 1 and "@" not in parts.fragment:
        return None
    match = _URL_PASSWORD.search(url)
    password = match.group("password") if match is not None else ""
    held = [repr(character) for character in "@#" if character in password] or ["'@'"]
    return (
        f"{mask_url_passwords(url)!r}: its password holds an unencoded {' and '.join(held)}; percent-encode "
        "@ as %40 and # as %23 in a URL's password (the driver would read the rest as the host name "
        "and print it in its errors)"
    )


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
    """The secret strings in `params`: values of secret keys and the passwords of URLs (plain and decoded),
    in nested mappings and lists too."""
    found: list[str] = []
    for key, value in params.items():
        found += _secrets_in(key, value)
    return found


def _secrets_in(key: object, value: Any) -> list[str]:
    if isinstance(value, Mapping):
        return secret_values(value)
    if isinstance(value, list | tuple):
        return [secret for item in value for secret in _secrets_in(key, item)]
    if isinstance(value, str):
        return ([value] if is_secret_key(key) else []) + url_password(value)
    if value is not None and is_secret_key(key):
        return [str(value)]
    return []


def spec_secrets(document: Any) -> list[str]:
    """The secrets of a spec document (YAML data): those of every `params:` block, and the password of any
    URL anywhere (a `from:` written `s3a://key:secret@bucket`)."""
    found: list[str] = []
    if isinstance(document, Mapping):
        for key, value in document.items():
            if key == "params" and isinstance(value, Mapping):
                found += secret_values(value)
            else:
                found += spec_secrets(value)
    elif isinstance(document, list | tuple):
        for item in document:
            found += spec_secrets(item)
    elif isinstance(document, str):
        found += url_password(document)
    return found


def url_password(url: str) -> list[str]:
    """The password of `url` (the one `mask_url_passwords` hides), as written and percent-decoded; empty
    when it has none."""
    passwords: list[str] = []
    for match in _URL_PASSWORD.finditer(url.strip()):
        password = match.group("password")
        if password:
            passwords += [password, unquote(password)]
    if not passwords:
        # A URL parser's reading, for what the pattern does not take as a URL.
        try:
            parsed = urlsplit(url.strip()).password
        except ValueError:
            parsed = None
        if parsed:
            passwords += [parsed, unquote(parsed)]
    return list(dict.fromkeys(passwords))


def remember_secrets(secrets: Iterable[str]) -> None:
    """Mask these in every later `mask_secrets` call of this process (a loaded spec's secrets), and tell
    the listeners (`on_secret`)."""
    with _remembered_lock:
        new = {s for s in secrets if len(s) >= MIN_REMEMBERED_LENGTH} - _remembered
        _remembered.update(new)
        listeners = list(_listeners)
    for secret in sorted(new):
        for listener in listeners:
            listener(secret)


def on_secret(listener: Callable[[str], None]) -> None:
    """Call `listener` with every secret remembered so far and every one remembered later.

    Adding a listener again registers it once but replays the secrets known so far: a secrets masker
    reset between tasks (Airflow resets its masker per task process) gets them back.
    """
    with _remembered_lock:
        if listener not in _listeners:
            _listeners.append(listener)
        known = sorted(_remembered)
    for secret in known:
        listener(secret)


def mask_secrets(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with URL passwords, every one of `secrets` and every remembered secret replaced by `***`
    (longest first, so a secret containing another goes whole)."""
    masked = mask_url_passwords(text)
    with _remembered_lock:
        known = set(_remembered)
    for secret in sorted(known.union(s for s in secrets if s), key=len, reverse=True):
        masked = masked.replace(secret, MASK)
    return masked
