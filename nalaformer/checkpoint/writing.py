"""Writing weights files atomically (:func:`~nalaformer.files.atomic_file`: an interrupted write never leaves
a truncated checkpoint), with the definition of the model they hold."""
import json
from typing import Optional

import torch

from ..files import atomic_file
from .reading import DEFINITIONS_KEY, PathLike, StateDict

__all__ = ['save_state_dict']


def save_state_dict(state_dict: StateDict, path: PathLike, definition: Optional[dict] = None) -> None:
    """Write ``.safetensors`` or ``.pth`` (as ``{'model': state_dict, 'meta': ...}``) atomically.

    ``definition`` (:func:`~nalaformer.checkpoint.definitions.model_definition`) is recorded as the file's one
    model.
    """
    tensors = {k: v.detach().cpu().contiguous() for k, v in state_dict.items()}
    definitions = [dict(definition, module='')] if definition else []
    with atomic_file(path) as tmp:
        if tmp.suffix == '.safetensors':
            from safetensors.torch import save_file
            save_file(tensors, str(tmp), metadata={DEFINITIONS_KEY: json.dumps(definitions)})
        else:
            torch.save({'model': tensors, 'meta': {DEFINITIONS_KEY: definitions}}, tmp)
