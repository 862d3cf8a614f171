"""Triton python-backend model that serves `model.onnx` with ONNX Runtime, honouring the ONNX Runtime
backend's settings from config.pbtxt: intra/inter-op thread counts, the dynamic batcher's grouping, and for
GPU instances the CUDA provider's memory options.

Runs inside Triton's python stub process; depends only on numpy, onnxruntime and Triton's utils.
Instance count, max batch size, queue policy, timeouts and warm-up are enforced by Triton's core.

Fault injection for drills and tests: while the file named by INFEROP_FAULT_STALL_FILE exists, made after the model
loaded, every execution blocks, as a hung model does (and FILE.held is created, so a test knows one is held);
removing the file lets the blocked executions finish. The fault lives in the process, as a deadlock does: a server
started after the file was made (a restarted container, whose /tmp kept it) runs normally.
INFEROP_FAULT_SLOWDOWN=F (at least 1) makes every execution take F times as long, as a slower build of the same
model would (the same answers, later). INFEROP_FAULT_FAIL_VALUE=V
fails every execution whose inputs hold the value V somewhere, as a model that breaks on inputs it was never
checked on: the whole batch fails, as an ONNX Runtime run does, and Triton counts each of its requests in
nv_inference_request_failure (an error response the model returns itself would count as a success there).
INFEROP_FAULT_LEAK_MIB=N keeps N MiB more after every execution, as a model that leaks does, until the container's
memory limit kills this process. With INFEROP_FAULT_ARM_FILE=PATH these two act only once PATH exists, made after the
model loaded: a regression that starts late, while the model serves (a restarted model runs normally again).
INFEROP_FAULT_LOAD_SECONDS=S makes the model take S seconds more to load, as a large model fetched and warmed does.
INFEROP_FAULT_TAIL_SHARE=P with INFEROP_FAULT_TAIL_MS=T makes a share P of executions, drawn at random, take T ms
more, as a build that stalls now and then does (a garbage collection, a lock): its mean time moves little, its p99 a
lot.
"""

import json
import os
import random
import time

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


def session_options(parameters):
    """SessionOptions from the config's `parameters` (the ONNX Runtime backend's names)."""
    options = ort.SessionOptions()
    # As in NVIDIA's ONNX Runtime backend: an absent or zero count leaves ONNX Runtime's default, a thread
    # per physical core of the machine, whatever the pod's CPU limit. Idle pool threads spin, as there: the
    # backend has no setting for it.
    options.intra_op_num_threads = int(parameters.get("intra_op_thread_count", "0"))
    options.inter_op_num_threads = int(parameters.get("inter_op_thread_count", "0"))
    if parameters.get("execution_mode", "0") == "1":
        options.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    # The backend's memory switches; unset, ONNX Runtime's defaults (both on) stay.
    if "enable_mem_arena" in parameters:
        options.enable_cpu_mem_arena = parameters["enable_mem_arena"].lower() in ("1", "true")
    if "enable_mem_pattern" in parameters:
        options.enable_mem_pattern = parameters["enable_mem_pattern"].lower() in ("1", "true")
    return options


def execution_providers(kind, device_id, parameters):
    """CPU for a CPU instance; for a GPU instance ONNX Runtime's CUDA provider on its device with the backend's
    memory options (gpu_mem_limit, arena_extend_strategy 1 = kSameAsRequested), the CPU one for what CUDA lacks."""
    if kind != "GPU":
        return ["CPUExecutionProvider"]
    options = {
        "device_id": int(device_id),
        "arena_extend_strategy": "kSameAsRequested"
        if parameters.get("arena_extend_strategy", "0") == "1"
        else "kNextPowerOfTwo",
    }
    if "gpu_mem_limit" in parameters:
        options["gpu_mem_limit"] = int(parameters["gpu_mem_limit"])
    return [("CUDAExecutionProvider", options), "CPUExecutionProvider"]


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        parameters = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        kind = args.get("model_instance_kind", "CPU")
        if kind == "GPU" and hasattr(ort, "preload_dlls"):
            ort.preload_dlls()  # CUDA and cuDNN from their pip packages (onnxruntime-gpu[cuda,cudnn]), where installed
        providers = execution_providers(kind, args.get("model_instance_device_id", "0"), parameters)
        self.session = ort.InferenceSession(path, session_options(parameters), providers=providers)
        if kind == "GPU" and self.session.get_providers()[0] != "CUDAExecutionProvider":
            # ONNX Runtime falls back to the CPU when CUDA fails to load: a GPU instance must not run there unseen.
            raise pb_utils.TritonModelException(
                f"GPU instance: ONNX Runtime could not use CUDA (providers {self.session.get_providers()}); "
                "install onnxruntime-gpu with its CUDA libraries: pip install 'onnxruntime-gpu[cuda,cudnn]'"
            )
        time.sleep(float(os.environ.get("INFEROP_FAULT_LOAD_SECONDS", "0")))
        self.input_names = [spec["name"] for spec in config["input"]]
        self.output_names = [spec["name"] for spec in config["output"]]
        self.stall_file = os.environ.get("INFEROP_FAULT_STALL_FILE")
        self.loaded_at = time.time()
        self.slowdown = max(float(os.environ.get("INFEROP_FAULT_SLOWDOWN", "1")), 1.0)
        fail_value = os.environ.get("INFEROP_FAULT_FAIL_VALUE")
        self.fail_value = None if fail_value is None else float(fail_value)
        self.leak_bytes = int(float(os.environ.get("INFEROP_FAULT_LEAK_MIB", "0")) * 2**20)
        self.leaked = []
        self.arm_file = os.environ.get("INFEROP_FAULT_ARM_FILE")
        self.tail_share = float(os.environ.get("INFEROP_FAULT_TAIL_SHARE", "0"))
        self.tail_seconds = float(os.environ.get("INFEROP_FAULT_TAIL_MS", "0")) / 1000

    def _made_since_loaded(self, path):
        try:
            return os.stat(path).st_mtime >= self.loaded_at
        except FileNotFoundError:
            return False

    def _faults_armed(self):
        return not self.arm_file or self._made_since_loaded(self.arm_file)

    def execute(self, requests):
        """One ONNX Runtime run for every request the dynamic batcher grouped, split back per request."""
        if self.stall_file and self._made_since_loaded(self.stall_file):
            open(self.stall_file + ".held", "w").close()
            while os.path.exists(self.stall_file):
                time.sleep(0.05)
        feeds = {}
        sizes = []
        for name in self.input_names:
            arrays = [pb_utils.get_input_tensor_by_name(request, name).as_numpy() for request in requests]
            feeds[name] = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
            sizes = [len(array) for array in arrays]
        armed = (self.fail_value is not None or self.leak_bytes) and self._faults_armed()
        if armed and self.leak_bytes:
            self.leaked.append(np.ones(self.leak_bytes, dtype=np.uint8))  # written, so resident
        if armed and self.fail_value is not None and any(np.any(a == self.fail_value) for a in feeds.values()):
            raise pb_utils.TritonModelException(f"input holds {self.fail_value} (injected fault)")
        began = time.perf_counter()
        outputs = self.session.run(self.output_names, feeds)
        if self.slowdown > 1:
            time.sleep((self.slowdown - 1) * (time.perf_counter() - began))
        if self.tail_share and random.random() < self.tail_share:
            time.sleep(self.tail_seconds)
        offsets = np.cumsum([0, *sizes])
        responses = []
        for index, request in enumerate(requests):
            wanted = set(request.requested_output_names()) or set(self.output_names)
            start, stop = offsets[index], offsets[index + 1]
            tensors = [
                pb_utils.Tensor(name, output[start:stop])
                for name, output in zip(self.output_names, outputs, strict=True)
                if name in wanted
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses
