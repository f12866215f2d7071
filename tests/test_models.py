"""NaLaFormer as a timm model: variants, API, shapes, switches."""
from pathlib import Path

import pytest
import timm
import timm.optim
import torch

import nalaformer  # noqa: F401  (registers the models)
from nalaformer.models import NaLaFormer

REFERENCE = Path(__file__).parent / 'data' / 'reference'  # copies of shared/reference (release layout listings)
SMALL = dict(embed_dims=(16, 32, 48, 64), depths=(1, 1, 1, 1), num_heads=(1, 2, 3, 4), head_hidden_size=32)
RELEASED_PARAMS = {'nalaformer_xt': 6_142_248, 'nalaformer_t': 15_907_752, 'nalaformer_s': 25_654_184,
                   'nalaformer_b': 52_002_952, 'nalaformer_l': 95_426_760}


def small(**kwargs):
    return timm.create_model('nalaformer_t', **{**SMALL, 'num_classes': 7, **kwargs})


@pytest.mark.parametrize('name, expected', RELEASED_PARAMS.items())
def test_parameter_counts_equal_release(name, expected):
    with torch.device('meta'):
        model = timm.create_model(name)
    assert sum(p.numel() for p in model.parameters()) == expected


@pytest.mark.parametrize('variant', ['XT', 'T'])
def test_state_dict_layout_is_the_release_layout(variant):
    rows = [line.split('\t') for line in (REFERENCE / f'official_state_dict_{variant}.txt').read_text().splitlines()]
    with torch.device('meta'):
        state = timm.create_model(f'nalaformer_{variant.lower()}').state_dict()
    ours = [[k, str(tuple(v.shape)), str(v.dtype).replace('torch.', '')] for k, v in state.items()]
    assert ours == rows


def test_variant_hyperparameters():
    with torch.device('meta'):
        b = timm.create_model('nalaformer_b')
    gammas = [stage.blocks[0].gamma_1.shape[1] for stage in b.layers]
    assert gammas == [96, 192, 384, 512]
    assert b.attn_types == ('nala', 'nala', 'softmax', 'softmax')
    assert [stage.blocks[0].attn.num_heads for stage in b.layers] == [1, 2, 6, 8]
    assert [len(stage.blocks) for stage in b.layers] == [4, 6, 12, 6]
    assert all(isinstance(block.drop_path, torch.nn.Identity) for stage in b.layers for block in stage.blocks)


@pytest.mark.parametrize('variant, rate', [('xt', 0.1), ('t', 0.1), ('s', 0.15), ('b', 0.4), ('l', 0.55)])
def test_drop_path_is_off_unless_asked_and_the_configs_state_the_recipe(variant, rate):
    """timm's convention: entrypoints default to no drop path; each variant's config states its recipe rate."""
    from mmengine.config import Config
    config = Config.fromfile(str(Path(__file__).resolve().parents[1] / 'configs' / 'nalaformer' /
                                 f'nalaformer-{variant}_8xb128_in1k.py'))
    assert config.model.arch == f'nalaformer_{variant}' and config.model.drop_path_rate == rate
    with torch.device('meta'):
        asked = timm.create_model(f'nalaformer_{variant}', drop_path_rate=rate)
    deepest = asked.layers[-1].blocks[-1].drop_path.drop_prob
    assert deepest == pytest.approx(rate)  # linear over depth, the last block gets the full rate


def test_layer_scale_init_values():
    model = small(layer_scale_init_values=(1.0, 1.0, 1e-6, None))
    assert model.layers[0].blocks[0].gamma_1.flatten()[0].item() == 1.0
    assert model.layers[2].blocks[0].gamma_2.flatten()[0].item() == pytest.approx(1e-6)
    assert model.layers[3].blocks[0].gamma_1 is None
    assert 'layers.3.blocks.0.gamma_1' not in model.state_dict()


def test_public_kwargs_reach_the_model():
    model = timm.create_model(
        'nalaformer_xt', embed_dims=[16, 32, 48, 64], depths=[1, 2, 1, 1], num_heads=[1, 2, 3, 4],
        mlp_ratios=[2, 2, 3, 4], attn_types=['nala', 'nala_cos', 'relu', 'softmax'], layer_scale_init_values=None,
        head_hidden_size=40, drop_path_rate=0.2, num_classes=5, in_chans=1)
    assert model.layers[1].blocks[1].ffn.fc1.out_features == 64
    assert [s.blocks[0].attn.kernel.attn_type for s in model.layers] == ['nala', 'nala_cos', 'relu', 'softmax']
    assert model.proj.out_features == 40 and model.head.out_channels == 5
    assert model.patch_embed.proj[0].in_channels == 1
    assert model(torch.randn(2, 1, 64, 64)).shape == (2, 5)


def test_all_nala_is_one_argument():
    model = small(attn_types='nala')
    assert model.attn_types == ('nala',) * 4
    assert all(b.attn.kernel.attn_type == 'nala' for s in model.layers for b in s.blocks)


def test_kernel_kwargs_for_every_stage_or_per_stage():
    """One dict reaches every stage's kernel; a per-stage sequence lets a hybrid model tune its NaLa stages."""
    every = small(attn_types='nala_cos', kernel_kwargs=dict(alpha=5.))
    assert {b.attn.kernel.alpha for s in every.layers for b in s.blocks} == {5.}
    hybrid = small(attn_types=('nala_cos', 'nala_cos', 'softmax', 'softmax'),
                   kernel_kwargs=(dict(alpha=3.), dict(alpha=7.), None, None))
    assert [s.blocks[0].attn.kernel.alpha for s in hybrid.layers[:2]] == [3., 7.]
    assert hybrid(torch.randn(1, 3, 64, 64)).isfinite().all()
    with pytest.raises(TypeError, match=r"kernel 'softmax' takes no arguments, got \['alpha'\].*per stage"):
        small(attn_types=('nala_cos', 'nala_cos', 'softmax', 'softmax'), kernel_kwargs=dict(alpha=5.))
    with pytest.raises(TypeError, match=r"kernel 'nala_cos' takes \['alpha'\], got \['alpah'\]"):
        small(attn_types='nala_cos', kernel_kwargs=dict(alpah=5.))
    with pytest.raises(ValueError, match='kernel_kwargs has 3 entries but the model has 4 stages'):
        small(kernel_kwargs=[None] * 3)


def test_bad_arguments_give_clear_errors():
    with pytest.raises(ValueError, match='attn_types has 3 entries but the model has 4 stages'):
        small(attn_types=('nala', 'nala', 'softmax'))
    with pytest.raises(ValueError, match="unknown attention kernel 'lin'"):
        small(attn_types='lin')
    with pytest.raises(TypeError):
        small(not_an_argument=1)
    with pytest.raises(ValueError, match='no weights are hosted'):
        timm.create_model('nalaformer_t', pretrained=True)


@pytest.mark.parametrize('size', [(64, 64), (96, 160), (70, 45)])
def test_any_input_size_and_aspect_ratio(size):
    model = small().eval()
    x = torch.randn(2, 3, *size)
    assert model(x).shape == (2, 7)
    feats = model.forward_intermediates(x, intermediates_only=True)
    for i, f in enumerate(feats):
        stride = 4 * 2 ** i
        assert f.shape[-2:] == (-(-size[0] // stride), -(-size[1] // stride))


def test_features_only_four_maps_at_strides_4_to_32():
    model = timm.create_model('nalaformer_t', features_only=True, **SMALL).eval()
    assert model.feature_info.reduction() == [4, 8, 16, 32]
    assert model.feature_info.channels() == [16, 32, 48, 64]
    feats = model(torch.randn(1, 3, 128, 96))
    assert [tuple(f.shape) for f in feats] == [(1, 16, 32, 24), (1, 32, 16, 12), (1, 48, 8, 6), (1, 64, 4, 3)]
    sub = timm.create_model('nalaformer_t', features_only=True, out_indices=(1, 3), **SMALL)
    assert [f.shape[1] for f in sub(torch.randn(1, 3, 64, 64))] == [32, 64]


def test_forward_intermediates_and_heads():
    model = small().eval()
    x = torch.randn(2, 3, 64, 96)
    final, inter = model.forward_intermediates(x)
    torch.testing.assert_close(final, model.forward_features(x))
    assert [f.shape[1] for f in inter] == [16, 32, 48, 64]
    last_two = model.forward_intermediates(x, indices=2, intermediates_only=True)
    torch.testing.assert_close(last_two[0], inter[2])
    assert model.forward_head(final, pre_logits=True).shape == (2, 32)
    torch.testing.assert_close(model.forward_head(final), model(x))


def test_reset_classifier_and_pooling():
    model = small().eval()
    assert model.get_classifier() is model.head
    model.reset_classifier(3)
    assert model(torch.randn(1, 3, 64, 64)).shape == (1, 3)
    model.reset_classifier(0)
    assert model(torch.randn(1, 3, 64, 64)).shape == (1, 32)
    model.reset_classifier(0, '')
    assert model(torch.randn(1, 3, 64, 96)).shape == (1, 32, 2, 3)


def test_no_weight_decay_and_group_matcher():
    model = small()
    from timm.models import group_parameters
    groups = group_parameters(model, model.group_matcher(coarse=False))
    assert len(groups) > 4
    # timm's optimizer factory decays what the release's does: LayerScale yes, norms and biases no
    opt = timm.optim.create_optimizer_v2(model, 'adamw', lr=1e-3, weight_decay=0.05)
    decayed = {id(p) for g in opt.param_groups if g['weight_decay'] > 0 for p in g['params']}
    names = {id(p): n for n, p in model.named_parameters()}
    assert 'layers.0.blocks.0.gamma_1' in {names[i] for i in decayed}
    assert not any(names[i].endswith('.bias') or 'norm' in names[i] for i in decayed)


@pytest.mark.parametrize('mode', [True, 'selective'])
def test_gradient_checkpointing_same_outputs_and_grads(mode):
    model = small(drop_path_rate=0.0).train()
    x = torch.randn(2, 3, 64, 64)
    torch.manual_seed(0)
    expected = model(x)
    expected.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.set_grad_checkpointing(mode)
    assert all(s.grad_checkpointing == mode for s in model.layers)
    out = model(x)
    out.sum().backward()
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    for g, p in zip(grads, model.parameters()):
        torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-6)


def test_gradient_checkpointing_rejects_unknown_modes():
    with pytest.raises(ValueError, match="True, False or 'selective'"):
        small().set_grad_checkpointing('all')


def test_drop_path_is_stochastic_in_training_only():
    model = small(drop_path_rate=0.5)
    x = torch.randn(4, 3, 64, 64)
    model.train()
    assert not torch.allclose(model(x), model(x))
    model.eval()
    torch.testing.assert_close(model(x), model(x))


def test_autocast_bf16_forward_is_finite_and_close():
    model = small().eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        ref = model(x)
        with torch.autocast('cpu', dtype=torch.bfloat16):
            out = model(x)
    assert torch.isfinite(out).all()
    assert (out.float() - ref).abs().max() < 0.1 * ref.abs().max() + 0.05


def test_bf16_weights_forward():
    model = small().eval().to(torch.bfloat16)
    out = model(torch.randn(1, 3, 64, 64, dtype=torch.bfloat16))
    assert out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()


def test_meta_device_construction():
    model = timm.create_model('nalaformer_l', device='meta')
    assert all(t.device.type == 'meta' for t in [*model.parameters(), *model.buffers()])


def test_torchscript_matches_eager():
    model = small().eval()
    scripted = torch.jit.script(model)
    x = torch.randn(1, 3, 64, 96)
    torch.testing.assert_close(scripted(x), model(x))


def test_is_a_nalaformer_instance_registered_in_timm():
    assert timm.list_models('nala*') == [
        'nala_swin_base', 'nala_swin_small', 'nala_swin_tiny', 'nalaformer_b', 'nalaformer_l', 'nalaformer_s',
        'nalaformer_t', 'nalaformer_xt', 'nalasr_light']
    families = {'nala_swin_': 'nala_swin', 'nalaformer_': 'nalaformer', 'nalasr_': 'nala_sr'}
    for name in timm.list_models('nala*'):  # each entrypoint is a function of its family's module
        family = next(module for prefix, module in families.items() if name.startswith(prefix))
        entrypoint = timm.models.model_entrypoint(name)
        assert (entrypoint.__module__, entrypoint.__name__) == (f'nalaformer.models.{family}', name)
    assert isinstance(small(), NaLaFormer)
    cfg = timm.create_model('nalaformer_t', **SMALL).pretrained_cfg
    assert cfg['input_size'] == (3, 224, 224) and cfg['crop_pct'] == 0.875 and cfg['interpolation'] == 'bicubic'
