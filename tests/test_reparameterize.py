"""Inference reparameterization (timm's ``reparameterize_model``) and the in-place inference path.

The folds (residual depthwise convs -> +1 at the centre tap, LayerScale -> the branch's last Linear, BatchNorm
-> the conv / Linear before it) must give the plain model's outputs up to float rounding, and the in-place
element-wise work at inference the very numbers of the plain ops.
"""
import copy

import pytest
import timm
import torch
import torch.nn as nn
from timm.utils import reparameterize_model

import nalaformer  # noqa: F401  (registers the models)
from nalaformer.models import inplace_inference
from nalaformer.models.layers import DepthwiseConv2d, NaLaBlock
from nalaformer.ops.nala import rope_angles, rope_table

NO_LAYER_SCALE = (None,) * 4  # timm.create_model drops a plain None keyword argument
CASES = {
    'xt-nala': ('nalaformer_xt', dict(attn_types='nala')),
    'xt-hybrid': ('nalaformer_xt', dict()),  # the release's ('nala', 'nala', 'softmax', 'softmax')
    'xt-no-conv-mixers': ('nalaformer_xt', dict(conv_mixers=False)),
    'xt-no-layer-scale': ('nalaformer_xt', dict(layer_scale_init_values=NO_LAYER_SCALE)),
    't-nala': ('nalaformer_t', dict(attn_types='nala')),
    't-hybrid': ('nalaformer_t', dict()),
}
SHAPE = (2, 3, 64, 96)


def randomized(name: str, seed: int = 0, **kwargs) -> nn.Module:
    """An eval-mode model whose BatchNorm statistics and affines, LayerScales and conv biases are not their
    init values, so that every fold changes something."""
    torch.manual_seed(seed)
    model = timm.create_model(name, **kwargs)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.running_mean.normal_(0, 0.5)
                module.running_var.uniform_(0.5, 2.)
                module.weight.normal_(1, 0.2)
                module.bias.normal_(0, 0.2)
            elif isinstance(module, nn.Conv2d) and module.bias is not None:
                module.bias.normal_(0, 0.1)
        for param_name, param in model.named_parameters():
            if 'gamma' in param_name:
                param.uniform_(0.5, 1.5)
    return model.eval()


def inputs(seed: int = 1) -> torch.Tensor:
    return torch.randn(*SHAPE, generator=torch.Generator().manual_seed(seed))


def assert_rel_close(out: torch.Tensor, ref: torch.Tensor, rel: float = 1e-5):
    assert out.shape == ref.shape
    err = (out - ref).abs().max().item()
    assert err <= rel * ref.abs().max().item(), f'max error {err:.3g} vs max |ref| {ref.abs().max().item():.3g}'


@pytest.mark.parametrize('case', list(CASES))
def test_reparameterized_copy_matches_and_is_idempotent(case):
    name, kwargs = CASES[case]
    model = randomized(name, **kwargs)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = inputs()
    with torch.inference_mode():
        ref = model(x)
    deploy = reparameterize_model(model)
    assert deploy is not model
    with torch.inference_mode():
        out = deploy(x)
    assert_rel_close(out, ref)

    # every fold happened: no BatchNorm but the head's, no LayerScale, the residual convs carry the identity
    assert [n for n, m in deploy.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)] == ['norm']
    assert not any('gamma' in k for k in deploy.state_dict())
    assert all(m.identity_in_kernel == (n.split('.')[-1] != 'lepe')
               for n, m in deploy.named_modules() if isinstance(m, DepthwiseConv2d))
    assert set(deploy.state_dict()) < set(model.state_dict())  # names kept, folded entries gone

    # the original is untouched
    after = model.state_dict()
    assert set(after) == set(before) and all(torch.equal(after[k], before[k]) for k in before)
    with torch.inference_mode():
        assert torch.equal(model(x), ref)

    # reparameterizing again changes nothing
    state = {k: v.clone() for k, v in deploy.state_dict().items()}
    again = reparameterize_model(deploy, inplace=True)
    assert again is deploy
    assert set(again.state_dict()) == set(state)
    assert all(torch.equal(again.state_dict()[k], v) for k, v in state.items())
    with torch.inference_mode():
        assert torch.equal(again(x), out)


@pytest.mark.parametrize('case', ['xt-nala', 'xt-no-conv-mixers'])
def test_reparameterized_state_dict_loads_by_name(case):
    name, kwargs = CASES[case]
    deploy = reparameterize_model(randomized(name, **kwargs))
    other = reparameterize_model(randomized(name, seed=5, **kwargs))
    other.load_state_dict(deploy.state_dict())  # strict: the same names
    x = inputs()
    with torch.inference_mode():
        torch.testing.assert_close(other(x), deploy(x), rtol=0, atol=0)


@pytest.mark.parametrize('case', list(CASES))
def test_in_place_inference_gives_the_plain_numbers(case):
    name, kwargs = CASES[case]
    model = randomized(name, **kwargs)
    for m in (model, reparameterize_model(model)):
        x = inputs()
        x_copy = x.clone()
        with_grad = m(x)
        assert with_grad.requires_grad
        with torch.no_grad():
            no_grad = m(x)
        with torch.inference_mode():
            inference = m(x)
        assert torch.equal(x, x_copy)  # the input is never written
        torch.testing.assert_close(no_grad, with_grad.detach(), rtol=0, atol=0)
        torch.testing.assert_close(inference, with_grad.detach(), rtol=0, atol=0)


@pytest.mark.parametrize('case', ['xt-nala', 'xt-hybrid', 'xt-no-conv-mixers', 'xt-no-layer-scale'])
def test_training_step_still_works(case):
    name, kwargs = CASES[case]
    model = randomized(name, **kwargs)
    deploy = reparameterize_model(model)  # leaves the model it copies trainable
    # input gradients through the deploy model (e.g. saliency) equal the plain model's, folds included
    xs = [inputs().requires_grad_() for _ in range(2)]
    for m, xi in zip((model, deploy), xs):
        m(xi)[:, :5].sum().backward()
    assert_rel_close(xs[1].grad, xs[0].grad, 1e-4)

    model.zero_grad()
    model.train()
    model(inputs()).logsumexp(-1).mean().backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values()), \
        [n for n, g in grads.items() if g is None or not torch.isfinite(g).all()]
    if kwargs.get('layer_scale_init_values') is None:
        assert grads['layers.0.blocks.0.gamma_1'].abs().sum() > 0


@pytest.mark.parametrize('case', ['xt-hybrid', 't-nala'])
def test_features_and_intermediates_of_the_reparameterized_model(case):
    name, kwargs = CASES[case]
    model = randomized(name, **kwargs)
    deploy = reparameterize_model(model)
    x = inputs()
    with torch.inference_mode():
        assert_rel_close(deploy.forward_features(x), model.forward_features(x))
        final, feats = deploy.forward_intermediates(x)
        ref_final, ref_feats = model.forward_intermediates(x)
        assert_rel_close(final, ref_final)
        assert len(feats) == len(ref_feats) == 4
        for f, r in zip(feats, ref_feats):
            assert f.is_contiguous()
            assert_rel_close(f, r)
        assert_rel_close(deploy.forward_head(final, pre_logits=True), model.forward_head(ref_final, pre_logits=True))


def test_reparameterized_model_scripts():
    name, kwargs = CASES['xt-hybrid']
    deploy = reparameterize_model(randomized(name, **kwargs))
    x = torch.randn(1, 3, 64, 96)
    scripted = torch.jit.script(deploy)
    with torch.no_grad():
        torch.testing.assert_close(scripted(x), deploy(x))


@pytest.mark.parametrize('conv_mixers', [True, False])
def test_block_reparameterize_is_exact_in_float64(conv_mixers):
    torch.manual_seed(0)
    block = NaLaBlock(16, 2, 2., 'nala', conv_mixers=conv_mixers).double().eval()
    with torch.no_grad():
        block.gamma_1.uniform_(0.5, 1.5)
        block.gamma_2.uniform_(-1., 1.)
    x = torch.randn(2, 16, 5, 7, dtype=torch.double)
    rope = rope_table(rope_angles(8, device=x.device), 5, 7).double()
    with torch.no_grad():
        ref = block(x, rope)
    deploy = copy.deepcopy(block)
    deploy.reparameterize()
    deploy.reparameterize()
    assert deploy.gamma_1 is None and deploy.gamma_2 is None
    with torch.no_grad():
        torch.testing.assert_close(deploy(x, rope), ref, rtol=1e-12, atol=1e-12)
    # gradients with respect to the input through the folded convs (the FFN's training path is bypassed)
    xs = [x.clone().requires_grad_() for _ in range(2)]
    for b, xi in zip((block, deploy), xs):
        b(xi, rope).square().sum().backward()
    torch.testing.assert_close(xs[1].grad, xs[0].grad, rtol=1e-10, atol=1e-10)


# Every task family whose network runs NaLaFormer's blocks: classification, super-resolution (NaLaAttention in its
# global slot), and the features_only backbone that segmentation and detection build on.
FAMILIES = {
    'classification': (lambda: timm.create_model('nalaformer_xt', attn_types='nala'), (2, 3, 64, 96)),
    'super-resolution': (lambda: timm.create_model('nalasr_light'), (1, 3, 24, 32)),
    'dense backbone': (lambda: timm.create_model('nalaformer_xt', features_only=True), (1, 3, 64, 96)),
}


@pytest.mark.parametrize('family', list(FAMILIES))
def test_in_place_inference_matches_the_plain_ops_in_every_family(family):
    """In-place inference (the default) against the same network within inplace_inference(False): the outputs agree
    up to float rounding, and the input is never written."""
    build, shape = FAMILIES[family]
    torch.manual_seed(0)
    model = build().eval()
    x = torch.randn(*shape)
    x_copy = x.clone()
    with torch.inference_mode():
        fast = model(x)
        with inplace_inference(False):
            plain = model(x)
    assert torch.equal(x, x_copy)
    for out, ref in zip(*(o if isinstance(o, (list, tuple)) else [o] for o in (fast, plain))):
        assert_rel_close(out, ref)
