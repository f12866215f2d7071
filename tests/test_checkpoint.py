"""Loading release-layout checkpoints safely, rejecting wrong ones clearly, converting formats."""
import argparse
import subprocess
import sys
from pathlib import Path

import pytest
import timm
import torch
from safetensors.torch import save_file

from nalaformer.checkpoint import (
    Checkpoint, CheckpointError, DefinitionMismatchError, model_definition, read_checkpoint, save_state_dict,
)
from nalaformer.models.nalaformer import checkpoint_filter_fn

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope='module')
def xt():
    return timm.create_model('nalaformer_xt').eval()


def release_style_checkpoint(model, path):
    """What the release's training script writes: weights under 'model' plus a pickled Namespace."""
    torch.save({'model': model.state_dict(), 'optimizer': {}, 'epoch': 299,
                'args': argparse.Namespace(model='NALAFORMER_XT', lr=1e-3, drop_path=0.1)}, path)
    return path


def assert_same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        torch.testing.assert_close(sa[k], sb[k], rtol=0, atol=0)


def test_release_checkpoint_with_namespace_loads_through_timm(xt, tmp_path):
    path = release_style_checkpoint(xt, tmp_path / 'release_xt.pth')
    loaded = timm.create_model('nalaformer_xt', pretrained=True, pretrained_cfg_overlay=dict(file=str(path))).eval()
    assert_same_weights(xt, loaded)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), xt(x), rtol=0, atol=0)


@pytest.mark.parametrize('fmt', ['bare', 'ddp', 'safetensors'])
def test_other_layouts_load(xt, tmp_path, fmt):
    state = xt.state_dict()
    if fmt == 'safetensors':
        path = tmp_path / 'w.safetensors'
        save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    else:
        path = tmp_path / 'w.pth'
        torch.save({f'module.{k}': v for k, v in state.items()} if fmt == 'ddp' else state, path)
    loaded = timm.create_model('nalaformer_xt', pretrained=True, pretrained_cfg_overlay=dict(file=str(path)))
    assert_same_weights(xt, loaded)


@pytest.mark.parametrize('prefix', ['module.', '_orig_mod.module.', 'model.', 'backbone.model.model.'])
def test_wrapper_prefixes_are_stripped_from_files_and_state_dicts(xt, tmp_path, prefix):
    """DDP / torch.compile (timm's clean_state_dict) and our runners' prefixes, in a file and in a state dict."""
    wrapped = {f'{prefix}{k}': v for k, v in xt.state_dict().items()}
    torch.save(wrapped, tmp_path / 'wrapped.pth')
    assert read_checkpoint(tmp_path / 'wrapped.pth').keys() == xt.state_dict().keys()
    loaded = timm.create_model('nalaformer_xt', pretrained=True, pretrained_cfg_overlay=dict(state_dict=wrapped))
    assert_same_weights(xt, loaded)


def test_tensors_of_the_wrong_shape_are_named_with_both_shapes(xt):
    state = dict(xt.state_dict())
    state['proj.bias'] = torch.zeros(7)
    with pytest.raises(CheckpointError, match=r"proj\.bias: \(7,\) vs \(1024,\)"):
        xt.load_weights(state)


def test_fine_tuning_with_new_number_of_classes_keeps_backbone(xt, tmp_path):
    path = release_style_checkpoint(xt, tmp_path / 'xt.pth')
    model = timm.create_model('nalaformer_xt', pretrained=True, num_classes=10,
                              pretrained_cfg_overlay=dict(file=str(path)))
    assert model.head.weight.shape[0] == 10
    torch.testing.assert_close(model.proj.weight, xt.proj.weight)
    features = timm.create_model('nalaformer_xt', pretrained=True, features_only=True,
                                 pretrained_cfg_overlay=dict(file=str(path)))
    torch.testing.assert_close(features.model.layers[3].blocks[1].attn.qkvg.weight,
                               xt.layers[3].blocks[1].attn.qkvg.weight)


def test_checkpoint_of_another_variant_is_named(tmp_path):
    with torch.device('meta'):
        s_state = timm.create_model('nalaformer_s').state_dict()
    path = tmp_path / 'nala_s.pth'
    torch.save({'model': {k: torch.zeros(v.shape, dtype=v.dtype) for k, v in s_state.items()}}, path)
    with pytest.raises(CheckpointError, match=r"looks like nalaformer_s .*but the model is nalaformer_t"):
        timm.create_model('nalaformer_t', pretrained=True, pretrained_cfg_overlay=dict(file=str(path)))


def test_corrupt_and_missing_files_are_reported(xt, tmp_path):
    good = release_style_checkpoint(xt, tmp_path / 'good.pth')
    truncated = tmp_path / 'truncated.pth'
    truncated.write_bytes(good.read_bytes()[:5000])
    with pytest.raises(CheckpointError, match='truncated or corrupt'):
        timm.create_model('nalaformer_xt', pretrained=True, pretrained_cfg_overlay=dict(file=str(truncated)))
    bad_st = tmp_path / 'bad.safetensors'
    bad_st.write_bytes(b'\x10\x00\x00\x00\x00\x00\x00\x00{not json')
    with pytest.raises(CheckpointError, match='not a readable safetensors'):
        read_checkpoint(bad_st)
    with pytest.raises(FileNotFoundError, match='does not exist'):
        read_checkpoint(tmp_path / 'nope.pth')
    empty = tmp_path / 'empty.pth'
    torch.save({'epoch': 3}, empty)
    with pytest.raises(CheckpointError, match='no tensors'):
        read_checkpoint(empty)


class _Payload:
    """Unpickling this would create a file: proof that arbitrary code would run."""
    marker = None

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def test_untrusted_pickles_are_refused_without_running_them(tmp_path):
    payload = _Payload()
    payload.marker = str(tmp_path / 'pwned')
    path = tmp_path / 'evil.pth'
    torch.save({'model': {'w': torch.zeros(1)}, 'extra': payload}, path)
    assert not (tmp_path / 'pwned').exists()
    with pytest.raises(CheckpointError, match='not unpickled for safety'):
        read_checkpoint(path)
    assert not (tmp_path / 'pwned').exists()


def test_filter_fn_is_identity_on_release_layout(xt):
    state = xt.state_dict()
    filtered = checkpoint_filter_fn(dict(state), xt)
    assert filtered.keys() == state.keys()
    assert all(filtered[k] is state[k] for k in state)


@pytest.mark.slow
def test_convert_tool_round_trip(xt, tmp_path):
    src = release_style_checkpoint(xt, tmp_path / 'release.pth')
    tool = [sys.executable, str(ROOT / 'tools' / 'convert_checkpoint.py')]
    out = subprocess.run(tool + [str(src), str(tmp_path / 'xt.safetensors')], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert 'nalaformer_xt' in out.stdout
    out = subprocess.run(tool + [str(tmp_path / 'xt.safetensors'), str(tmp_path / 'back.pth')],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    for path in (tmp_path / 'xt.safetensors', tmp_path / 'back.pth'):
        loaded = read_checkpoint(path)
        assert loaded.keys() == xt.state_dict().keys()
        for k, v in xt.state_dict().items():
            torch.testing.assert_close(loaded[k], v, rtol=0, atol=0)
    assert not list(tmp_path.glob('.*.tmp'))  # atomic writes leave no temp files
    bad = subprocess.run(tool + [str(tmp_path / 'missing.pth'), str(tmp_path / 'x.safetensors')],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and 'does not exist' in bad.stderr


# ----------------------------------------------------------------------------------------------
# EMA weights: one reader for every key in use, never a fallback to the raw weights
# ----------------------------------------------------------------------------------------------
def shifted(state, by=1.0):
    return {k: v + by if v.is_floating_point() else v for k, v in state.items()}


@pytest.mark.parametrize('layout', ['release', 'timm', 'ours'])
def test_ema_weights_of_every_known_layout(xt, tmp_path, layout):
    raw, ema = xt.state_dict(), shifted(xt.state_dict())
    if layout == 'release':    # DeiT-style training scripts
        content = {'model': raw, 'model_ema': ema}
    elif layout == 'timm':     # timm's train.py
        content = {'state_dict': raw, 'state_dict_ema': ema}
    else:                      # our runner: mmengine's averaged model is 'module.<runner key>' plus 'steps'
        content = {'state_dict': {f'model.{k}': v for k, v in raw.items()}, 'meta': {},
                   'ema_state_dict': {'steps': torch.tensor(7), **{f'module.model.{k}': v for k, v in ema.items()}}}
    path = tmp_path / 'ckpt.pth'
    torch.save(content, path)
    for want, flag in ((raw, False), (ema, True)):
        got = read_checkpoint(path, ema=flag)
        assert got.keys() == want.keys()
        for k in want:
            torch.testing.assert_close(got[k], want[k], rtol=0, atol=0)
    loaded = timm.create_model('nalaformer_xt', pretrained=True, pretrained_ema=True,
                               pretrained_cfg_overlay=dict(file=str(path)))
    torch.testing.assert_close(loaded.proj.weight, ema['proj.weight'], rtol=0, atol=0)


@pytest.mark.slow
def test_ema_asked_from_a_file_without_it_fails_naming_its_keys(xt, tmp_path):
    path = release_style_checkpoint(xt, tmp_path / 'no_ema.pth')
    with pytest.raises(CheckpointError, match=r"no EMA weights .*'args', 'epoch', 'model', 'optimizer'"):
        read_checkpoint(path, ema=True)
    with pytest.raises(CheckpointError, match='no EMA weights'):
        timm.create_model('nalaformer_xt', pretrained=True, pretrained_ema=True,
                          pretrained_cfg_overlay=dict(file=str(path)))
    tool = [sys.executable, str(ROOT / 'tools' / 'convert_checkpoint.py')]
    out = subprocess.run(tool + [str(path), str(tmp_path / 'x.safetensors'), '--ema'], capture_output=True, text=True)
    assert out.returncode == 2 and 'no EMA weights' in out.stderr
    assert not (tmp_path / 'x.safetensors').exists()


# ----------------------------------------------------------------------------------------------
# Model definitions: what the weights were trained to compute
# ----------------------------------------------------------------------------------------------
TINY = dict(embed_dims=(16, 32, 48, 64), depths=(1, 1, 1, 1), num_heads=(1, 2, 3, 4), head_hidden_size=32,
            num_classes=5)


@pytest.mark.parametrize('suffix', ['.safetensors', '.pth'])
def test_recorded_definition_round_trips_and_guards_loading(tmp_path, suffix):
    trained = timm.create_model('nalaformer_t', attn_types='relu', kernel_kwargs=dict(power=3), **TINY).eval()
    path = tmp_path / f'relu{suffix}'
    save_state_dict(trained.state_dict(), path, model_definition(trained))
    [recorded] = Checkpoint.read(path).definitions
    assert recorded['architecture'] == 'nalaformer_t'
    # everything that rebuilds the model (timm's reconstruction arguments), the attention written out per stage
    assert recorded['model_args'] == {**{k: list(v) if isinstance(v, tuple) else v for k, v in TINY.items()},
                                      'in_chans': 3, 'global_pool': 'avg',
                                      'attn_types': ['relu'] * 4, 'kernel_kwargs': [{'power': 3}] * 4}

    same = timm.create_model('nalaformer_t', pretrained=True, pretrained_cfg_overlay=dict(file=str(path)),
                             attn_types='relu', kernel_kwargs=dict(power=3), **TINY).eval()
    x = torch.randn(2, 3, 64, 48)
    with torch.no_grad():
        torch.testing.assert_close(same(x), trained(x), rtol=0, atol=0)
    with pytest.raises(DefinitionMismatchError) as err:  # the default hybrid would load these weights silently
        timm.create_model('nalaformer_t', pretrained=True, pretrained_cfg_overlay=dict(file=str(path)), **TINY)
    message = str(err.value)
    assert "attn_types=['relu', 'relu', 'relu', 'relu']" in message
    assert "attn_types=['nala', 'nala', 'softmax', 'softmax']" in message
    assert "--cfg-options model.attn_types=\"[relu,relu,relu,relu]\" model.kernel_kwargs=[{'power': 3}, " in message
    assert 'accept_definition_change' in message
    with pytest.raises(DefinitionMismatchError, match="kernel_kwargs=\\[None, None, None, None\\]"):  # power 1
        timm.create_model('nalaformer_t', pretrained=True, pretrained_cfg_overlay=dict(file=str(path)),
                          attn_types='relu', **TINY)
    accepted = timm.create_model('nalaformer_t', pretrained=True, pretrained_cfg_overlay=dict(file=str(path)),
                                 accept_definition_change=True, **TINY)
    torch.testing.assert_close(accepted.proj.weight, trained.proj.weight, rtol=0, atol=0)


def test_definitions_compare_what_the_kernels_compute(tmp_path):
    cos = timm.create_model('nalaformer_t', attn_types=('nala_cos', 'nala_cos', 'softmax', 'softmax'), **TINY)
    path = tmp_path / 'cos.safetensors'
    save_state_dict(cos.state_dict(), path, model_definition(cos))
    load = dict(pretrained=True, pretrained_cfg_overlay=dict(file=str(path)), **TINY)
    # default arguments written out, and the fused implementation of the same function: the same model
    timm.create_model('nalaformer_t', attn_types=('nala_cos', 'nala_cos', 'softmax', 'softmax'),
                      kernel_kwargs=(dict(alpha=20.), dict(alpha=20.), None, None), **load)
    timm.create_model('nalaformer_t', attn_types=('nala_cos_triton', 'nala_cos_triton', 'softmax', 'softmax'), **load)
    with pytest.raises(DefinitionMismatchError, match="'alpha': 5.0"):
        timm.create_model('nalaformer_t', attn_types=('nala_cos', 'nala_cos', 'softmax', 'softmax'),
                          kernel_kwargs=(dict(alpha=5.), dict(alpha=5.), None, None), **load)
    with pytest.raises(DefinitionMismatchError):
        timm.create_model('nalaformer_t', attn_types=('nala', 'nala', 'softmax', 'softmax'), **load)


def test_nala_swin_checkpoints_carry_their_definition(tmp_path):
    small = dict(embed_dim=16, depths=(1, 1, 1, 1), num_heads=(1, 2, 2, 4), num_classes=3)
    trained = timm.create_model('nala_swin_tiny', attn_types=('relu', 'relu', 'shifted_window', 'shifted_window'),
                                **small)
    path = tmp_path / 'swin.pth'
    save_state_dict(trained.state_dict(), path, model_definition(trained))
    with pytest.raises(DefinitionMismatchError, match="'relu', 'relu', 'shifted_window', 'shifted_window'"):
        timm.create_model('nala_swin_tiny', pretrained=True, pretrained_cfg_overlay=dict(file=str(path)), **small)
    loaded = timm.create_model('nala_swin_tiny', pretrained=True, pretrained_cfg_overlay=dict(file=str(path)),
                               attn_types=('relu', 'relu', 'shifted_window', 'shifted_window'), **small)
    torch.testing.assert_close(loaded.head.fc.weight, trained.head.fc.weight, rtol=0, atol=0)


def test_files_without_a_definition_load_into_any_model(xt, tmp_path):
    """The release's .pth records nothing: it loads into the hybrid and the all-NaLa model alike."""
    path = release_style_checkpoint(xt, tmp_path / 'release_xt.pth')
    assert Checkpoint.read(path).definitions == []
    all_nala = timm.create_model('nalaformer_xt', attn_types='nala', pretrained=True,
                                 pretrained_cfg_overlay=dict(file=str(path)))
    assert_same_weights(xt, all_nala)
