"""ONNX export (tools/deployment/export_onnx.py): files run in ONNX Runtime match PyTorch at other sizes."""
import importlib.util
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import timm
import torch
from mmengine.config import Config
from mmengine.registry import MODELS, DefaultScope

import nalaformer.dense  # noqa: F401  (registers NaLaBackbone)
from nalaformer.checkpoint import model_definition, model_definitions, save_state_dict
from nalaformer.deployment import (
    ExportError, ExportTarget, config_target, require_export_packages, timm_target, write_onnx,
)
from nalaformer.ops import ATTENTION_KERNELS, AttentionKernel

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / 'tools' / 'deployment'))
import export_onnx  # noqa: E402

UPERNET_XT = ROOT / 'configs' / 'ade20k' / 'upernet_nalaformer-xt_8xb2-160k_ade20k-512x512.py'
CLASSIFIER_XT = ROOT / 'configs' / 'nalaformer' / 'nalaformer-xt_8xb128_in1k.py'
needs_triton = pytest.mark.skipif('nala_triton' not in ATTENTION_KERNELS, reason='triton is not installed')


def onnx_outputs(path, x):
    """Every output of the ONNX file for x (B, C, H, W), run by ONNX Runtime on the CPU."""
    session = onnxruntime.InferenceSession(str(path), providers=['CPUExecutionProvider'])
    return session.run(None, {session.get_inputs()[0].name: x.numpy()})


def max_diff(outputs, expected) -> float:
    expected = [expected] if isinstance(expected, torch.Tensor) else expected
    assert len(outputs) == len(expected)
    for out, ref in zip(outputs, expected):
        assert out.shape == tuple(ref.shape)
    return max(float(np.abs(out - ref.numpy()).max()) for out, ref in zip(outputs, expected))


def saved_weights(model, path):
    """``model``'s weights as the project writes them (its definition recorded); returns the path."""
    save_state_dict(model.state_dict(), path, model_definition(model))
    return str(path)


def randomise_norms(model):
    """BatchNorm statistics and LayerNorm affines away from their init, so that loading them matters."""
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.normal_(0, 0.1)
            module.running_var.uniform_(0.5, 1.5)
        elif isinstance(module, torch.nn.LayerNorm):
            module.weight.data.uniform_(0.5, 1.5)
            module.bias.data.normal_(0, 0.1)
    return model


def fused_attn_types_in(module):
    kernels = [m for m in module.modules() if isinstance(m, AttentionKernel)]
    return {kernel.attn_type for kernel in kernels if kernel.attn_type != kernel.function_name}


@pytest.mark.slow
def test_nalaformer_t_runs_in_onnxruntime_at_224_and_320x480(tmp_path, capsys):
    """The acceptance: NaLaFormer-T (the release's hybrid), weights through --checkpoint, exported once and
    run at 224x224 (batch 1) and 320x480 (batch 2) within 1e-4 of PyTorch."""
    model = randomise_norms(timm.create_model('nalaformer_t')).eval()
    out = tmp_path / 'nalaformer_t.onnx'
    assert export_onnx.main(['nalaformer_t', '--checkpoint', saved_weights(model, tmp_path / 't.pth'),
                             '--out', str(out)]) == 0
    printed = capsys.readouterr().out
    assert 'checked in ONNX Runtime at 1x3x224x224' in printed and 'at 2x3x320x480' in printed
    for shape in [(1, 3, 224, 224), (2, 3, 320, 480)]:
        x = torch.randn(shape)
        with torch.no_grad():
            expected = model(x)
        assert max_diff(onnx_outputs(out, x), expected) <= 1e-4, shape


@pytest.mark.slow
def test_all_nala_model_at_odd_sizes_has_only_standard_onnx_operators(tmp_path):
    model = randomise_norms(timm.create_model('nalaformer_xt', attn_types='nala')).eval()
    out = tmp_path / 'xt.onnx'
    assert export_onnx.main(['nalaformer_xt', '--attn-types', 'nala', '--checkpoint',
                             saved_weights(model, tmp_path / 'xt.safetensors'), '--size', '96x128',
                             '--check-shapes', '1x96x128', '--out', str(out)]) == 0
    for shape in [(1, 3, 97, 130), (3, 3, 61, 45), (1, 3, 20, 27)]:
        x = torch.randn(shape)
        with torch.no_grad():
            expected = model(x)
        assert max_diff(onnx_outputs(out, x), expected) <= 1e-4, shape
    graph = onnx.load(str(out))
    nodes = [*graph.graph.node, *(node for function in graph.functions for node in function.node)]
    assert {node.domain for node in nodes} <= {'', 'ai.onnx'} | {f.domain for f in graph.functions}
    assert not any('nalaformer' in node.domain or 'nala' in node.op_type.lower() for node in nodes)


@pytest.mark.slow
def test_dense_config_exports_its_backbone_with_a_runner_checkpoint(tmp_path):
    """A segmentation run's checkpoint (a backbone with nala_cos stages, its output norms, the heads): the
    ONNX file is the backbone, four maps at strides 4-32 named feat0..feat3, equal to the segmentor's."""
    config = tmp_path / 'upernet_cos.py'
    config.write_text(f"_base_ = ['{UPERNET_XT}']\n"
                      "model = dict(backbone=dict(attn_types=('nala_cos', 'nala_cos', 'softmax', 'softmax'), "
                      "kernel_kwargs=(dict(alpha=5.0), dict(alpha=5.0), None, None)))\n")
    cfg = Config.fromfile(str(config))
    cfg.model.backbone.init_cfg = None
    with DefaultScope.overwrite_default_scope('mmseg'):
        segmentor = randomise_norms(MODELS.build(cfg.model))
    checkpoint = tmp_path / 'iter_100.pth'
    torch.save({'meta': {'model_definitions': model_definitions(segmentor)}, 'state_dict': segmentor.state_dict()},
               checkpoint)
    out = tmp_path / 'backbone.onnx'
    assert export_onnx.main([str(config), '--checkpoint', str(checkpoint), '--size', '128x128',
                             '--check-shapes', '1x128x128', '--out', str(out)]) == 0
    assert [o.name for o in onnx.load(str(out)).graph.output] == ['feat0', 'feat1', 'feat2', 'feat3']
    x = torch.randn(2, 3, 100, 150)
    with torch.no_grad():
        expected = segmentor.backbone.eval()(x)
    outputs = onnx_outputs(out, x)
    assert [o.shape[-2:] for o in outputs] == [(25, 38), (13, 19), (7, 10), (4, 5)]
    assert max_diff(outputs, expected) <= 1e-4


@needs_triton
def test_fused_kernels_a_checkpoint_records_become_their_pytorch_kernels(tmp_path):
    """A checkpoint trained with Triton kernels: without --attn-types the tool builds what it records, with
    the PyTorch kernels of the same functions, and loads its weights."""
    fused = timm.create_model('nalaformer_xt', attn_types=('nala_triton', 'nala_cos_triton', 'softmax', 'relu'),
                              kernel_kwargs=(None, dict(alpha=5.0), None, dict(power=2.0)))
    target = timm_target('nalaformer_xt', checkpoint=saved_weights(randomise_norms(fused), tmp_path / 'fused.pth'))
    model = target.module
    assert model.attn_types == ('nala', 'nala_cos', 'softmax', 'relu')
    assert model.kernel_kwargs == (None, dict(alpha=5.0), None, dict(power=2.0))
    assert not fused_attn_types_in(model) and fused_attn_types_in(fused) == {'nala_triton', 'nala_cos_triton'}
    assert "-> ('nala', 'nala_cos', 'softmax', 'relu')" in target.notes[0]
    own = model.state_dict()
    for key, value in fused.state_dict().items():
        assert torch.equal(own[key], value), key


@needs_triton
def test_fused_kernels_a_config_names_become_their_pytorch_kernels(tmp_path):
    config = tmp_path / 'fused.py'
    config.write_text(f"_base_ = ['{CLASSIFIER_XT}']\n"
                      "model = dict(attn_types=('nala_triton', 'nala_triton', 'softmax', 'softmax'))\n")
    target = config_target(str(config))
    assert target.module.attn_types == ('nala', 'nala', 'softmax', 'softmax') and not fused_attn_types_in(target.module)
    assert target.output_names == ('logits',) and "-> ('nala', 'nala', 'softmax', 'softmax')" in target.notes[0]


@pytest.mark.parametrize('argv, message', [
    (['nalaformer_t', '--attn-types', 'nala_triton'], "ask for the PyTorch kernel that computes the same function"),
    (['nalaformer_t', '--attn-types', 'nala_triton', 'nala_triton', 'softmax', 'softmax'], '--attn-types nala'),
    ([str(CLASSIFIER_XT), '--attn-types', 'nala_cos_triton'], "'nala_cos_triton' -> 'nala_cos'"),
    (['nalaformer_tt'], "unknown model 'nalaformer_tt'"),
    (['nalaformer_t', '--checkpoint', 'missing.pth'], 'checkpoint missing.pth does not exist'),
    (['configs/none.py'], 'config file configs/none.py does not exist'),
    (['nalaformer_t', '--size', '224x'], 'write HxW or BxHxW'),
    (['nalaformer_xt', '--size', '32x64'], 'export at a height and width above 32 (got 32x64, e.g. 64x64)'),
    (['nala_swin_tiny'], 'NaLa-Swin cannot be exported with a dynamic image size'),
], ids=['fused', 'fused-per-stage', 'fused-in-config', 'unknown-model', 'missing-checkpoint', 'missing-config',
        'bad-size', 'one-pixel-maps', 'nala-swin'])
def test_user_errors_are_one_line_messages(argv, message, tmp_path, capsys):
    if any(arg.endswith('_triton') for arg in argv) and 'nala_triton' not in ATTENTION_KERNELS:
        pytest.skip('triton is not installed')
    out = tmp_path / 'model.onnx'
    try:
        code = export_onnx.main([*argv, '--out', str(out)])
    except SystemExit as e:  # argparse: bad argument values
        code = e.code
    assert code != 0
    err = capsys.readouterr().err
    assert message in err and 'Traceback' not in err
    assert not out.exists()


def test_missing_export_packages_name_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, 'find_spec', lambda name, *a: None if name == 'onnxscript' else real(name, *a))
    with pytest.raises(ExportError, match=r'needs onnxscript.*pip install -e \.\[export\]'):
        require_export_packages()


class _ExportedWrong(torch.nn.Module):
    """(B, C, H, W) -> (B, C) channel means, off by one in the exported graph."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean((2, 3)) + (1.0 if torch.onnx.is_in_onnx_export() else 0.0)


def test_a_failed_check_writes_nothing(tmp_path):
    out = tmp_path / 'wrong.onnx'
    with pytest.raises(ExportError, match=r'differs from PyTorch by more than atol=0.0001 at 1x3x8x8 \(1\)'):
        write_onnx(ExportTarget(_ExportedWrong().eval(), 3, ('logits',), 'wrong'), out, (2, 8, 8), [(1, 8, 8)])
    assert list(tmp_path.iterdir()) == []
