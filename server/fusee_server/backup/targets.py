"""Where a backup goes: a directory, or an S3-compatible bucket (docs/backup.md, *Targets*).

A target stores immutable named objects and one manifest replaced whole. That is all a
backup needs of it: put, get, list, delete, and the manifest's atomic replacement, which
S3 gives (a PUT is atomic) and a directory gives by a rename.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

from fusee._errors import RejectedError

MANIFEST = "manifest.json"


class Target(Protocol):
    url: str

    def put(self, name: str, data: bytes) -> None: ...
    def get(self, name: str) -> bytes | None: ...  # None: no such object
    def names(self, prefix: str = "") -> list[str]: ...
    def delete(self, names: list[str]) -> None: ...


class LocalTarget:
    """A directory: each object a file, written to a temporary name, flushed and renamed,
    so a reader (or a crash) never sees half of one."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.url = f"file://{self.root}"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise RejectedError(
                f"backup target {self.root}: not a directory that can be made ({error})"
            ) from None

    def put(self, name: str, data: bytes) -> None:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, path)

    def get(self, name: str) -> bytes | None:
        try:
            return (self.root / name).read_bytes()
        except FileNotFoundError:
            return None

    def names(self, prefix: str = "") -> list[str]:
        found = []
        for path in self.root.rglob("*"):
            if path.is_file() and not path.name.startswith("."):
                name = path.relative_to(self.root).as_posix()
                if name.startswith(prefix):
                    found.append(name)
        return sorted(found)

    def delete(self, names: list[str]) -> None:
        for name in names:
            try:
                (self.root / name).unlink()
            except FileNotFoundError:
                pass


class S3Target:
    """A bucket and prefix of S3 or a store that speaks its API (MinIO, moto, ...):
    `s3://bucket/prefix?region=eu-west-1&endpoint=http://127.0.0.1:9000`. Credentials
    come from the usual AWS settings (`AWS_ACCESS_KEY_ID`, ..., a profile, a role)."""

    def __init__(self, bucket: str, prefix: str, region: str | None, endpoint: str | None, url: str) -> None:
        try:
            import boto3
            from botocore.config import Config
        except ImportError:
            raise RejectedError("an s3:// backup needs boto3: pip install 'fusee-server[s3]'") from None
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.url = url
        # Short timeouts and no retries of its own: the backup retries with its backoff,
        # and says so, rather than a call hanging inside botocore.
        config = Config(connect_timeout=3, read_timeout=10, retries={"max_attempts": 1})
        self.client: Any = boto3.client("s3", region_name=region, endpoint_url=endpoint, config=config)

    def put(self, name: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self.prefix + name, Body=data)

    def get(self, name: str) -> bytes | None:
        try:
            answer = self.client.get_object(Bucket=self.bucket, Key=self.prefix + name)
        except self.client.exceptions.NoSuchKey:
            return None
        data: bytes = answer["Body"].read()
        return data

    def names(self, prefix: str = "") -> list[str]:
        names: list[str] = []
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.prefix + prefix
        )
        for page in pages:
            names += [item["Key"][len(self.prefix) :] for item in page.get("Contents", ())]
        return sorted(names)

    def delete(self, names: list[str]) -> None:
        for first in range(0, len(names), 1000):
            chunk = names[first : first + 1000]
            self.client.delete_objects(
                Bucket=self.bucket,
                Delete={"Objects": [{"Key": self.prefix + n} for n in chunk], "Quiet": True},
            )


def target(url: str) -> Target:
    """The target a URL names: `s3://bucket/prefix?...`, `file:///path` or a plain path."""
    parts = urlsplit(url)
    if parts.scheme == "s3":
        if not parts.netloc:
            raise RejectedError(f"backup target {url!r}: no bucket (expected s3://bucket/prefix)")
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        unknown = set(query) - {"region", "endpoint"}
        if unknown:
            raise RejectedError(
                f"backup target {url!r}: unknown option {sorted(unknown)[0]!r} (region, endpoint)"
            )
        return S3Target(parts.netloc, parts.path, query.get("region"), query.get("endpoint"), url)
    if parts.scheme == "file":
        return LocalTarget(parts.path)
    if parts.scheme == "":
        return LocalTarget(url)
    raise RejectedError(f"backup target {url!r}: expected s3://bucket/prefix, file:///path or a directory")
