"""Lightning checkpoints read weights-only, from local files only: a checkpoint can never run code.

Lightning reads `--ckpt_path` URLs with `torch.hub.load_state_dict_from_url` (unpickling them
in full, and caching them to be unpickled again on the next run) and local files with
whatever `weights_only` its caller passed. zoo's Trainer reads every checkpoint through
`read_checkpoint` instead, which refuses URLs and says in one line why a file is not one it reads.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import torch
from lightning.fabric.plugins import TorchCheckpointIO

URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def read_checkpoint(path, map_location="cpu") -> dict:
    """The dict in the Lightning checkpoint file `path`, read with torch.load(weights_only=True)."""
    shown = str(path)
    if URL.match(shown):
        raise ValueError(f"zoo does not read checkpoints from URLs ({shown[:80]}): a checkpoint is a pickle, and "
                         "unpickling what came from the network can run code; download it yourself, and zoo "
                         "reads the local file weights-only")
    if not Path(path).is_file():
        raise FileNotFoundError(f"no checkpoint file at {shown}")
    if shown.endswith(".safetensors"):
        raise ValueError(f"{shown} is a release's weights, not a Lightning checkpoint: to start from a release, name "
                         "its folder as model.init_args.model_name (ckpt_path resumes a run from its .ckpt)")
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    except OSError:
        raise
    except Exception as error:  # torch's reader fails in many ways on a file that is not a checkpoint at all
        called = re.search(r"GLOBAL (\S+)", str(error)) if isinstance(error, pickle.UnpicklingError) else None
        if called:
            raise ValueError(f"{shown} is not a checkpoint zoo can read safely: it holds pickled objects beyond "
                             f"tensors and plain data (it would call {called.group(1)}); zoo reads checkpoints "
                             "weights-only, so that no file can run code") from None
        reason = " ".join(f"{type(error).__name__} {error}".split())[:120]
        raise ValueError(f"{shown} is not a PyTorch checkpoint (torch.load: {reason}); expected a .ckpt file "
                         "written by Lightning") from None
    if not isinstance(checkpoint, dict):
        raise ValueError(f"{shown} is not a Lightning checkpoint: it holds a {type(checkpoint).__name__}, "
                         "not a dict of states")
    return checkpoint


class SafeCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint IO, loading through `read_checkpoint` whatever `weights_only` it is asked for."""

    def load_checkpoint(self, path, map_location=lambda storage, loc: storage, weights_only=None) -> dict:
        return read_checkpoint(path, map_location)
