"""A private Postgres cluster with `wal_level = logical`, for change data capture tests.

The shared test server runs with `wal_level = replica`; logical replication slots need `logical`, a
server-start setting. So the change data capture tests start their own cluster from Debian's
postgresql package (`initdb` / `pg_ctl`, run as the `postgres` user when the tests run as root), on a free
loopback port, trust authentication, torn down with the test session (`pg_ctl stop -m immediate`).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path


def _bin_dir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), reverse=True)
    return Path(found[0]).parent if found else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_postgres(args: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args


@contextlib.contextmanager
def logical_cluster() -> Iterator[tuple[str, int] | None]:
    """(host, port) of a running private cluster with wal_level=logical; None when none can start."""
    bin_dir = _bin_dir()
    if bin_dir is None:
        yield None
        return
    root = Path(tempfile.mkdtemp(prefix="ap-pg-logical-"))
    data = root / "data"
    port = _free_port()
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    started = False
    try:
        subprocess.run(
            _as_postgres([str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"]),
            check=True,
            capture_output=True,
        )
        options = (
            f"-c wal_level=logical -c port={port} -c listen_addresses=127.0.0.1 "
            f"-c unix_socket_directories={root} -c max_replication_slots=20 -c max_wal_senders=20 "
            "-c fsync=off -c full_page_writes=off"
        )
        subprocess.run(
            _as_postgres(
                [
                    str(bin_dir / "pg_ctl"),
                    "-D",
                    str(data),
                    "-o",
                    options,
                    "-l",
                    str(root / "log"),
                    "-w",
                    "start",
                ]
            ),
            check=True,
            capture_output=True,
        )
        started = True
        yield ("127.0.0.1", port)
    finally:
        if started:
            subprocess.run(
                _as_postgres([str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"]),
                capture_output=True,
            )
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def fresh_database(host: str, port: int) -> Iterator[str]:
    """A new database on the cluster, dropped on exit (its replication slots first); yields its URL."""
    import psycopg

    name = f"ap_cdc_{uuid.uuid4().hex[:12]}"
    admin = f"postgresql://postgres@{host}:{port}/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql://postgres@{host}:{port}/{name}"
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            slots = conn.execute(
                "SELECT slot_name FROM pg_replication_slots WHERE database = %s", (name,)
            ).fetchall()
            for (slot,) in slots:
                with contextlib.suppress(Exception):
                    conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
