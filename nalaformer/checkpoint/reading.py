"""Reading checkpoints safely, whatever wrote them, and choosing their weights.

* Reading never unpickles arbitrary objects: ``.pth`` files are read with ``torch.load(weights_only=True)``
  (plus ``argparse.Namespace``, which the release's training script stores under ``args``), ``.safetensors``
  with safetensors; a file that is no checkpoint at all (text, random bytes, a zip of other files) or a
  damaged one raises its own error type, naming the file.
* timm's hub folders (``config.json`` + ``model.safetensors``, written with ``timm.models.save_for_hf``) are
  checkpoints too: their definition is the folder's ``architecture`` and ``model_args``.
* Weights: the raw weights are the first of :data:`WEIGHT_KEYS` (or the file's own tensors), the EMA
  weights the first of :data:`EMA_KEYS`. Asking for EMA weights from a file without them is an error; it
  never falls back to the raw weights. A converted file or timm folder records which weights it holds
  (:data:`ORIGIN_KEY`): one converted from EMA weights gives them for either choice.
"""
import argparse
import json
import os
import pickle
import re
import zipfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
from timm.models import clean_state_dict

from .errors import CheckpointError, CorruptCheckpointError, MissingCheckpointError, NotACheckpointError

__all__ = ['Checkpoint', 'PathLike', 'StateDict', 'WEIGHT_KEYS', 'EMA_KEYS', 'DEFINITIONS_KEY', 'TIMM_FOLDER_WEIGHTS',
           'EMA_FLAG', 'ORIGIN_KEY', 'is_timm_folder', 'is_converted_file', 'read_checkpoint', 'strip_wrapper_prefixes',
           'newest_readable_checkpoint']

PathLike = Union[str, os.PathLike]
StateDict = Dict[str, torch.Tensor]
# Where training scripts keep the weights inside a checkpoint dict, in order of preference:
# ours and timm's train.py ('state_dict'), the release / DeiT family ('model'), others ('module').
WEIGHT_KEYS = ('state_dict', 'model', 'module')
# EMA weights: ours (mmengine's EMAHook via DualEMAHook), timm's train.py, the release / DeiT family.
EMA_KEYS = ('ema_state_dict', 'state_dict_ema', 'model_ema')
# Where checkpoints written here record the models they hold (nalaformer.checkpoint.definitions).
DEFINITIONS_KEY = 'model_definitions'
# Prefixes our mmengine models put before a timm model's own keys (classification 'model.', dense tasks
# 'backbone.model.model.'); DDP's and torch.compile's are timm's clean_state_dict's.
_RUNNER_PREFIXES = re.compile(r'^(backbone\.|model\.)+')
# The weights of a timm hub folder, in timm's order of preference (save_for_hf writes these names).
TIMM_FOLDER_WEIGHTS = ('model.safetensors', 'pytorch_model.bin')
# config.json entry of our folders saying whether the weights are a run's EMA weights.
EMA_FLAG = 'ema'
# Where converted files record which weights they hold: {'ema': EMA or raw, 'source': the checkpoint they came from}.
ORIGIN_KEY = 'weights_origin'


def is_timm_folder(path: PathLike) -> bool:
    """``path`` is a timm hub folder and nothing else: config.json with an ``architecture`` and weights,
    no other files (what :func:`save_timm_folder` writes, so it can be written again)."""
    path = Path(path)
    names = {p.name for p in path.iterdir()} if path.is_dir() else set()
    if 'config.json' not in names or not names & set(TIMM_FOLDER_WEIGHTS) or names - {'config.json', *TIMM_FOLDER_WEIGHTS}:
        return False
    try:
        return 'architecture' in json.loads((path / 'config.json').read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, TypeError):
        return False


def is_converted_file(path: PathLike) -> bool:
    """``path`` is a file :func:`save_state_dict` wrote (the converter's output: a ``.safetensors`` with recorded
    definitions, or a ``.pth`` holding exactly ``{'model', 'meta': {'model_definitions'}}``), so it can be written
    again; anything else (a run's checkpoint, a user's file) is not."""
    path = Path(path)
    try:
        if path.suffix == '.safetensors':
            from safetensors import safe_open
            with safe_open(str(path), framework='pt', device='cpu') as f:
                return DEFINITIONS_KEY in (f.metadata() or {})
        content = torch.load(path, map_location='cpu', weights_only=True, mmap=True)
    except Exception:  # unreadable in any way: not a file written here
        return False
    return (isinstance(content, dict) and set(content) == {'model', 'meta'} and isinstance(content['meta'], dict)
            and DEFINITIONS_KEY in content['meta'] and set(content['meta']) <= {DEFINITIONS_KEY, ORIGIN_KEY})


def _load_folder(path: Path) -> dict:
    """A timm hub folder as {'model', 'meta'} (plus 'model_ema' when it holds EMA weights); its one
    definition is the folder's ``architecture`` and ``model_args``."""
    config_file = path / 'config.json'
    if not config_file.is_file():
        runs = sorted(path.glob('epoch_*.pth')) + sorted(path.glob('iter_*.pth'))
        hint = (f'; it looks like a training work dir: give one of its checkpoints, e.g. {runs[-1]}' if runs else
                f' (write one with: python3 tools/convert_checkpoint.py CHECKPOINT {path})')
        raise NotACheckpointError(f'{path} is a folder, not a checkpoint: it has no config.json of a timm model '
                                  f'folder{hint}')
    try:
        config = json.loads(config_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CorruptCheckpointError(f'{config_file} is not valid JSON (damaged?): {e}') from e
    weights_file = next((path / name for name in TIMM_FOLDER_WEIGHTS if (path / name).is_file()), None)
    if weights_file is None or not isinstance(config, dict) or 'architecture' not in config:
        raise NotACheckpointError(f'{path} is not a complete timm model folder: it needs config.json with an '
                                  f'"architecture" and one of {TIMM_FOLDER_WEIGHTS}')
    tensors = Checkpoint(weights_file, _load_file(weights_file)).weights()
    definition = dict(module='', architecture=config['architecture'], model_args=config.get('model_args') or {})
    origin = {'ema': bool(config.get(EMA_FLAG))}
    content = {'model': tensors, 'meta': {DEFINITIONS_KEY: [definition], ORIGIN_KEY: origin}}
    if config.get(EMA_FLAG):
        content['model_ema'] = tensors
    return content


# How files begin: a torch.save archive (zip), a legacy torch.save / pickle stream (protocol 2+), safetensors
# (an 8-byte little-endian header length, then the JSON header).
_ZIP_MAGIC = b'PK\x03\x04'
_PICKLE_MAGIC = b'\x80'


def _sniff(path: Path) -> Optional[str]:
    """Why ``path`` is not a checkpoint at all, judged from its first bytes; None when it may be one."""
    with open(path, 'rb') as f:
        head = f.read(64)
    if not head:
        return 'it is empty (0 bytes: an interrupted copy or write?)'
    if path.suffix == '.safetensors':
        return None
    if head.startswith(_PICKLE_MAGIC):
        return None
    if head.startswith(_ZIP_MAGIC):
        # a torch.save archive holds <archive name>/data.pkl, its first member; a truncated one has no listing
        try:
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
        except (zipfile.BadZipFile, OSError):
            name_length = int.from_bytes(head[26:28], 'little')
            names = [head[30:30 + name_length].decode('utf-8', 'replace')] if len(head) >= 30 + name_length else []
            if not names:
                return None
        if any(name.endswith('/data.pkl') for name in names):
            return None
        return (f'it is a zip archive of other files ({", ".join(names[:3])}{", ..." if len(names) > 3 else ""}), not '
                f'a PyTorch checkpoint')
    if len(head) > 8 and head[8:9] == b'{':
        return None  # safetensors under another suffix
    try:
        text = head.decode('utf-8')
    except UnicodeDecodeError:
        return (f'its first bytes ({head[:8].hex(" ")}) are neither a PyTorch checkpoint (a zip archive or '
                f'pickle) nor safetensors')
    return f'it is a text file (it begins {text[:30]!r})'


def _unpickling_reason(error: Exception) -> str:
    """The line of torch's weights-only message that names what was refused (its advice to unpickle is
    left out: never right for a file one did not write)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    line = next((line for line in lines if 'Unsupported' in line or 'GLOBAL' in line), lines[0] if lines else '')
    return _first_sentence(line)


def _first_sentence(text: str) -> str:
    return str(text).split('. ')[0]


def _load_file(path: Path) -> dict:
    """The file's top-level dict, read safely; a safetensors file as {'model', 'meta'} (as the converter's .pth),
    a timm hub folder as :func:`_load_folder` reads it."""
    if path.is_dir():
        return _load_folder(path)
    if not path.is_file():
        raise MissingCheckpointError(f'checkpoint {path} does not exist')
    reason = _sniff(path)
    if reason:
        raise NotACheckpointError(f'{path} is not a checkpoint: {reason}. Give a .pth or .safetensors file written '
                                  f'by tools/train.py, tools/convert_checkpoint.py or torch.save, or a timm folder')
    with open(path, 'rb') as f:
        head = f.read(9)
    if path.suffix == '.safetensors' or (not head.startswith((_ZIP_MAGIC, _PICKLE_MAGIC)) and head[8:9] == b'{'):
        from safetensors import SafetensorError, safe_open
        try:
            with safe_open(str(path), framework='pt', device='cpu') as f:
                metadata = f.metadata() or {}
                tensors = {key: f.get_tensor(key) for key in f.keys()}
        except (SafetensorError, OSError, ValueError) as e:
            raise NotACheckpointError(f'{path} is not a checkpoint: not a readable safetensors file (corrupt or '
                                      f'truncated?): {e}') from e
        meta = {key: json.loads(metadata[key]) for key in (DEFINITIONS_KEY, ORIGIN_KEY) if key in metadata}
        return {'model': tensors, 'meta': {DEFINITIONS_KEY: [], **meta}}
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            content = torch.load(path, map_location='cpu', weights_only=True)
    except pickle.UnpicklingError as e:
        if head.startswith(_PICKLE_MAGIC) or 'Unsupported global' in str(e) or 'Unsupported class' in str(e):
            raise CheckpointError(
                f'{path} holds objects other than tensors and plain data, which are not unpickled for '
                f'safety ({_unpickling_reason(e)}). Re-save only the state dict, e.g. '
                f'torch.save(model.state_dict(), ...), or convert it with tools/convert_checkpoint.py on a machine '
                f'where you trust the file.') from e
        raise CorruptCheckpointError(f'{path} is not a readable PyTorch checkpoint: it is truncated or corrupt '
                                     f'({_first_sentence(e)})') from e
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, KeyError, ValueError) as e:
        raise CorruptCheckpointError(f'{path} is not a readable PyTorch checkpoint: it is truncated or corrupt '
                                     f'({_first_sentence(e)})') from e
    if not isinstance(content, dict):
        raise NotACheckpointError(f'{path} is not a checkpoint: it holds a {type(content).__name__}, not a state '
                                  f'dict or checkpoint dict')
    return content


def _tensors(mapping: dict) -> StateDict:
    return {k: v for k, v in mapping.items() if isinstance(v, torch.Tensor)}


def _mmengine_ema(state_dict: StateDict) -> StateDict:
    """mmengine's averaged model stores ``module.<model key>`` plus a ``steps`` counter."""
    if 'steps' in state_dict and all(k.startswith('module.') for k in state_dict if k != 'steps'):
        return {k[len('module.'):]: v for k, v in state_dict.items() if k != 'steps'}
    return state_dict


class Checkpoint:
    """One checkpoint file, read once.

    ``Checkpoint.read(path)``; then :meth:`weights` (raw or EMA, keys as stored), :meth:`model_weights`
    (the one model it holds, with that model's own keys, and its recorded definition) and
    :attr:`definitions`.
    """

    def __init__(self, path: PathLike, content: dict):
        self.path = Path(path)
        self.content = content

    @classmethod
    def read(cls, path: PathLike) -> 'Checkpoint':
        path = Path(path)
        return cls(path, _load_file(path))

    def __str__(self) -> str:
        return str(self.path)

    @property
    def is_runner_checkpoint(self) -> bool:
        """Written by an mmengine runner (tools/train.py): keys are those of the runner's model."""
        return isinstance(self.content.get('state_dict'), dict) and isinstance(self.content.get('meta'), dict)

    @property
    def definitions(self) -> List[dict]:
        """Recorded models: ``[{'module': path in the stored model ('' = all of it), 'architecture', 'model_args'}]``."""
        meta = self.content.get('meta')
        return list(meta.get(DEFINITIONS_KEY) or []) if isinstance(meta, dict) else []

    @property
    def origin(self) -> dict:
        """What a converted file or timm folder records about its weights (``{'ema': bool, 'source': path}``;
        either may be absent); ``{}`` for any other file."""
        meta = self.content.get('meta')
        origin = meta.get(ORIGIN_KEY) if isinstance(meta, dict) else None
        return origin if isinstance(origin, dict) else {}

    @property
    def has_ema(self) -> bool:
        """The file holds EMA weights (under one of :data:`EMA_KEYS`, or converted from them)."""
        return any(isinstance(self.content.get(key), dict) for key in EMA_KEYS) or bool(self.origin.get('ema'))

    def weights_origin(self, ema: bool = False) -> dict:
        """Which weights :meth:`weights` gives: ``{'ema': True for a run's EMA weights, 'source': the checkpoint
        training wrote them in}`` (a converted file names the run checkpoint it came from)."""
        return {'ema': bool(ema or self.origin.get('ema')), 'source': str(self.origin.get('source') or self.path)}

    def describe_weights(self, ema: bool = False) -> str:
        """'EMA weights of RUN_CHECKPOINT' or 'raw weights of ...' (:meth:`weights_origin`), with a note when raw
        weights are taken from a file that also holds EMA weights."""
        origin = self.weights_origin(ema)
        text = f'{"EMA" if origin["ema"] else "raw"} weights of {origin["source"]}'
        if not origin['ema'] and self.has_ema:
            text += ', not the EMA weights it also holds'
        return text

    def _keys(self) -> List[str]:
        return sorted(map(str, self.content))[:20]

    def weights(self, ema: bool = False) -> StateDict:
        """The raw weights, or the EMA weights (with the raw weights' keys); never one for the other."""
        if ema:
            for key in EMA_KEYS:
                if isinstance(self.content.get(key), dict):
                    state_dict = _tensors(self.content[key])
                    return _mmengine_ema(state_dict) if key == 'ema_state_dict' else state_dict
            if self.origin.get('ema'):  # converted from EMA weights: they are the file's weights
                return self.weights()
            raise CheckpointError(
                f'{self.path} has no EMA weights (looked for {", ".join(EMA_KEYS)}); its top-level keys are '
                f'{self._keys()}. Evaluate or convert its raw weights without --ema / ema=True, or train with '
                f'an EMA hook (DualEMAHook) to get them.')
        for key in WEIGHT_KEYS:
            if isinstance(self.content.get(key), dict):
                state_dict = _tensors(self.content[key])
                break
        else:
            state_dict = _tensors(self.content)  # a bare state dict
        if not state_dict:
            raise CheckpointError(
                f'{self.path} has no tensors under any of {WEIGHT_KEYS} nor at the top level; top-level keys are '
                f'{self._keys()}')
        return state_dict

    def model_weights(self, ema: bool = False) -> Tuple[StateDict, Optional[dict]]:
        """The weights of the one timm model the file holds, with that model's own keys, and its definition.

        A recorded definition says where the model sits (e.g. 'model' in a classification run,
        'backbone.model.model' in a dense one: only its keys are kept); without one, wrapper prefixes
        (DDP, torch.compile, our runners) are stripped.
        """
        state_dict = self.weights(ema)
        definitions = self.definitions
        if len(definitions) > 1:
            raise CheckpointError(f'{self.path} holds {len(definitions)} models '
                                  f'({[d["module"] for d in definitions]}); load it with the config that wrote it')
        if not definitions:
            return strip_wrapper_prefixes(state_dict), None
        definition = definitions[0]
        prefix = f'{definition["module"]}.' if definition['module'] else ''
        own = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
        if not own:
            raise CheckpointError(f'{self.path} records a model at {definition["module"]!r} but has no weights there')
        return own, definition


def read_checkpoint(path: PathLike, ema: bool = False) -> StateDict:
    """The weights of the model a checkpoint holds (raw, or EMA with ``ema``), with the model's own keys."""
    return Checkpoint.read(path).model_weights(ema)[0]


def strip_wrapper_prefixes(state_dict: StateDict) -> StateDict:
    """The state dict with a model's own keys: without the prefixes that DDP and torch.compile (timm's
    ``clean_state_dict``) and then our mmengine models put before them. The one place that strips them."""
    return {_RUNNER_PREFIXES.sub('', k): v for k, v in clean_state_dict(state_dict).items()}


def newest_readable_checkpoint(directory: PathLike, exclude: Sequence[PathLike] = ()) -> Optional[Path]:
    """The most recently written resumable checkpoint (``epoch_*.pth``, ``iter_*.pth``: best-metric
    checkpoints hold no optimizer state) in ``directory`` whose archive is complete, or None."""
    excluded = {Path(p).resolve() for p in exclude}
    found = [*Path(directory).glob('epoch_*.pth'), *Path(directory).glob('iter_*.pth')]
    candidates = sorted((p for p in found if p.resolve() not in excluded),
                        key=lambda p: p.stat().st_mtime, reverse=True)
    for candidate in candidates:
        try:
            with zipfile.ZipFile(candidate) as archive:
                if archive.testzip() is None:
                    return candidate
        except (zipfile.BadZipFile, OSError):
            continue
    return None
