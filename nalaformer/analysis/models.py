"""Model specs of the analysis tools: a timm model name (``arch``), optionally with keyword arguments in call syntax,
or a config file, whose timm model its task wrapper names (:func:`nalaformer.engine.launch.model_spec`)::

    nalaformer_t
    nalaformer_t(attn_types='nala')
    configs/nalaformer/nalaformer-t_8xb128_in1k.py
"""
import ast
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Dict, Optional, Tuple

import timm
import torch
import torch.nn as nn
from timm.models import get_pretrained_cfg_value

import nalaformer  # noqa: F401  (registers the nalaformer_* models in timm)
from ..engine.model_spec import check_model_name
from ..errors import ConfigError

__all__ = ['IMPLEMENTATIONS', 'ModelSpecError', 'ModelSpec', 'OnnxRuntimeModel', 'parse_model_spec', 'parse_entry',
           'create_model']

# Prefixes of a benchmark's model entry: our model on a given NaLa backend, the release's model, the model compiled
# (torch.compile, default settings; 'frozen': with inductor's freezing, for inference), exported to ONNX and run by ONNX Runtime (inference on the CPU), reparameterized
# for inference (timm's reparameterize_model), or without in-place inference (nalaformer.models.inplace_inference).
IMPLEMENTATIONS = ('torch', 'fused', 'reference', 'release', 'compiled', 'frozen', 'onnx', 'deploy', 'outofplace')


class ModelSpecError(ConfigError):
    """An unreadable spec or config, or an argument the model does not take or a value it rejects."""


@dataclass(frozen=True)
class ModelSpec:
    """A timm model name with its kwargs; ``label`` is how results name it."""
    arch: str
    kwargs: Dict[str, object] = field(default_factory=dict)
    label: str = ''

    def __post_init__(self):
        if not self.label:
            object.__setattr__(self, 'label', self.arch)


def parse_model_spec(text: str) -> ModelSpec:
    """Parse ``arch``, ``arch(key=value, ...)`` (Python literals) or a config file path."""
    if text.endswith('.py'):
        return _spec_from_config(Path(text))
    arch, call, args = text.strip().partition('(')
    kwargs = _literal_kwargs(args, text) if call else {}
    check_model_name(arch, key='model spec')
    return ModelSpec(arch, kwargs, text.strip())


def parse_entry(text: str) -> Tuple[ModelSpec, Optional[str]]:
    """A benchmark's model entry: its spec (labelled with the whole entry) and its :data:`IMPLEMENTATIONS` prefix,
    if any (``torch:<spec>``, ``fused:<spec>``, ``release:<spec>``, ...)."""
    implementation, _, rest = text.partition(':')
    if implementation not in IMPLEMENTATIONS or not rest:
        return parse_model_spec(text), None
    return replace(parse_model_spec(rest), label=text.strip()), implementation


def _literal_kwargs(args: str, text: str) -> Dict[str, object]:
    try:
        call = ast.parse(f'f({args}', mode='eval').body
        if call.args:
            raise ValueError('positional arguments are not allowed')
        return {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
    except (SyntaxError, ValueError) as e:
        raise ModelSpecError(
            f"cannot parse model spec {text!r} ({e}); write it as arch(key=value, ...) with Python "
            f"literals, e.g. \"nalaformer_t(attn_types='nala')\"") from None


def _spec_from_config(path: Path) -> ModelSpec:
    """The timm model of a config, as its task wrapper builds it."""
    from ..engine.launch import load_config, model_spec
    spec = model_spec(load_config(str(path)))
    if spec is None:
        raise ModelSpecError(f'{path}: its model has no task wrapper of this project naming a timm model')
    part = '' if spec.prefix == 'model.' else ' (backbone only)'
    return ModelSpec(spec.name, dict(spec.kwargs), f'{path.name}: {spec.name}{part}')


def create_model(spec: ModelSpec, img_size: Optional[Tuple[int, int]] = None,
                 checkpoint: Optional[str] = None, **kwargs) -> nn.Module:
    """timm model of ``spec`` (random init unless ``checkpoint``) for ``img_size`` (H, W): models with a fixed input
    size (ViT, Swin: ``fixed_input_size`` in their timm cfg) get it at construction, the others take any size."""
    kwargs = {**spec.kwargs, **kwargs}
    if img_size is not None and get_pretrained_cfg_value(spec.arch, 'fixed_input_size'):
        kwargs.setdefault('img_size', tuple(img_size))
    if checkpoint:
        kwargs['pretrained_cfg_overlay'] = dict(file=str(checkpoint))
    try:
        return timm.create_model(spec.arch, pretrained=bool(checkpoint), **kwargs)
    except (TypeError, ValueError) as e:  # a kwarg the model does not take, or a value it rejects
        raise ModelSpecError(f'{spec.label}: {e}') from None


class OnnxRuntimeModel(nn.Module):
    """``model`` exported to ONNX for the shape of ``example`` (B, C, H, W) (static shapes; the NaLa reference
    kernels, which ONNX can express) and run by ONNX Runtime on the CPU with torch's thread count: inference only."""

    def __init__(self, model: nn.Module, example: torch.Tensor):
        super().__init__()
        import onnxruntime
        from ..ops import use_nala_backend
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()
        with tempfile.TemporaryDirectory() as folder, torch.no_grad(), use_nala_backend('reference'):
            path = str(Path(folder) / 'model.onnx')
            torch.onnx.export(model.eval(), (example,), dynamo=True, verbose=False, input_names=['input']).save(
                path, external_data=False)
            self.session = onnxruntime.InferenceSession(path, options, providers=['CPUExecutionProvider'])
        self.num_classes = model.num_classes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self.session.run(None, {'input': x.numpy()})[0])
