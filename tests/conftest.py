import os
import threading
from pathlib import Path

import pytest
import torch
from hypothesis import settings

settings.register_profile("zoo", deadline=None, max_examples=15, derandomize=True)
settings.load_profile("zoo")
# the cores shared among pytest-xdist's workers (-n), so that two workers on two cores do not fight over four threads
torch.set_num_threads(max(1, min(2, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", 1)))))


def pytest_configure(config):
    # The compiled kernels build once per machine and torch version (about 20 s on 2 cores with an empty cache:
    # the bindings and the kernels, two units side by side). pytest itself (xdist's controller, which runs no
    # tests) starts it at once, beside the workers' start-up and collection; a test that needs the kernels waits
    # on the build's lock. Not a daemon thread: killed at exit, it would leave its compilers running on a
    # half-built folder; so a short run on an empty cache waits for the build to end before pytest exits.
    if "PYTEST_XDIST_WORKER" not in os.environ and not config.option.collectonly:
        from zoo.attention import native

        threading.Thread(target=native.load, name="zoo kernels build").start()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def data_root() -> Path | None:
    """The shared data folder: $ZOO_DATA, else ../shared/data beside the checkout."""
    root = Path(os.environ.get("ZOO_DATA", Path(__file__).resolve().parents[1] / ".." / "shared" / "data"))
    return root.resolve() if root.is_dir() else None


def onnx_program(folder: Path, name: str):
    """The graph `name`.onnx of an ONNX export folder as a callable on tensors, through ONNX Runtime."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(folder / f"{name}.onnx"), providers=["CPUExecutionProvider"])

    def run(*inputs):
        feed = {i.name: t.numpy() for i, t in zip(session.get_inputs(), inputs)}
        return [torch.as_tensor(o) for o in session.run(None, feed)]
    return run


def onnx_decoding(folder: Path):
    """The exported prefill.onnx and step.onnx of a release folder as callables on tensors, through ONNX Runtime
    (for zoo.models.decoding.greedy)."""
    return onnx_program(folder, "prefill"), onnx_program(folder, "step")
