"""Loading release-layout checkpoints safely, rejecting wrong ones clearly, converting formats."""
import argparse
import subprocess
import sys
from pathlib import Path

import pytest
import timm
import torch
from safetensors.torch import save_file

from nalaformer.checkpoint import CheckpointError, read_checkpoint
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
    with pytest.raises(CheckpointError, match='corrupt or truncated'):
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


def test_prefer_ema(xt, tmp_path):
    ema = {k: v + 1 if v.is_floating_point() else v for k, v in xt.state_dict().items()}
    path = tmp_path / 'ema.pth'
    torch.save({'model': xt.state_dict(), 'model_ema': ema}, path)
    torch.testing.assert_close(read_checkpoint(path)['proj.weight'], xt.proj.weight.detach())
    torch.testing.assert_close(read_checkpoint(path, prefer_ema=True)['proj.weight'], ema['proj.weight'])


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
    assert bad.returncode == 1 and 'does not exist' in bad.stderr
