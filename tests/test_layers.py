"""The block's memory layout and memory savers compute what the plain channels-first ops compute."""
import pytest
import torch
import torch.nn.functional as F

from nalaformer.models.layers import ConvFFN, DepthwiseConv2d


def plain_conv_ffn(ffn: ConvFFN, x: torch.Tensor) -> torch.Tensor:
    """The ConvFFN as plain channels-first ops, every activation kept by autograd."""
    B, C, H, W = x.shape
    h = F.gelu(F.linear(x.flatten(2).transpose(1, 2), ffn.fc1.weight, ffn.fc1.bias))
    h = h.transpose(1, 2).reshape(B, -1, H, W).contiguous()
    h = h + F.conv2d(h, ffn.dwconv.weight, ffn.dwconv.bias, padding=1, groups=h.shape[1])
    return F.linear(h.flatten(2).transpose(1, 2), ffn.fc2.weight, ffn.fc2.bias).transpose(1, 2).reshape(B, C, H, W)


@pytest.mark.parametrize('channels_last', [False, True])
@pytest.mark.parametrize('size', [(7, 9), (1, 5), (16, 16)])
def test_conv_ffn_values_and_gradients_equal_the_plain_ops(channels_last, size):
    torch.manual_seed(0)
    ffn = ConvFFN(24, 84).double()
    x = torch.randn(2, 24, *size, dtype=torch.double)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    x.requires_grad_()
    grad = torch.randn(2, 24, *size, dtype=torch.double)
    out = ffn(x)
    expected = plain_conv_ffn(ffn, x)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    inputs = [x, *ffn.parameters()]
    for g, e in zip(torch.autograd.grad(out, inputs, grad), torch.autograd.grad(expected, inputs, grad)):
        torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_conv_ffn_under_autocast_gives_the_plain_ops_gradients(dtype):
    """Backward runs outside autocast while the forward's convolution ran in reduced precision."""
    torch.manual_seed(0)
    ffn = ConvFFN(16, 64)
    x = torch.randn(2, 16, 6, 7, requires_grad=True)
    grad = torch.randn(2, 16, 6, 7)
    inputs = [x, *ffn.parameters()]
    with torch.autocast('cpu', dtype=dtype):
        out, expected = ffn(x), plain_conv_ffn(ffn, x)
    assert out.dtype == expected.dtype == dtype
    for g, e, t in zip(torch.autograd.grad(out, inputs, grad.to(dtype)),
                       torch.autograd.grad(expected, inputs, grad.to(dtype)), inputs):
        assert g.dtype == t.dtype
        torch.testing.assert_close(g, e, rtol=0.02, atol=0.02 * e.abs().max().item())


def test_conv_ffn_keeps_one_hidden_activation_fewer_for_backward():
    """What autograd stores for backward: the GELU output is recomputed instead of kept."""
    torch.manual_seed(0)
    ffn = ConvFFN(16, 64)
    x = torch.randn(2, 16, 12, 12, requires_grad=True)
    hidden = 2 * 64 * 12 * 12

    def stored_hidden_sized(fn):
        sizes = []

        def pack(t):
            sizes.append(t.numel())
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn()
        return sum(n == hidden for n in sizes)
    assert stored_hidden_sized(lambda: ffn(x)) == stored_hidden_sized(lambda: plain_conv_ffn(ffn, x)) - 1


def test_depthwise_conv_keeps_a_channels_last_input_channels_last():
    torch.manual_seed(0)
    conv = DepthwiseConv2d(32, 5)
    x = torch.randn(2, 11, 13, 32).permute(0, 3, 1, 2)  # a (B, N, C) token matrix seen as (B, C, H, W)
    out = conv(x)
    assert out.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(out, F.conv2d(x.contiguous(), conv.weight, conv.bias, padding=2, groups=32))
    assert conv.weight.is_contiguous()  # the parameter itself is untouched


@pytest.mark.parametrize('conv_mixers', [True, False])
def test_without_conv_mixers_tokens_interact_only_through_attention(conv_mixers):
    """With the attention branch switched off (LayerScale 0), a block without its convolutional mixers is
    per-token: an output token depends on its own input token only; with them, on its neighbours too."""
    from nalaformer.models.layers import NaLaBlock
    from nalaformer.ops.nala import rope_angles, rope_table
    torch.manual_seed(0)
    block = NaLaBlock(16, 2, 2., 'nala', conv_mixers=conv_mixers).double()
    names = {name.split('.')[-2] if name.endswith('weight') else '' for name, _ in block.named_parameters()}
    assert ({'cpe1', 'cpe2', 'lepe', 'dwconv'} <= names) == conv_mixers
    with torch.no_grad():
        block.gamma_1.zero_()
    x = torch.randn(1, 16, 5, 6, dtype=torch.double, requires_grad=True)
    rope = rope_table(rope_angles(8, device=x.device), 5, 6).double()
    block(x, rope)[0, :, 2, 3].sum().backward()
    others = x.grad[0].abs().sum(0)
    own = others[2, 3].item()
    others[2, 3] = 0
    assert own > 0 and (others.max().item() > 0) == conv_mixers
