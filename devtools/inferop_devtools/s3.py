"""A real S3 server on one machine: versity's versitygw (scripts/s3-server.sh) over a throw-away directory.

Buckets are folders of that directory and objects its files, so a test can change a stored byte behind the
server's back, as a replaced or half-written object would be. Requests are signed with AWS Signature V4 against one
root account whose keys the runner makes up.
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
from pathlib import Path
from types import TracebackType

from minio import Minio

from inferop_core.objectstore import S3Endpoint
from inferop_devtools.cluster.addons import Daemon
from inferop_devtools.cluster.controlplane import free_ports, http_get
from inferop_devtools.cluster.tools import built

HEALTH_PATH = "/health"
READY_TIMEOUT_S = 30.0


def versitygw(build: bool = False) -> Path:
    return built("s3-server.sh", "versitygw (an S3 server)", build) / "versitygw"


class S3Server:
    """versitygw's posix backend on `address` (127.0.0.1, or an address pods reach); `root` is the folder that holds
    the buckets. Use as a context manager, or `start()` / `stop()`; the folder and the log are removed on stop. A
    server that exits or never answers raises ClusterError with its log's tail."""

    def __init__(self, region: str = "us-east-1", address: str = "127.0.0.1") -> None:
        self.region = region
        self.address = address
        self.access_key = f"inferop{secrets.token_hex(4)}"
        self.secret_key = secrets.token_hex(16)
        self.port = 0
        self.daemon: Daemon | None = None
        self._workdir: Path | None = None

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"

    @property
    def root(self) -> Path:
        assert self._workdir is not None, "the server is not started"
        return self._workdir / "buckets"

    @property
    def endpoint(self) -> S3Endpoint:
        return S3Endpoint(url=self.url, region=self.region, addressing="path")

    def credentials(self) -> dict[str, str]:
        """The environment an S3 client signs with."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key}

    def client(self) -> Minio:
        return Minio(
            f"{self.address}:{self.port}",
            access_key=self.access_key,
            secret_key=self.secret_key,
            secure=False,
            region=self.region,
        )

    def make_bucket(self, name: str) -> None:
        self.client().make_bucket(name)

    def start(self, timeout: float = READY_TIMEOUT_S) -> S3Server:
        binary = versitygw()
        self._workdir = Path(tempfile.mkdtemp(prefix="inferop-s3-"))
        self.root.mkdir()
        (self._workdir / "meta").mkdir()
        self.port = self.port or free_ports(1)[0]
        argv = [
            str(binary),
            "--port", f"{self.address}:{self.port}",
            "--access", self.access_key,
            "--secret", self.secret_key,
            "--region", self.region,
            "--health", HEALTH_PATH,
            "--quiet",
            "posix", "--sidecar", str(self._workdir / "meta"), str(self.root),
        ]  # fmt: skip
        self.daemon = Daemon(argv, self._workdir / "versitygw.log")
        try:
            self.daemon.start()
            self.daemon.wait(lambda: http_get(f"{self.url}{HEALTH_PATH}")[0] == 200, "versitygw", timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.daemon is not None:
            self.daemon.stop()
            self.daemon = None
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()
