"""Container images without a registry or a Docker engine.

An image here is one layer, a root filesystem assembled from files on this machine, written as the tar that
`docker save` writes (manifest.json, the image config, the layer) and imported into the node's containerd with
`ctr images import`. The layer is written in a fixed order with fixed owners and times, so the same files give the
same digest: the image's tag is its digest, an image is written once per content and imported once per node.

`ImageSpec` says what goes in; `write_archive` is the only part that reads files; `Images` keeps archives in the
cache and tells containerd about them.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import subprocess
import tarfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from inferop_core.errors import InferopError

# Where the images of the local node are named: no registry answers there, so a pod must not pull
# (imagePullPolicy: Never, or IfNotPresent with the image imported).
REGISTRY = "inferop.local"
# The namespace of containerd's images that its CRI plugin, and so the kubelet, sees.
CRI_NAMESPACE = "k8s.io"


class ImageError(InferopError, RuntimeError):
    """An image could not be written or imported; the message names the file or the command."""


@dataclass(frozen=True)
class ImageSpec:
    """An image: `files` maps each path in the image to a file or a directory on this machine (a directory is
    copied whole, symlinks kept as links) or to the bytes of a file; `links` maps paths to what their symbolic link
    points at; `directories` are made empty."""

    name: str
    files: Mapping[str, Path | bytes]
    entrypoint: tuple[str, ...]
    env: tuple[str, ...] = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",)
    workdir: str = "/"
    directories: tuple[str, ...] = ("tmp",)
    links: Mapping[str, str] = field(default_factory=dict)
    # Directories of a copied tree that go in empty: a root filesystem's device nodes and mount points, which the
    # runtime fills.
    emptied: tuple[str, ...] = ("dev", "proc", "sys")
    user: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)

    def fingerprint(self) -> str:
        """A digest of what the image is made of, from each source's path, size and modification time (cheap: no
        file is read), so an unchanged image is not written again."""
        digest = hashlib.sha256(json.dumps(self._settings(), sort_keys=True).encode())
        for target, source in sorted(self.files.items()):
            digest.update(target.encode())
            if isinstance(source, bytes):
                digest.update(hashlib.sha256(source).digest())
                continue
            for path in _walk(source.resolve()):
                info = path.lstat()
                digest.update(f"{path}\0{info.st_size}\0{info.st_mtime_ns}\0{info.st_mode}".encode())
        return digest.hexdigest()

    def _settings(self) -> dict[str, object]:
        return {"entrypoint": self.entrypoint, "env": self.env, "workdir": self.workdir, "user": self.user,
                "directories": self.directories, "links": dict(self.links), "labels": dict(self.labels),
                "emptied": self.emptied}  # fmt: skip

    def config(self, diff_id: str) -> dict[str, object]:
        """The image config (the OCI image spec's, which docker-archive carries as is)."""
        settings: dict[str, object] = {"Entrypoint": list(self.entrypoint), "Env": list(self.env),
                                       "WorkingDir": self.workdir, "Labels": dict(self.labels)}  # fmt: skip
        if self.user:
            settings["User"] = self.user
        return {
            "architecture": "amd64",
            "os": "linux",
            "config": settings,
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{"created_by": f"inferop image {self.name}"}],
        }


def _walk(source: Path) -> Iterator[Path]:
    """`source` and, for a directory, everything under it, in a fixed order; links are not followed."""
    if not source.exists() and not source.is_symlink():
        raise ImageError(f"{source}: no such file, needed in an image")
    yield source
    if source.is_dir() and not source.is_symlink():
        for root, directories, files in os.walk(source):
            directories.sort()
            for name in sorted([*directories, *files]):
                yield Path(root) / name


Source = Path | bytes | str | None  # a file or directory, a file's bytes, a link's target, an empty directory


def _entries(spec: ImageSpec) -> Iterator[tuple[PurePosixPath, Source]]:
    """Every entry of the layer: image path and its source. A source given for "" is the image's root."""
    emptied = [PurePosixPath(path.strip("/")) for path in spec.emptied]
    for directory in spec.directories:
        yield PurePosixPath(directory.strip("/")), None
    for link, target in spec.links.items():
        yield PurePosixPath(link.strip("/")), target
    for target, source in spec.files.items():
        inside = PurePosixPath(target.strip("/"))
        if isinstance(source, bytes):
            yield inside, source
            continue
        root = source.resolve()  # a link named as a source is followed; links inside a directory are kept
        for path in _walk(root):
            name = inside / path.relative_to(root)
            if str(name) != "." and not any(empty in name.parents for empty in emptied):
                yield name, path


def _tar_info(name: PurePosixPath, source: Source) -> tuple[tarfile.TarInfo, bytes | Path | None]:
    info = tarfile.TarInfo(str(name))
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    if source is None:
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        return info, None
    if isinstance(source, str):
        info.type, info.mode, info.linkname = tarfile.SYMTYPE, 0o777, source
        return info, None
    if isinstance(source, bytes):
        info.size, info.mode = len(source), 0o644
        return info, source
    mode = source.lstat().st_mode
    info.mode = stat.S_IMODE(mode)
    if stat.S_ISLNK(mode):
        info.type, info.linkname = tarfile.SYMTYPE, os.readlink(source)
        return info, None
    if stat.S_ISDIR(mode):
        info.type = tarfile.DIRTYPE
        return info, None
    if not stat.S_ISREG(mode):
        raise ImageError(f"{source}: neither a file, a directory nor a link; it cannot go in an image")
    info.size = source.stat().st_size
    return info, source


def _parents(entries: Sequence[tuple[PurePosixPath, Source]]) -> list[PurePosixPath]:
    """The directories above the entries that no entry makes: a tar needs each before what it holds."""
    named = {name for name, _ in entries}
    return sorted({p for name, _ in entries for p in name.parents if str(p) != "." and p not in named})


def write_layer(spec: ImageSpec, out: io.BufferedIOBase) -> str:
    """Write the image's layer (an uncompressed tar, parents before children) to `out`; returns its digest."""
    entries = list(_entries(spec))
    hashed = _Hashing(out)
    with tarfile.open(fileobj=hashed, mode="w|", format=tarfile.PAX_FORMAT) as layer:
        ordered: list[tuple[PurePosixPath, Source]] = [(p, None) for p in _parents(entries)]
        ordered += sorted(entries, key=lambda entry: entry[0].parts)
        directories: dict[PurePosixPath, bool] = {}  # each entry written, and whether it is a directory
        for name, source in ordered:
            info, content = _tar_info(name, source)
            if name in directories:
                if directories[name] and info.isdir():
                    continue  # a directory both made and copied is one directory
                raise ImageError(f"{spec.name}: /{name} is given twice")
            directories[name] = info.isdir()
            if isinstance(content, Path):
                with content.open("rb") as data:
                    layer.addfile(info, data)
            else:
                layer.addfile(info, io.BytesIO(content) if content is not None else None)
    return f"sha256:{hashed.digest.hexdigest()}"


class _Hashing(io.RawIOBase):
    """A writable stream that hashes what passes through it on its way to `out`."""

    def __init__(self, out: io.BufferedIOBase) -> None:
        self.out = out
        self.digest = hashlib.sha256()

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.digest.update(data)
        self.out.write(data)
        return len(data)


def write_archive(spec: ImageSpec, path: Path) -> str:
    """`spec` as a docker-archive tar at `path`, tagged with its digest; returns the image's reference."""
    layer_path = path.with_name(f".{path.name}.layer")
    try:
        with layer_path.open("wb") as layer:
            diff_id = write_layer(spec, layer)
        config = json.dumps(spec.config(diff_id), sort_keys=True).encode()
        config_name = f"{hashlib.sha256(config).hexdigest()}.json"
        reference = f"{REGISTRY}/{spec.name}:{config_name[:12]}"
        manifest = json.dumps([{"Config": config_name, "RepoTags": [reference], "Layers": ["layer.tar"]}]).encode()
        partial = path.with_name(f".{path.name}.partial")
        with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as archive:
            for name, content in ((config_name, config), ("manifest.json", manifest)):
                info = tarfile.TarInfo(name)
                info.size = len(content)
                archive.addfile(info, io.BytesIO(content))
            info = tarfile.TarInfo("layer.tar")
            info.size = layer_path.stat().st_size
            with layer_path.open("rb") as layer:
                archive.addfile(info, layer)
        partial.replace(path)
    finally:
        layer_path.unlink(missing_ok=True)
    return reference


def archive_reference(path: Path) -> str:
    """The reference a docker-archive at `path` is tagged with."""
    with tarfile.open(path) as archive:
        member = archive.extractfile("manifest.json")
        if member is None:
            raise ImageError(f"{path}: no manifest.json")
        (entry,) = json.load(member)
    reference: str = entry["RepoTags"][0]
    return reference


class Images:
    """The archives of `specs` in `cache` (written when their fingerprint is new), imported into the containerd
    that listens on `address` when it lacks them."""

    def __init__(self, cache: Path, ctr: str = "ctr") -> None:
        self.cache = cache
        self.ctr = ctr

    def archive(self, spec: ImageSpec) -> tuple[Path, str]:
        """The archive of `spec` and its reference, written now unless the cache has it."""
        self.cache.mkdir(parents=True, exist_ok=True)
        path = self.cache / f"{spec.name}-{spec.fingerprint()[:16]}.tar"
        if path.is_file():
            return path, archive_reference(path)
        for stale in self.cache.glob(f"{spec.name}-*.tar"):
            stale.unlink()
        return path, write_archive(spec, path)

    def imported(self, address: Path) -> set[str]:
        """The references containerd at `address` holds in the CRI's namespace."""
        listed = self._ctr(address, "images", "list", "--quiet")
        return set(listed.split())

    def ensure(self, address: Path, specs: Sequence[ImageSpec]) -> dict[str, str]:
        """Each spec's reference, by name, imported into containerd at `address` where it was not."""
        references: dict[str, str] = {}
        present = self.imported(address)
        for spec in specs:
            path, reference = self.archive(spec)
            if reference not in present:
                self._ctr(address, "images", "import", str(path))
            references[spec.name] = reference
        return references

    def _ctr(self, address: Path, *args: str) -> str:
        argv = [self.ctr, "--address", str(address), "--namespace", CRI_NAMESPACE, *args]
        result = subprocess.run(argv, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise ImageError(f"{' '.join(argv)} failed: {result.stderr.strip()[-1000:]}")
        return result.stdout
