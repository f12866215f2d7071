"""timm's hub folder: tools/convert_checkpoint.py SRC DIR, then timm.create_model('local-dir:DIR', pretrained=True)."""
import argparse
import json
import runpy
from pathlib import Path

import pytest
import timm
import torch

import nalaformer  # noqa: F401  (registers the models)
from nalaformer.checkpoint import (
    Checkpoint, CheckpointError, DefinitionMismatchError, model_definition, save_state_dict,
)

ROOT = Path(__file__).resolve().parents[1]
CONVERT = runpy.run_path(str(ROOT / 'tools' / 'convert_checkpoint.py'))['main']
TINY = dict(embed_dims=(16, 32, 48, 64), depths=(1, 1, 1, 1), num_heads=(1, 2, 3, 4), head_hidden_size=32,
            num_classes=5)
SWIN = dict(embed_dim=16, depths=(1, 1, 1, 1), num_heads=(1, 2, 2, 4), num_classes=3)
MODELS = {
    'hybrid': ('nalaformer_t', TINY),
    'all-nala': ('nalaformer_t', dict(TINY, attn_types='nala')),
    'nala_cos-alpha5': ('nalaformer_t', dict(TINY, attn_types='nala_cos', kernel_kwargs=dict(alpha=5.))),
    'attention-only': ('nalaformer_t', dict(TINY, attn_types='softmax', conv_mixers=False)),
    'swin': ('nala_swin_tiny', SWIN),
    'swin-relu': ('nala_swin_tiny', dict(SWIN, attn_types=('relu', 'relu', 'shifted_window', 'shifted_window'))),
}


def convert(src, dst, *flags):
    assert CONVERT([str(src), str(dst), *flags]) == 0


def folder_of(model, tmp_path, source='m.pth'):
    """``model`` saved with its definition as ``source``, then converted to a timm folder; the folder."""
    save_state_dict(model.state_dict(), tmp_path / source, model_definition(model))
    convert(tmp_path / source, tmp_path / 'folder')
    return tmp_path / 'folder'


def trained_like(arch, kwargs, seed=0):
    """A model whose BatchNorm statistics are not the init values (so eval logits depend on them too)."""
    torch.manual_seed(seed)
    model = timm.create_model(arch, **kwargs)
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name.endswith('running_mean') or name.endswith('running_var'):
                buffer.copy_(torch.rand_like(buffer) + 0.5)
    return model.eval()


def logits(model, x):
    with torch.no_grad():
        return model.eval()(x)


@pytest.mark.parametrize('name', list(MODELS))
def test_folder_rebuilds_the_same_model_with_the_same_weights(name, tmp_path):
    arch, kwargs = MODELS[name]
    model = trained_like(arch, kwargs)
    folder_of(model, tmp_path, 'm.safetensors')

    config = json.loads((tmp_path / 'folder' / 'config.json').read_text())
    assert config['architecture'] == arch and config['num_classes'] == kwargs['num_classes']
    assert (tmp_path / 'folder' / 'model.safetensors').is_file()
    loaded = timm.create_model(f'local-dir:{tmp_path / "folder"}', pretrained=True)
    assert (loaded.attn_types, loaded.kernel_kwargs) == (model.attn_types, model.kernel_kwargs)
    x = torch.randn(2, 3, 64, 64)
    torch.testing.assert_close(logits(loaded, x), logits(model, x), rtol=0, atol=0)


def test_release_checkpoint_becomes_the_release_hybrid(tmp_path):
    model = trained_like('nalaformer_xt', {})
    torch.save({'model': model.state_dict(), 'epoch': 299, 'args': argparse.Namespace(model='NALAFORMER_XT')},
               tmp_path / 'release.pth')
    convert(tmp_path / 'release.pth', tmp_path / 'folder')
    config = json.loads((tmp_path / 'folder' / 'config.json').read_text())
    assert config['architecture'] == 'nalaformer_xt'
    assert config['model_args']['attn_types'] == ['nala', 'nala', 'softmax', 'softmax']
    loaded = timm.create_model(f'local-dir:{tmp_path / "folder"}', pretrained=True)
    x = torch.randn(1, 3, 96, 80)
    torch.testing.assert_close(logits(loaded, x), logits(model, x), rtol=0, atol=0)


def test_release_layout_of_another_configuration_keeps_its_architecture(tmp_path):
    model = trained_like('nalaformer_t', dict(TINY, layer_scale_init_values=None))
    torch.save({'model': model.state_dict()}, tmp_path / 'small.pth')
    convert(tmp_path / 'small.pth', tmp_path / 'folder')
    loaded = timm.create_model(f'local-dir:{tmp_path / "folder"}', pretrained=True)
    assert loaded.num_classes == 5
    x = torch.randn(2, 3, 64, 48)
    torch.testing.assert_close(logits(loaded, x), logits(model, x), rtol=0, atol=0)


def test_folder_guards_its_definition_and_ema_flag(tmp_path):
    model = trained_like('nalaformer_t', dict(TINY, attn_types='relu', kernel_kwargs=dict(power=3)))
    folder_of(model, tmp_path, 'relu.pth')
    folder = f'local-dir:{tmp_path / "folder"}'
    with pytest.raises(DefinitionMismatchError, match=r"attn_types=\['relu', 'relu', 'relu', 'relu'\]"):
        timm.create_model(folder, pretrained=True, attn_types='nala', kernel_kwargs={})  # another function
    accepted = timm.create_model(folder, pretrained=True, attn_types='nala', kernel_kwargs={},
                                 accept_definition_change=True)
    assert torch.equal(accepted.proj.weight, model.proj.weight)
    with pytest.raises(CheckpointError, match='has no EMA weights'):  # exported from raw weights
        timm.create_model(folder, pretrained=True, pretrained_ema=True)


def test_folder_converts_back_to_a_file_with_its_definition(tmp_path):
    model = trained_like(*MODELS['nala_cos-alpha5'])
    folder_of(model, tmp_path, 'm.safetensors')
    convert(tmp_path / 'folder', tmp_path / 'back.safetensors')
    [definition] = Checkpoint.read(tmp_path / 'back.safetensors').definitions
    assert definition['model_args']['kernel_kwargs'] == [{'alpha': 5.0}] * 4
    loaded = timm.create_model('nalaformer_t', pretrained=True, attn_types='nala_cos', kernel_kwargs=dict(alpha=5.),
                               pretrained_cfg_overlay=dict(file=str(tmp_path / 'back.safetensors')), **TINY)
    x = torch.randn(1, 3, 64, 64)
    torch.testing.assert_close(logits(loaded, x), logits(model, x), rtol=0, atol=0)


def test_a_folder_is_replaced_only_by_a_complete_one(tmp_path):
    model = trained_like(*MODELS['hybrid'])
    folder_of(model, tmp_path)
    other = trained_like('nalaformer_xt', {})
    torch.save({'model': other.state_dict()}, tmp_path / 'xt.pth')
    convert(tmp_path / 'xt.pth', tmp_path / 'folder')  # overwrite: the new model, nothing of the old one left
    assert json.loads((tmp_path / 'folder' / 'config.json').read_text())['architecture'] == 'nalaformer_xt'
    assert sorted(p.name for p in tmp_path.iterdir()) == ['folder', 'm.pth', 'xt.pth']
    broken = {k: v for k, v in model.state_dict().items() if k != 'layers.1.blocks.0.attn.qkvg.weight'}
    torch.save({'model': broken}, tmp_path / 'broken.pth')
    assert CONVERT([str(tmp_path / 'broken.pth'), str(tmp_path / 'folder')]) == 2
    assert json.loads((tmp_path / 'folder' / 'config.json').read_text())['architecture'] == 'nalaformer_xt'


def test_push_to_hf_hub_publishes_a_folder_that_loads(tmp_path, monkeypatch):
    """timm's push_to_hf_hub of a model loaded from a folder uploads a folder that rebuilds it (the hub's
    client replaced by a local copy: there is no network here)."""
    import shutil

    import timm.models._hub as hub

    class LocalHub:
        def __init__(self, **kwargs):
            pass

        def create_repo(self, repo_id, **kwargs):
            return argparse.Namespace(repo_id=repo_id)

        def file_exists(self, **kwargs):
            return False

        def upload_folder(self, repo_id, folder_path, **kwargs):
            shutil.copytree(folder_path, tmp_path / 'hub' / repo_id)

    monkeypatch.setattr(hub, 'HfApi', LocalHub)
    model = trained_like(*MODELS['all-nala'])
    folder_of(model, tmp_path)
    timm.models.push_to_hf_hub(timm.create_model(f'local-dir:{tmp_path / "folder"}', pretrained=True), 'me/nala')
    published = timm.create_model(f'local-dir:{tmp_path / "hub" / "me" / "nala"}', pretrained=True)
    x = torch.randn(1, 3, 64, 64)
    torch.testing.assert_close(logits(published, x), logits(model, x), rtol=0, atol=0)


def test_a_folder_initialises_a_dense_backbone(tmp_path):
    from nalaformer.dense import NaLaBackbone
    model = trained_like(*MODELS['hybrid'])
    folder_of(model, tmp_path)
    backbone_kwargs = {k: v for k, v in TINY.items() if k not in ('num_classes', 'head_hidden_size')}
    backbone = NaLaBackbone('nalaformer_t', init_cfg=dict(type='Pretrained', checkpoint=str(tmp_path / 'folder')),
                            **backbone_kwargs)
    backbone.init_weights()
    own = model.state_dict()
    assert all(torch.equal(v, own[k]) for k, v in backbone.model.model.state_dict().items())
    with pytest.raises(DefinitionMismatchError):
        NaLaBackbone('nalaformer_t', attn_types='relu', init_cfg=dict(
            type='Pretrained', checkpoint=str(tmp_path / 'folder')), **backbone_kwargs).init_weights()
