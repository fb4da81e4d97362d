import os
from pathlib import Path

import pytest
import torch
from hypothesis import settings

settings.register_profile("zoo", deadline=None, max_examples=15, derandomize=True)
settings.load_profile("zoo")
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def data_root() -> Path | None:
    """The shared data folder: $ZOO_DATA, else ../shared/data beside the checkout."""
    root = Path(os.environ.get("ZOO_DATA", Path(__file__).resolve().parents[1] / ".." / "shared" / "data"))
    return root.resolve() if root.is_dir() else None
