"""NaLa-SR (nalaformer/models/nala_sr.py): topology, any input size, scales, every global kernel, tiled inference,
checkpoint definitions and the errors a user reads."""
import pytest
import timm
import torch
import torch.nn.functional as F

from nalaformer.checkpoint import CheckpointError, DefinitionMismatchError, model_definition, save_state_dict
from nalaformer.models.nala_sr import WINDOW_ONLY, NaLaSR, mirror_pad, tiled_upscale
from nalaformer.ops import ATTENTION_KERNELS, build_attention_kernel, rope_angles, rope_table

# Two groups of one layer, 16 channels in 2 heads (head dim 8), 8x8 windows: every part of the network, small.
TINY = dict(embed_dim=16, depths=(1, 1), num_heads=2, window_size=8)


def tiny(**kwargs) -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model('nalasr_light', **{**TINY, **kwargs})


def test_parameter_counts_follow_the_authors_topology():
    # PolaFormerPP's MambaIRv2-Light logs 939,440 parameters at x4; per layer their kernel's two (4, 24) scale
    # vectors (192) are our attention's LayerNorm (96): 20 layers x 96 fewer. The scale changes only the upsampler.
    counts = {s: sum(p.numel() for p in timm.create_model('nalasr_light', upscale=s).parameters()) for s in (2, 3, 4)}
    assert counts[4] == 939_440 - 20 * 96
    upsampler = {s: 48 * 3 * s * s * 9 + 3 * s * s for s in (2, 3, 4)}
    assert counts[2] == counts[4] - upsampler[4] + upsampler[2] == 921_932
    assert counts[3] == counts[4] - upsampler[4] + upsampler[3]
    model = timm.create_model('nalasr_light')
    assert model.upscale == 2 and model.attn_types == ('nala',) * 4
    assert len(model.groups) == 4 and all(len(g.layers) == 5 for g in model.groups)


@pytest.mark.parametrize('scale', [2, 3, 4])
def test_any_size_gives_scale_times_the_input(scale):
    model = tiny(upscale=scale).eval()
    with torch.no_grad():
        for h, w in ((5, 3), (13, 21), (16, 16), (9, 40)):  # smaller than a window, odd, whole windows, wide
            assert model(torch.rand(2, 3, h, w)).shape == (2, 3, scale * h, scale * w)


def test_inputs_are_mirror_padded_to_whole_windows_and_cropped_back():
    x = torch.arange(6.).view(1, 1, 2, 3)
    padded = mirror_pad(x, 5, 7)
    assert padded[0, 0, :, 0].tolist() == [0, 3, 3, 0, 0]  # rows 0 1 | 1 0 | 0: the edge pixel repeated
    assert padded[0, 0, 0].tolist() == [0, 1, 2, 2, 1, 0, 0]
    model = tiny().eval()
    x = torch.rand(1, 3, 13, 21)
    with torch.no_grad():  # the network pads 13x21 to 16x24: the same as padding the input first
        torch.testing.assert_close(model(x), model(mirror_pad(x, 16, 24))[..., :26, :42], rtol=0, atol=0)


# The fused Triton kernels compute nala / nala_cos (tests/test_triton_kernels.py); on CPU they run interpreted.
GLOBAL_KERNELS = sorted(set(ATTENTION_KERNELS) - {'nala_triton', 'nala_cos_triton'})


@pytest.mark.parametrize('attn_type', GLOBAL_KERNELS + [WINDOW_ONLY])
def test_every_kernel_in_the_global_slot_trains(attn_type):
    model = tiny(upscale=3, attn_types=attn_type)
    out = model(torch.rand(2, 3, 11, 14))
    F.l1_loss(out, torch.rand_like(out)).backward()
    assert out.shape == (2, 3, 33, 42) and torch.isfinite(out).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    slots = [layer.global_attn for group in model.groups for layer in group.layers]
    if attn_type == WINDOW_ONLY:
        assert all(slot is None for slot in slots)
    else:  # the slot's kernel is the one asked for, and gradients reach through it
        assert all(slot.attn.kernel.attn_type == attn_type for slot in slots)
        assert all(slot.attn.qkvg.weight.grad.abs().sum() > 0 for slot in slots)


def test_kernels_per_group_with_their_arguments():
    model = tiny(attn_types=('nala_cos', WINDOW_ONLY), kernel_kwargs=(dict(alpha=5.), None))
    first, second = (group.layers[0].global_attn for group in model.groups)
    assert first.attn.kernel.alpha == 5. and second is None
    assert model.attn_types == ('nala_cos', WINDOW_ONLY) and model.kernel_kwargs == ({'alpha': 5.}, None)


def test_explicit_softmax_computes_the_sdpa_softmax():
    q, k, v = torch.randn(3, 2, 2, 24, 8).unbind(0)
    rope = rope_table(rope_angles(8), 4, 6)
    torch.testing.assert_close(build_attention_kernel('softmax_explicit')(q, k, v, rope),
                               build_attention_kernel('softmax')(q, k, v, rope))
    explicit, sdpa = tiny(attn_types='softmax_explicit').eval(), tiny(attn_types='softmax').eval()
    x = torch.rand(1, 3, 12, 10)
    with torch.no_grad():
        torch.testing.assert_close(explicit(x), sdpa(x))


def test_tiles_covering_the_image_give_the_whole_image_result_exactly():
    model = tiny().eval()
    x = torch.rand(1, 3, 19, 23)
    with torch.no_grad():
        whole = model(x)
    assert torch.equal(model.forward_tiled(x, tile=23, overlap=4), whole)
    assert torch.equal(model.forward_tiled(x, tile=64, overlap=8), whole)


def test_tiles_are_stitched_exactly_for_a_local_function():
    # Output pixels of a 3x3 conv followed by pixel shuffle depend on LR pixels within 1 px: with an overlap of 2
    # every output pixel comes from a tile that holds its whole neighbourhood, so the stitching is exact.
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 3 * 9, 3, padding=1)
    local = torch.nn.Sequential(conv, torch.nn.PixelShuffle(3))
    x = torch.rand(2, 3, 29, 17)
    with torch.no_grad():
        whole = local(x)
        for tile, overlap in ((8, 2), (10, 3), (5, 4)):
            torch.testing.assert_close(tiled_upscale(local, x, 3, tile, overlap), whole, rtol=0, atol=1e-6)
        seams = tiled_upscale(local, x, 3, 8, 0)  # no overlap: the zero padding of each tile shows at its seams
    assert not torch.allclose(seams, whole)


def test_tiled_network_output_is_each_tiles_own_output():
    # What tiles change: each tile's global attention sees only that tile (every pixel of it, not just the seams,
    # may change), and window attention near a seam sees other neighbours. Each region of the result is exactly
    # the network's output on the tile it was taken from.
    model = tiny().eval()
    x = torch.rand(1, 3, 20, 28)
    with torch.no_grad():
        tiled = model.forward_tiled(x, tile=16, overlap=4)  # rows: tiles at 0 and 4; columns at 0 and 12
        first, last = model(x[..., 0:16, 0:16]), model(x[..., 4:20, 12:28])
        whole = model(x)
    # row cut at (4 + 16) // 2 = 10, column cut at (12 + 16) // 2 = 14; scale 2
    assert torch.equal(tiled[..., :20, :28], first[..., :20, :28])
    assert torch.equal(tiled[..., 20:, 28:], last[..., 12:, 4:])
    assert tiled.shape == whole.shape and not torch.equal(tiled, whole)


@pytest.mark.parametrize('selective', [False, True])
def test_gradient_checkpointing_keeps_outputs_and_gradients(selective):
    x = torch.rand(1, 3, 12, 12)
    grads = []
    for enable in (False, 'selective' if selective else True):
        model = tiny()
        model.set_grad_checkpointing(enable)
        model(x).square().mean().backward()
        grads.append([p.grad for p in model.parameters()])
    for plain, recomputed in zip(*grads):
        torch.testing.assert_close(plain, recomputed)


def test_checkpoints_record_and_check_the_global_slots(tmp_path):
    trained = tiny(upscale=3, attn_types=('nala_cos', 'softmax_explicit'), kernel_kwargs=(dict(alpha=5.), None))
    path = tmp_path / 'sr.safetensors'
    save_state_dict(trained.state_dict(), path, model_definition(trained))
    load = dict(pretrained=True, pretrained_cfg_overlay=dict(file=str(path)), **TINY)
    # the same kernels (softmax through SDPA computes what softmax_explicit computes): same outputs
    loaded = timm.create_model('nalasr_light', upscale=3, attn_types=('nala_cos', 'softmax'),
                               kernel_kwargs=(dict(alpha=5.), None), **load).eval()
    x = torch.rand(1, 3, 9, 10)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), trained.eval()(x))
    with pytest.raises(DefinitionMismatchError, match=r"attn_types=\['nala_cos', 'softmax_explicit'\]"):
        timm.create_model('nalasr_light', upscale=3, **load)  # nala: weights that fit, another function
    with pytest.raises(DefinitionMismatchError, match="'alpha': 5.0"):
        timm.create_model('nalasr_light', upscale=3, attn_types=('nala_cos', 'softmax'), **load)  # alpha 20
    with pytest.raises(DefinitionMismatchError):
        timm.create_model('nalasr_light', upscale=3, attn_types=('nala_cos', WINDOW_ONLY),
                          kernel_kwargs=(dict(alpha=5.), None), **load)
    with pytest.raises(CheckpointError, match='upsample.0.weight'):
        timm.create_model('nalasr_light', upscale=2, attn_types=('nala_cos', 'softmax'),
                          kernel_kwargs=(dict(alpha=5.), None), **load)


@pytest.mark.parametrize('kwargs, message', [
    (dict(upscale=5), r'upscale must be one of \(2, 3, 4\)'),
    (dict(attn_types='nala2'), "unknown attention kernel 'nala2'.*also takes 'none'"),
    (dict(attn_types=('nala', 'none'), kernel_kwargs=(None, dict(alpha=5.))), "group 1 is 'none'.*no kernel_kwargs"),
    (dict(attn_types=('nala',) * 3), 'attn_types has 3 entries but the model has 2 stages'),
    (dict(embed_dim=24, num_heads=4), 'embed_dim / num_heads must be a whole multiple of 4'),
])
def test_bad_definitions_say_what_is_wrong(kwargs, message):
    with pytest.raises(ValueError, match=message):
        tiny(**kwargs)


def test_no_attn_types_is_not_read_as_window_only():
    # timm.create_model drops None kwargs (the default, nala, would be built); the class itself refuses None.
    with pytest.raises(ValueError, match="write attn_types='none' for window attention only"):
        NaLaSR(attn_types=None, **TINY)


def test_bad_inputs_and_tiles_say_what_is_wrong():
    model = tiny().eval()
    with pytest.raises(ValueError, match=r'expected images \(B, 3, H, W\), got shape \(1, 1, 8, 8\)'):
        model(torch.rand(1, 1, 8, 8))
    for tile, overlap in ((0, 0), (8, 8), (8, -1)):
        with pytest.raises(ValueError, match='tile >= 1 and 0 <= overlap < tile'):
            model.forward_tiled(torch.rand(1, 3, 8, 8), tile, overlap)
