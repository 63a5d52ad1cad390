"""What several benchmarks share: a free loopback port and a moto S3 server in its own process."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def moto_server() -> Iterator[dict[str, str]]:
    """moto's S3 server in its own process, as a real endpoint would be: in this process it would compete
    with the code under test for the interpreter lock and slow both down. Yields boto3 client settings."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("the moto S3 server did not start") from None
                time.sleep(0.1)
        yield {
            "endpoint_url": f"http://127.0.0.1:{port}",
            "aws_access_key_id": "bench",
            "aws_secret_access_key": "bench",
            "region_name": "us-east-1",
        }
    finally:
        server.terminate()
        server.wait(timeout=30)
