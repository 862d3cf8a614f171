"""scripts/fetch.py and the build scripts' Go: what a fresh Debian 12 lacks (npm, unzip, a Go new enough) comes from
the registries, checked against their digests."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import io
import json
import os
import subprocess
import sys
import tarfile
import threading
import urllib.request
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType

import pytest

from inferop.paths import repo_root

SCRIPTS = repo_root() / "scripts"
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
# The Go that Debian 12 packages (scripts/kube-binaries.sh installs it for the 1.20 build): too old for the builds.
DEBIAN_GO = Path("/usr/lib/go-1.19/bin")


def load_fetch() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fetch", SCRIPTS / "fetch.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fetch = load_fetch()


def tarball(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, content in files.items():
            info = tarfile.TarInfo(f"package/{name}")
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


@pytest.fixture
def registry() -> Iterator[tuple[str, dict[str, bytes]]]:
    """An npm registry on 127.0.0.1 serving what the test puts in its dict (path -> body)."""
    served: dict[str, bytes] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = served.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", served
    finally:
        server.shutdown()


def publish(served: dict[str, bytes], url: str, content: bytes, integrity_of: bytes) -> None:
    served["/@scope%2Fpkg/1.0.0"] = json.dumps({"dist": {
        "tarball": f"{url}pkg-1.0.0.tgz",
        "integrity": "sha512-" + base64.b64encode(hashlib.sha512(integrity_of).digest()).decode(),
    }}).encode()  # fmt: skip
    served["/pkg-1.0.0.tgz"] = content


def run_fetch(*args: str, registry_url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NPM_CONFIG_REGISTRY": registry_url}
    command = [sys.executable, str(SCRIPTS / "fetch.py"), *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=60, check=False)


def test_an_npm_member_comes_only_from_a_tarball_that_matches_its_integrity(
    registry: tuple[str, dict[str, bytes]], tmp_path: Path
) -> None:
    url, served = registry
    good = tarball({"lib/layer.zip": b"the layer"})
    dest = tmp_path / "layer.zip"
    publish(served, url, good, integrity_of=good)
    assert run_fetch("npm", "@scope/pkg", "1.0.0", "lib/layer.zip", str(dest), registry_url=url).returncode == 0
    assert dest.read_bytes() == b"the layer"
    dest.unlink()
    publish(served, url, tarball({"lib/layer.zip": b"another layer"}), integrity_of=good)
    refused = run_fetch("npm", "@scope/pkg", "1.0.0", "lib/layer.zip", str(dest), registry_url=url)
    assert refused.returncode == 1
    assert "npm package @scope/pkg@1.0.0: the tarball's sha512 is not the registry's dist.integrity" in refused.stderr
    assert not dest.exists()
    publish(served, url, good, integrity_of=good)
    missing = run_fetch("npm", "@scope/pkg", "1.0.0", "lib/other.zip", str(dest), registry_url=url)
    assert "npm package @scope/pkg@1.0.0 has no lib/other.zip" in missing.stderr


def test_nothing_unpacks_outside_its_destination(tmp_path: Path) -> None:
    with pytest.raises(fetch.FetchError, match=r"'\.\./escape' would land outside"):
        fetch.unpacked_into(tmp_path / "dest", {"ok": b"", "../escape": b""}, set())
    assert not (tmp_path / "dest").exists() and not (tmp_path / "escape").exists()


@pytest.mark.integration
def test_the_module_hash_is_the_one_go_sum_records() -> None:
    """dirhash's Hash1 of a module zip from the proxy, against the go.sum line every Go user has seen."""
    with urllib.request.urlopen("https://proxy.golang.org/rsc.io/quote/@v/v1.5.2.zip", timeout=60) as answer:
        archive = zipfile.ZipFile(io.BytesIO(answer.read()))
    assert fetch.module_hash(archive) == "h1:w5fcysjrx7yqtD/aO+QwRjYZOKnaM9Uh2b40tElTs3Y="


@pytest.mark.integration
def test_builds_without_a_new_enough_go_use_one_from_the_module_proxy(tmp_path: Path) -> None:
    """No go on PATH, then Debian's 1.19 first on it: the builds' Go is the proxy's, fetched once into the cache."""
    assert (DEBIAN_GO / "go").exists(), "make tools installs Debian's Go 1.19 (scripts/kube-binaries.sh)"
    script = f"""
        SCRIPT=test; source {SCRIPTS / "go-cache.sh"}
        use_go; command -v go; go env GOVERSION
        PATH={DEBIAN_GO}:$PATH; go env GOVERSION; use_go; go env GOVERSION
    """
    env = {"HOME": os.environ["HOME"], "PATH": SYSTEM_PATH, "INFEROP_CACHE": str(tmp_path)}
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    root = tmp_path / "go" / "go1.26.8"
    assert result.stdout.split() == [str(root / "bin" / "go"), "go1.26.8", "go1.19.8", "go1.26.8"], result.stdout
    assert result.stderr.count("fetching Go 1.26.8 from the Go module proxy") == 1, result.stderr
