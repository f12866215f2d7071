"""Our models against tensors produced by the authors' release code (fp32, CPU, eval)."""
import pytest
import timm
import torch

from nalaformer.models import NaLaAttention
from reference_weights import deterministic_input, fill_deterministic

TINY = dict(embed_dims=(32, 64, 96, 128), depths=(1, 1, 2, 1), num_heads=(1, 2, 3, 4), mlp_ratios=3.5,
            layer_scale_init_values=1., num_classes=10)


@pytest.mark.parametrize('case, attn_type', [
    ('attn_nala_c64_h2', 'nala'), ('attn_nala_c192_h2', 'nala'), ('attn_softmax_c64_h2', 'softmax')])
def test_attention_block_matches_release(release_reference, case, attn_type):
    ref = release_reference[case]
    dim = ref['x'].shape[1]
    block = NaLaAttention(dim, 2, attn_type=attn_type)
    block.load_state_dict(ref['state_dict'])
    # the reference inputs spread |q| over tanh's unsaturated range
    assert ref['q_norm_quantiles'][0] < 1.2 and ref['q_norm_quantiles'][1] < 2.5
    x = ref['x'].clone().requires_grad_(True)
    out = block(x)  # RoPE computed by the block for this (non-square) H, W
    out.backward(ref['grad_out'])
    torch.testing.assert_close(out, ref['out'], atol=1e-5, rtol=0)
    torch.testing.assert_close(x.grad, ref['grad_x'], atol=5e-5, rtol=0)


@pytest.mark.parametrize('name, attn_types', [('hybrid', ('nala', 'nala', 'softmax', 'softmax')), ('all_nala', 'nala')])
def test_tiny_model_logits_match_release(release_reference, name, attn_types):
    ref = release_reference[f'tiny_{name}']
    model = fill_deterministic(timm.create_model('nalaformer_t', attn_types=attn_types, **TINY), ref['seed']).eval()
    with torch.no_grad():
        logits = model(deterministic_input((2, 3, 64, 96), ref['input_seed']))
    torch.testing.assert_close(logits, ref['logits'], atol=1e-5, rtol=0)


@pytest.mark.parametrize('variant, atol', [('XT', 1e-4), ('T', 1e-4)])
def test_released_variant_logits_at_224(release_reference, variant, atol):
    ref = release_reference[f'{variant}_224']
    model = fill_deterministic(timm.create_model(f'nalaformer_{variant.lower()}'), ref['seed']).eval()
    with torch.no_grad():
        logits = model(deterministic_input((1, 3, 224, 224), ref['input_seed']))
    assert logits.abs().max() > 0.1  # a meaningful scale, not a degenerate network
    torch.testing.assert_close(logits, ref['logits'], atol=atol, rtol=0)
