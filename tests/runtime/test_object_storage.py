"""Models in object storage, on a real S3 server (versitygw): an exported model pushed, fetched with its digest
checked, served from s3:// by `inferop serve` and called; each way a fetch fails gives its reason and advice."""

from __future__ import annotations

import socket
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import numpy as np
import pytest

from inferop_core.objectstore import FetchLimits, S3Endpoint, StorageError, fetch, push, sha256_file
from inferop_devtools.s3 import S3Server
from tests.helpers import MODEL_BUCKET, SERVE_EXTRA, TINY, ExportedRepo, inferop_with_credentials, wait_for

pytestmark = pytest.mark.integration

INFEROP = Path(sys.executable).with_name("inferop")
BUCKET = MODEL_BUCKET
QUICK = FetchLimits(timeout_seconds=30, attempts=2)


def test_export_records_the_model_files_digest_in_the_config(exported_tiny: ExportedRepo) -> None:
    from inferop_core.objectstore import recorded_digest

    model = exported_tiny.path / "conv_net"
    assert recorded_digest(model) == sha256_file(model / "1" / "model.onnx")


def test_export_uploads_what_it_verified_and_writes_a_manifest_that_fetches_it(s3: S3Server, tmp_path: Path) -> None:
    """`inferop export --storage-uri s3://... --upload`: the model directory in the bucket, and a manifest whose
    model.storage says where and with which Secret, and whose sha256 the fetched file matches."""
    import yaml

    uri = f"s3://{BUCKET}/uploaded/conv_net"
    tiny = [f"--{key}={value}" for key, value in TINY.items()]
    argv = ["export", "conv_net", *tiny, "--repo", str(tmp_path / "repo"), "--storage-uri", uri]
    argv += ["--upload", "--endpoint", s3.url, "--addressing", "path", "--credentials-secret", "model-store"]
    argv += ["--manifest", str(tmp_path / "conv-net.yaml")]
    result = inferop_with_credentials(s3, *argv, timeout=300)
    assert result.returncode == 0, result.stderr
    assert f"uploaded 2 objects to {uri}" in result.stderr
    model = yaml.safe_load((tmp_path / "conv-net.yaml").read_text())["spec"]["model"]
    assert model["storageUri"] == uri
    given = {"endpoint": s3.url, "addressing": "path", "credentialsSecret": "model-store"}
    assert {key: model["storage"].get(key) for key in given} == given  # beside the spelled-out defaults
    endpoint = S3Endpoint(url=s3.url, addressing="path")
    with pytest.MonkeyPatch.context() as env:
        for name, value in s3.credentials().items():
            env.setenv(name, value)
        fetched = fetch(uri, tmp_path / "fetched", endpoint, QUICK, sha256=model["sha256"])
    assert fetched.digests == {"1/model.onnx": model["sha256"]}


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--storage-uri", "hostpath:///models/x", "--upload"], "--upload needs --storage-uri s3://"),
        (["--upload"], "--upload needs --storage-uri s3://"),
        (["--storage-uri", "pvc://claim/x", "--credentials-secret", "s"], "--credentials-secret: only for an s3://"),
        (["--storage-uri", "s3://b/x", "--endpoint", "minio:9000"], "--endpoint 'minio:9000': String should match"),
        (["--storage-uri", "s3://b/x", "--credentials-secret", "Bad_Name"], "--credentials-secret 'Bad_Name'"),
    ],
)
def test_storage_options_without_an_s3_uri_are_refused_before_export(
    flags: list[str], named: str, tmp_path: Path
) -> None:
    result = subprocess.run(
        [str(INFEROP), "export", "conv_net", "--repo", str(tmp_path / "repo"), *flags],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 2 and named in result.stderr
    assert not (tmp_path / "repo").exists()  # nothing exported


def test_a_pushed_model_is_fetched_whole_with_its_digest_checked(signed: S3Server, pushed: str, tmp_path: Path) -> None:
    fetched = fetch(f"{pushed}/conv_net", tmp_path / "conv_net", signed.endpoint, QUICK)
    assert sorted(fetched.files) == ["1/model.onnx", "config.pbtxt"]
    assert fetched.digests == {"1/model.onnx": sha256_file(tmp_path / "conv_net" / "1" / "model.onnx")}
    stored = signed.root / BUCKET / "repo" / "conv_net" / "config.pbtxt"
    assert (tmp_path / "conv_net" / "config.pbtxt").read_bytes() == stored.read_bytes()


def test_serve_fetches_a_repository_from_s3_and_answers(signed: S3Server, pushed: str, tmp_path: Path) -> None:
    pytest.importorskip("pytriton", reason=SERVE_EXTRA)
    import tritonclient.http as httpclient

    from inferop.serving.tritonserver import free_port

    port = free_port()
    argv = [str(INFEROP), "serve", "--repo", pushed, "--endpoint", signed.url, "--http-port", str(port)]
    output = tmp_path / "serve.log"
    with open(output, "wb") as sink:
        server = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        wait_for(lambda: "tritonserver ready" in output.read_text() or server.poll() is not None, 120, "ready")
        assert server.poll() is None, output.read_text()
        assert "digests checked: conv_net/1/model.onnx sha256" in output.read_text()
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=30)
        try:
            board = np.zeros((1, 1, TINY["rows"], TINY["cols"]), dtype=np.float32)
            request = httpclient.InferInput("board", list(board.shape), "FP32")
            request.set_data_from_numpy(board)
            answer = client.infer("conv_net", [request])
            assert answer.as_numpy("policy").shape == (1, TINY["moves"])
        finally:
            client.close()
    finally:
        server.terminate()
        server.wait(30)


def test_a_byte_changed_in_the_bucket_is_refused_with_both_digests(
    signed: S3Server, exported_tiny: ExportedRepo, tmp_path: Path
) -> None:
    push(exported_tiny.path, f"s3://{BUCKET}/flipped", signed.endpoint)
    stored = signed.root / BUCKET / "flipped" / "conv_net" / "1" / "model.onnx"
    expected = sha256_file(stored)
    data = bytearray(stored.read_bytes())
    data[len(data) // 2] ^= 0x01
    stored.write_bytes(bytes(data))
    with pytest.raises(StorageError) as refused:
        fetch(f"s3://{BUCKET}/flipped/conv_net", tmp_path / "conv_net", signed.endpoint, QUICK)
    assert refused.value.reason == "DigestMismatch"
    message = str(refused.value)
    assert f"s3://{BUCKET}/flipped/conv_net/1/model.onnx" in message
    assert expected in message and sha256_file(stored) in message
    assert not (tmp_path / "conv_net").exists()  # nothing half-checked is left to serve


def test_a_digest_given_on_the_command_line_overrides_the_stored_config(
    signed: S3Server, pushed: str, tmp_path: Path
) -> None:
    """The operator passes the spec's digest: a config replaced in the bucket with the model cannot vouch for it."""
    result = subprocess.run(
        [str(INFEROP), "fetch", f"{pushed}/conv_net", str(tmp_path / "m"), "--endpoint", signed.url,
         "--sha256", "0" * 64, "--termination-log", str(tmp_path / "termination")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 1
    assert (tmp_path / "termination").read_text().startswith("DigestMismatch: ")
    assert "0" * 64 in result.stderr


@pytest.mark.parametrize(
    ("uri", "credentials", "reason"),
    [
        ("s3://no-such-bucket/conv_net", "right", "BucketNotFound"),
        (f"s3://{BUCKET}/no/such/model", "right", "ObjectNotFound"),
        (f"s3://{BUCKET}/repo/conv_net", "wrong", "AccessDenied"),
        (f"s3://{BUCKET}/repo/conv_net", "none", "AccessDenied"),
    ],
)
def test_each_refusal_of_the_server_has_its_reason(
    s3: S3Server,
    pushed: str,
    uri: str,
    credentials: str,
    reason: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    keys = s3.credentials()
    if credentials == "wrong":
        keys["AWS_SECRET_ACCESS_KEY"] = "not-" + keys["AWS_SECRET_ACCESS_KEY"]
    for name, value in keys.items():
        if credentials == "none":
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    with pytest.raises(StorageError) as refused:
        fetch(uri, tmp_path / "m", s3.endpoint, QUICK)
    assert refused.value.reason == reason
    assert s3.secret_key not in str(refused.value)


def test_an_endpoint_nobody_listens_on_is_unreachable_after_its_attempts(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: connections are refused
    with pytest.raises(StorageError) as refused:
        fetch(f"s3://{BUCKET}/repo", tmp_path / "m", S3Endpoint(url=f"http://127.0.0.1:{port}"), QUICK)
    assert refused.value.reason == "EndpointUnreachable"
    assert "create" not in str(refused.value) and "reaches it" in str(refused.value)


def test_a_server_that_never_answers_is_cut_off_at_the_deadline(tmp_path: Path) -> None:
    """Accepted and never answered: the deadline, not the socket's 60 s read timeout per attempt, ends it."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held: list[socket.socket] = []
    accepting = threading.Thread(target=lambda: [held.append(listener.accept()[0]) for _ in range(8)], daemon=True)
    accepting.start()
    endpoint = S3Endpoint(url=f"http://127.0.0.1:{listener.getsockname()[1]}")
    try:
        with pytest.raises(StorageError) as refused:
            fetch(f"s3://{BUCKET}/repo", tmp_path / "m", endpoint, FetchLimits(timeout_seconds=2, attempts=5))
        assert refused.value.reason == "DownloadTimeout"
        assert "not complete within 2 s" in str(refused.value)
    finally:
        listener.close()
        for connection in held:
            connection.close()


def test_a_model_over_the_size_limit_is_refused_before_it_is_read(
    signed: S3Server, pushed: str, tmp_path: Path
) -> None:
    stored = sum(p.stat().st_size for p in (signed.root / BUCKET / "repo" / "conv_net").rglob("*") if p.is_file())
    limits = FetchLimits(timeout_seconds=30, attempts=1, max_bytes=stored - 1)
    with pytest.raises(StorageError) as refused:
        fetch(f"{pushed}/conv_net", tmp_path / "m", signed.endpoint, limits)
    assert refused.value.reason == "TooLarge"
    assert f"{stored} bytes" in str(refused.value)
    fetch(f"{pushed}/conv_net", tmp_path / "m", signed.endpoint, FetchLimits(attempts=1, max_bytes=stored))


def test_a_tarball_over_http_is_fetched_and_checked(exported_tiny: ExportedRepo, tmp_path: Path) -> None:
    """A release asset or any web server: the model directory as a tarball, its one top-level folder stripped."""
    site = tmp_path / "site"
    site.mkdir()
    with tarfile.open(site / "conv_net.tar.gz", "w:gz") as tar:
        tar.add(exported_tiny.path / "conv_net", arcname="conv_net")
    port = free_tcp_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(site)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: port_open(port), 20, "http.server")
        fetched = fetch(f"http://127.0.0.1:{port}/conv_net.tar.gz", tmp_path / "m", limits=QUICK)
        assert sorted(fetched.files) == ["1/model.onnx", "config.pbtxt"]
        assert list(fetched.digests) == ["1/model.onnx"]
        with pytest.raises(StorageError) as missing:
            fetch(f"http://127.0.0.1:{port}/other.tar.gz", tmp_path / "n", limits=QUICK)
        assert missing.value.reason == "ObjectNotFound"
    finally:
        server.terminate()
        server.wait(10)


def free_tcp_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def port_open(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0
