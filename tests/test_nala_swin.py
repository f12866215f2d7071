"""NaLa-Swin (the paper's Swin-T protocol): attn_types, sizes, timm parity, kernels, features, checkpoints."""
import re
from pathlib import Path

import pytest
import timm
import torch
import torch.nn as nn
from timm.models.swin_transformer import SwinTransformerBlock, WindowAttention

import nalaformer  # noqa: F401  (registers the models)
from nalaformer.checkpoint import CheckpointError
from nalaformer.dense.backbone import NaLaBackbone
from nalaformer.models.nala_swin import (
    SHIFTED_WINDOW, GlobalAttentionBlock, NaLaSwinTransformer, ShiftedWindowBlock, checkpoint_filter_fn,
    shifted_window_mask,
)
from nalaformer.ops.kernels import ATTENTION_KERNELS, SoftmaxKernel
from nalaformer.ops.nala import apply_rope, rope_angles, rope_table

# Small widths (head dims 16/16/32/32) keep these fast; depth 2 per stage includes a shifted block.
SMALL = dict(embed_dim=16, depths=(2, 2, 2, 2), num_heads=(1, 2, 2, 4))
# Smaller still for the layout x size grid (head dims 8/16/16/32; stage 3 has a shifted block).
TINY = dict(embed_dim=8, depths=(1, 1, 2, 1), num_heads=(1, 1, 2, 2))
NON_SQUARE = (200, 296)  # stage maps 50x74, 25x37, 13x19, 7x10: not multiples of the 7x7 window
PAPER_TYPES = ('nala', 'nala', SHIFTED_WINDOW, SHIFTED_WINDOW)  # the paper's: global NaLa, then Swin's windows


def small(attn_types=PAPER_TYPES, **kwargs):
    return timm.create_model('nala_swin_tiny', attn_types=attn_types, **{**SMALL, **kwargs})


@pytest.mark.parametrize('attn_types', [PAPER_TYPES, 'nala', SHIFTED_WINDOW,
                                        ('softmax', 'relu', SHIFTED_WINDOW, 'nala')],
                         ids=['paper', 'all-nala', 'swin', 'mixed'])
@pytest.mark.parametrize('size', [(224, 224), NON_SQUARE], ids=['224', '200x296'])
def test_attn_types_forward_backward(attn_types, size):
    torch.manual_seed(0)
    model = small(attn_types, num_classes=5, **TINY)
    names = (attn_types,) * 4 if isinstance(attn_types, str) else attn_types
    assert model.attn_types == names and model.kernel_kwargs == (None,) * 4
    for stage, name in zip(model.layers, names):
        if name == SHIFTED_WINDOW:
            assert all(type(b) is ShiftedWindowBlock for b in stage.blocks)
        else:
            assert all(type(b) is GlobalAttentionBlock and type(b.attn.kernel) is ATTENTION_KERNELS[name]
                       for b in stage.blocks)
    out = model(torch.randn(2, 3, *size))
    assert out.shape == (2, 5) and torch.isfinite(out).all()
    out.logsumexp(-1).mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_real_width_tiny_forward_backward_non_square():
    torch.manual_seed(0)
    model = timm.create_model('nala_swin_tiny')
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(28.30e6, abs=0.01e6)
    feats, inter = model.forward_intermediates(torch.randn(1, 3, *NON_SQUARE))
    assert [tuple(f.shape) for f in inter] == [(1, 96, 50, 74), (1, 192, 25, 37), (1, 384, 13, 19), (1, 768, 7, 10)]
    out = model.forward_head(feats)
    out.sum().backward()
    assert model.layers[0].blocks[0].attn.qkv.weight.grad.abs().sum() > 0


def test_odd_input_sizes_are_padded():
    model = small().eval()
    with torch.no_grad():
        assert model(torch.randn(1, 3, 97, 61)).shape == (1, 1000)
        maps = model.forward_intermediates(torch.randn(1, 3, 97, 61), intermediates_only=True)
    assert [tuple(m.shape[-2:]) for m in maps] == [(25, 16), (13, 8), (7, 4), (4, 2)]


@pytest.mark.parametrize('through_checkpoint', [False, True], ids=['state_dict', 'load_pretrained'])
def test_ssss_matches_timm_swin_tiny(tmp_path, through_checkpoint):
    torch.manual_seed(0)
    reference = timm.create_model('swin_tiny_patch4_window7_224').eval()
    ours = timm.create_model('nala_swin_tiny', attn_types=SHIFTED_WINDOW).eval()
    if through_checkpoint:
        path = tmp_path / 'swin_t.pth'
        torch.save({'model': reference.state_dict()}, path)
        ours.load_pretrained(str(path))
    else:
        ours.load_state_dict(reference.state_dict(), strict=True)
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), reference(x), atol=1e-5, rtol=0)


def test_original_swin_layout_checkpoint_loads(tmp_path):
    """The Microsoft release stores downsampling at the end of a stage and the classifier as 'head'."""
    kwargs = dict(embed_dim=16, depths=(2, 2, 2, 2), num_heads=(1, 2, 2, 4))
    reference = timm.create_model('swin_tiny_patch4_window7_224', **kwargs).eval()
    original = {}
    for key, value in reference.state_dict().items():
        key = re.sub(r'layers\.(\d+)\.downsample', lambda m: f'layers.{int(m.group(1)) - 1}.downsample', key)
        original[key.replace('head.fc.', 'head.')] = value
    torch.save({'model': original}, tmp_path / 'original.pth')
    ours = small(SHIFTED_WINDOW).eval()
    ours.load_pretrained(str(tmp_path / 'original.pth'))
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), reference(x), atol=1e-5, rtol=0)


def test_llss_starts_from_swin_weights_only_when_not_strict(tmp_path):
    reference = timm.create_model('swin_tiny_patch4_window7_224', **SMALL)
    torch.save(reference.state_dict(), tmp_path / 'swin.pth')
    ours = small()
    with pytest.raises(CheckpointError, match='strict=False'):
        ours.load_pretrained(str(tmp_path / 'swin.pth'))
    result = ours.load_pretrained(str(tmp_path / 'swin.pth'), strict=False)
    assert result.missing_keys and all('.attn.dwc.' in k for k in result.missing_keys)
    for key in ('layers.0.blocks.0.attn.qkv.weight', 'layers.1.downsample.reduction.weight',
                'layers.2.blocks.1.attn.relative_position_bias_table', 'head.fc.weight'):
        assert torch.equal(ours.state_dict()[key], reference.state_dict()[key])


def test_checkpoint_of_another_architecture_is_refused(tmp_path):
    torch.save(small(depths=(2, 2, 4, 2)).state_dict(), tmp_path / 'deeper.pth')
    with pytest.raises(CheckpointError, match='another architecture'):
        small().load_pretrained(str(tmp_path / 'deeper.pth'))
    torch.save(small(embed_dim=32).state_dict(), tmp_path / 'wider.pth')
    with pytest.raises(CheckpointError, match='wrong shape'):
        small().load_pretrained(str(tmp_path / 'wider.pth'))


def test_own_checkpoint_round_trip_with_prefixes_and_new_head(tmp_path):
    torch.manual_seed(0)
    source = small().eval()
    torch.save({'state_dict': {f'model.{k}': v for k, v in source.state_dict().items()}}, tmp_path / 'ours.pth')
    target = timm.create_model('nala_swin_tiny', pretrained=True, num_classes=7,
                               pretrained_cfg_overlay=dict(file=str(tmp_path / 'ours.pth')), **SMALL).eval()
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        torch.testing.assert_close(target.forward_features(x), source.forward_features(x))
    assert target.head.fc.out_features == 7
    with pytest.raises(ValueError, match='no weights are hosted'):
        timm.create_model('nala_swin_tiny', pretrained=True)


@pytest.mark.parametrize('name,kwargs', [
    ('nala', {}), ('nala_cos', dict(alpha=20.)), ('const_power', dict(power=3.)), ('relu', dict(power=3.)),
    ('elu', {}), ('focused', dict(power=3.)), ('polarity', dict(power=3.)),
])
def test_global_stages_use_the_nalaformer_kernels(name, kwargs):
    model = small((name, name, SHIFTED_WINDOW, SHIFTED_WINDOW), kernel_kwargs=(kwargs, kwargs, None, None))
    assert model.kernel_kwargs == (kwargs, kwargs, None, None)
    for stage, global_stage in zip(model.layers, (True, True, False, False)):
        for block in stage.blocks:
            if global_stage:
                assert type(block.attn.kernel) is ATTENTION_KERNELS[name]
                assert all(getattr(block.attn.kernel, k) == v for k, v in kwargs.items())
            else:
                assert isinstance(block, SwinTransformerBlock) and type(block.attn) is WindowAttention
    assert model(torch.randn(1, 3, 64, 64)).isfinite().all()


def test_kernel_kwargs_per_stage():
    torch.manual_seed(0)
    cos = ('nala_cos', 'nala_cos', SHIFTED_WINDOW, SHIFTED_WINDOW)
    different = small(cos, kernel_kwargs=(dict(alpha=1.), dict(alpha=50.), None, None)).eval()
    equal = small(cos, kernel_kwargs=(dict(alpha=1.), dict(alpha=1.), None, None)).eval()
    assert [b.attn.kernel.alpha for s in different.layers[:2] for b in s.blocks] == [1., 1., 50., 50.]
    assert different.kernel_kwargs == (dict(alpha=1.), dict(alpha=50.), None, None)
    equal.load_state_dict(different.state_dict())  # kernel arguments are not weights
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        assert (equal(x) - different(x)).abs().max() > 1e-4
        for block in equal.layers[1].blocks:
            block.attn.kernel.alpha = 50.
        torch.testing.assert_close(equal(x), different(x))


def test_global_softmax_stage_is_softmax_over_the_whole_map():
    torch.manual_seed(0)
    model = small(('softmax', 'nala', SHIFTED_WINDOW, SHIFTED_WINDOW)).eval()
    attn = model.layers[0].blocks[0].attn
    assert type(model.layers[0].blocks[0]) is GlobalAttentionBlock and type(attn.kernel) is SoftmaxKernel
    x = torch.randn(2, 9, 13, 16)
    B, H, W, C = x.shape
    q, k, v = attn.qkv(x).reshape(B, H * W, 3, 1, 16).permute(2, 0, 3, 1, 4)
    rope = rope_table(rope_angles(16), H, W)
    weights = torch.softmax(apply_rope(q, rope) @ apply_rope(k, rope).transpose(-2, -1) / 4, dim=-1)  # (B, 1, N, N)
    expected = (weights @ v).transpose(1, 2).reshape(B, H, W, C)
    expected = expected + attn.dwc(v.transpose(1, 2).reshape(B, H, W, C).permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
    with torch.no_grad():
        torch.testing.assert_close(attn(x), attn.proj(expected), atol=1e-5, rtol=1e-4)
        assert model(torch.randn(1, 3, 64, 96)).isfinite().all()


def test_global_attention_is_the_kernel_over_the_whole_map():
    torch.manual_seed(0)
    block = GlobalAttentionBlock(32, (9, 13), num_heads=2).eval()
    attn = block.attn
    x = torch.randn(2, 9, 13, 32)
    B, H, W, C = x.shape
    q, k, v = attn.qkv(x).reshape(B, H * W, 3, 2, 16).permute(2, 0, 3, 1, 4)
    expected = attn.kernel(q, k, v, rope_table(rope_angles(16), H, W)).transpose(1, 2).reshape(B, H, W, C)
    expected = expected + attn.dwc(v.transpose(1, 2).reshape(B, H, W, C).permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
    torch.testing.assert_close(attn(x), attn.proj(expected))
    # one token far outside any 7x7 window (and the 5x5 conv) still changes the other corner
    y = x.clone()
    y[:, 0, 0] += 1.0
    with torch.no_grad():
        assert (attn(y)[:, -1, -1] - attn(x)[:, -1, -1]).abs().max() > 1e-6
    assert not hasattr(attn, 'relative_position_bias_table')


def test_dwc_kernel_size_choices():
    assert small(dwc_kernel_size=3).layers[0].blocks[0].attn.dwc.kernel_size == (3, 3)
    no_dwc = small(dwc_kernel_size=0)
    assert isinstance(no_dwc.layers[0].blocks[0].attn.dwc, nn.Identity)
    assert no_dwc(torch.randn(1, 3, 64, 64)).shape == (1, 1000)


@pytest.mark.parametrize('padded,window,shift', [((14, 14), (7, 7), (3, 3)), ((14, 21), (7, 7), (3, 3)),
                                                 ((8, 12), (4, 4), (2, 2))])
def test_shifted_window_mask_matches_timm(padded, window, shift):
    timm_block = SwinTransformerBlock(8, padded, num_heads=1, window_size=window, shift_size=shift, dynamic_mask=True)
    x = torch.zeros(1, *padded, 1)
    torch.testing.assert_close(shifted_window_mask(x, window, shift), timm_block.get_attn_mask(x))


def test_fixed_size_model_equals_dynamic_one():
    torch.manual_seed(0)
    dynamic = small(img_size=128).eval()
    fixed = small(img_size=128, dynamic_img_size=False).eval()
    fixed.load_state_dict(dynamic.state_dict())
    x = torch.randn(1, 3, 128, 128)
    with torch.no_grad():
        torch.testing.assert_close(fixed(x), dynamic(x))
    with pytest.raises(AssertionError):
        fixed(torch.randn(1, 3, 96, 128))


def test_fx_and_torchscript_match_eager_at_a_non_square_size():
    from timm.layers import set_layer_config
    from timm.models import get_notrace_functions, get_notrace_modules
    from torchvision.models.feature_extraction import create_feature_extractor, get_graph_node_names
    with set_layer_config(scriptable=True):
        model = small(depths=(1, 2, 2, 1)).eval()
    x = torch.randn(1, 3, 96, 160)
    with torch.no_grad():
        expected = model(x)
        tracer_kwargs = dict(leaf_modules=get_notrace_modules(), autowrap_functions=get_notrace_functions())
        _, eval_nodes = get_graph_node_names(model, tracer_kwargs=tracer_kwargs)
        fx_model = create_feature_extractor(model, return_nodes=[eval_nodes[-1]], tracer_kwargs=tracer_kwargs)
        torch.testing.assert_close(next(iter(fx_model(x).values())), expected)
        torch.testing.assert_close(torch.jit.script(model)(x), expected)


def test_features_only_and_pruning():
    features = timm.create_model('nala_swin_tiny', features_only=True, **SMALL)
    assert features.feature_info.reduction() == [4, 8, 16, 32]
    assert features.feature_info.channels() == [16, 32, 64, 128]
    maps = features(torch.randn(1, 3, *NON_SQUARE))
    assert [tuple(m.shape) for m in maps] == [(1, 16, 50, 74), (1, 32, 25, 37), (1, 64, 13, 19), (1, 128, 7, 10)]
    two = timm.create_model('nala_swin_tiny', features_only=True, out_indices=(0, 1), **SMALL)
    assert len(two.model.layers) == 2 and len(two(torch.randn(1, 3, 64, 64))) == 2

    model = small().eval()
    x = torch.randn(1, 3, 96, 128)
    with torch.no_grad():
        final, inter = model.forward_intermediates(x)
        torch.testing.assert_close(final, model.forward_features(x))
        last = model.forward_intermediates(x, indices=1, norm=True, intermediates_only=True)
        torch.testing.assert_close(last[0], final.permute(0, 3, 1, 2))
    assert model.prune_intermediate_layers(indices=(1, 2)) == [1, 2]
    assert len(model.layers) == 3 and model.num_classes == 0


def test_nala_backbone_builds_outputs_four_maps_and_freezes(tmp_path):
    torch.manual_seed(0)
    classifier = small(num_classes=10)
    path = tmp_path / 'classifier.pth'
    torch.save({'state_dict': {f'model.{k}': v for k, v in classifier.state_dict().items()}}, path)

    backbone = NaLaBackbone(arch='nala_swin_tiny', frozen_stages=2, init_cfg=dict(type='Pretrained', checkpoint=str(path)),
                            **{**SMALL, 'attn_types': PAPER_TYPES, 'drop_path_rate': 0.1})
    backbone.init_weights()
    net = backbone.model.model
    assert isinstance(net, NaLaSwinTransformer)
    assert torch.equal(net.layers[2].blocks[1].attn.relative_position_bias_table,
                       classifier.layers[2].blocks[1].attn.relative_position_bias_table)
    backbone.train()
    outs = backbone(torch.randn(2, 3, *NON_SQUARE))
    assert [tuple(o.shape) for o in outs] == [(2, 16, 50, 74), (2, 32, 25, 37), (2, 64, 13, 19), (2, 128, 7, 10)]
    frozen = [net.patch_embed, net.layers[0], net.layers[1]]
    assert all(not p.requires_grad for m in frozen for p in m.parameters())
    assert all(not m.training for m in frozen)
    assert all(p.requires_grad for m in net.layers[2:] for p in m.parameters())
    sum(o.mean() for o in outs).backward()
    assert net.layers[2].blocks[0].attn.qkv.weight.grad is not None
    assert net.layers[1].blocks[0].attn.qkv.weight.grad is None


def test_bad_attn_types_and_kernel_kwargs_are_refused():
    for attn_types in (PAPER_TYPES[:3], PAPER_TYPES + ('nala',)):
        with pytest.raises(ValueError, match=f'attn_types has {len(attn_types)} entries but the model has 4 stages'):
            small(attn_types)
    with pytest.raises(ValueError, match='kernel_kwargs has 2 entries'):
        small(kernel_kwargs=(None, None))
    for name in ('nope', 'LLSS', 'S'):  # the letters of an old layout are no kernel names
        with pytest.raises(ValueError, match=f"unknown attention kernel '{name}'.*also takes 'shifted_window'"):
            small(('nala', name, SHIFTED_WINDOW, SHIFTED_WINDOW))
    relu = ('relu', 'relu', SHIFTED_WINDOW, SHIFTED_WINDOW)
    with pytest.raises(ValueError, match="stage 2 is 'shifted_window'.*takes no kernel_kwargs.*None for it"):
        small(relu, kernel_kwargs=dict(power=3.))
    with pytest.raises(ValueError, match="stage 3 is 'shifted_window'"):
        small(relu, kernel_kwargs=(dict(power=3.), dict(power=3.), None, dict(power=3.)))
    assert small(relu, kernel_kwargs=(dict(power=3.), dict(power=3.), {}, None)).kernel_kwargs[2] == {}
    with pytest.raises(TypeError, match="'relu' takes \\['power'\\], got \\['alpha'\\]"):
        small(relu, kernel_kwargs=(dict(power=3.), dict(alpha=3.), None, None))
    with pytest.raises(ValueError, match='divisible by 4'):
        small(embed_dim=6, num_heads=(1, 1, 1, 1))


def test_definition_args_are_model_attributes():
    kwargs = (dict(alpha=5.), dict(alpha=5.), None, None)
    model = small(['nala_cos', 'nala_cos', SHIFTED_WINDOW, SHIFTED_WINDOW], kernel_kwargs=list(kwargs))
    assert NaLaSwinTransformer.definition_args == ('attn_types', 'kernel_kwargs')
    assert {name: getattr(model, name) for name in model.definition_args} == dict(
        attn_types=('nala_cos', 'nala_cos', SHIFTED_WINDOW, SHIFTED_WINDOW), kernel_kwargs=kwargs)
    assert all(type(value) is tuple for value in (model.attn_types, model.kernel_kwargs))


def test_variants_and_checkpoint_filter_on_meta():
    expected = {'nala_swin_tiny': 28.30e6, 'nala_swin_small': 49.62e6, 'nala_swin_base': 87.78e6}
    for name, params in expected.items():
        with torch.device('meta'):
            model = timm.create_model(name)
        assert sum(p.numel() for p in model.parameters()) == pytest.approx(params, abs=0.01e6), name
        assert model.attn_types == PAPER_TYPES and model.kernel_kwargs == (None,) * 4
        assert isinstance(model.layers[-1].blocks[-1].drop_path1, nn.Identity)  # timm's default: no drop path
    state = {f'module.{k}': v for k, v in model.state_dict().items()}
    assert set(checkpoint_filter_fn(state, model)) == set(model.state_dict())


PROTOCOL = Path(__file__).resolve().parents[1] / 'configs' / 'swin_protocol'
POWER_3 = (dict(power=3.0), dict(power=3.0), None, None)
# config -> (attn_types, kernel_kwargs): the rows of the paper's Tables 5 and 6.
PAPER_ROWS = {
    'nala-swin-t_table5-relu-constpower_8xb128-300e_in1k.py': (('relu',) * 2 + PAPER_TYPES[2:], POWER_3),
    'nala-swin-t_table5-cosinhibit-constpower_8xb128-300e_in1k.py': (('const_power',) * 2 + PAPER_TYPES[2:], POWER_3),
    'nala-swin-t_table5-table6-nala_8xb128-300e_in1k.py': (PAPER_TYPES, (None,) * 4),
    'nala-swin-t_table6-flatten-focused_8xb128-300e_in1k.py': (('focused',) * 2 + PAPER_TYPES[2:], POWER_3),
    'nala-swin-t_table6-polarity_8xb128-300e_in1k.py': (('polarity',) * 2 + PAPER_TYPES[2:], POWER_3),
    'swin-t_table6-ssss-baseline_8xb128-300e_in1k.py': ((SHIFTED_WINDOW,) * 4, (None,) * 4),
}


@pytest.mark.parametrize('name', sorted(PAPER_ROWS))
def test_protocol_configs_build_the_paper_rows_with_swins_recipe(name):
    from mmengine.config import Config
    from mmengine.registry import MODELS
    import nalaformer.classification  # noqa: F401  (TimmClassifier)
    cfg = Config.fromfile(str(PROTOCOL / name))
    attn_types, kernel_kwargs = PAPER_ROWS[name]
    with torch.device('meta'):
        model = MODELS.build(cfg.model).model
    assert isinstance(model, NaLaSwinTransformer)
    assert (model.attn_types, model.kernel_kwargs) == (attn_types, kernel_kwargs)
    assert model.layers[-1].blocks[-1].drop_path1.drop_prob == pytest.approx(0.2)  # Swin-T's drop path
    for stage, attn_type, kwargs in zip(model.layers, attn_types, kernel_kwargs):
        for block in stage.blocks:
            if attn_type == SHIFTED_WINDOW:
                assert type(block.attn) is WindowAttention
            else:
                assert type(block.attn.kernel) is ATTENTION_KERNELS[attn_type]
                assert all(getattr(block.attn.kernel, k) == v for k, v in (kwargs or {}).items())
    # Swin's recipe: batch 8 x 128 at lr 1e-3, wd 0.05, 20 warm-up epochs then cosine to epoch 300, no
    # repeated augmentation, no EMA.
    assert cfg.train_dataloader.batch_size == 128 and cfg.train_dataloader.sampler.type == 'DefaultSampler'
    assert cfg.optim_wrapper.optimizer.lr == 1e-3 and cfg.optim_wrapper.optimizer.weight_decay == 0.05
    warmup, cosine = cfg.param_scheduler
    assert (warmup.type, warmup.end, cosine.type, cosine.begin, cosine.end) == ('LinearLR', 20, 'CosineAnnealingLR', 20, 300)
    assert cfg.train_cfg.max_epochs == 300
    assert not any('EMA' in hook.type for hook in cfg.custom_hooks)
