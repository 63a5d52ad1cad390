"""Snapshot upload speed against a plain boto3 `upload_file` loop, and the cost of an all-skipped re-upload.

    python -m benchmarks.bench_snapshots                 # 200 partitions x 256 KiB + 2 x 24 MiB multipart
    python -m benchmarks.bench_snapshots --quick         # 40 partitions x 64 KiB, no large files
    python -m benchmarks.bench_snapshots --endpoint-url http://localhost:9000 --bucket bench \\
        --access-key minio --secret-key minio12345       # against MinIO instead of moto

Anchors, run in the same process against the same endpoint:
* `upload_file loop`: one boto3 `upload_file` per file, sequentially (what a hand-written sync does).
* `sync-like re-run`: list the prefix and upload only files whose size differs (what `aws s3 sync`
  does on a second run), the fair anchor for our re-upload, where every file is skipped.

Our upload does more per file: it HEADs the key, hashes the file, PUTs conditionally with a SHA-256
checksum and HEADs again to verify; the ratios show what that costs. Then the catalog version is
published and an empty replica bootstrapped from it, against a `download_file` loop of the same files
(our bootstrap also verifies every SHA-256, places files atomically and commits the local catalog).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow_partitions.catalog import Catalog, LocalStore, PartitionEntry, PartitionSpecInfo
from airflow_partitions.keys import PartitionKey
from airflow_partitions.snapshots import (
    BootstrapResult,
    S3Settings,
    bootstrap_snapshot,
    upload_partition_snapshot,
    upload_snapshot_manifest,
)
from airflow_partitions.storage.datafile import DataFile, file_checksum
from benchmarks import load
from benchmarks.support import free_port

MiB = 1024 * 1024


@dataclass(frozen=True)
class Partition:
    key_path: str
    files: list[DataFile]


@contextmanager
def _endpoint(args: argparse.Namespace) -> Iterator[S3Settings]:
    if args.endpoint_url:
        yield S3Settings(
            endpoint_url=args.endpoint_url,
            region_name=args.region,
            aws_access_key_id=args.access_key,
            aws_secret_access_key=args.secret_key,
            addressing_style="path",
        )
        return
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield S3Settings(
            endpoint_url=f"http://127.0.0.1:{port}",
            region_name="us-east-1",
            aws_access_key_id="bench",
            aws_secret_access_key="bench",
        )
    finally:
        server.stop()


def _make_partitions(root: Path, count: int, size: int, large: int, large_size: int) -> list[Partition]:
    partitions = []
    for index in range(count + large):
        key_path = PartitionKey((index % 7, f"v-{index}")).path(["bucket", "name"])
        relative = f"{key_path}/part-{uuid.uuid4().hex}.parquet"
        local = root / relative
        local.parent.mkdir(parents=True, exist_ok=True)
        file_size = large_size if index >= count else size
        local.write_bytes(os.urandom(file_size))
        data_file = DataFile(relative, "parquet", rows=0, bytes=file_size, checksum=file_checksum(local))
        partitions.append(Partition(key_path, [data_file]))
    return partitions


def _key_of(partition: Partition) -> PartitionKey:
    bucket, name = partition.key_path.split("/")
    return PartitionKey((int(bucket.split("=")[1]), name.split("=")[1]))


def _timed(action: Callable[[], Any]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small run (a few seconds)")
    parser.add_argument("--partitions", type=int, default=None, help="number of small partition files")
    parser.add_argument("--file-kib", type=int, default=None, help="size of each small file in KiB")
    parser.add_argument("--large-files", type=int, default=None, help="files above the multipart threshold")
    parser.add_argument("--endpoint-url", default=None, help="use this S3 endpoint instead of a moto server")
    parser.add_argument("--bucket", default=None, help="existing bucket on --endpoint-url (created on moto)")
    parser.add_argument("--region", default="us-east-1")
    parser.add_argument("--access-key", default=None)
    parser.add_argument("--secret-key", default=None)
    args = load.parse_args(parser, argv)

    count = args.partitions if args.partitions is not None else (40 if args.quick else 200)
    size = (args.file_kib if args.file_kib is not None else (64 if args.quick else 256)) * 1024
    large = args.large_files if args.large_files is not None else (0 if args.quick else 2)
    large_size = 24 * MiB
    threshold = 8 * MiB

    with tempfile.TemporaryDirectory(prefix="bench-snapshots-") as tmp, _endpoint(args) as settings:
        root = Path(tmp)
        partitions = _make_partitions(root, count, size, large, large_size)
        all_files = [f for p in partitions for f in p.files]
        total_bytes = sum(f.bytes for f in all_files)
        client = settings.create_client()
        bucket = args.bucket or f"bench-{uuid.uuid4().hex[:10]}"
        if not args.bucket:
            client.create_bucket(Bucket=bucket)
        run = uuid.uuid4().hex[:8]
        anchor_prefix = f"anchor-{run}"
        ours_location = f"s3://{bucket}/ours-{run}"

        from boto3.s3.transfer import TransferConfig

        anchor_config = TransferConfig(multipart_threshold=threshold, multipart_chunksize=threshold)

        def anchor_upload() -> None:
            for data_file in all_files:
                client.upload_file(
                    str(root / data_file.path),
                    bucket,
                    f"{anchor_prefix}/{data_file.path}",
                    Config=anchor_config,
                )

        def anchor_sync_rerun() -> None:
            remote: dict[str, int] = {}
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=anchor_prefix):
                for item in page.get("Contents", []):
                    remote[item["Key"]] = item["Size"]
            for data_file in all_files:
                key = f"{anchor_prefix}/{data_file.path}"
                if remote.get(key) != data_file.bytes:
                    client.upload_file(str(root / data_file.path), bucket, key, Config=anchor_config)

        results: list[Any] = []

        def ours() -> None:
            results.clear()
            # One call per partition, as the mapped upload tasks make them.
            for partition in partitions:
                results.append(
                    upload_partition_snapshot(
                        settings,
                        ours_location,
                        root,
                        partition.files,
                        dataset="bench",
                        multipart_threshold=threshold,
                        multipart_chunksize=threshold,
                    )
                )

        anchor_seconds = _timed(anchor_upload)
        ours_seconds = _timed(ours)
        uploaded = sum(len(r.uploaded) for r in results)
        ours_rerun_seconds = _timed(ours)
        skipped = sum(len(r.skipped) for r in results)
        anchor_rerun_seconds = _timed(anchor_sync_rerun)
        anchor_again_seconds = _timed(anchor_upload)

        # Publish the catalog version holding these partitions, then hydrate an empty replica from it.
        spec = PartitionSpecInfo.from_fields([("bucket", "bucket", "int"), ("name", "name", "string")])
        source = Catalog(LocalStore(root / "_source_catalog"), "bench", data_root=root)
        source.commit(
            base_version=None,
            upserts=[PartitionEntry.from_files(_key_of(p), spec, p.files) for p in partitions],
            partition_spec=spec,
        )
        snapshot = source.latest()
        assert snapshot is not None
        publish_seconds = _timed(lambda: upload_snapshot_manifest(settings, ours_location, "bench", snapshot))
        replica_dir = root / "_replica"
        replica_dir.mkdir()
        replica = Catalog(LocalStore(replica_dir), "bench")
        assert replica.data_root is not None
        replica_root = replica.data_root
        bootstraps: list[BootstrapResult] = []

        def bootstrap() -> None:
            bootstraps.append(
                bootstrap_snapshot(
                    settings,
                    ours_location,
                    "bench",
                    replica_root,
                    catalog=replica,
                    ranged_threshold=threshold,
                )
            )

        anchor_download_dir = root / "_anchor_download"

        def anchor_download() -> None:
            for data_file in all_files:
                target = anchor_download_dir / data_file.path
                target.parent.mkdir(parents=True, exist_ok=True)
                client.download_file(
                    bucket, f"{anchor_prefix}/{data_file.path}", str(target), Config=anchor_config
                )

        anchor_download_seconds = _timed(anchor_download)
        bootstrap_seconds = _timed(bootstrap)
        rebootstrap_seconds = _timed(bootstrap)

    assert uploaded == len(all_files), f"first run uploaded {uploaded} of {len(all_files)} files"
    assert skipped == len(all_files), f"re-run skipped {skipped} of {len(all_files)} files"
    assert bootstraps[0].files_downloaded == len(all_files), "the first bootstrap fetches every file"
    assert bootstraps[1].files_skipped == len(all_files), "the second bootstrap fetches nothing"
    mb = total_bytes / MiB
    print(
        f"snapshots upload: {len(all_files)} partition files, {mb:.1f} MiB "
        f"({large} above the multipart threshold)"
    )
    print(f"  anchor upload_file loop          {anchor_seconds:8.3f} s  {mb / anchor_seconds:8.1f} MiB/s")
    print(f"  upload_partition_snapshot        {ours_seconds:8.3f} s  {mb / ours_seconds:8.1f} MiB/s")
    print(f"  ratio ours / anchor              {ours_seconds / anchor_seconds:8.2f}x")
    print(f"  re-upload, all skipped (ours)    {ours_rerun_seconds:8.3f} s")
    print(f"  anchor sync-like re-run (list)   {anchor_rerun_seconds:8.3f} s")
    print(f"  anchor upload_file loop again    {anchor_again_seconds:8.3f} s")
    print(f"  ratio ours re-upload / sync-like {ours_rerun_seconds / anchor_rerun_seconds:8.2f}x")
    print(f"  ratio ours re-upload / upload    {ours_rerun_seconds / anchor_again_seconds:8.2f}x")
    print(f"snapshots bootstrap: manifest of {len(partitions)} partitions")
    print(f"  publish manifest (checks files)  {publish_seconds:8.3f} s")
    print(f"  anchor download_file loop        {anchor_download_seconds:8.3f} s")
    print(
        f"  bootstrap_snapshot (+ commit)    {bootstrap_seconds:8.3f} s  {mb / bootstrap_seconds:8.1f} MiB/s"
    )
    print(f"  ratio ours / anchor              {bootstrap_seconds / anchor_download_seconds:8.2f}x")
    print(f"  re-bootstrap, all skipped        {rebootstrap_seconds:8.3f} s")


if __name__ == "__main__":
    main()
