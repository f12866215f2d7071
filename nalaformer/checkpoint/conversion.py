"""Converting checkpoints: ``.pth`` <-> ``.safetensors`` <-> timm hub folders, with their definitions.

The one part of the package that builds models (a timm folder holds a whole model, rebuilt by timm) and asks
a family about a file that records no model: the release's ``.pth`` is NaLaFormer's hybrid
(:meth:`~nalaformer.models.nalaformer.NaLaFormer.release_definition`). Nothing in the model families imports
this module. Destinations are checked before anything is read and written atomically.
"""
from pathlib import Path
from typing import Optional

from ..errors import DestinationError
from ..files import atomic_folder, check_file_destination, check_folder_destination, same_path
from ..models.nalaformer import NaLaFormer
from .definitions import describe_definition
from .errors import CheckpointError, MissingCheckpointError
from .loading import check_state_dict_fits
from .reading import EMA_FLAG, Checkpoint, PathLike, StateDict, is_converted_file, is_timm_folder
from .writing import save_state_dict

__all__ = ['save_timm_folder', 'check_conversion_destination', 'convert_checkpoint']


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
        raise CheckpointError(f'cannot rebuild {describe_definition(definition["architecture"], definition["model_args"])} '
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


def convert_checkpoint(src: PathLike, dst: PathLike, ema: Optional[bool] = None, overwrite: bool = False) -> str:
    """Convert any checkpoint of ours or the release's (or a timm folder) to ``.pth``, ``.safetensors`` or,
    for a destination without a suffix, a timm hub folder; returns what it wrote: which weights (EMA or raw, of
    which run checkpoint) and of which model.

    Runner checkpoints give the weights of their timm model: ``ema=None`` takes the EMA weights where the run kept
    them (what the release evaluates) and the raw weights otherwise, ``ema=True`` / ``False`` asks for one of them
    (EMA weights that are absent are an error). The definition is kept, and so
    is which weights they are (:meth:`~nalaformer.checkpoint.reading.Checkpoint.weights_origin`), so that whatever
    starts from the file logs it. A file that records no definition (the release's) becomes, as a folder, the
    release's hybrid model. The destination is checked first (:func:`check_conversion_destination`) and written
    atomically.
    """
    check_conversion_destination(src, dst, overwrite)
    checkpoint = Checkpoint.read(src)
    if ema is None:
        ema = checkpoint.has_ema
    state_dict, recorded = checkpoint.model_weights(ema)  # read once, own keys
    origin = checkpoint.weights_origin(ema)
    definition = {k: v for k, v in recorded.items() if k != 'module'} if recorded else None
    if Path(dst).suffix:
        save_state_dict(state_dict, dst, definition, origin)
    else:
        if recorded and recorded['module'].startswith('backbone'):
            raise CheckpointError(f'{src} is a dense-task run: it holds a backbone, not the classification model a '
                                  f'timm folder holds; convert it to .safetensors or .pth for a backbone init_cfg')
        if definition is None:
            try:
                definition = NaLaFormer.release_definition(state_dict)
            except CheckpointError as e:
                raise CheckpointError(f'{src} records no model definition and {e}; a timm folder needs the '
                                      f'model: convert a checkpoint this project wrote (it records its model)') from None
        save_timm_folder(state_dict, definition, dst, origin['ema'], overwrite)
    weights = checkpoint.describe_weights(ema)
    try:
        described = NaLaFormer.architecture_of(state_dict)
    except CheckpointError:  # another family (NaLa-Swin, NaLa-SR): its definition says what it is
        described = f'{len(state_dict)} tensors'
    if definition is not None:
        described = f'{describe_definition(definition["architecture"], definition["model_args"])}, {described}'
    return f'{weights}; {described}'
