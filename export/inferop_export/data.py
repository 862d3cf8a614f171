"""The samples a user brings for a reduced precision: calibration inputs that set int8's ranges, and held-out
validation inputs (with labels, for a classifier) that gate it. A user's model is never calibrated on noise.

A set is an `.npz` file with one array per model input (samples along the first axis) and optionally `labels`,
a directory of `<input>.npy` files (and `labels.npy`), or, for a model with one input, a single `.npy` file. For an
image classifier (`--processing` kind imageClassification) it may be a folder of images, processed as callers'
images are (`inferop.client.preprocess_image`): unlabelled, or in one subfolder a class, named as in `--labels` or
by the class's index.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from inferop_core.errors import InferopError
from inferop_core.processing import Processing
from inferop_export.signature import NUMPY_DTYPES, Signature

LABELS = "labels"
FORMS = (
    "an .npz with one array per input (and optionally 'labels'), a directory of <input>.npy, or one .npy; for an image "
    "classifier, a folder of images (in one subfolder a class, for labels)"
)
IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".ppm", ".tif", ".tiff"})
# The worst of n samples bounds the share of inputs doing worse below 3/n at 95% confidence (the rule of three):
# a gate on `agreement` of the inputs needs 3 / (1 - agreement) samples to say anything about it.
CONFIDENCE_FACTOR = 3.0

Inputs = tuple[np.ndarray, ...]


class DataError(InferopError, ValueError):
    """A calibration or validation set does not fit the model; the message names the flag, file and tensor."""


@dataclass(frozen=True)
class SampleSet:
    """Arrays for each model input, in the signature's order, with the samples along the first axis."""

    origin: str  # the flag and path it came from, for messages
    arrays: Inputs
    labels: np.ndarray | None = None

    @property
    def samples(self) -> int:
        return len(self.arrays[0])

    def batches(self, batch: int) -> Iterator[tuple[Inputs, np.ndarray | None]]:
        for start in range(0, self.samples, batch):
            end = min(start + batch, self.samples)
            labels = None if self.labels is None else self.labels[start:end]
            yield tuple(array[start:end] for array in self.arrays), labels


def samples_needed(agreement: float) -> int:
    """Validation samples a gate on `agreement` of the inputs needs (CONFIDENCE_FACTOR)."""
    return math.ceil(round(CONFIDENCE_FACTOR / (1 - agreement), 6))


def load_samples(
    path: Path, flag: str, signature: Signature, processing: Processing | None = None, classes: list[str] | None = None
) -> SampleSet:
    """The set at `path` checked against the model's inputs: names, dtypes and shapes, one count of samples for all,
    and labels (if any) one integer a sample. A folder of images is read as `processing` declares, its subfolders
    named as in `classes` (the model's labels) or by index."""
    origin = f"{flag} {path}"
    if not signature.batched:
        raise DataError(f"{origin}: the model has no batch axis, so a set of samples cannot be fed to it")
    if path.is_dir() and _images(path):
        return _image_folder(path, origin, signature, processing, classes)
    named = _read(path, origin)
    expected = [tensor.name for tensor in signature.inputs]
    if len(expected) == 1 and list(named) == ["array"]:  # a single .npy
        named = {expected[0]: named["array"]}
    unknown = sorted(set(named) - {*expected, LABELS})
    if unknown:
        raise DataError(f"{origin}: holds {unknown}, which the model does not take; its inputs are {expected}")
    arrays = []
    for tensor in signature.inputs:
        if tensor.name not in named:
            raise DataError(f"{origin}: no array for input {tensor.name!r}; the model's inputs are {expected}")
        array = named[tensor.name]
        want_dtype = np.dtype(NUMPY_DTYPES[tensor.datatype])
        want_shape = ["n", *tensor.dims]
        fits = array.ndim == len(want_shape) and all(
            want in (-1, got) for want, got in zip(tensor.dims, array.shape[1:], strict=True)
        )
        if array.dtype != want_dtype or not fits:
            raise DataError(
                f"{origin}: input {tensor.name!r} is {array.dtype} {list(array.shape)}; the model takes "
                f"{want_dtype} {want_shape} ({tensor.datatype}, samples first)"
            )
        arrays.append(array)
    counts = {tensor.name: len(array) for tensor, array in zip(signature.inputs, arrays, strict=True)}
    if LABELS in named:
        counts[LABELS] = len(named[LABELS])
    if len(set(counts.values())) != 1:
        raise DataError(f"{origin}: the arrays hold different numbers of samples: {counts}")
    if not len(arrays[0]):
        raise DataError(f"{origin}: holds no samples")
    labels = _labels(named.get(LABELS), origin)
    return SampleSet(origin, tuple(arrays), labels)


def _images(folder: Path) -> list[Path]:
    """The images in `folder` and in its subfolders, one level down."""
    return sorted(
        file for file in (*folder.iterdir(), *(f for d in folder.iterdir() if d.is_dir() for f in d.iterdir()))
        if file.is_file() and file.suffix.lower() in IMAGE_SUFFIXES
    )  # fmt: skip


def _image_folder(
    folder: Path, origin: str, signature: Signature, processing: Processing | None, classes: list[str] | None
) -> SampleSet:
    """Images processed as callers' are, labelled by their subfolders (none: unlabelled)."""
    from inferop.client import InferError, preprocess_image

    if processing is None or processing.kind != "imageClassification":
        raise DataError(
            f"{origin}: holds images, which only an image classifier can read: give --processing with kind "
            "imageClassification (how callers' images are resized and normalised), or give " + FORMS.split(";")[0]
        )
    (tensor, *others) = signature.inputs
    dims = list(tensor.dims)
    if others or len(dims) != 3 or dims[0] != 3 or dims[1] != dims[2]:
        raise DataError(
            f"{origin}: images become one input of [3, size, size]; the model takes "
            f"{[(t.name, list(t.dims)) for t in signature.inputs]}"
        )
    direct = [file for file in _images(folder) if file.parent == folder]
    subfolders = sorted({file.parent for file in _images(folder)} - {folder})
    if direct and subfolders:
        raise DataError(
            f"{origin}: holds images both in it ({direct[0].name}...) and in subfolders ({subfolders[0].name}/); put "
            "all in one subfolder a class (labelled) or all in the folder (unlabelled)"
        )
    files = direct or [file for file in _images(folder) if file.parent != folder]
    labels = None
    if subfolders:
        index = {name: number for number, name in enumerate(classes)} if classes else None
        label_of = {}
        for sub in subfolders:
            if index is not None and sub.name in index:
                label_of[sub] = index[sub.name]
            elif index is None and sub.name.isdigit():
                label_of[sub] = int(sub.name)
            else:
                shown = ", ".join(classes[:5]) + ("..." if len(classes) > 5 else "") if classes else ""
                known = f"one of --labels ({shown})" if classes else "a class index (or give --labels, the names)"
                raise DataError(f"{origin}: subfolder {sub.name!r} is not a class: name it {known}")
        labels = np.array([label_of[file.parent] for file in files], dtype=np.int64)
    dtype = np.dtype(NUMPY_DTYPES[tensor.datatype])
    arrays = []
    for file in files:
        try:
            arrays.append(preprocess_image(file, dims[1], processing).astype(dtype))
        except InferError as error:
            raise DataError(
                f"{origin}: {file.relative_to(folder)} is not a readable image ({error.__cause__})"
            ) from None
    return SampleSet(origin, (np.stack(arrays),), labels)


def _read(path: Path, origin: str) -> dict[str, np.ndarray]:
    try:
        if path.is_dir():
            files = sorted(path.glob("*.npy"))
            if not files:
                raise DataError(f"{origin}: the directory holds no .npy files; give {FORMS}")
            return {file.stem: np.load(file, allow_pickle=False) for file in files}
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as archive:
                return {name: archive[name] for name in archive.files}
        if path.suffix == ".npy":
            return {"array": np.load(path, allow_pickle=False)}
    except FileNotFoundError:
        raise DataError(f"{origin}: no such file or directory") from None
    except (OSError, ValueError) as error:  # not numpy's format, or object arrays
        raise DataError(f"{origin}: not readable as numpy arrays ({error})") from None
    if not path.exists():
        raise DataError(f"{origin}: no such file or directory")
    raise DataError(f"{origin}: give {FORMS}")


def _labels(labels: np.ndarray | None, origin: str) -> np.ndarray | None:
    if labels is not None and (labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer)):
        raise DataError(f"{origin}: 'labels' is {labels.dtype} {list(labels.shape)}; give one integer class a sample")
    return labels


def check_labels(samples: SampleSet, output: str, classes: int) -> None:
    """Refuse labels that are not classes of the classifier `output` (`classes` wide)."""
    labels = samples.labels
    if labels is None or not len(labels):
        return
    bad = [int(value) for value in (labels.min(), labels.max()) if not 0 <= value < classes]
    if bad:
        raise DataError(
            f"{samples.origin}: label {bad[0]} is not a class of output {output!r}, which has {classes} "
            f"(0..{classes - 1})"
        )
