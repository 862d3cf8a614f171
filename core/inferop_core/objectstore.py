"""Models in object storage: fetch a model directory from `s3://` or `http(s)://` before a server starts, and push one.

A fetch is bounded three ways: a deadline for the whole download, retries with exponential back-off for connections
that fail or answer 5xx (urllib3's, under the MinIO SDK's signing), and a size limit checked on the listing before
any byte is read and again on what arrives. It writes into a fresh folder beside the destination and renames it into
place only when complete, so a server never sees half a model. Each failure is a `StorageError` with a `reason` from
`ADVICE`, which the command line prints and the operator turns into a condition.

Integrity beyond the transport: `inferop export` records the model file's SHA-256; `verify_digests` compares each
fetched `<version>/model.onnx` with it, so a half-written upload or a replaced object is refused with both digests.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import tarfile
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Literal, Protocol

import urllib3
from minio import Minio
from minio.credentials import EnvAWSProvider
from minio.error import S3Error

from inferop_core.errors import InferopError
from inferop_core.quantity import format_bytes
from inferop_core.tritonconfig import MODEL_FILENAME, MODEL_SHA256_PARAMETER, parse_model_config

OBJECT_SCHEMES = ("s3", "https", "http")
TARBALL_SUFFIXES = (".tar", ".tar.gz", ".tgz")
CONFIG_FILENAME = "config.pbtxt"
CHUNK_BYTES = 1 << 20
# What a reason means for the user, and what to do; the operator's condition carries the same words.
ADVICE: dict[str, str] = {
    "BucketNotFound": (
        "create the bucket, or correct the bucket in the URI (and the endpoint, for an S3-compatible server)"
    ),
    "ObjectNotFound": "push the model there (inferop push), or correct the URI's path",
    "AccessDenied": (
        "check the credentials (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, from the Secret the spec names) "
        "and that they may list the bucket and read its objects"
    ),
    "EndpointUnreachable": "check the endpoint's address and port, and that the pod's network reaches it",
    "DigestMismatch": (
        "the stored model is not the one exported: push the exported model again, or export again and use the "
        "digest it records"
    ),
    "DownloadTimeout": "raise the download timeout, or check the storage's bandwidth",
    "TooLarge": "raise the size limit, or check that the URI names the model and not a larger folder",
    "ServerError": "the storage server failed the request; its answer is quoted",
    "NotAModel": "the URI must name a model directory (config.pbtxt and <version>/model.onnx) or a tarball of one",
}


class StorageError(InferopError, RuntimeError):
    """A model could not be fetched or pushed, or what was fetched is not what was exported."""

    def __init__(self, reason: str, uri: str, detail: str) -> None:
        self.reason, self.uri, self.detail = reason, uri, detail
        super().__init__(f"{uri}: {detail}: {ADVICE[reason]}")

    def with_reason(self) -> str:
        """`<reason>: <message>`, as the command line prints it and a pod's termination log carries it."""
        return f"{self.reason}: {self}"


class ObjectUriError(InferopError, ValueError):
    """A storage URI that is not one of the forms inferop fetches."""


@dataclass(frozen=True)
class ObjectUri:
    """`s3://bucket/key` or `http(s)://host/path`; `key` is the object or prefix within the bucket."""

    text: str
    scheme: str
    bucket: str  # the host for http(s)
    key: str

    @property
    def is_tarball(self) -> bool:
        return self.key.endswith(TARBALL_SUFFIXES)

    def child(self, relative: str) -> str:
        """The URI of an object below this prefix, as messages name it."""
        return f"{self.text.rstrip('/')}/{relative}"


def is_object_uri(text: str) -> bool:
    return text.partition("://")[0] in OBJECT_SCHEMES and "://" in text


def parse_object_uri(text: str) -> ObjectUri:
    scheme, _, rest = text.partition("://")
    if scheme not in OBJECT_SCHEMES or not rest:
        raise ObjectUriError(f"{text!r}: expected s3://bucket/path, https://host/model.tar.gz or http://...")
    bucket, _, key = rest.partition("/")
    if scheme == "s3":
        # S3's bucket naming rules, which every S3-compatible server follows
        if not (3 <= len(bucket) <= 63) or not all(c.islower() or c.isdigit() or c in ".-" for c in bucket):
            raise ObjectUriError(f"{text!r}: bucket {bucket!r} must be 3-63 lower-case letters, digits, '.' or '-'")
        if ".." in key.split("/"):
            raise ObjectUriError(f"{text!r}: the path must not contain '..'")
    elif not key.endswith(TARBALL_SUFFIXES):
        raise ObjectUriError(f"{text!r}: an {scheme}:// model must be a tarball ({', '.join(TARBALL_SUFFIXES)})")
    return ObjectUri(text=text, scheme=scheme, bucket=bucket, key=key.strip("/") if scheme == "s3" else key)


@dataclass(frozen=True)
class S3Endpoint:
    """Where an S3 API answers: AWS by region when `url` is None, or an S3-compatible server."""

    url: str | None = None  # http(s)://host[:port]
    region: str | None = None
    addressing: Literal["auto", "path", "virtual"] = "auto"  # auto: virtual-hosted for AWS, path-style elsewhere

    def host(self) -> tuple[str, bool]:
        """The SDK's endpoint (host[:port]) and whether it is TLS."""
        if self.url is None:
            return (f"s3.{self.region}.amazonaws.com" if self.region else "s3.amazonaws.com"), True
        parsed = urllib.parse.urlsplit(self.url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc or parsed.path not in ("", "/"):
            raise ObjectUriError(f"endpoint {self.url!r}: expected http(s)://host[:port] with no path")
        return parsed.netloc, parsed.scheme == "https"


@dataclass(frozen=True)
class FetchLimits:
    timeout_seconds: float = 300.0  # the whole download, every attempt together
    attempts: int = 5  # per request, with exponential back-off between them
    max_bytes: int | None = None  # what the listing and the download may add up to

    def __post_init__(self) -> None:
        if self.timeout_seconds <= 0 or self.attempts < 1 or (self.max_bytes is not None and self.max_bytes < 1):
            raise ValueError(f"fetch limits must be positive: {self}")


@dataclass
class Fetched:
    destination: Path
    files: list[str] = field(default_factory=list)
    bytes: int = 0
    seconds: float = 0.0
    digests: dict[str, str] = field(default_factory=dict)  # model file -> the SHA-256 checked

    def summary(self, uri: str) -> str:
        """One line for a person: what came, how fast, and which digests were checked."""
        checked = ", ".join(f"{name} sha256 {digest[:16]}" for name, digest in self.digests.items())
        return (
            f"fetched {uri}: {len(self.files)} files, {format_bytes(self.bytes)} in {self.seconds:.1f} s into "
            f"{self.destination} (digests checked: {checked or 'none recorded'})"
        )


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for chunk in iter(lambda: stream.read(CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()


class _Deadline:
    """The whole download's deadline: checked between chunks, and in the main thread also by a timer signal, so a
    read that stalls inside the client is cut off at the deadline rather than at its socket timeout."""

    def __init__(self, uri: str, seconds: float) -> None:
        self.uri, self.seconds = uri, seconds
        self.end = time.monotonic() + seconds

    def remaining(self) -> float:
        left = self.end - time.monotonic()
        if left <= 0:
            raise self.expired()
        return left

    def expired(self) -> StorageError:
        return StorageError("DownloadTimeout", self.uri, f"not complete within {self.seconds:g} s")

    @contextlib.contextmanager
    def armed(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def expire(signum: int, frame: FrameType | None) -> None:
            raise self.expired()

        previous = signal.signal(signal.SIGALRM, expire)
        signal.setitimer(signal.ITIMER_REAL, self.seconds)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


class _Readable(Protocol):
    def read(self, size: int, /) -> bytes: ...


def _copy(source: _Readable, target: IO[bytes], uri: str, budget: _Budget, deadline: _Deadline) -> int:
    copied = 0
    while chunk := source.read(CHUNK_BYTES):
        deadline.remaining()
        budget.spend(len(chunk))
        target.write(chunk)
        copied += len(chunk)
    return copied


@dataclass
class _Budget:
    uri: str
    max_bytes: int | None
    spent: int = 0

    def spend(self, count: int) -> None:
        self.spent += count
        if self.max_bytes is not None and self.spent > self.max_bytes:
            raise StorageError("TooLarge", self.uri, f"more than the limit of {self.max_bytes} bytes")


def _s3_client(endpoint: S3Endpoint, limits: FetchLimits) -> Minio:
    """The MinIO SDK's client over a urllib3 pool with the limits' timeouts and back-off. Credentials come from
    AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN) when set, else requests are anonymous."""
    host, secure = endpoint.host()
    retries = urllib3.Retry(
        total=limits.attempts - 1,
        connect=limits.attempts - 1,
        read=limits.attempts - 1,
        status=limits.attempts - 1,
        backoff_factor=0.5,
        backoff_max=10,
        status_forcelist=(500, 502, 503, 504),
        allowed_methods=None,  # S3's GET, HEAD and PUT of a whole object are idempotent
    )
    timeout = urllib3.Timeout(connect=min(10.0, limits.timeout_seconds), read=min(60.0, limits.timeout_seconds))
    pool = urllib3.PoolManager(timeout=timeout, retries=retries, maxsize=4)
    credentials = EnvAWSProvider() if os.environ.get("AWS_ACCESS_KEY_ID") else None
    client = Minio(host, secure=secure, region=endpoint.region, http_client=pool, credentials=credentials)
    if endpoint.addressing == "path":
        client.disable_virtual_style_endpoint()
    elif endpoint.addressing == "virtual":
        client.enable_virtual_style_endpoint()
    return client


def _s3_failure(uri: ObjectUri, error: Exception) -> StorageError:
    """The reason behind an SDK or connection error, or the error itself re-raised when it is not one we know."""
    if isinstance(error, S3Error):
        code = error.code or ""
        if code == "NoSuchBucket":
            return StorageError("BucketNotFound", uri.text, f"bucket {uri.bucket!r} does not exist")
        if code in ("NoSuchKey", "NoSuchObject"):
            return StorageError("ObjectNotFound", uri.text, f"no object {error.object_name or uri.key!r}")
        if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled"):
            return StorageError("AccessDenied", uri.text, f"the server refused the credentials ({code})")
        return StorageError("ServerError", uri.text, f"the server answered {code}: {error.message}")
    if isinstance(error, (urllib3.exceptions.HTTPError, OSError)):
        return StorageError("EndpointUnreachable", uri.text, f"{type(error).__name__}: {error}")
    raise error


def _s3_fetch(uri: ObjectUri, target: Path, endpoint: S3Endpoint, limits: FetchLimits, deadline: _Deadline) -> int:
    client = _s3_client(endpoint, limits)
    budget = _Budget(uri.text, limits.max_bytes)
    try:
        if uri.is_tarball:
            return _s3_tarball(client, uri, target, budget, deadline)
        prefix = f"{uri.key}/" if uri.key else ""
        objects = [o for o in client.list_objects(uri.bucket, prefix=prefix, recursive=True) if not o.is_dir]
        if not objects:
            raise StorageError("ObjectNotFound", uri.text, f"no object under {prefix or 'the bucket'!r}")
        listed = sum(o.size or 0 for o in objects)
        if limits.max_bytes is not None and listed > limits.max_bytes:
            detail = f"{len(objects)} objects of {listed} bytes, over the limit of {limits.max_bytes}"
            raise StorageError("TooLarge", uri.text, detail)
        for stored in objects:
            relative = stored.object_name[len(prefix) :]
            path = _inside(target, relative, uri)
            path.parent.mkdir(parents=True, exist_ok=True)
            response = client.get_object(uri.bucket, stored.object_name)
            try:
                with path.open("wb") as out:
                    _copy(response, out, uri.child(relative), budget, deadline)
            finally:
                response.close()
                response.release_conn()
    except StorageError:
        raise
    except Exception as error:  # classified, or re-raised when unknown
        raise _s3_failure(uri, error) from error
    return budget.spent


def _s3_tarball(client: Minio, uri: ObjectUri, target: Path, budget: _Budget, deadline: _Deadline) -> int:
    with tempfile.TemporaryFile() as archive:
        response = client.get_object(uri.bucket, uri.key)
        try:
            _copy(response, archive, uri.text, budget, deadline)
        finally:
            response.close()
            response.release_conn()
        archive.seek(0)
        _extract(archive, target, uri)
    return budget.spent


def _http_fetch(uri: ObjectUri, target: Path, limits: FetchLimits, deadline: _Deadline) -> int:
    """A tarball over HTTP(S): retried with back-off on connection errors and 5xx answers, within the deadline."""
    budget = _Budget(uri.text, limits.max_bytes)
    for attempt in range(limits.attempts):
        budget.spent = 0
        try:
            with urllib.request.urlopen(uri.text, timeout=min(60.0, deadline.remaining())) as response:
                length = response.headers.get("Content-Length")
                if length and limits.max_bytes is not None and int(length) > limits.max_bytes:
                    raise StorageError("TooLarge", uri.text, f"{length} bytes, over {limits.max_bytes}")
                with tempfile.TemporaryFile() as archive:
                    _copy(response, archive, uri.text, budget, deadline)
                    archive.seek(0)
                    _extract(archive, target, uri)
                return budget.spent
        except urllib.error.HTTPError as error:
            if error.code == 404:
                raise StorageError("ObjectNotFound", uri.text, "the server answered 404") from error
            if error.code in (401, 403):
                raise StorageError("AccessDenied", uri.text, f"the server answered {error.code}") from error
            failure = StorageError("EndpointUnreachable", uri.text, f"the server answered {error.code}")
            if error.code < 500:
                raise failure from error
        except (TimeoutError, urllib.error.URLError, ConnectionError) as error:
            failure = StorageError("EndpointUnreachable", uri.text, f"{type(error).__name__}: {error}")
        if attempt + 1 < limits.attempts:
            time.sleep(min(0.5 * 2**attempt, 10.0, deadline.remaining()))
    raise failure


def _inside(root: Path, relative: str, uri: ObjectUri) -> Path:
    path = (root / relative).resolve()
    if not relative or not path.is_relative_to(root.resolve()):
        raise StorageError("NotAModel", uri.text, f"object {relative!r} would be written outside the model folder")
    return path


def _extract(archive: IO[bytes], target: Path, uri: ObjectUri) -> None:
    """Unpack with tarfile's `data` filter (no absolute paths, links out of the folder or device files). A tarball
    may hold the model directory's files at its root or inside one top-level folder."""
    try:
        with tarfile.open(fileobj=archive) as tar:
            tar.extractall(target, filter="data")
    except (tarfile.TarError, OSError) as error:
        raise StorageError("NotAModel", uri.text, f"not a readable tarball: {error}") from error
    entries = list(target.iterdir())
    if len(entries) == 1 and entries[0].is_dir() and not (target / CONFIG_FILENAME).exists():
        inner = entries[0]
        for item in list(inner.iterdir()):
            item.rename(target / item.name)
        inner.rmdir()


def fetch(
    text: str,
    destination: Path,
    endpoint: S3Endpoint | None = None,
    limits: FetchLimits | None = None,
    sha256: str | None = None,
) -> Fetched:
    """Fetch the model directory (or a repository of them) at `text` into `destination`, replacing what is there,
    and check each model file against `sha256` or else the digest its config records. Nothing is left at
    `destination` unless all of it arrived and passed."""
    uri = parse_object_uri(text)
    limits = limits or FetchLimits()
    deadline = _Deadline(uri.text, limits.timeout_seconds)
    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{destination.name}.", dir=destination.parent))
    start = time.perf_counter()
    try:
        with deadline.armed():
            if uri.scheme == "s3":
                size = _s3_fetch(uri, staging, endpoint or S3Endpoint(), limits, deadline)
            else:
                size = _http_fetch(uri, staging, limits, deadline)
        digests = verify_digests(staging, uri, sha256)
        if destination.exists():
            shutil.rmtree(destination)
        staging.rename(destination)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    files = sorted(str(p.relative_to(destination)) for p in destination.rglob("*") if p.is_file())
    return Fetched(destination, files, size, round(time.perf_counter() - start, 3), digests)


def model_files(folder: Path) -> list[Path]:
    """The `<version>/model.onnx` files of a model directory, or of each model directory in a repository."""
    return sorted(
        path
        for path in folder.rglob(MODEL_FILENAME)
        if path.parent.name.isdigit() and (path.parent.parent / CONFIG_FILENAME).is_file()
    )


def recorded_digest(model_dir: Path) -> str | None:
    """The model file's SHA-256 as export recorded it in the model's config, or None."""
    config = parse_model_config((model_dir / CONFIG_FILENAME).read_text())
    parameter = config.parameters.get(MODEL_SHA256_PARAMETER)
    return parameter.string_value if parameter is not None and parameter.string_value else None


def verify_digests(folder: Path, uri: ObjectUri, sha256: str | None = None) -> dict[str, str]:
    """Each model file's SHA-256 against `sha256` (one model) or its config's recorded digest; a model with neither
    is not checked. Raises DigestMismatch naming the object and both digests."""
    files = model_files(folder)
    if not files:
        raise StorageError("NotAModel", uri.text, f"no <version>/{MODEL_FILENAME} beside a {CONFIG_FILENAME}")
    if sha256 is not None and len({f.parent.parent for f in files}) > 1:
        raise StorageError("NotAModel", uri.text, "one digest was given for a repository of several models")
    checked: dict[str, str] = {}
    for path in files:
        expected = sha256 or recorded_digest(path.parent.parent)
        relative = str(path.relative_to(folder))
        if expected is None:
            continue
        found = sha256_file(path)
        if found != expected:
            raise StorageError(
                "DigestMismatch", uri.child(relative), f"SHA-256 {found}, but the model was exported as {expected}"
            )
        checked[relative] = found
    return checked


def push(folder: Path, text: str, endpoint: S3Endpoint | None = None, limits: FetchLimits | None = None) -> list[str]:
    """Upload a model directory (or a repository) to `s3://bucket/prefix`, configs last: until the last config is
    written, a fetch of what is there finds no complete model. Returns the object URIs written."""
    uri = parse_object_uri(text)
    if uri.scheme != "s3":
        raise ObjectUriError(f"{text!r}: models are pushed to s3://bucket/path")
    if not model_files(folder):
        raise StorageError("NotAModel", str(folder), f"no <version>/{MODEL_FILENAME} beside a {CONFIG_FILENAME}")
    limits = limits or FetchLimits()
    client = _s3_client(endpoint or S3Endpoint(), limits)
    files = sorted((p for p in folder.rglob("*") if p.is_file()), key=lambda p: (p.name == CONFIG_FILENAME, str(p)))
    written: list[str] = []
    try:
        for path in files:
            relative = str(path.relative_to(folder))
            key = f"{uri.key}/{relative}" if uri.key else relative
            client.fput_object(uri.bucket, key, str(path))
            written.append(uri.child(relative))
    except Exception as error:  # classified, or re-raised when unknown
        raise _s3_failure(uri, error) from error
    return written
