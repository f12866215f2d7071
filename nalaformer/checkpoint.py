"""Checkpoints: safe reading, EMA choice, model definitions, variant naming, atomic writing, conversion.

Every tool that takes a checkpoint goes through :class:`Checkpoint`:

* Reading never unpickles arbitrary objects: ``.pth`` files are read with
  ``torch.load(weights_only=True)`` (plus ``argparse.Namespace``, which the release's training script
  stores under ``args``), ``.safetensors`` with safetensors.
* Weights: the raw weights are the first of :data:`WEIGHT_KEYS` (or the file's own tensors), the EMA
  weights the first of :data:`EMA_KEYS`. Asking for EMA weights from a file without them is an error;
  it never falls back to the raw weights.
* Definitions: attention kernels have no parameters, so nothing in a state dict tells ``nala`` from
  ``relu`` attention. Every checkpoint the project writes records, under ``meta.model_definitions``,
  each model's timm name and the kwargs that change its function but not its state dict
  (``definition_args`` of the model class, e.g. ``attn_types`` and ``kernel_kwargs``). Loading such a
  checkpoint into a model that computes something else fails naming both, unless accepted explicitly.
  A file without definitions (the release's, a bare state dict) loads into whatever model is built.

timm's hub folders (``config.json`` + ``model.safetensors``, written with ``timm.models.save_for_hf``)
are checkpoints too: their definition is the folder's ``architecture`` and ``model_args``.

Writes go to a temporary file (or folder) that is renamed into place, so an interrupted write never
leaves a truncated checkpoint.
"""
import argparse
import contextlib
import contextvars
import inspect
import json
import logging
import os
import pickle
import re
import tempfile
import zipfile
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn

from .errors import DestinationError, UserError
from .files import atomic_folder, check_file_destination, check_folder_destination, same_path
from .ops.nala import kernel_function

__all__ = [
    'CheckpointError', 'NotACheckpointError', 'CorruptCheckpointError', 'MissingCheckpointError',
    'NotResumableError', 'DefinitionMismatchError', 'Checkpoint', 'is_timm_folder', 'is_converted_file', 'WEIGHT_KEYS', 'EMA_KEYS', 'read_checkpoint',
    'strip_wrapper_prefixes', 'model_definition', 'model_definitions', 'definition_modules', 'check_definition', 'check_state_dict_fits',
    'check_recorded_definitions', 'load_checkpoint_into', 'describe_architecture', 'name_architecture', 'save_state_dict',
    'save_timm_folder', 'check_conversion_destination', 'convert_checkpoint', 'TIMM_FOLDER_WEIGHTS',
    'newest_readable_checkpoint', 'variant_of', 'pretrained_kwargs', 'pretrained_options', 'pretrained_weights',
    'loading_options',
]

_logger = logging.getLogger(__name__)

PathLike = Union[str, os.PathLike]
StateDict = Dict[str, torch.Tensor]
# Where training scripts keep the weights inside a checkpoint dict, in order of preference:
# ours and timm's train.py ('state_dict'), the release / DeiT family ('model'), others ('module').
WEIGHT_KEYS = ('state_dict', 'model', 'module')
# EMA weights: ours (mmengine's EMAHook via DualEMAHook), timm's train.py, the release / DeiT family.
EMA_KEYS = ('ema_state_dict', 'state_dict_ema', 'model_ema')
DEFINITIONS_KEY = 'model_definitions'
# Prefixes wrappers put before a model's own keys: DDP, torch.compile, our mmengine models
# (classification 'model.', dense tasks 'backbone.model.model.'); used for files without definitions.
_WRAPPER_PREFIXES = re.compile(r'^(module\.|_orig_mod\.|backbone\.|model\.)+')
# The weights of a timm hub folder, in timm's order of preference (save_for_hf writes these names).
TIMM_FOLDER_WEIGHTS = ('model.safetensors', 'pytorch_model.bin')
# config.json entry of our folders saying whether the weights are a run's EMA weights.
EMA_FLAG = 'ema'
# timm.create_model kwargs of this project that say how to load weights, not what the model is.
_LOADING_KWARGS = ('pretrained_ema', 'accept_definition_change')


class CheckpointError(UserError, ValueError):
    """A checkpoint that cannot be read or does not fit the model; the message says why."""


class MissingCheckpointError(CheckpointError, FileNotFoundError):
    """No file or folder at the checkpoint's path."""


class NotACheckpointError(CheckpointError):
    """The file is no checkpoint at all (text, an image, random bytes, a zip of something else)."""


class CorruptCheckpointError(CheckpointError):
    """The file was a checkpoint but is truncated or damaged (an interrupted copy or write)."""


class NotResumableError(CheckpointError):
    """A checkpoint that holds weights but no training state, given to resume a training run."""


class DefinitionMismatchError(CheckpointError):
    """The checkpoint's model computes another function than the model it is loaded into."""


# ----------------------------------------------------------------------------------------------
# Reading
# ----------------------------------------------------------------------------------------------
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
            and set(content['meta']) == {DEFINITIONS_KEY})


def _load_folder(path: Path) -> dict:
    """A timm hub folder as {'model', 'meta'} (plus 'model_ema' when it holds EMA weights); its one
    definition is the folder's ``architecture`` and ``model_args``."""
    config_file = path / 'config.json'
    if not config_file.is_file():
        runs = sorted(path.glob('epoch_*.pth')) + sorted(path.glob('iter_*.pth'))
        hint = (f'; it looks like a training work dir: give one of its checkpoints, e.g. {runs[-1]}' if runs else
                f' (write one with: python tools/convert_checkpoint.py CHECKPOINT {path})')
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
    content = {'model': tensors, 'meta': {DEFINITIONS_KEY: [definition]}}
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
        definitions = json.loads(metadata[DEFINITIONS_KEY]) if DEFINITIONS_KEY in metadata else []
        return {'model': tensors, 'meta': {DEFINITIONS_KEY: definitions}}
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

    @property
    def is_runner_checkpoint(self) -> bool:
        """Written by an mmengine runner (tools/train.py): keys are those of the runner's model."""
        return isinstance(self.content.get('state_dict'), dict) and isinstance(self.content.get('meta'), dict)

    @property
    def definitions(self) -> List[dict]:
        """Recorded models: ``[{'module': path in the stored model ('' = all of it), 'architecture', 'model_args'}]``."""
        meta = self.content.get('meta')
        return list(meta.get(DEFINITIONS_KEY) or []) if isinstance(meta, dict) else []

    def _keys(self) -> List[str]:
        return sorted(map(str, self.content))[:20]

    def weights(self, ema: bool = False) -> StateDict:
        """The raw weights, or the EMA weights (with the raw weights' keys); never one for the other."""
        if ema:
            for key in EMA_KEYS:
                if isinstance(self.content.get(key), dict):
                    state_dict = _tensors(self.content[key])
                    return _mmengine_ema(state_dict) if key == 'ema_state_dict' else state_dict
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
    """Drop the prefixes that DDP, torch.compile and our mmengine models put before a model's keys."""
    return {_WRAPPER_PREFIXES.sub('', k): v for k, v in state_dict.items()}


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


# ----------------------------------------------------------------------------------------------
# Model definitions
# ----------------------------------------------------------------------------------------------
def _plain(value):
    """Tuples -> lists, recursively: the JSON form definitions are stored and compared in."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _is_plain_data(value) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def model_definition(model: nn.Module) -> dict:
    """``{'architecture': timm name, 'model_args': ...}``: the arguments that rebuild the model
    (``timm.models.get_model_args``, as in a timm hub folder's config.json), with each of the model's
    ``definition_args`` (what it computes but its state dict does not show) written out."""
    from timm.models import get_model_args
    architecture = (getattr(model, 'pretrained_cfg', None) or {}).get('architecture')
    args = {k: _plain(v) for k, v in get_model_args(model).items() if k not in _LOADING_KWARGS}
    dropped = sorted(k for k, v in args.items() if not _is_plain_data(v))
    if dropped:  # checkpoints hold plain data only (they are read without unpickling objects)
        _logger.warning(f'model arguments {dropped} are not plain data and are not recorded in checkpoints')
    args = {k: v for k, v in args.items() if k not in dropped}
    args.update({name: _plain(getattr(model, name)) for name in model.definition_args})
    return {'architecture': architecture, 'model_args': args}


def definition_modules(model: nn.Module) -> List[Tuple[str, nn.Module]]:
    """(name, module) of every model of this project inside ``model`` (itself: name '')."""
    return [(name, module) for name, module in model.named_modules() if hasattr(module, 'definition_args')]


def model_definitions(model: nn.Module) -> List[dict]:
    """What a checkpoint of ``model`` records: :func:`model_definition` of each project model inside it,
    with its ``module`` path (DDP / TTA wrappers unwrapped)."""
    model = _unwrap(model)
    return [dict(model_definition(module), module=name) for name, module in definition_modules(model)]


def _definition_args(model_args: dict, model_cls: type) -> dict:
    """The ``definition_args`` of ``model_cls`` out of recorded ``model_args``; one left out (a folder written
    for a default model) is the class's default."""
    defaults = inspect.signature(model_cls).parameters
    return {name: _plain(model_args[name] if name in model_args else defaults[name].default)
            for name in model_cls.definition_args}


def _function(model_args: dict) -> dict:
    """What definition arguments compute: kernels compared through :func:`kernel_function` (defaults
    filled in, fused implementations equal to the reference)."""
    args = dict(model_args)
    if 'attn_types' in args:
        names = args.pop('attn_types')
        kwargs = args.pop('kernel_kwargs', None) or [None] * len(names)
        args['kernels'] = [kernel_function(name, kw) for name, kw in zip(names, kwargs)]
    return args


def _describe(architecture: Optional[str], args: dict) -> str:
    return f'{architecture or "model"}({", ".join(f"{k}={v!r}" for k, v in args.items())})'


def _cfg_option(key: str, value) -> str:
    """How ``value`` is written on an mmengine ``--cfg-options`` command line (dicts cannot be)."""
    def written(v):
        if isinstance(v, list):
            parts = [written(x) for x in v]
            return None if None in parts else f'[{",".join(parts)}]'
        return None if isinstance(v, dict) else str(v)
    if isinstance(value, list) and all(v is None for v in value):
        value = None
    text = written(value)
    return f'{key}="{text}"' if text is not None else f'{key}={value!r} (in the config file)'


def check_definition(recorded: Optional[dict], model: nn.Module, accept: bool = False, source: str = 'checkpoint',
                     cfg_prefix: str = 'model.') -> None:
    """Raise :class:`DefinitionMismatchError` when ``model`` computes another function than ``recorded``.

    ``recorded`` None (a file without definitions) always passes; ``accept`` turns a mismatch into a
    warning. ``cfg_prefix`` is where the model's kwargs sit in a config, for the suggested override.
    """
    if recorded is None:
        return
    theirs = _definition_args(recorded['model_args'], type(model))
    own = {name: _plain(getattr(model, name)) for name in model.definition_args}
    if _function(theirs) == _function(own):
        return
    architecture = (getattr(model, 'pretrained_cfg', None) or {}).get('architecture')
    message = (f'{source} was trained as {_describe(recorded.get("architecture"), theirs)} but the model is '
               f'{_describe(architecture, own)}')
    if accept:
        _logger.warning(f'{message}; loading anyway (accept_definition_change)')
        return
    overrides = ' '.join(_cfg_option(f'{cfg_prefix}{k}', v) for k, v in theirs.items())
    kwargs = ', '.join(f'{k}={v!r}' for k, v in theirs.items())
    raise DefinitionMismatchError(
        f'{message}. Attention kernels have no weights, so these would load and silently compute another '
        f'function. Build the model the checkpoint describes (tools: --cfg-options {overrides}; Python: '
        f'timm.create_model({recorded.get("architecture")!r}, {kwargs})), or accept the difference explicitly '
        f'(tools/test.py --accept-definition-change; accept_definition_change=True in timm.create_model, '
        f'load_pretrained or a backbone init_cfg).')


# ----------------------------------------------------------------------------------------------
# Architecture of a NaLaFormer state dict, and variant names
# ----------------------------------------------------------------------------------------------
def describe_architecture(state_dict: StateDict) -> dict:
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
    try:
        for i in stages:
            dim = state_dict[f'layers.{i}.blocks.0.norm1.norm.weight'].shape[0]
            head_dim = 2 * state_dict[f'layers.{i}.RoPE.angle'].shape[0]
            dims.append(dim)
            heads.append(dim // head_dim)
            ratios.append(state_dict[f'layers.{i}.blocks.0.ffn.fc1.weight'].shape[0] / dim)
    except KeyError as e:
        raise CheckpointError(f'this is not a NaLaFormer state dict: it lacks {e.args[0]}') from None
    return dict(embed_dims=tuple(dims), depths=tuple(depths.get(i, 0) for i in stages),
                num_heads=tuple(heads), mlp_ratios=tuple(ratios))


def variant_of(arch: dict) -> Optional[str]:
    """The NaLaFormer variant with this architecture (:func:`describe_architecture`), or None."""
    from .models.nalaformer import MODEL_ARGS  # the models import this module
    for name, args in MODEL_ARGS.items():
        if all(tuple(arch.get(k, ())) == tuple(args[k]) for k in ('embed_dims', 'depths', 'num_heads', 'mlp_ratios')):
            return name
    return None


def name_architecture(arch: dict) -> str:
    """'nalaformer_t (embed_dims=[...], ...)' or 'an unknown configuration (...)'."""
    variant = variant_of(arch)
    described = ', '.join(f'{k}={list(v) if isinstance(v, tuple) else v}' for k, v in arch.items())
    return f'{variant} ({described})' if variant else f'an unknown configuration ({described})'


def check_state_dict_fits(model: nn.Module, state_dict: StateDict) -> None:
    """Raise CheckpointError when tensors of ``state_dict`` have other shapes than ``model``'s.

    When the mismatch is inside a NaLaFormer, the message names the variant the checkpoint looks like.
    """
    own = model.state_dict()
    mismatched = [k for k, v in state_dict.items() if k in own and own[k].shape != v.shape]
    if not mismatched:
        return
    message = f'checkpoint does not fit the model: {len(mismatched)} tensors differ in shape, e.g. {mismatched[:3]}'
    first = mismatched[0]
    if 'layers.' in first:  # inside a NaLaFormer: say which variant the checkpoint is
        prefix = first[:first.index('layers.')]
        theirs = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
        mine = {k[len(prefix):]: v for k, v in own.items() if k.startswith(prefix)}
        with contextlib.suppress(CheckpointError):  # not a NaLaFormer layout after all: the shapes say enough
            message += (f'; the checkpoint looks like {name_architecture(describe_architecture(theirs))}, '
                        f'the model is {name_architecture(describe_architecture(mine))}')
    raise CheckpointError(message)


# ----------------------------------------------------------------------------------------------
# Loading into models
# ----------------------------------------------------------------------------------------------
def _unwrap(model: nn.Module) -> nn.Module:
    """The model inside DDP / test-time-augmentation wrappers (their ``module``)."""
    while isinstance(getattr(model, 'module', None), nn.Module):
        model = model.module
    return model


def check_recorded_definitions(model: nn.Module, checkpoint: 'Checkpoint', accept: bool = False,
                               cfg_prefix: str = 'model.') -> None:
    """:func:`check_definition` of every model a runner checkpoint records, at its path inside ``model``."""
    for definition in checkpoint.definitions:
        try:
            module = model.get_submodule(definition['module'])
        except AttributeError:
            raise CheckpointError(f'{checkpoint.path} holds a model at {definition["module"]!r}, which this '
                                  f'model lacks: was it written by another config?') from None
        check_definition(definition, module, accept, str(checkpoint.path), cfg_prefix)


def load_checkpoint_into(model: nn.Module, checkpoint: Checkpoint, ema: bool = False,
                         accept_definition_change: bool = False, cfg_prefix: str = 'model.') -> None:
    """Load a checkpoint into a (wrapped) model for evaluation, checking definitions and fit.

    A runner checkpoint loads strictly into the model that wrote it (every recorded definition checked).
    Any other file (the release's, a converted one, a bare state dict) holds one timm model: it goes
    through that model's ``load_pretrained`` (checkpoint filter, variant check) and must cover all its
    weights, classifier included.
    """
    target = _unwrap(model)
    if checkpoint.is_runner_checkpoint:
        check_recorded_definitions(target, checkpoint, accept_definition_change, cfg_prefix)
        state_dict = checkpoint.weights(ema)
        check_state_dict_fits(target, state_dict)
        result = target.load_state_dict(state_dict, strict=False)
        missing, unexpected = result.missing_keys, result.unexpected_keys
    else:
        modules = definition_modules(target)
        if len(modules) != 1:
            raise CheckpointError(f'{checkpoint.path} holds the weights of one model, but the config builds '
                                  f'{len(modules)} models of this project: load it through the backbone init_cfg')
        name, module = modules[0]
        result = module.load_pretrained(checkpoint, ema=ema, accept_definition_change=accept_definition_change)
        missing, unexpected = [f'{name}.{k}' if name else k for k in result.missing_keys], []
    if missing or unexpected:
        raise CheckpointError(f'{checkpoint.path} does not hold every weight of the model: missing {missing[:10]}, '
                              f'unexpected {unexpected[:10]} (a checkpoint for another number of classes or task?)')


_LOADING = contextvars.ContextVar('nalaformer_pretrained_loading', default={})


@contextlib.contextmanager
def loading_options(**options) -> Iterator[None]:
    """Options for the ``load_pretrained`` that timm calls while building a model (it passes only the file)."""
    token = _LOADING.set(options)
    try:
        yield
    finally:
        _LOADING.reset(token)


def pretrained_options(ema: Optional[bool], accept_definition_change: Optional[bool]) -> Tuple[bool, bool]:
    """Explicit arguments of ``load_pretrained``, else those of the enclosing :func:`loading_options`."""
    options = _LOADING.get()
    return (options.get('ema', False) if ema is None else ema,
            options.get('accept_definition_change', False) if accept_definition_change is None
            else accept_definition_change)


def pretrained_weights(model: nn.Module, checkpoint: Union[PathLike, Checkpoint], ema: Optional[bool] = None,
                       accept_definition_change: Optional[bool] = None) -> StateDict:
    """The weights a model's ``load_pretrained`` should load (its own keys), after the definition check."""
    ema, accept = pretrained_options(ema, accept_definition_change)
    if not isinstance(checkpoint, Checkpoint):
        checkpoint = Checkpoint.read(checkpoint)
    state_dict, definition = checkpoint.model_weights(ema)
    check_definition(definition, model, accept, str(checkpoint.path))
    return state_dict


def pretrained_kwargs(variant: str, kwargs: dict) -> Tuple[dict, dict]:
    """Split timm kwargs for ``pretrained=True`` into the model's and :func:`loading_options`'.

    ``pretrained_ema=True`` loads the checkpoint's EMA weights, ``accept_definition_change=True`` a
    checkpoint recorded with other ``attn_types`` / ``kernel_kwargs``. No weights are hosted, so a
    local file, state dict or timm folder (``timm.create_model('local-dir:DIR')``) is required; files and
    folders are read by the model's own ``load_pretrained`` (timm's ``custom_load``), which is safe,
    checks the recorded definition and names what is wrong with a checkpoint. A model named
    ``hf-hub:...`` is loaded by timm.
    """
    kwargs = dict(kwargs)
    options = dict(ema=kwargs.pop('pretrained_ema', False),
                   accept_definition_change=kwargs.pop('accept_definition_change', False))
    overlay = dict(kwargs.get('pretrained_cfg_overlay') or {})
    cfg = kwargs.get('pretrained_cfg')
    source = cfg.get('source') if isinstance(cfg, dict) else None  # set by timm for 'local-dir:' / 'hf-hub:' names
    if source == 'hf-hub':
        return kwargs, options
    if source == 'local-dir' and not overlay:
        overlay = dict(file=cfg['file'], source=None)  # the folder, read like any checkpoint
    if not (overlay.get('file') or overlay.get('state_dict')):
        raise ValueError(
            f'{variant}: no weights are hosted for download; pass a local checkpoint with '
            f"pretrained_cfg_overlay=dict(file='path/to/checkpoint.pth' or '.safetensors')")
    overlay.setdefault('custom_load', bool(overlay.get('file')))
    return {**kwargs, 'pretrained_cfg_overlay': overlay}, options


# ----------------------------------------------------------------------------------------------
# Writing
# ----------------------------------------------------------------------------------------------
def save_state_dict(state_dict: StateDict, path: PathLike, definition: Optional[dict] = None) -> None:
    """Write ``.safetensors`` or ``.pth`` (as ``{'model': state_dict, 'meta': ...}``) atomically.

    ``definition`` (:func:`model_definition`) is recorded as the file's one model.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous() for k, v in state_dict.items()}
    definitions = [dict(definition, module='')] if definition else []
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f'.{path.name}.', suffix='.tmp')
    os.close(fd)
    try:
        if path.suffix == '.safetensors':
            from safetensors.torch import save_file
            save_file(tensors, tmp, metadata={DEFINITIONS_KEY: json.dumps(definitions)})
        else:
            torch.save({'model': tensors, 'meta': {DEFINITIONS_KEY: definitions}}, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _release_definition(state_dict: StateDict) -> dict:
    """The definition of a NaLaFormer state dict that records none (the release's ``.pth``): its
    architecture read off the tensors, the release's hybrid attention written out."""
    from .models.nalaformer import NaLaFormer  # the models import this module
    arch = describe_architecture(state_dict)
    variant = variant_of(arch)
    args = dict(arch) if variant is None else {}
    for name, key, dim in (('in_chans', 'patch_embed.proj.0.weight', 1), ('head_hidden_size', 'proj.weight', 0)):
        if key not in state_dict:
            raise CheckpointError(f'it lacks {key}, so it is not a whole NaLaFormer')
        args[name] = state_dict[key].shape[dim]
    args['num_classes'] = state_dict['head.weight'].shape[0] if 'head.weight' in state_dict else 0
    if not any('.gamma_1' in k for k in state_dict):
        args['layer_scale_init_values'] = None
    args.update(_definition_args({}, NaLaFormer))  # the release's hybrid, written out
    return dict(architecture=variant or 'nalaformer_t', model_args=_plain(args))


def save_timm_folder(state_dict: StateDict, definition: dict, path: PathLike, ema: bool = False,
                     overwrite: bool = False) -> None:
    """Write a timm hub folder (``timm.models.save_for_hf``: config.json + model.safetensors) of the model
    ``definition`` describes, holding ``state_dict``; ``timm.create_model('local-dir:PATH', pretrained=True)``
    rebuilds it. ``ema`` is recorded in config.json. Written atomically; ``path`` must be absent, empty or a
    timm folder (any folder with ``overwrite``)."""
    import timm
    from timm.models import save_for_hf
    path = check_folder_destination(path, overwrite, 'timm folder', replaceable=is_timm_folder,
                                    kind='a timm model folder')
    try:
        model = timm.create_model(definition['architecture'], **definition['model_args'])
    except (TypeError, ValueError, RuntimeError) as e:
        raise CheckpointError(f'cannot rebuild {_describe(definition["architecture"], definition["model_args"])} '
                              f'for the folder: {e}') from e
    check_state_dict_fits(model, state_dict)
    result = model.load_state_dict(state_dict, strict=False)
    if result.missing_keys:
        raise CheckpointError(
            f'the weights lack {len(result.missing_keys)} tensors of {definition["architecture"]} '
            f'(e.g. {result.missing_keys[:3]}): a timm folder holds a whole classification model; '
            f'backbone weights of a dense-task run convert to .safetensors or .pth instead')
    if result.unexpected_keys:
        raise CheckpointError(f'the weights have tensors {definition["architecture"]} lacks: '
                              f'{result.unexpected_keys[:5]}')
    with atomic_folder(path) as tmp:
        save_for_hf(model, tmp, model_config={EMA_FLAG: ema}, model_args=definition['model_args'],
                    safe_serialization=True)


def check_conversion_destination(src: PathLike, dst: PathLike, overwrite: bool = False) -> None:
    """Refuse, before anything is read, a conversion that would destroy files: ``dst`` the source itself or a
    folder holding it; an existing file the converter did not write (:func:`is_converted_file`); for a timm folder
    (no suffix) a folder that holds anything but a timm folder. ``overwrite`` allows the last two; what is
    replaced is replaced atomically."""
    src, dst = Path(src), Path(dst)
    if not src.exists():
        raise MissingCheckpointError(f'checkpoint {src} does not exist')
    if same_path(src, dst):
        raise DestinationError(f'the destination {dst} is the source checkpoint itself: write to another path')
    if dst.is_dir() and any(same_path(dst, parent) for parent in src.resolve().parents):
        raise DestinationError(f'the destination folder {dst} holds the source {src}: writing there would delete it; '
                               f'give a new folder name, e.g. {dst / "timm_folder"}')
    if dst.suffix:
        check_file_destination(dst, overwrite, 'destination', 'model.safetensors', replaceable=is_converted_file,
                               kind='a file tools/convert_checkpoint.py wrote')
    else:
        check_folder_destination(dst, overwrite, 'destination (a timm folder: no suffix)', replaceable=is_timm_folder,
                                 kind='a timm model folder')


def convert_checkpoint(src: PathLike, dst: PathLike, ema: bool = False, overwrite: bool = False) -> str:
    """Convert any checkpoint of ours or the release's (or a timm folder) to ``.pth``, ``.safetensors`` or,
    for a destination without a suffix, a timm hub folder; returns what it holds.

    Runner checkpoints (raw or ``ema``) give the weights of their timm model; the definition is kept. A
    file that records no definition (the release's) becomes, as a folder, the release's hybrid model.
    The destination is checked first (:func:`check_conversion_destination`) and written atomically.
    """
    check_conversion_destination(src, dst, overwrite)
    state_dict, recorded = Checkpoint.read(src).model_weights(ema)
    definition = {k: v for k, v in recorded.items() if k != 'module'} if recorded else None
    if Path(dst).suffix:
        save_state_dict(state_dict, dst, definition)
    else:
        if recorded and recorded['module'].startswith('backbone'):
            raise CheckpointError(f'{src} is a dense-task run: it holds a backbone, not the classification model a '
                                  f'timm folder holds; convert it to .safetensors or .pth for a backbone init_cfg')
        if definition is None:
            try:
                definition = _release_definition(state_dict)
            except CheckpointError as e:
                raise CheckpointError(f'{src} records no model definition and {e}; a timm folder needs the '
                                      f'model: convert a checkpoint this project wrote (it records its model)') from None
        save_timm_folder(state_dict, definition, dst, ema, overwrite)
    try:
        described = name_architecture(describe_architecture(state_dict))
    except CheckpointError:  # another family (NaLa-Swin): its definition says what it is
        described = f'{len(state_dict)} tensors'
    if definition is None:
        return described
    return f'{_describe(definition["architecture"], definition["model_args"])}, {described}'
