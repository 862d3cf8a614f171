"""Object-storage URIs, limits and the checks on what arrives, without a server: each refusal names the value."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from inferop_core.objectstore import (
    ADVICE,
    FetchLimits,
    ObjectUriError,
    S3Endpoint,
    StorageError,
    _extract,
    parse_object_uri,
    sha256_file,
    verify_digests,
)
from inferop_core.tritonconfig import MODEL_SHA256_PARAMETER


@pytest.mark.parametrize(
    ("text", "bucket", "key", "tarball"),
    [
        ("s3://models/conv_net", "models", "conv_net", False),
        ("s3://models/team/conv_net/", "models", "team/conv_net", False),
        ("s3://models", "models", "", False),
        ("s3://models/conv_net.tar.gz", "models", "conv_net.tar.gz", True),
        ("https://example.com/releases/conv_net.tgz", "example.com", "releases/conv_net.tgz", True),
    ],
)
def test_uris_name_a_bucket_and_a_key(text: str, bucket: str, key: str, tarball: bool) -> None:
    uri = parse_object_uri(text)
    assert (uri.bucket, uri.key, uri.is_tarball) == (bucket, key, tarball)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("gs://models/x", "expected s3://"),
        ("s3://", "expected s3://"),
        ("s3://Models/x", "bucket 'Models'"),
        ("s3://ab/x", "bucket 'ab'"),
        ("s3://models/../etc", "'..'"),
        ("https://example.com/models/conv_net/", "must be a tarball"),
    ],
)
def test_a_uri_inferop_cannot_fetch_is_refused_by_name(text: str, named: str) -> None:
    with pytest.raises(ObjectUriError, match=named.replace(".", r"\.").replace("(", r"\(")):
        parse_object_uri(text)


@pytest.mark.parametrize(
    ("endpoint", "host", "tls"),
    [
        (S3Endpoint(), "s3.amazonaws.com", True),
        (S3Endpoint(region="eu-west-1"), "s3.eu-west-1.amazonaws.com", True),
        (S3Endpoint(url="http://minio.storage:9000"), "minio.storage:9000", False),
        (S3Endpoint(url="https://s3.example.com/"), "s3.example.com", True),
    ],
)
def test_endpoints(endpoint: S3Endpoint, host: str, tls: bool) -> None:
    assert endpoint.host() == (host, tls)


def test_an_endpoint_with_a_path_is_refused() -> None:
    with pytest.raises(ObjectUriError, match="'http://minio:9000/bucket'"):
        S3Endpoint(url="http://minio:9000/bucket").host()


@pytest.mark.parametrize("limits", [{"timeout_seconds": 0}, {"attempts": 0}, {"max_bytes": 0}])
def test_limits_must_be_positive(limits: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        FetchLimits(**limits)  # type: ignore[arg-type]


def test_every_reason_carries_advice() -> None:
    error = StorageError("AccessDenied", "s3://models/x", "the server refused the credentials (AccessDenied)")
    assert str(error) == f"s3://models/x: the server refused the credentials (AccessDenied): {ADVICE['AccessDenied']}"
    assert error.with_reason() == f"AccessDenied: {error}"


def model_dir(root: Path, digest: str | None, content: bytes = b"onnx") -> Path:
    (root / "1").mkdir(parents=True)
    (root / "1" / "model.onnx").write_bytes(content)
    parameter = f'parameters {{ key: "{MODEL_SHA256_PARAMETER}" value {{ string_value: "{digest}" }} }}\n'
    (root / "config.pbtxt").write_text('name: "m"\n' + (parameter if digest else ""))
    return root


def test_digests_come_from_the_config_or_the_caller(tmp_path: Path) -> None:
    uri = parse_object_uri("s3://models/m")
    folder = model_dir(tmp_path / "m", digest=None)
    found = sha256_file(folder / "1" / "model.onnx")
    assert verify_digests(folder, uri) == {}  # nothing recorded: nothing checked, and the report says so
    assert verify_digests(folder, uri, sha256=found) == {"1/model.onnx": found}
    with pytest.raises(StorageError, match=f"SHA-256 {found}, but the model was exported as {'1' * 64}") as wrong:
        verify_digests(folder, uri, sha256="1" * 64)
    assert wrong.value.uri == "s3://models/m/1/model.onnx"
    recorded = model_dir(tmp_path / "r", digest="2" * 64)
    with pytest.raises(StorageError, match=f"exported as {'2' * 64}") as recorded_wrong:
        verify_digests(recorded, uri)
    assert recorded_wrong.value.reason == "DigestMismatch"


def test_a_folder_without_a_model_is_not_a_model(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(StorageError, match=r"no <version>/model\.onnx") as refused:
        verify_digests(tmp_path, parse_object_uri("s3://models/m"))
    assert refused.value.reason == "NotAModel"


def test_a_tarball_cannot_write_outside_its_folder(tmp_path: Path) -> None:
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        entry = tarfile.TarInfo("../escaped.txt")
        entry.size = 1
        tar.addfile(entry, io.BytesIO(b"x"))
    archive.seek(0)
    (tmp_path / "into").mkdir()
    with pytest.raises(StorageError, match="not a readable tarball") as refused:
        _extract(archive, tmp_path / "into", parse_object_uri("https://example.com/m.tar"))
    assert refused.value.reason == "NotAModel"
    assert not (tmp_path / "escaped.txt").exists()
