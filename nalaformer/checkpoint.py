"""Safe checkpoint reading and writing.

Nothing here unpickles arbitrary objects: ``.pth`` files are read with
``torch.load(weights_only=True)`` (plus ``argparse.Namespace``, which the release's training
script stores under ``args``), ``.safetensors`` with safetensors. Writes go to a temporary
file that is renamed into place, so an interrupted write never leaves a truncated checkpoint.
"""
import argparse
import os
import pickle
import re
import tempfile
import zipfile
from pathlib import Path
from typing import Dict, Optional, Union

import torch

__all__ = ['CheckpointError', 'read_checkpoint', 'describe_architecture', 'save_state_dict', 'convert_checkpoint',
           'local_pretrained_kwargs']

PathLike = Union[str, os.PathLike]
# Where training scripts keep the weights inside a checkpoint dict, in order of preference.
STATE_DICT_KEYS = ('model', 'state_dict', 'module')
EMA_KEYS = ('model_ema', 'state_dict_ema')


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or does not fit the model; the message says why."""


def read_checkpoint(path: PathLike, prefer_ema: bool = False) -> Dict[str, torch.Tensor]:
    """Read a state dict from ``.pth``/``.pt``/``.bin`` (bare or wrapped) or ``.safetensors``.

    A dict checkpoint yields its ``model`` (or ``state_dict``) entry, or its EMA weights when
    ``prefer_ema`` and present. Raises FileNotFoundError or :class:`CheckpointError`.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f'checkpoint {path} does not exist (or is not a file)')
    if path.suffix == '.safetensors':
        return _read_safetensors(path)
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            obj = torch.load(path, map_location='cpu', weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(
            f'{path} holds objects other than tensors and plain data, which are not unpickled for '
            f'safety ({e}). Re-save only the state dict, e.g. torch.save(model.state_dict(), ...), '
            f'or convert it with tools/convert_checkpoint.py on a machine where you trust the file.') from e
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError) as e:
        raise CheckpointError(f'{path} is not a readable PyTorch checkpoint (corrupt or truncated?): {e}') from e
    return _extract_state_dict(obj, path, prefer_ema)


def _read_safetensors(path: Path) -> Dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    try:
        return load_file(str(path), device='cpu')
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f'{path} is not a readable safetensors file (corrupt or truncated?): {e}') from e


def _extract_state_dict(obj, path: Path, prefer_ema: bool) -> Dict[str, torch.Tensor]:
    if not isinstance(obj, dict):
        raise CheckpointError(f'{path} holds a {type(obj).__name__}, not a state dict')
    keys = (EMA_KEYS + STATE_DICT_KEYS) if prefer_ema else STATE_DICT_KEYS
    for key in keys:
        if isinstance(obj.get(key), dict):
            obj = obj[key]
            break
    state_dict = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    if not state_dict:
        raise CheckpointError(
            f'{path} has no tensors under any of {keys}; top-level keys are {sorted(map(str, obj))[:10]}')
    return state_dict


def describe_architecture(state_dict: Dict[str, torch.Tensor]) -> dict:
    """Per-stage embed_dims, depths, num_heads and mlp_ratios read off a NaLaFormer state dict."""
    depths: Dict[int, int] = {}
    for key in state_dict:
        m = re.match(r'layers\.(\d+)\.blocks\.(\d+)\.', key)
        if m:
            stage, block = int(m.group(1)), int(m.group(2))
            depths[stage] = max(depths.get(stage, 0), block + 1)
    if not depths:
        raise CheckpointError('this is not a NaLaFormer state dict: it has no layers.<i>.blocks.<j> entries')
    stages = range(max(depths) + 1)
    dims, heads, ratios = [], [], []
    for i in stages:
        dim = state_dict[f'layers.{i}.blocks.0.norm1.norm.weight'].shape[0]
        head_dim = 2 * state_dict[f'layers.{i}.RoPE.angle'].shape[0]
        dims.append(dim)
        heads.append(dim // head_dim)
        ratios.append(state_dict[f'layers.{i}.blocks.0.ffn.fc1.weight'].shape[0] / dim)
    return dict(embed_dims=tuple(dims), depths=tuple(depths.get(i, 0) for i in stages),
                num_heads=tuple(heads), mlp_ratios=tuple(ratios))


def save_state_dict(state_dict: Dict[str, torch.Tensor], path: PathLike, metadata: Optional[Dict[str, str]] = None):
    """Write ``.safetensors`` or ``.pth`` (as ``{'model': state_dict}``) atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous() for k, v in state_dict.items()}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f'.{path.name}.', suffix='.tmp')
    os.close(fd)
    try:
        if path.suffix == '.safetensors':
            from safetensors.torch import save_file
            save_file(tensors, tmp, metadata=metadata)
        else:
            torch.save({'model': tensors, 'meta': dict(metadata or {})}, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def convert_checkpoint(src: PathLike, dst: PathLike, prefer_ema: bool = False) -> dict:
    """Convert between a release/our ``.pth`` and ``.safetensors``; returns the architecture found."""
    state_dict = read_checkpoint(src, prefer_ema=prefer_ema)
    arch = describe_architecture(state_dict)
    save_state_dict(state_dict, dst, metadata={k: str(list(v)) for k, v in arch.items()})
    return arch


def local_pretrained_kwargs(variant: str, kwargs: dict) -> dict:
    """timm kwargs for ``pretrained=True``: no weights are hosted, so a local file (or state dict) is
    required, and files are read by the model's own ``load_pretrained`` (timm's ``custom_load``),
    which is safe and names what is wrong with a checkpoint."""
    overlay = dict(kwargs.get('pretrained_cfg_overlay') or {})
    if not (overlay.get('file') or overlay.get('state_dict')):
        raise ValueError(
            f'{variant}: no weights are hosted for download; pass a local checkpoint with '
            f"pretrained_cfg_overlay=dict(file='path/to/checkpoint.pth' or '.safetensors')")
    overlay.setdefault('custom_load', bool(overlay.get('file')))
    return {**kwargs, 'pretrained_cfg_overlay': overlay}
