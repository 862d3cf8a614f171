"""What `inferop export` turns into a served model: a PyTorch module (a built-in network or a user's factory)
or a user's ONNX file. Each writes `model.onnx` and says what the served file is checked against.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import re
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from torch import nn

from inferop_core.agreement import Gate
from inferop_core.errors import InferopError
from inferop_core.processing import Processing
from inferop_core.tritonconfig import TensorSpec
from inferop_export.signature import InputFlag, Signature, generated_inputs

# Largest batch the exported graph accepts, as a multiple of maxBatchSize: torch.export needs a bound.
BATCH_HEADROOM = 64
# A user's module or file is checked to this absolute difference unless --tolerance says otherwise.
DEFAULT_TOLERANCE = 1e-3
MODEL_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,63}$")


class SourceError(InferopError, ValueError):
    """The model to export cannot be loaded or traced; the message names the file, factory or tensor."""


Inputs = tuple[np.ndarray, ...]


@dataclass(frozen=True)
class TorchModule:
    """A PyTorch module ready to export: its inputs (the outputs are read from the exported file), how test
    inputs are made, how closely ONNX Runtime must agree with it, and what a caller needs to know."""

    name: str
    module: nn.Module
    inputs: tuple[TensorSpec, ...]
    tolerance: float  # max |ONNX Runtime - PyTorch| accepted, per output element
    weights: str  # provenance, served with the config: `random_weights(seed)`, a file's digest, a factory
    make_input: Callable[[int, np.random.Generator], Inputs] | None = None  # None: generated from the signature
    output_names: tuple[str, ...] | None = None  # None: "output", or "output_0"... for several
    labels: list[str] | None = None  # class names for the first output (Triton's classification extension)
    processing: Processing | None = None  # how callers make inputs and read outputs; None: plain tensors
    gate: Gate | None = None  # what a reduced precision must keep; None: the one its outputs imply

    overrides: dict[str, InputFlag] = field(default_factory=dict)  # a module's inputs are fixed by `inputs`

    @property
    def parameters(self) -> int:
        return sum(p.numel() for p in self.module.parameters())

    def inputs_for(self, signature: Signature, batch: int, rng: np.random.Generator) -> Inputs:
        if self.make_input is not None:
            return self.make_input(batch, rng)
        return generated_inputs(signature, batch, rng)

    def write_onnx(self, path: Path, max_batch_size: int, seed: int) -> None:
        """torch.onnx (dynamo exporter) with a dynamic batch axis and the weights inside the one file."""
        module = self.module.eval()
        rng = np.random.default_rng(seed)
        # Batch 2: a 1 would be specialised away by the tracer.
        example = tuple(
            torch.from_numpy(array)
            for array in (
                self.make_input(2, rng)
                if self.make_input is not None
                else generated_inputs(Signature(self.inputs, (), batched=True), 2, rng)
            )
        )
        with torch.no_grad():
            outputs = _as_tuple(module(*example), self.name)
        names = self.output_names or (
            ("output",) if len(outputs) == 1 else tuple(f"output_{i}" for i in range(len(outputs)))
        )
        if len(names) != len(outputs):
            raise SourceError(
                f"{self.name}: {len(names)} output names given, the module returns {len(outputs)} tensors"
            )
        arg_names = list(inspect.signature(module.forward).parameters)[: len(example)]
        batch = torch.export.Dim("batch", min=1, max=max(max_batch_size, 2) * BATCH_HEADROOM)
        try:
            with warnings.catch_warnings():
                # The exporter's notes on axis naming are about its internals, not about the user's model.
                warnings.simplefilter("ignore", UserWarning)
                torch.onnx.export(
                    module,
                    example,
                    str(path),
                    input_names=[t.name for t in self.inputs],
                    output_names=list(names),
                    dynamic_shapes={name: {0: batch} for name in arg_names},
                    external_data=False,
                    dynamo=True,
                    verbose=False,
                )
        except Exception as error:  # torch.export raises many kinds, each with the reason in its message
            reason = str(error).strip().splitlines()[0][:500] if str(error).strip() else type(error).__name__
            raise SourceError(f"{self.name}: torch.onnx.export failed: {reason}") from error

    def reference(self, inputs: Inputs) -> Inputs | None:
        """What PyTorch computes: what ONNX Runtime must agree with."""
        with torch.no_grad():
            outputs = _as_tuple(self.module.eval()(*(torch.from_numpy(a) for a in inputs)), self.name)
        return tuple(o.numpy() for o in outputs)


@dataclass(frozen=True)
class OnnxFile:
    """A user's ONNX file, copied into the repository with its weights inside. Its only source is itself:
    ONNX Runtime is checked against ONNX's reference implementation where that runs in reasonable time."""

    name: str
    path: Path
    tolerance: float = DEFAULT_TOLERANCE
    overrides: dict[str, InputFlag] = field(default_factory=dict)
    labels: list[str] | None = None
    processing: Processing | None = None
    gate: Gate | None = None  # None: the one its outputs imply (precision.stated_gate)

    @property
    def weights(self) -> str:
        return file_weights(self.path)

    @property
    def parameters(self) -> int | None:
        return None  # the graph cannot tell trainable weights from buffers: the profile counts initializers

    def inputs_for(self, signature: Signature, batch: int, rng: np.random.Generator) -> Inputs:
        return generated_inputs(signature, batch, rng)

    def write_onnx(self, path: Path, max_batch_size: int, seed: int) -> None:
        try:
            model = onnx.load(str(self.path))
        except Exception as error:  # DecodeError, OSError: not an ONNX file or not readable
            raise SourceError(f"{self.path}: not a readable ONNX model ({type(error).__name__}: {error})") from error
        onnx.save_model(model, str(path), save_as_external_data=False)

    def reference(self, inputs: Inputs) -> Inputs | None:
        return None  # set by the exporter from ONNX's reference implementation, where it is affordable


def load_factory(target: str, app_dir: Path) -> Callable[[], Any]:
    """`package.module:factory` imported with `app_dir` first on the path; errors name the target."""
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute or not re.fullmatch(r"[\w.]+", module_name + "." + attribute):
        raise SourceError(f"{target!r}: expected package.module:factory, e.g. mypackage.models:build")
    sys.path.insert(0, str(app_dir.resolve()))
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise SourceError(
            f"{target}: cannot import {module_name} from {app_dir} or the environment ({error})"
        ) from error
    finally:
        sys.path.remove(str(app_dir.resolve()))
    factory: Any = module
    for part in attribute.split("."):
        if not hasattr(factory, part):
            raise SourceError(f"{target}: {module_name} has no attribute {attribute!r}")
        factory = getattr(factory, part)
    if not callable(factory):
        raise SourceError(f"{target}: {attribute} is not callable")
    return factory


def torch_module(
    target: str,
    inputs: Sequence[InputFlag],
    name: str,
    app_dir: Path = Path("."),
    output_names: Sequence[str] = (),
    weights: Path | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    seed: int = 0,
) -> TorchModule:
    """A user's module from its factory, with its inputs as `--input` flags give them."""
    if not inputs:
        raise SourceError(f"{target}: give every input of the module's forward with --input name=dims[:dtype]")
    torch.manual_seed(seed)
    try:
        module = load_factory(target, app_dir)()
    except SourceError:
        raise
    except Exception as error:  # the user's factory failed: say so, with its own message
        raise SourceError(f"{target}: the factory raised {type(error).__name__}: {error}") from error
    if not isinstance(module, nn.Module):
        raise SourceError(f"{target}: the factory returned {type(module).__name__}, not a torch.nn.Module")
    forward = list(inspect.signature(module.forward).parameters.values())
    positional = [p for p in forward if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) < len(inputs) or len([p for p in positional if p.default is p.empty]) > len(inputs):
        raise SourceError(
            f"{target}: forward takes {[p.name for p in positional]}, but {len(inputs)} --input flag(s) were given"
        )
    provenance = f"module {target}"
    if weights is not None:
        load_state_dict(module, weights)
        provenance = f"module {target} with {file_weights(weights)}"
    tensors = tuple(TensorSpec(name=flag.name, datatype=flag.datatype or "FP32", dims=flag.dims) for flag in inputs)
    return TorchModule(
        name=name,
        module=module.eval(),
        inputs=tensors,
        tolerance=tolerance,
        weights=provenance,
        output_names=tuple(output_names) or None,
    )


def load_state_dict(module: nn.Module, path: Path, what: str = "") -> None:
    """`path`'s state dict into `module`; an error names `--weights path` and, when given, what it must fit."""
    if not path.is_file():
        raise SourceError(f"--weights {path}: no such file")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        module.load_state_dict(state)
    except Exception as error:  # not a checkpoint, or not this module's
        fit = f" (not {what})" if what else ""
        raise SourceError(f"--weights {path}{fit}: {type(error).__name__}: {str(error)[:300]}") from error


def _as_tuple(outputs: Any, name: str) -> tuple[torch.Tensor, ...]:
    if isinstance(outputs, torch.Tensor):
        return (outputs,)
    if isinstance(outputs, (tuple, list)) and all(isinstance(o, torch.Tensor) for o in outputs):
        return tuple(outputs)
    raise SourceError(f"{name}: forward returned {type(outputs).__name__}; return a tensor or a tuple of tensors")


def model_name(text: str, what: str) -> str:
    """A Triton model name (the URL path): letters, digits, `_`, `.` and `-`, at most 63."""
    if not MODEL_NAME.fullmatch(text):
        raise SourceError(f"{what} {text!r}: a model name is 1 to 63 of letters, digits, '_', '.' and '-'")
    return text


def file_weights(path: Path) -> str:
    """The provenance of weights loaded from `path`: its name, and enough of its SHA-256 to tell two files apart
    where the name alone would not (the export machine's path means nothing where the model is served)."""
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return f"{path.name}, sha256 {digest.hexdigest()[:16]}"
