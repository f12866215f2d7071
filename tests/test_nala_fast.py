"""The fast NaLa op (nalaformer/ops/nala_fast.py) against the plain-PyTorch reference of nala.py.

Outputs and the gradients of q, k, v (and of a whole block's parameters) must equal the reference
``linear_attention(*nala_feature_maps(q, k), v, rope)`` (and its ``nala_cos`` form) within 1e-5
relative to their scale in float32. Inputs whose gradients are cancellations (N = 1: the output is
v whatever q and k are, so dq and dk are the tiny difference of two large terms) are compared in
float64, where both agree to ~1e-10. No timings here (see tools/analysis/benchmark_nala_op.py).
"""

import pytest
import timm
import torch

import nalaformer  # noqa: F401  (registers the models)
from extreme_tokens import make_extreme_
from nalaformer.models import NaLaBlock
from nalaformer.ops import build_attention_kernel, nala_backend, rope_angles, rope_table, use_nala_backend
from nalaformer.ops import nala_fast
from nalaformer.ops.nala import linear_attention, nala_cos_feature_maps, nala_feature_maps

KINDS = {'nala': None, 'nala_cos': 20.0, 'nala_cos_soft': 2.0}


def reference(q, k, v, rope, alpha):
    features = nala_feature_maps(q, k) if alpha is None else nala_cos_feature_maps(q, k, alpha)
    return linear_attention(*features, v, rope)


def fast(q, k, v, rope, alpha):
    return nala_fast.nala_attention(q, k, v, rope) if alpha is None else \
        nala_fast.nala_cos_attention(q, k, v, rope, alpha)


def inputs(height, width, d, dtype=torch.float32, batch=2, heads=3, seed=0):
    """q with norms spread over tanh's range (so the power p(|q|) varies), k, v, dout and the RoPE table."""
    g = torch.Generator().manual_seed(seed)
    n = height * width
    q = torch.randn(batch, heads, n, d, generator=g) * torch.linspace(0.1, 3.0, n)[:, None] / d ** 0.5
    k = torch.randn(batch, heads, n, d, generator=g) * 0.7
    v = torch.randn(batch, heads, n, d, generator=g)
    dout = torch.randn(batch, heads, n, d, generator=g)
    rope = rope_table(rope_angles(d).to(dtype), height, width)
    return [t.to(dtype) for t in (q, k, v, dout)] + [rope]


def outputs_and_grads(fn, q, k, v, dout, rope, alpha):
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    out = fn(*leaves, rope, alpha)
    return [out.detach(), *torch.autograd.grad(out, leaves, dout)]


def assert_close_to_scale(actual, expected, tol, names=('out', 'dq', 'dk', 'dv')):
    for name, a, e in zip(names, actual, expected):
        assert torch.isfinite(a).all(), name
        error = ((a - e).abs().max() / e.abs().max()).item()
        assert error <= tol, f'{name}: max error {error:.2e} of its scale {e.abs().max().item():.2e}'


@pytest.mark.parametrize('kind', list(KINDS))
@pytest.mark.parametrize('d', [32, 64, 96])
@pytest.mark.parametrize('grid', [(5, 7), (3, 5), (7, 2)])  # odd N = 35 and 15, non-square grids
def test_matches_reference_fp32(kind, d, grid):
    args = inputs(*grid, d)
    expected = outputs_and_grads(reference, *args, KINDS[kind])
    assert_close_to_scale(outputs_and_grads(fast, *args, KINDS[kind]), expected, 1e-5)


@pytest.mark.parametrize('kind', list(KINDS))
@pytest.mark.parametrize('d', [32, 96])
@pytest.mark.parametrize('grid', [(1, 1), (1, 3), (3, 1), (5, 7)])
def test_matches_reference_fp64_small_n(kind, d, grid):
    args = inputs(*grid, d, dtype=torch.float64)
    expected = outputs_and_grads(reference, *args, KINDS[kind])
    assert_close_to_scale(outputs_and_grads(fast, *args, KINDS[kind]), expected, 1e-9)


@pytest.mark.parametrize('kind', list(KINDS))
def test_single_token_output_fp32(kind):
    """N = 1 in float32: the output (= v up to the normaliser's eps) and dv; dq, dk are cancellations."""
    args = inputs(1, 1, 64)
    expected = outputs_and_grads(reference, *args, KINDS[kind])
    actual = outputs_and_grads(fast, *args, KINDS[kind])
    assert_close_to_scale([actual[0], actual[3]], [expected[0], expected[3]], 1e-5, names=('out', 'dv'))


def extreme_inputs(dtype):
    q, k, v, dout, rope = inputs(3, 5, 32, dtype=dtype, heads=2)
    make_extreme_(q, k)
    q[:, :, 6, :7] = 0.0  # exact zeros inside a query
    return q, k, v, dout, rope


@pytest.mark.parametrize('kind', list(KINDS))
@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
def test_zero_tiny_and_huge_norms_finite_and_equal(kind, dtype):
    args = extreme_inputs(dtype)
    actual = outputs_and_grads(fast, *args, KINDS[kind])
    for t in actual:
        assert torch.isfinite(t).all()
    expected = outputs_and_grads(reference, *args, KINDS[kind])
    assert_close_to_scale(actual, expected, 1e-9 if dtype == torch.float64 else 5e-5)


@pytest.mark.parametrize('kind', ['nala', 'nala_cos_soft'])
def test_gradcheck_fp64(kind):
    q, k, v, _, rope = inputs(2, 3, 8, dtype=torch.float64, batch=1, heads=2)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    assert torch.autograd.gradcheck(lambda *x: fast(*x, rope, KINDS[kind]), leaves)


def test_keeps_only_inputs_state_and_normaliser_for_backward():
    """Nothing of the (N, 2d) feature maps is saved: only q, k, v, rope and small per-head tensors."""
    q, k, v, _, rope = inputs(8, 8, 32)
    n, d = q.shape[-2:]
    saved = []
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        fast(*leaves, rope, None)
    big = [tuple(t.shape) for t in saved if t.shape[-1] >= 2 * d and t.shape[-2] == n]
    assert not big, big
    small = sum(t.numel() for t in saved if t.shape[-2] != n or t.shape[-1] == 1)
    assert small <= q.shape[0] * q.shape[1] * (2 * d * d + n + 2 * d) + rope.numel()


@pytest.mark.parametrize('name, alpha', [('nala', None), ('nala_cos', 20.0)])
def test_kernel_uses_fast_op_and_the_switch_restores_the_reference(name, alpha):
    q, k, v, _, rope = inputs(3, 5, 32)
    kernel = build_attention_kernel(name)
    leaf = q.clone().requires_grad_(True)
    assert nala_backend() == 'auto'  # the PyTorch operator here: the CPU, and q requires grad
    assert 'nala_fast' in type(kernel(leaf, k, v, rope).grad_fn).__name__
    with use_nala_backend('reference'):
        out_reference = kernel(leaf, k, v, rope)
        assert 'nala_fast' not in type(out_reference.grad_fn).__name__
        with use_nala_backend('torch'):
            assert 'nala_fast' in type(kernel(leaf, k, v, rope).grad_fn).__name__
    assert nala_backend() == 'auto'
    torch.testing.assert_close(out_reference, reference(q, k, v, rope, alpha))


def test_inference_mode_and_autocast():
    q, k, v, _, rope = inputs(3, 5, 32)
    expected = reference(q, k, v, rope, None)
    with torch.inference_mode():
        torch.testing.assert_close(fast(q, k, v, rope, None), expected, rtol=1e-5, atol=1e-5)
    kernel = build_attention_kernel('nala')
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = kernel(q.bfloat16(), k.bfloat16(), v.bfloat16(), rope)
    assert out.dtype == torch.float32
    exact = reference(q.bfloat16().float(), k.bfloat16().float(), v.bfloat16().float(), rope, None)
    torch.testing.assert_close(out, exact, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('attn_type, kernel_kwargs', [('nala', None), ('nala_cos', dict(alpha=5.0))])
def test_block_parameter_gradients_equal_with_op_and_reference(attn_type, kernel_kwargs):
    torch.manual_seed(0)
    block = NaLaBlock(64, 2, 2.0, attn_type=attn_type, kernel_kwargs=kernel_kwargs)
    x = torch.randn(2, 64, 5, 7)
    rope = rope_table(rope_angles(32), 5, 7)

    def run():
        block.zero_grad(set_to_none=True)
        leaf = x.clone().requires_grad_(True)
        out = block(leaf, rope)
        out.square().mean().backward()
        return {'out': out.detach(), 'x': leaf.grad, **{n: p.grad.clone() for n, p in block.named_parameters()}}

    fast_run = run()
    with use_nala_backend('reference'):
        reference_run = run()
    assert fast_run.keys() == reference_run.keys()
    assert_close_to_scale(list(fast_run.values()), list(reference_run.values()), 1e-5, names=list(fast_run))


def test_torchscript_runs_the_reference():
    q, k, v, _, rope = inputs(3, 5, 32)
    scripted = torch.jit.script(build_attention_kernel('nala'))
    torch.testing.assert_close(scripted(q, k, v, rope), reference(q, k, v, rope, None))


TINY = dict(embed_dims=(32, 64, 96, 128), depths=(1, 1, 1, 1), num_heads=(1, 2, 3, 4), mlp_ratios=2.,
            num_classes=10)


@pytest.mark.slow
@pytest.mark.parametrize('attn_types', ['nala', ('nala_cos', 'nala_cos', 'nala', 'softmax')])
def test_compiled_model_matches_eager(attn_types):
    """torch.compile(fullgraph=True) captures the op whole (an opaque custom op with its fake and
    backward) and gives eager's logits and input gradients."""
    torch.manual_seed(0)
    model = timm.create_model('nalaformer_t', attn_types=attn_types, **TINY).eval()
    x = torch.randn(2, 3, 64, 96)

    def logits_and_grad(fn):
        leaf = x.clone().requires_grad_(True)
        logits = fn(leaf)
        return logits.detach(), torch.autograd.grad(logits.square().sum(), leaf)[0]

    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend='aot_eager')
    (logits, grad), (logits_c, grad_c) = logits_and_grad(model), logits_and_grad(compiled)
    torch.testing.assert_close(logits_c, logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad_c, grad, rtol=1e-5, atol=1e-5 * grad.abs().max().item())
