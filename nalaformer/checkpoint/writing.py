"""Writing weights files atomically (:func:`~nalaformer.files.atomic_file`: an interrupted write never leaves
a truncated checkpoint), with the definition of the model they hold."""
import json
from typing import Optional

import torch

from ..files import atomic_file
from .reading import DEFINITIONS_KEY, ORIGIN_KEY, PathLike, StateDict

__all__ = ['save_state_dict']


def save_state_dict(state_dict: StateDict, path: PathLike, definition: Optional[dict] = None,
                    origin: Optional[dict] = None) -> None:
    """Write ``.safetensors`` or ``.pth`` (as ``{'model': state_dict, 'meta': ...}``) atomically.

    ``definition`` (:func:`~nalaformer.checkpoint.definitions.model_definition`) is recorded as the file's one
    model; ``origin`` (:meth:`~nalaformer.checkpoint.reading.Checkpoint.weights_origin`: EMA or raw, and the
    checkpoint they came from) as what its weights are.
    """
    tensors = {k: v.detach().cpu().contiguous() for k, v in state_dict.items()}
    meta = {DEFINITIONS_KEY: [dict(definition, module='')] if definition else []}
    if origin:
        meta[ORIGIN_KEY] = dict(origin)
    with atomic_file(path) as tmp:
        if tmp.suffix == '.safetensors':
            from safetensors.torch import save_file
            save_file(tensors, str(tmp), metadata={key: json.dumps(value) for key, value in meta.items()})
        else:
            torch.save({'model': tensors, 'meta': meta}, tmp)
