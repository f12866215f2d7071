"""ONNX export of this project's models: classifiers and dense backbones, any batch size and image size.

    target = build_target('nalaformer_t', checkpoint='nalaformer_t.pth')   # a timm name, or a config file
    diffs = write_onnx(target, 'nalaformer_t.onnx', export_shape=(2, 224, 224),
                       check_shapes=[(1, 224, 224), (2, 320, 480)], atol=1e-4)

What is exported:

* A timm name (``nalaformer_xt`` ... ``nalaformer_l``; ``attn_types`` as in timm) or a classification
  config (``TimmClassifier``): the classifier, ``input`` (B, C, H, W) -> ``logits`` (B, classes).
* A dense config (segmentation, detection): its ``NaLaBackbone``, ``input`` (B, C, H, W) -> one map per
  output stage, ``feat<i>`` (B, C_i, ceil(H / s_i), ceil(W / s_i)) for stage i at stride s_i.

Inputs are normalised images, as the timm model takes them (a config's data preprocessor is not part of
the graph). NaLa-Swin (``nala_swin_*``) is refused: the timm Swin parts it is built of cannot be exported
with a dynamic size (the error says why).

Batch, H and W are dynamic in the graph (``torch.export`` with symbolic sizes, through the ONNX exporter
of ``torch.onnx.export(dynamo=True)``): the RoPE tables, padding and reshapes are computed from the input's
shape inside the graph, never baked in at the export size. The file is written only after ONNX Runtime
(CPUExecutionProvider) ran it at the check shapes within ``atol`` of PyTorch.

The graph holds standard ONNX operators only: ``nala`` / ``nala_cos`` are traced through their
plain-PyTorch reference (``use_nala_backend('reference')``; the PyTorch and Triton operators have no ONNX
translation), and fused Triton kernels (``nala_triton``, ...) that a config or a checkpoint's recorded
definition names are replaced by the PyTorch kernel computing the same function
(:func:`nalaformer.ops.nala.kernel_function`). Asking for a fused kernel explicitly is an error.

Problems with the arguments (unknown model, missing file, fused kernel asked for, the export packages not
installed, a check above tolerance) raise :class:`ExportError`, whose message says what to do.
"""
import importlib
import importlib.util
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import timm
import torch
import torch.nn as nn

from .checkpoint import Checkpoint, definition_modules, load_checkpoint_into
from .errors import UserError
from .models.family import per_stage_kernels
from .models.nala_swin import NaLaSwinTransformer
from .ops.kernels import AttentionKernel, kernel_function
from .ops.backend import use_nala_backend

__all__ = [
    'ExportError', 'ExportTarget', 'INSTALL_HINT', 'require_export_packages', 'fused_attn_types',
    'reference_attn_types', 'build_target', 'timm_target', 'config_target', 'parse_shape', 'export_onnx', 'nonstandard_ops',
    'fixed_input_sizes', 'compare_with_onnxruntime', 'write_onnx',
]

INSTALL_HINT = 'pip install -e .[export] (or bash scripts/setup.sh)'
EXPORT_PACKAGES = ('onnx', 'onnxruntime', 'onnxscript')  # onnxscript: the translation of torch.export graphs
# Operator domains of standard ONNX (anything else needs a custom runtime library)
STANDARD_DOMAINS = ('', 'ai.onnx')

Shape = Tuple[int, int, int]  # (batch, height, width)
AttnTypes = Union[str, Sequence[str]]
KernelKwargs = Union[None, Mapping, Sequence[Optional[Mapping]]]


class ExportError(UserError, ValueError):
    """A bad argument, a missing file or package, or a failed check: the message says what to do."""


@dataclass
class ExportTarget:
    """What is exported: ``module`` (eval mode) maps ``input`` (B, in_chans, H, W) to ``output_names``.

    ``description``: what it is, for messages (e.g. 'nalaformer_t classifier'). ``notes``: what was
    changed to export it (fused kernels replaced), for the user to read. ``max_stride``: the largest
    downsampling inside (32 for NaLaFormer's last stage): the export traces at sizes above it, since the
    exporter fixes the sizes of maps that are one pixel wide when traced.
    """
    module: nn.Module
    in_chans: int
    output_names: Tuple[str, ...]
    description: str
    notes: Tuple[str, ...] = ()
    max_stride: int = 1


def require_export_packages() -> None:
    """Raise :class:`ExportError` naming the export packages that are not installed."""
    missing = [name for name in EXPORT_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise ExportError(f'ONNX export needs {", ".join(missing)}, which {"is" if len(missing) == 1 else "are"} '
                          f'not installed: {INSTALL_HINT}')


# ----------------------------------------------------------------------------------------------
# Attention kernels: the PyTorch ones only
# ----------------------------------------------------------------------------------------------
def fused_attn_types(attn_types: AttnTypes) -> List[str]:
    """The names in ``attn_types`` that are another implementation of a kernel (``nala_triton`` -> ``nala``)."""
    attn_types = [attn_types] if isinstance(attn_types, str) else list(attn_types)
    return sorted({attn_type for attn_type in attn_types if kernel_function(attn_type)['attn_type'] != attn_type})


def reference_attn_types(attn_types: AttnTypes, kernel_kwargs: KernelKwargs = None
                         ) -> Tuple[AttnTypes, KernelKwargs]:
    """``(attn_types, kernel_kwargs)`` computing the same functions with PyTorch kernels only.

    Each kernel becomes the one whose function it computes (``nala_triton`` -> ``nala``,
    ``nala_cos_triton`` -> ``nala_cos``, others stay), with its arguments. One name
    and one (or no) dict for all stages stay one name and one dict; otherwise the result is per stage.
    """
    per_stage = [v for v in (attn_types, kernel_kwargs) if isinstance(v, (list, tuple))]
    attn_types, kernel_kwargs = per_stage_kernels(attn_types, kernel_kwargs, len(per_stage[0]) if per_stage else 1)
    functions = [kernel_function(attn_type, kwargs) for attn_type, kwargs in zip(attn_types, kernel_kwargs)]
    attn_types = tuple(function.pop('attn_type') for function in functions)
    kernel_kwargs = tuple(function or None for function in functions)
    return (attn_types, kernel_kwargs) if per_stage else (attn_types[0], kernel_kwargs[0])


def _replace_fused(model_args: Mapping, where: str) -> Tuple[dict, Tuple[str, ...]]:
    """``model_args`` with :func:`reference_attn_types` (when it names kernels) and a note of what changed."""
    model_args = dict(model_args)
    if 'attn_types' not in model_args or not fused_attn_types(model_args['attn_types']):
        return model_args, ()
    before = model_args['attn_types']
    model_args['attn_types'], model_args['kernel_kwargs'] = reference_attn_types(before,
                                                                                 model_args.get('kernel_kwargs'))
    return model_args, (f'{where} attn_types {before} -> {model_args["attn_types"]}: the fused kernels replaced '
                        f'by the PyTorch kernels computing the same function',)


def _check_not_fused(attn_types: AttnTypes) -> None:
    fused = fused_attn_types(attn_types)
    if fused:
        same = ', '.join(f'{attn_type!r} -> {kernel_function(attn_type)["attn_type"]!r}' for attn_type in fused)
        raise ExportError(f'fused kernel {", ".join(map(repr, fused))} cannot be exported to ONNX (its Triton '
                          f'operator has no ONNX translation): ask for the PyTorch kernel that computes the same '
                          f'function instead ({same}), e.g. --attn-types {kernel_function(fused[0])["attn_type"]}')


def _check_no_fused_modules(module: nn.Module) -> None:
    """Fused kernel modules left in the model (from where this module does not rewrite) are a bug."""
    fused = sorted({m.attn_type for m in module.modules()
                    if isinstance(m, AttentionKernel) and m.attn_type != m.function_name})
    if fused:
        raise RuntimeError(f'fused attention kernels {fused} remain in the model to export')


# ----------------------------------------------------------------------------------------------
# Building what is exported
# ----------------------------------------------------------------------------------------------
def _exportable_model(module: nn.Module, what: str) -> nn.Module:
    """The one model of this project inside ``module``; NaLa-Swin is refused (see the message)."""
    models = definition_modules(module)
    if len(models) != 1:
        raise ExportError(f'{what} is not a model of this project (NaLaFormer, NaLa-Swin): found {len(models)}')
    model = models[0][1]
    if isinstance(model, NaLaSwinTransformer):
        raise ExportError(
            f'{what}: NaLa-Swin cannot be exported with a dynamic image size. The timm Swin parts it is built '
            f'of pad inside the graph (PatchEmbed to multiples of 4, PatchMerging to even sizes, shifted-window '
            f'stages to whole windows), and torch.export cannot prove the reshapes after that padding valid for '
            f'every height and width, so the exporter would fix the size it traced. Export a NaLaFormer '
            f'(nalaformer_*) instead.')
    return model


def _target(module: nn.Module, model: nn.Module, output_names: Tuple[str, ...], description: str,
            notes: Tuple[str, ...]) -> ExportTarget:
    """``module`` (containing the project model ``model``) in eval mode, as what is exported."""
    max_stride = max(info['reduction'] for info in model.feature_info)
    return ExportTarget(module.eval(), model.in_chans, output_names, description, notes, max_stride)


def _recorded_model_args(checkpoint: Checkpoint, name: str) -> dict:
    """The arguments the checkpoint's one model was built with, when it records a ``name`` model (else {}:
    loading names what the checkpoint holds)."""
    definitions = checkpoint.definitions
    if len(definitions) != 1:
        return {}
    if definitions[0]['module'].startswith('backbone.'):
        raise ExportError(f'{checkpoint.path} is a dense-task run (its model is the backbone '
                          f'{definitions[0]["module"]!r}): export its config with --checkpoint')
    return dict(definitions[0]['model_args']) if definitions[0].get('architecture') in (name, None) else {}


def timm_target(name: str, attn_types: Optional[AttnTypes] = None, num_classes: Optional[int] = None,
                checkpoint: Optional[str] = None, ema: bool = False) -> ExportTarget:
    """A classifier built by ``timm.create_model(name, ...)``, with a checkpoint's weights (every weight).

    The model is built with the arguments the checkpoint records (fused kernels replaced), overridden by
    ``attn_types`` (the model's kernels, without kernel arguments) and ``num_classes`` where given.
    ``checkpoint``: any file the model's ``load_pretrained`` reads (ours, the release's, a tools/train.py
    classification run, a timm hub folder); ``ema``: its EMA weights.
    """
    if name not in timm.list_models():
        close = timm.list_models(f'*{name.split("_")[0]}*')[:10] or timm.list_models('nala*')
        raise ExportError(f'unknown model {name!r} (neither a timm model name nor a config file); '
                          f'similar names: {close}')
    if attn_types is not None:
        _check_not_fused(attn_types)
    ckpt = None if checkpoint is None else Checkpoint.read(checkpoint)
    model_args = _recorded_model_args(ckpt, name) if ckpt else {}
    if attn_types is not None:
        model_args.update(attn_types=attn_types, kernel_kwargs=None)
    model_args, notes = _replace_fused(model_args, f'{checkpoint} records')
    if num_classes is not None:
        model_args['num_classes'] = num_classes
    try:
        model = timm.create_model(name, **model_args)
    except ValueError as e:  # e.g. an unknown kernel or a wrong number of them
        raise ExportError(f'{name}: {e}') from None
    _exportable_model(model, name)
    if ckpt is not None:
        missing = model.load_pretrained(ckpt, ema=ema).missing_keys
        if missing:
            raise ExportError(f'{checkpoint} has no weights for {missing[:4]} of {name}: a classifier fine-tuned to '
                              f'another number of classes? Pass --num-classes')
    return _target(model, model, ('logits',), f'{name} classifier', notes)


def _import_config_modules(cfg) -> None:
    """The config's ``custom_imports`` and its default scope's modules (what tools/train.py's runner does)."""
    try:
        for module in (cfg.get('custom_imports') or {}).get('imports', []):
            importlib.import_module(module)
        scope = cfg.get('default_scope')
        if scope:
            importlib.import_module(f'{scope}.utils').register_all_modules(init_default_scope=False)
    except ImportError as e:
        raise ExportError(f'the config needs a package that is not installed ({e}): bash scripts/setup.sh') from None


def config_target(path: str, attn_types: Optional[AttnTypes] = None, checkpoint: Optional[str] = None,
                  ema: bool = False) -> ExportTarget:
    """The classifier of a classification config, or the backbone of a dense (segmentation, detection) one.

    The config's whole model is built (without the weights it would load) and the checkpoint loaded into it
    as tools/test.py does: a runner checkpoint of this config's task (every weight, definitions checked) or
    the weights of its one timm model (e.g. ImageNet weights for a backbone). ``attn_types`` overrides the
    config's (classifier's or backbone's) kernels, without kernel arguments.
    """
    from mmengine.config import Config
    from mmengine.registry import MODELS, DefaultScope

    from .classification import TimmClassifier
    from .engine.launch import check_model_keywords, model_spec

    cfg = Config.fromfile(path)
    _import_config_modules(cfg)
    check_model_keywords(cfg)  # a keyword the model does not take, or a value it rejects, named in one line
    spec = model_spec(cfg)  # which part of the config is the timm model
    classification = spec is not None and issubclass(spec.wrapper, TimmClassifier)
    backbone = spec is not None and spec.prefix != 'model.'  # inside a dense model: its features are exported
    if not (classification or backbone):
        what = 'no timm model' if spec is None else f'a {spec.wrapper.__name__}'
        raise ExportError(f'{path}: its model is {what}; ONNX export takes a TimmClassifier or a dense model\'s '
                          f'NaLaBackbone')
    owner, prefix = spec.part(cfg), spec.prefix
    where = 'the config\'s model' if classification else 'the config\'s backbone'
    for option in spec.weight_options:  # the weights come from the checkpoint alone
        owner[option] = None
    if attn_types is not None:
        _check_not_fused(attn_types)
        owner.update(attn_types=attn_types, kernel_kwargs=None)
    model_args, notes = _replace_fused(owner, where)
    owner.update(model_args)
    ckpt = None if checkpoint is None else Checkpoint.read(checkpoint)
    try:
        with DefaultScope.overwrite_default_scope(cfg.get('default_scope')):
            model = MODELS.build(cfg.model)
    except ValueError as e:  # e.g. an unknown kernel or a wrong number of them
        raise ExportError(f'{path}: {e}') from None
    if ckpt is not None:
        load_checkpoint_into(model, ckpt, ema=ema, cfg_prefix=prefix)
    name = Path(path).name
    if classification:
        module, outputs, what = model.model, ('logits',), f'{name} classifier'
    else:
        module, what = model.get_submodule(prefix[len('model.'):].rstrip('.')), f'{name} backbone'
        outputs = tuple(f'feat{i}' for i in module.out_indices)
    return _target(module, _exportable_model(module, name), outputs, what, notes)


def build_target(model_or_config: str, attn_types: Optional[AttnTypes] = None, num_classes: Optional[int] = None,
                 checkpoint: Optional[str] = None, ema: bool = False) -> ExportTarget:
    """:func:`config_target` for a ``.py`` file, else :func:`timm_target` (``num_classes``: timm names only)."""
    if model_or_config.endswith('.py'):
        if not os.path.isfile(model_or_config):
            raise ExportError(f'config file {model_or_config} does not exist')
        if num_classes is not None:
            raise ExportError('--num-classes is for timm names: a config sets its model\'s num_classes')
        return config_target(model_or_config, attn_types, checkpoint, ema)
    return timm_target(model_or_config, attn_types, num_classes, checkpoint, ema)


# ----------------------------------------------------------------------------------------------
# Export and check
# ----------------------------------------------------------------------------------------------
def parse_shape(text: str) -> Shape:
    """'320x480' -> (1, 320, 480); '2x320x480' -> (2, 320, 480); '224' -> (1, 224, 224)."""
    try:
        sizes = [int(part) for part in text.lower().split('x')]
    except ValueError:
        sizes = []
    if len(sizes) == 1:
        sizes = sizes * 2
    if len(sizes) == 2:
        sizes = [1, *sizes]
    if len(sizes) != 3 or min(sizes) < 1:
        raise ExportError(f'{text!r} is not a shape: write HxW or BxHxW, e.g. 320x480 or 2x320x480')
    return tuple(sizes)


def _inputs(target: ExportTarget, shape: Shape) -> torch.Tensor:
    """A (B, in_chans, H, W) float32 input of normal noise, the same for the same shape."""
    batch, height, width = shape
    generator = torch.Generator().manual_seed(0)
    return torch.randn(batch, target.in_chans, height, width, generator=generator)


def export_onnx(target: ExportTarget, path: Union[str, os.PathLike], shape: Shape,
                opset: Optional[int] = None) -> None:
    """Write ``target`` to ``path`` as ONNX traced at ``shape``, with dynamic batch, height and width.

    torch.export fixes sizes of 0 and 1 as constants: the batch must be at least 2, and H, W above the
    target's ``max_stride`` (no map of one pixel).
    """
    if shape[0] < 2:
        raise ExportError(f'export at batch size 2 or more (got {shape[0]}): a batch of 1 would be fixed in the graph')
    if min(shape[1:]) <= target.max_stride:
        raise ExportError(f'export at a height and width above {target.max_stride} (got {shape[1]}x{shape[2]}, '
                          f'e.g. {2 * target.max_stride}x{2 * target.max_stride}): the stride-{target.max_stride} '
                          f'maps would be one pixel wide and their size fixed in the graph. The exported graph '
                          f'still takes smaller images.')
    _check_no_fused_modules(target.module)
    batch, height, width = torch.export.Dim('batch'), torch.export.Dim('height'), torch.export.Dim('width')
    with torch.no_grad(), use_nala_backend('reference'):
        program = torch.onnx.export(
            target.module, (_inputs(target, shape),), dynamo=True, verbose=False,
            dynamic_shapes=({0: batch, 2: height, 3: width},), opset_version=opset,
            input_names=['input'], output_names=list(target.output_names))
    program.save(str(path), external_data=False)


def nonstandard_ops(model) -> List[str]:
    """'domain::op' of every operator of an ``onnx.ModelProto`` outside standard ONNX (e.g. a custom
    ``nalaformer::`` op); calls of the model's own local functions are not counted."""
    nodes = [*model.graph.node, *(node for function in model.functions for node in function.node)]
    local = {(function.domain, function.name) for function in model.functions}
    return sorted({f'{node.domain}::{node.op_type}' for node in nodes
                   if node.domain not in STANDARD_DOMAINS and (node.domain, node.op_type) not in local})


def fixed_input_sizes(model) -> Dict[str, int]:
    """{axis: size} for the batch, height and width of an ``onnx.ModelProto``'s input that are constants
    (the exporter fixes a size it cannot keep symbolic, e.g. to the one it traced)."""
    dims = model.graph.input[0].type.tensor_type.shape.dim
    return {axis: dims[i].dim_value for axis, i in (('batch', 0), ('height', 2), ('width', 3))
            if not dims[i].dim_param}


def _check_graph(path: Path, description: str, opset: Optional[int]) -> None:
    """Only standard operators, dynamic batch, height and width, and the opset asked for (if one was)."""
    import onnx
    model = onnx.load(str(path))
    written = {entry.version for entry in model.opset_import if entry.domain in STANDARD_DOMAINS}
    if opset is not None and written != {opset}:
        raise ExportError(f'{description}: the exporter could not write ONNX opset {opset} (it wrote '
                          f'{sorted(written)}): ask for --opset {max(written)} or newer, or leave the default')
    foreign = nonstandard_ops(model)
    if foreign:
        raise RuntimeError(f'the exported graph has operators outside standard ONNX: {foreign}')
    fixed = fixed_input_sizes(model)
    if fixed:
        raise ExportError(f'{description}: the exporter could not keep the input\'s '
                          f'{", ".join(f"{k} (fixed to {v})" for k, v in fixed.items())} dynamic')


def compare_with_onnxruntime(target: ExportTarget, path: Union[str, os.PathLike], shapes: Sequence[Shape]
                             ) -> List[Dict[str, float]]:
    """For each shape: {output name: max |ONNX Runtime - PyTorch|} on the same noise input (PyTorch runs
    the model as it runs by default, fast operators included)."""
    import onnxruntime
    session = onnxruntime.InferenceSession(str(path), providers=['CPUExecutionProvider'])
    diffs = []
    for shape in shapes:
        x = _inputs(target, shape)
        with torch.no_grad():
            expected = target.module(x)
        expected = [expected] if isinstance(expected, torch.Tensor) else list(expected)
        outputs = session.run(list(target.output_names), {'input': x.numpy()})
        diffs.append({name: float(np.abs(out - ref.numpy()).max())
                      for name, out, ref in zip(target.output_names, outputs, expected)})
    return diffs


def _describe_shape(target: ExportTarget, shape: Shape) -> str:
    return 'x'.join(map(str, (shape[0], target.in_chans, *shape[1:])))


def write_onnx(target: ExportTarget, out: Union[str, os.PathLike], export_shape: Shape,
               check_shapes: Sequence[Shape] = (), atol: float = 1e-4, opset: Optional[int] = None,
               log: Callable[[str], None] = lambda message: None) -> List[Dict[str, float]]:
    """Export ``target`` (:func:`export_onnx`), check it (standard operators only and a dynamic input:
    :func:`nonstandard_ops`, :func:`fixed_input_sizes`; :func:`compare_with_onnxruntime` at ``check_shapes``
    within ``atol``) and only then move it to ``out``.

    Returns the differences per check shape; raises :class:`ExportError` when a check fails (nothing is
    written). ``log`` receives one line per step.
    """
    require_export_packages()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(dir=out.parent, prefix=f'.{out.name}.'))  # same file system: atomic rename
    tmp = tmp_dir / out.name
    try:
        log(f'exporting {target.description} traced at {_describe_shape(target, export_shape)} '
            f'(batch, height and width dynamic)')
        started = time.perf_counter()
        export_onnx(target, tmp, export_shape, opset)
        log(f'exported in {time.perf_counter() - started:.1f} s: {tmp.stat().st_size / 2 ** 20:.1f} MiB')
        _check_graph(tmp, target.description, opset)
        diffs = compare_with_onnxruntime(target, tmp, check_shapes)
        for shape, diff in zip(check_shapes, diffs):
            log(f'checked in ONNX Runtime at {_describe_shape(target, shape)}: max |onnx - torch| = '
                f'{max(diff.values()):.3g}' + (f' ({", ".join(f"{k} {v:.3g}" for k, v in diff.items())})'
                                               if len(diff) > 1 else ''))
        failed = [(shape, max(diff.values())) for shape, diff in zip(check_shapes, diffs) if max(diff.values()) > atol]
        if failed:
            raise ExportError(f'ONNX Runtime differs from PyTorch by more than atol={atol:g} at '
                              + ', '.join(f'{_describe_shape(target, s)} ({d:.3g})' for s, d in failed)
                              + f'; {out} not written')
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp_dir)
    return diffs
