"""Linux namespaces that let real pod addresses and a pod's absolute paths exist on this machine, changing nothing
outside them.

- `enter_private_network`: the calling process moves into a network namespace of its own, with only `lo`, where
  the pod CIDR is routed to `lo` as AnyIP (`ip route add local CIDR dev lo`). Every address a fake pod gets is then
  local: a backend process can bind its pod's IP, which an EndpointSlice accepts (it refuses loopback addresses),
  and Envoy reaches it as it would reach a pod. Everything started afterwards inherits the namespace, and it
  vanishes with the last of those processes: no host route, interface or iptables rule is touched.
- `private_root_argv`: wraps a command so it runs in a mount namespace of its own whose `/` is the host's plus
  bind mounts at absolute paths that do not exist on the host (`/certs`, `/sds`) or must differ there
  (`/etc/hosts`). Envoy Gateway reads its xDS certificates from a fixed `/certs`, and the Envoy it renders
  reads `/certs` and `/sds`: a pod's volumes, as the kubelet would mount them, with the command left untouched.

Both need root (CAP_SYS_ADMIN), as the kubelet does, and util-linux's unshare and mount and iproute2's ip.
"""

from __future__ import annotations

import argparse
import ctypes
import ipaddress
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from inferop_core.errors import InferopError

# <sched.h>: unshare(2)'s flag for a new network namespace.
CLONE_NEWNET = 0x40000000


class NamespaceError(InferopError, RuntimeError):
    """A namespace could not be made; the message says what was refused."""


def enter_private_network(pod_cidrs: Sequence[str]) -> None:
    """Move this process (and whatever it starts from now on) into a fresh network namespace with `lo` up and each
    of `pod_cidrs` routed to `lo` as local addresses.

    Call it before any thread starts: unshare(2) moves the calling thread only, and threads started earlier stay
    in the host's namespace."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise NamespaceError(f"unshare(CLONE_NEWNET) failed: {os.strerror(errno)} (needs root or CAP_SYS_ADMIN)")
    _ip("link", "set", "lo", "up")
    for cidr in pod_cidrs:
        network = ipaddress.ip_network(cidr, strict=False)
        _ip("route", "add", "local", str(network), "dev", "lo")


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise NamespaceError(f"ip {' '.join(args)} failed: {result.stderr.strip()}")


def private_root_argv(root: Path, binds: Mapping[str, Path], argv: Sequence[str]) -> list[str]:
    """`argv` run by `unshare` in a private mount namespace whose `/` is built at `root` (an empty directory) from
    the host's top-level entries plus `binds` (absolute path inside -> file or directory outside)."""
    bind_args = [f"--bind={source}:{target}" for target, source in binds.items()]
    return [
        "unshare",
        "--mount",
        "--propagation=private",
        sys.executable,
        "-m",
        __name__,
        f"--root={root}",
        *bind_args,
        "--",
        *argv,
    ]


def _mount(*args: str) -> None:
    result = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise NamespaceError(f"mount {' '.join(args)} failed: {result.stderr.strip()}")


def build_root(root: Path, binds: Mapping[str, Path]) -> None:
    """Inside a private mount namespace: a tmpfs at `root` holding the host's `/` entry by entry (recursive bind
    mounts, symlinks copied), then `binds` on top. Made unbindable first, so the recursive binds of `/tmp` or
    `/root` (where `root` may live) do not copy it into itself."""
    _mount("-t", "tmpfs", "-o", "mode=0755", "inferop-root", str(root))
    _mount("--make-unbindable", str(root))
    for entry in sorted(Path("/").iterdir()):
        target = root / entry.name
        if entry.is_symlink():
            target.symlink_to(os.readlink(entry))
        elif entry.is_dir():
            target.mkdir()
            _mount("--rbind", str(entry), str(target))
        else:
            target.touch()
            _mount("--bind", str(entry), str(target))
    for inside, source in binds.items():
        target = root / inside.lstrip("/")
        if source.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.touch(exist_ok=True)
        _mount("--bind", str(source), str(target))


def main(args: Sequence[str] | None = None) -> None:
    """Entry point of `private_root_argv`: build the root, enter it, keep the working directory, exec."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--bind", action="append", default=[], help="SOURCE:TARGET")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    options = parser.parse_args(args)
    command = options.command[1:] if options.command[:1] == ["--"] else options.command
    binds = {target: Path(source) for source, target in (bind.rsplit(":", 1) for bind in options.bind)}
    cwd = os.getcwd()
    build_root(options.root, binds)
    os.chroot(options.root)
    os.chdir(cwd)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
