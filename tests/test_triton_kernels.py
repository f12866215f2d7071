"""The fused Triton NaLa kernels (nalaformer.kernels) against the PyTorch reference (nalaformer.ops.nala).

On a machine without a GPU the kernels run in the Triton interpreter. ``TRITON_INTERPRET`` is
read when ``nalaformer.kernels.nala_jit`` is imported, which happens on the first fused call
(importing ``nalaformer`` only registers the kernels), so setting it here, before that import,
works in a full test session too. ``TRITON_INTERPRET=0 pytest tests/test_triton_kernels.py`` runs
the compiled kernels on CUDA instead.
"""
import os

os.environ.setdefault('TRITON_INTERPRET', '1')

import importlib.util  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip('triton')

import timm  # noqa: E402

from nalaformer.kernels import nala_triton  # noqa: E402
from nalaformer.kernels.nala_triton import NaLaTritonKernel  # noqa: E402
from nalaformer.kernels.tuning import feature_blocks, has_tensor_cores  # noqa: E402
from nalaformer.ops import (  # noqa: E402
    ATTENTION_KERNELS, build_attention_kernel, linear_attention, nala_cos_feature_maps, nala_feature_maps,
    rope_angles, rope_table,
)

INTERPRETED = nala_triton.interpreting()
if not INTERPRETED and not torch.cuda.is_available():
    pytest.skip('TRITON_INTERPRET=0 runs the compiled kernels, which need a CUDA device', allow_module_level=True)
DEVICE = 'cpu' if INTERPRETED else 'cuda'
CAPABILITY = None if INTERPRETED else torch.cuda.get_device_capability()
TENSOR_CORES = CAPABILITY is None or has_tensor_cores(CAPABILITY)
ROOT = Path(__file__).resolve().parents[1]

# Errors are measured against a float64 reference on the same inputs, relative to the largest
# magnitude of the reference tensor. float32 kernels with float32 products: 1e-5. float16 /
# bfloat16 inputs: gradients come back in the input dtype, so they carry its rounding: 2e-3 for
# float16 (2^-11 relative), 5e-3 for bfloat16 (2^-8).
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 5e-3, torch.float64: 1e-12}
# Tensor-core operands add their own rounding: three TF32 products recover about 2^-22
# (float32-like), TF32 keeps 10 mantissa bits (2^-11 relative), bfloat16 7 (2^-8).
# Errors of the output and all gradients, measured under the interpreter (which rounds operands
# to TF32 / bfloat16 as a GPU does) over 3 seeds, float32 / bfloat16 / float16 inputs and both
# forms: 'tf32' 0.7-1.1e-3, 'bf16' 4.4-8.6e-3 (bfloat16 inputs with float32 products: 3.3e-3
# for the gradients). 'tf32' leaves room for a GPU that truncates to TF32 instead of rounding.
DOT_TOLERANCE = {'ieee': 0.0, 'tf32x3': 2e-5, 'tf32': 4e-3, 'bf16': 1.5e-2}


def resolved_dot(dtype):
    """The operands the current tuning gives inputs of ``dtype`` here."""
    return nala_triton.resolve_dot(nala_triton.current_tuning().dot, dtype, CAPABILITY)


def make_inputs(batch, heads, height, width, d, dtype=torch.float32, seed=0):
    """q, k, v (batch, heads, H*W, d) leaves in ``dtype`` on DEVICE, and the (2, N, d) RoPE table.

    Query norms span 0.1 .. 3 so that p(|q|) = 3 (0.5 + tanh |q|) and its slope both vary; the
    tensors are strided views of one (B, N, 3, heads, d) buffer, like the attention module's.
    """
    g = torch.Generator().manual_seed(seed)
    n = height * width
    qkv = torch.randn(batch, n, 3, heads, d, generator=g, dtype=torch.float64)
    qkv[:, :, 0] *= torch.linspace(0.1, 3.0, n, dtype=torch.float64)[:, None, None] / qkv[:, :, 0].norm(
        dim=-1, keepdim=True)
    qkv[:, :, 1] *= 0.7
    qkv = qkv.to(device=DEVICE, dtype=dtype)
    q, k, v = (qkv[:, :, i].transpose(1, 2).requires_grad_() for i in range(3))
    rope = rope_table(rope_angles(d, device=DEVICE), height, width)
    return q, k, v, rope


def reference(q, k, v, rope, alpha=None):
    """The PyTorch reference in float64 on the same values: output and the function for gradients."""
    q, k, v = (x.detach().double().requires_grad_() for x in (q, k, v))
    maps = nala_feature_maps(q, k) if alpha is None else nala_cos_feature_maps(q, k, alpha)
    return linear_attention(*maps, v, rope.double()), (q, k, v)


def fused(q, k, v, rope, alpha=None, grid=None):
    if alpha is None:
        return nala_triton.nala_attention(q, k, v, rope, grid=grid)
    return nala_triton.nala_cos_attention(q, k, v, rope, alpha, grid=grid)


def assert_close_scaled(actual, expected, rel, what):
    scale = expected.abs().max().item()
    err = (actual.double() - expected).abs().max().item()
    assert err <= rel * scale, f'{what}: max error {err:.3e} > {rel:g} x scale {scale:.3e}'


def check_against_reference(q, k, v, rope, alpha=None):
    """Output and dq, dk, dv of the fused kernels vs the float64 reference, for one random dout,
    within the tolerances of the input dtype and of the current tuning's products."""
    out = fused(q, k, v, rope, alpha)
    ref, ref_inputs = reference(q, k, v, rope, alpha)
    assert out.dtype == (torch.float64 if q.dtype == torch.float64 else torch.float32)
    assert out.shape == q.shape
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref_grads = torch.autograd.grad(ref, ref_inputs, dout.double())
    products = DOT_TOLERANCE[resolved_dot(q.dtype)]
    tol = max(TOLERANCE[q.dtype], products)
    out_tol = max(TOLERANCE[torch.float64 if q.dtype == torch.float64 else torch.float32], products)
    assert_close_scaled(out, ref, out_tol, 'out')
    for name, grad, ref_grad, x in zip('qkv', grads, ref_grads, (q, k, v)):
        assert grad.dtype == x.dtype and grad.shape == x.shape
        assert_close_scaled(grad, ref_grad, tol, f'd{name}')


# (batch, heads, H, W, head dim): odd N, N below one block of tokens (16), several
# blocks, non-square grids, padded feature dims (96 -> 128, two value blocks), B * heads > 1.
SHAPES = [
    (2, 2, 3, 5, 32),
    (1, 3, 7, 11, 64),
    (2, 1, 5, 9, 96),
    (1, 2, 1, 3, 32),
    (1, 1, 9, 11, 32),
]


@pytest.mark.parametrize('batch,heads,height,width,d', SHAPES)
def test_nala_matches_reference_fp32(batch, heads, height, width, d):
    check_against_reference(*make_inputs(batch, heads, height, width, d))


def scramble_outside_factors(rope, height, width):
    """rope_table(angles, H, W) with every value outside its row and column factors overwritten: the first
    halves of each grid row's first token and the second halves of the first grid row are kept."""
    d = rope.shape[-1]
    factors = torch.zeros(height * width, d, dtype=torch.bool, device=rope.device)
    factors[::width, :d // 2] = True
    factors[:width, d // 2:] = True
    return torch.where(factors, rope, torch.full_like(rope, 0.5))


@pytest.mark.parametrize('batch,heads,height,width,d', SHAPES)
@pytest.mark.parametrize('alpha', [None, 20.0])
def test_grid_reads_of_the_rope_table_change_nothing(batch, heads, height, width, d, alpha):
    """With grid=(H, W) all kernels read rope_table's values through its H + W distinct rows only
    (first halves of each grid row's first token, second halves of the first row): same bits, and
    the other rows of the table are never read."""
    q, k, v, rope = make_inputs(batch, heads, height, width, d)
    scrambled = scramble_outside_factors(rope, height, width)

    def outputs(table, grid):
        out = fused(q, k, v, table, alpha, grid)
        return [out, *torch.autograd.grad(out, (q, k, v), torch.ones_like(out))]

    full = outputs(rope, None)
    for table in (rope, scrambled):
        for name, a, b in zip(('out', 'dq', 'dk', 'dv'), outputs(table, (height, width)), full):
            assert torch.equal(a, b), name
    assert not torch.equal(outputs(scrambled, None)[0], full[0])  # without a grid every row is read


def test_grid_must_match_the_tokens():
    q, k, v, rope = make_inputs(1, 1, 3, 5, 32)
    for grid in ((5, 5), (15, 0), (-3, -5)):
        with pytest.raises(ValueError, match=r'does not match the N = 15 tokens of q, k, v: give \(H, W\)'):
            fused(q, k, v, rope, grid=grid)


@pytest.mark.parametrize('alpha,shape', [(20.0, (2, 2, 3, 5, 32)), (5.0, (1, 2, 4, 7, 96)), (1.0, (1, 1, 9, 8, 64))])
def test_nala_cos_matches_reference_fp32(alpha, shape):
    check_against_reference(*make_inputs(*shape), alpha=alpha)


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
@pytest.mark.parametrize('alpha', [None, 20.0])
@pytest.mark.parametrize('dot', ['auto', 'ieee'])
def test_half_precision_inputs(dtype, alpha, dot):
    """Half inputs upcast on load; with float32 products the output is as exact as for float32 inputs."""
    with nala_triton.use_tuning(dot=dot):
        check_against_reference(*make_inputs(2, 2, 5, 7, 64, dtype=dtype), alpha=alpha)


def test_zero_query_and_key_rows():
    """A zero query (direction clamped at 1e-12) and a zero key keep finite, matching gradients."""
    q, k, v, rope = make_inputs(1, 2, 3, 4, 32)
    with torch.no_grad():
        q[0, 0, 5] = 0
        k[0, 1, 2] = 0
    check_against_reference(q, k, v, rope)
    check_against_reference(q, k, v, rope, alpha=20.0)


# (programs per head and value block, alpha, head dim): 3 token blocks per head split 1 x 3, 2 + a short 1,
# 3 x 1, and with more programs than blocks (also 3 x 1); at d = 96 (two value blocks) the kernels over
# token blocks take one block per program whatever the tuning, so only the passes over the state split.
TOKEN_SPLITS = [(1, None, 32), (2, 20.0, 32), (3, None, 32), (1000, 20.0, 32), (2, None, 64),
                (1, 20.0, 96), (2, None, 96), (1000, 20.0, 96)]


@pytest.mark.parametrize('per_head,alpha,d', TOKEN_SPLITS)
def test_tokens_split_across_programs(per_head, alpha, d):
    """Kernels that split each head's tokens into ranges of token blocks, one range per program (as on a GPU),
    compute the same function: 45 tokens (3 blocks of 16) in each of 2 heads, with about ``per_head``
    programs for every head and value block (Tuning.programs counts them all)."""
    q, k, v, rope = make_inputs(1, 2, 5, 9, d)
    _, block_dv, dv_pad = feature_blocks(d)
    with nala_triton.use_tuning(programs=per_head * 2 * (dv_pad // block_dv)):
        check_against_reference(q, k, v, rope, alpha=alpha)


@pytest.mark.parametrize('block_n,num_warps,alpha,shape', [
    (32, 8, None, (1, 2, 5, 9, 96)),   # 45 tokens: a partial second block of 32
    (64, 4, 20.0, (2, 1, 3, 7, 64)),   # 21 tokens: one partial block of 64
    (32, 2, None, (1, 1, 9, 11, 32)),  # 99 tokens
])
def test_token_block_sizes(block_n, num_warps, alpha, shape):
    """Other token block sizes and warp counts compute the same function."""
    with nala_triton.use_tuning(block_n=block_n, num_warps=num_warps, programs=2):
        check_against_reference(*make_inputs(*shape), alpha=alpha)


@pytest.mark.parametrize('dot', ['bf16', 'tf32', 'tf32x3'])
@pytest.mark.parametrize('dtype,alpha', [(torch.float32, None), (torch.bfloat16, 20.0), (torch.float16, None)])
def test_tensor_core_dots(dot, dtype, alpha):
    """The tensor-core dot tunings stay within their rounding of the float64 reference."""
    with nala_triton.use_tuning(dot=dot):
        check_against_reference(*make_inputs(1, 2, 5, 7, 64, dtype=dtype), alpha=alpha)


@pytest.mark.parametrize('dot', ['tf32', 'bf16'])
def test_single_pass_tensor_core_dots_round_their_operands(dot):
    """'tf32' and 'bf16' really multiply rounded operands: their result moves off the exact one."""
    q, k, v, rope = make_inputs(1, 1, 4, 8, 32)
    with nala_triton.use_tuning(dot='ieee'):
        exact = fused(q, k, v, rope).detach()
    with nala_triton.use_tuning(dot=dot):
        rounded = fused(q, k, v, rope).detach()
    relative = ((rounded - exact).abs().max() / exact.abs().max()).item()
    assert DOT_TOLERANCE[dot] / 100 < relative < DOT_TOLERANCE[dot]


def outputs_and_grads(q, k, v, rope, dout, alpha=None, forward=None, backward=None):
    """[out, dq, dk, dv] of one fused call, its forward run under ``use_tuning(**forward)`` and its backward
    under ``use_tuning(**backward)`` (None: the current tuning)."""
    with nala_triton.use_tuning(**(forward or {})):
        out = fused(q, k, v, rope, alpha)
    with nala_triton.use_tuning(**(backward or {})):
        return [out.detach(), *torch.autograd.grad(out, (q, k, v), dout)]


def assert_all_equal(actual, expected):
    for name, a, b in zip(('out', 'dq', 'dk', 'dv'), actual, expected):
        assert torch.equal(a, b), name


def test_backward_uses_the_tuning_of_its_forward():
    """A call's backward runs with its forward's tuning, whatever is current when it runs: the same bits as a
    call under that tuning throughout (and the two tunings do give different gradients). d = 96: every
    backward pass, the d state's own included; 21 tokens, 2 blocks of 16 or 1 of 32."""
    q, k, v, rope = make_inputs(1, 1, 3, 7, 96)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    a = dict(block_n=32, dot='bf16' if TENSOR_CORES else 'ieee', programs=1)
    b = dict(block_n=16, dot='ieee', programs=1000)
    switched = outputs_and_grads(q, k, v, rope, dout, forward=a, backward=b)
    assert_all_equal(switched, outputs_and_grads(q, k, v, rope, dout, forward=a, backward=a))
    throughout_b = outputs_and_grads(q, k, v, rope, dout, forward=b, backward=b)
    assert not any(torch.equal(x, y) for x, y in zip(switched[1:], throughout_b[1:]))


def test_auto_dot_follows_the_inputs_and_pytorch_matmul_precision():
    """'auto' multiplies as PyTorch's matmul would: bf16 -> bf16, fp16 -> TF32, fp32 -> TF32 only when
    PyTorch's float32 matmuls use it (either API); float64 and GPUs before sm_80 -> float32 products."""
    resolve = nala_triton.resolve_dot
    dtypes = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
    assert [resolve('auto', dtype, (9, 0)) for dtype in dtypes] == ['bf16', 'tf32', 'ieee', 'ieee']
    assert [resolve('auto', dtype, None) for dtype in dtypes] == ['bf16', 'tf32', 'ieee', 'ieee']
    assert {resolve('auto', dtype, (7, 5)) for dtype in dtypes} == {'ieee'}
    matmul = torch.backends.cuda.matmul
    previous = torch.get_float32_matmul_precision()
    try:
        matmul.fp32_precision = 'tf32'
        assert resolve('auto', torch.float32, (8, 0)) == 'tf32'
        matmul.fp32_precision = 'none'
        assert resolve('auto', torch.float32, (8, 0)) == 'ieee'
        torch.set_float32_matmul_precision('high')
        assert resolve('auto', torch.float32, (8, 0)) == 'tf32'
        assert resolve('auto', torch.float32, (7, 0)) == 'ieee'
    finally:
        torch.set_float32_matmul_precision(previous)
    assert resolve('auto', torch.float32, (8, 0)) == 'ieee'
    # Explicit modes stay, checked against the GPU; float64 always multiplies in float64.
    assert resolve('tf32x3', torch.bfloat16, (9, 0)) == 'tf32x3' and resolve('bf16', torch.float64, (7, 5)) == 'ieee'
    with pytest.raises(ValueError, match="dot='bf16' needs .* sm_75"):
        resolve('bf16', torch.float32, (7, 5))


@pytest.mark.parametrize('dtype,expected,d', [(torch.bfloat16, 'bf16', 32), (torch.float16, 'tf32', 96),
                                              (torch.float32, 'ieee', 32)])
def test_default_tuning_multiplies_as_the_resolved_operands(dtype, expected, d):
    """The default ('auto') reaches a forward and backward as one resolved mode: the output and gradients are
    bit-identical to those of that mode named explicitly (and differ from another mode's)."""
    resolved = nala_triton.resolve_dot('auto', dtype, CAPABILITY)
    assert resolved == (expected if TENSOR_CORES else 'ieee')
    assert nala_triton.current_tuning().dot == 'auto'
    q, k, v, rope = make_inputs(1, 1, 3, 5, d, dtype=dtype)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    default = outputs_and_grads(q, k, v, rope, dout)
    assert_all_equal(outputs_and_grads(q, k, v, rope, dout, forward=dict(dot=resolved)), default)
    if TENSOR_CORES:
        other = outputs_and_grads(q, k, v, rope, dout, forward=dict(dot='ieee' if resolved != 'ieee' else 'tf32'))
        assert not any(torch.equal(x, y) for x, y in zip(other, default))


def test_kernel_tuning_from_model_kernel_kwargs():
    """Per-stage kernel_kwargs give the fused stages their own checked tuning, which their calls run with."""
    model = timm.create_model(
        'nalaformer_xt', attn_types=('nala_triton', 'nala_cos_triton', 'softmax', 'softmax'),
        kernel_kwargs=(dict(tuning=dict(block_n=32)), dict(alpha=5., tuning=dict(block_n=64, dot='bf16')), None, None))
    kernels = [model.layers[i].blocks[0].attn.kernel for i in range(2)]
    assert [(k.tuning.block_n, k.tuning.dot) for k in kernels] == [(32, 'auto'), (64, 'bf16')]
    assert kernels[1].alpha == 5. and 'tuning=Tuning(block_n=64' in repr(kernels[1])
    assert nala_triton.current_tuning() == nala_triton.Tuning()
    q, k, v, rope = make_inputs(1, 2, 3, 5, 32)
    with torch.no_grad():
        out = kernels[1](q, k, v, rope)
        tuned = nala_triton.Tuning(block_n=64, dot='bf16')
        assert torch.equal(out, nala_triton.nala_cos_attention(q, k, v, rope, 5.0, tuning=tuned))
        assert not torch.equal(out, nala_triton.nala_cos_attention(q, k, v, rope, 5.0))  # the current tuning's
    with pytest.raises(ValueError, match="dot must be 'auto' or one of"):
        build_attention_kernel('nala_triton', tuning=dict(dot='fp8'))
    with pytest.raises(TypeError, match="got an unexpected keyword argument 'block'"):
        build_attention_kernel('nala_triton', tuning=dict(block=32))


def test_tuning_beyond_the_gpu_on_chip_memory_fails_clearly(monkeypatch):
    """A tuning whose programs need more shared memory than the GPU has (e.g. 'tf32x3' products at d = 64 on a
    100 KB sm_86) fails naming the kernel, the figures and what to change, not Triton's block-size advice."""
    from triton.runtime.errors import OutOfResources

    from nalaformer.kernels import nala_jit  # no public way to make a launch exceed the on-chip memory

    class TooLarge:
        __name__ = '_backward_key_kernel'

        def __getitem__(self, grid):
            def launch(*args, **meta):
                raise OutOfResources(155648, 101376, 'shared memory')
            return launch

    monkeypatch.setattr(nala_jit, '_backward_key_kernel', TooLarge())
    q, k, v, rope = make_inputs(1, 1, 3, 5, 64)
    out = fused(q, k, v, rope)
    with pytest.raises(RuntimeError, match=r"_backward_key_kernel at head dim 64 .* needs 155648 B of shared memory "
                       r"per program, but this GPU has 101376 B\. .*use dot='tf32', 'bf16' or 'ieee'"):
        out.sum().backward()


def test_tensor_core_dots_need_sm80():
    """A tensor-core tuning on an older GPU fails with a message naming the GPU and the way out."""
    from nalaformer.kernels.tuning import check_dot_support
    for dot in ('ieee', 'tf32x3', 'tf32', 'bf16'):
        check_dot_support(dot, (9, 0))
        check_dot_support(dot, (8, 0))
    check_dot_support('ieee', (7, 5))
    for dot in ('tf32x3', 'tf32', 'bf16'):
        with pytest.raises(ValueError, match=rf"dot='{dot}' needs .* this GPU is sm_75: use dot='ieee'"):
            check_dot_support(dot, (7, 5))


@pytest.mark.parametrize('field,value,message', [
    ('block_n', 24, 'power of two'), ('block_n', 8, 'power of two'), ('num_warps', 3, 'num_warps'),
    ('num_stages', 0, 'num_stages'),
    ('dot', 'fp8', "dot must be 'auto' or one of ('ieee', 'tf32x3', 'tf32', 'bf16')"),
    ('programs', 0, '>= 1'),
])
def test_tuning_rejects_bad_values(field, value, message):
    with pytest.raises(ValueError, match=message.replace('(', r'\(').replace(')', r'\)')):
        with nala_triton.use_tuning(**{field: value}):
            pass
    assert nala_triton.current_tuning() == nala_triton.Tuning()  # a failed change leaves the tuning as it was


@pytest.mark.parametrize('alpha', [None, 3.0])
def test_gradcheck_float64(alpha):
    """torch.autograd.gradcheck (fast mode: random projections of the Jacobian) in float64."""
    q, k, v, rope = make_inputs(2, 2, 3, 5, 32, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda *x: fused(*x, rope.double(), alpha), (q, k, v), fast_mode=True)


def test_registered_kernels_and_fallback(monkeypatch):
    """The registered kernels run fused here and fall back to the reference where Triton cannot run."""
    assert {'nala_triton', 'nala_cos_triton'} <= set(ATTENTION_KERNELS)
    kernel = build_attention_kernel('nala_cos_triton', alpha=5.0)
    assert kernel.alpha == 5.0
    q, k, v, rope = make_inputs(1, 2, 3, 5, 32)
    assert nala_triton.triton_supported(q, k, v, rope)
    assert not nala_triton.triton_supported(q, k, v, rope[:, :-1])  # table for another grid
    q6, k6, v6, rope6 = make_inputs(1, 1, 2, 3, 192)  # head dim above 128
    assert not nala_triton.triton_supported(q6, k6, v6, rope6)
    reference_kernel = build_attention_kernel('nala')
    torch.testing.assert_close(build_attention_kernel('nala_triton')(q6, k6, v6, rope6),
                               reference_kernel(q6, k6, v6, rope6))

    with monkeypatch.context() as m:  # CPU tensors without the interpreter
        m.setattr(nala_triton, 'INTERPRETED', False)
        assert not nala_triton.triton_supported(*(x.detach().cpu() for x in (q, k, v, rope)))

    with torch.no_grad():
        expected = build_attention_kernel('nala_cos', alpha=5.0)(q, k, v, rope)
        fused_out = kernel(q, k, v, rope)
        monkeypatch.setattr(nala_triton, 'triton_supported', lambda *a: False)
        fallback = kernel(q, k, v, rope)
    for out in (fused_out, fallback):
        torch.testing.assert_close(out, expected)
    assert not torch.equal(fallback, fused_out)  # not the fused kernels, which round differently


def test_kernel_module_keeps_half_inputs_and_returns_float32():
    """The registered kernel hands bfloat16 q, k, v to the fused function as they are (the same bits as
    nala_attention on them, whose 'auto' products then follow bfloat16); output float32."""
    q, k, v, rope = make_inputs(1, 1, 3, 5, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        out = build_attention_kernel('nala_triton')(q, k, v, rope)
        assert out.dtype == torch.float32
        assert torch.equal(out, nala_triton.nala_attention(q, k, v, rope))
        if resolved_dot(torch.bfloat16) != resolved_dot(torch.float32):
            assert not torch.equal(out, nala_triton.nala_attention(q.float(), k.float(), v.float(), rope))


@pytest.mark.parametrize('alpha', [None, 5.0])
def test_custom_operators_pass_opcheck(alpha):
    """torch.library.opcheck: schema, autograd registration, fake (shape-only) versions, AOT dispatch."""
    q, k, v, rope = make_inputs(1, 2, 3, 5, 32)  # strided views of one qkv buffer
    tuning = (32, 4, 3, 'ieee', 2)
    forward_args = (q, k, v, rope, 5, alpha, *tuning)
    assert set(torch.library.opcheck(torch.ops.nalaformer.nala_attention_forward.default, forward_args).values()) \
        == {'SUCCESS'}
    out, state, mean = torch.ops.nalaformer.nala_attention_forward(*forward_args)
    backward_args = (torch.randn_like(out), *(x.detach() for x in (q, k, v)), rope, 5, state, mean, alpha, *tuning)
    assert set(torch.library.opcheck(torch.ops.nalaformer.nala_attention_backward.default, backward_args).values()) \
        == {'SUCCESS'}


def test_model_compiles_in_one_graph():
    """torch.compile(fullgraph=True) captures a model with fused stages whole (the fused attention is an
    opaque custom operator), with the eager logits and input gradients.

    The 'aot_eager' backend runs dynamo and AOT autograd with the operators' fake versions like the
    default 'inductor' does, without its C++ code generation (over a minute on CPU; checked by hand:
    logits within 5e-7 of eager).
    """
    torch.manual_seed(0)
    model = timm.create_model('nalaformer_xt', attn_types=('nala_triton', 'nala_cos_triton', 'softmax', 'softmax'))
    model = model.eval().to(DEVICE)
    x = torch.randn(2, 3, 32, 64, device=DEVICE, requires_grad=True)
    logits = model(x)
    grad, = torch.autograd.grad(logits.square().sum(), x)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend='aot_eager')
    x_compiled = x.detach().clone().requires_grad_()
    logits_compiled = compiled(x_compiled)
    grad_compiled, = torch.autograd.grad(logits_compiled.square().sum(), x_compiled)
    torch.testing.assert_close(logits_compiled, logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad_compiled, grad, rtol=1e-4, atol=1e-4 * grad.abs().max().item())


def test_gradient_checkpointing_with_fused_stages():
    """Recomputing fused stages in backward (grad checkpointing) gives the same parameter gradients."""
    torch.manual_seed(0)
    model = timm.create_model('nalaformer_xt', attn_types=('nala_triton', 'nala_cos_triton', 'softmax', 'softmax'),
                              drop_path_rate=0.0)  # stochastic depth would draw differently in the two runs
    model = model.train().to(DEVICE)
    x = torch.randn(2, 3, 32, 64, device=DEVICE)
    grads = []
    for checkpointing in (False, True):
        model.zero_grad()
        model.set_grad_checkpointing(checkpointing)
        model(x).square().sum().backward()
        grads.append({name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 200
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-5, atol=1e-6 * grad.abs().max().item(), msg=name)


FUSED_XT_STAGES = ('nala_triton', 'nala_triton', 'softmax', 'softmax')


def reference_and_fused(model_name, config=None, **fused_kernels):
    """(model with the reference kernels, the same model and weights with ``fused_kernels``), in eval mode on DEVICE."""
    torch.manual_seed(0)
    config = config or {}
    default = timm.create_model(model_name, **config).eval().to(DEVICE)
    fused_model = timm.create_model(model_name, **fused_kernels, **config)
    fused_model.load_state_dict(default.state_dict())
    return default, fused_model.eval().to(DEVICE)


def read_only_grid_factors(model, grids):
    """Overwrite, before each call of ``model``'s fused kernels, every value of the RoPE table outside the row
    and column factors of its token grid (``grids``: N -> (H, W)). The results stay the reference model's only
    if the model gives the kernels their grid, so that they read the table through its factors."""
    def scramble(module, args, kwargs):
        q, k, v, rope = args
        return (q, k, v, scramble_outside_factors(rope, *grids[q.shape[-2]])), kwargs

    hooked = [m.register_forward_pre_hook(scramble, with_kwargs=True) for m in model.modules()
              if isinstance(m, NaLaTritonKernel)]
    assert hooked


def test_model_with_triton_stages_matches_default():
    """nalaformer_xt with fused NaLa stages gives the default model's logits and input gradients; its
    attention modules give the kernels their token grid, so the RoPE table is read through its factors."""
    default, fused_model = reference_and_fused('nalaformer_xt', attn_types=FUSED_XT_STAGES)
    kernels = [type(m).__name__ for name, m in fused_model.named_modules() if name.endswith('attn.kernel')]
    assert kernels[:4] == ['NaLaTritonKernel'] * 4 and 'NaLaTritonKernel' not in kernels[4:]
    read_only_grid_factors(fused_model, {8 * 16: (8, 16), 4 * 8: (4, 8)})
    x = torch.randn(2, 3, 32, 64, device=DEVICE)  # stage 1: 8 x 16 tokens, stage 2: 4 x 8
    x_default = x.clone().requires_grad_()
    x_fused = x.clone().requires_grad_()
    logits = default(x_default)
    logits_fused = fused_model(x_fused)
    torch.testing.assert_close(logits_fused, logits, rtol=1e-4, atol=1e-4)
    logits.square().sum().backward()
    logits_fused.square().sum().backward()
    # Input gradients pass through the whole network (on a GPU: TF32, non-deterministic convolution backward).
    torch.testing.assert_close(x_fused.grad, x_default.grad, rtol=1e-3, atol=1e-3 * x_default.grad.abs().max().item())


def test_nala_swin_with_triton_linear_stages_matches_default():
    """NaLa-Swin's global-attention stages with the fused kernel: same logits, grid reads of the table."""
    default, fused_model = reference_and_fused(
        'nala_swin_tiny', attn_types=('nala_triton', 'nala_triton', 'shifted_window', 'shifted_window'),
        config=dict(embed_dim=16, depths=(1, 1, 1, 1), num_heads=(1, 2, 2, 4)))
    read_only_grid_factors(fused_model, {16 * 24: (16, 24), 8 * 12: (8, 12)})
    x = torch.randn(2, 3, 64, 96, device=DEVICE)  # linear stages: 16 x 24 and 8 x 12 tokens
    with torch.no_grad():
        torch.testing.assert_close(fused_model(x), default(x), rtol=1e-4, atol=1e-4)


def test_model_with_triton_stages_under_bf16_autocast():
    """Under bfloat16 autocast the logits of the model with fused stages (which take the bf16 q, k, v as they
    are and multiply bf16 operands, see test_kernel_module_keeps_half_inputs_and_returns_float32) stay as close
    to the float32 model's as those of the reference kernel under autocast."""
    default, fused_model = reference_and_fused('nalaformer_xt', attn_types=FUSED_XT_STAGES)
    x = torch.randn(2, 3, 32, 64, device=DEVICE)
    with torch.no_grad():
        exact = default(x)
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            reference_amp = default(x).float()
            fused_amp = fused_model(x).float()
    autocast_error = (reference_amp - exact).abs().max()
    assert autocast_error > 0  # autocast really ran in bfloat16
    assert (fused_amp - exact).abs().max() <= 2 * autocast_error


def test_benchmark_tool_smoke(tmp_path, capsys):
    """tools/analysis/benchmark_kernels.py --tiny writes valid JSON, a PNG and tables with every row measured."""
    spec = importlib.util.spec_from_file_location('benchmark_kernels', ROOT / 'tools/analysis/benchmark_kernels.py')
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    tool.main(['--tiny', '--check', '--breakdown', '--sweep', '--sweep-block-n', '16', '32', '--sweep-warps', '4',
               '--sweep-dot', 'ieee', '--sweep-programs', '1', '2', '--dot', 'tf32', '--programs', '3',
               '--device', DEVICE, '--out-dir', str(tmp_path)])
    results = json.loads((tmp_path / 'benchmark_kernels.json').read_text())
    assert results['config']['tuning']['dot'] == results['config']['dot_resolved'] == 'tf32'
    assert results['config']['tuning']['programs'] == 3
    assert nala_triton.current_tuning() == nala_triton.Tuning()
    assert [set(b['time_ms']) for b in results['breakdown']] == [
        {'forward_state', 'forward_output', 'backward_query', 'backward_key'}] * len(tool.TINY_SIDES)
    sweep = [(r['n'], r['mode'], r['tuning']['block_n'], r['tuning']['programs'])
             for r in results['sweep'] if r['status'] == 'ok']
    assert sorted(sweep) == sorted((s * s, mode, block_n, programs) for s in tool.TINY_SIDES for mode in tool.MODES
                                   for block_n in (16, 32) for programs in (1, 2))
    assert 'forward_backward' in capsys.readouterr().out
    rows = results['rows']
    assert len(rows) == len(tool.TINY_SIDES) * len(tool.METHODS) * len(tool.MODES)
    assert all(r['status'] == 'ok' and r['time_ms'] > 0 and r['bandwidth_gbps'] > 0 for r in rows)
    assert all(r['fused'] for r in rows if r['method'] == 'nala_triton')
    assert results['triton_interpreter'] == INTERPRETED
    assert [c['n'] for c in results['checks']] == [side * side for side in tool.TINY_SIDES]
    assert all(err < DOT_TOLERANCE['tf32'] for c in results['checks'] for err in c['relative_max_error'].values())
    assert (tmp_path / 'benchmark_kernels.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_resource_tool_compiles_for_hopper_without_a_gpu(tmp_path):
    """tools/analysis/kernel_resources.py compiles kernels for sm_90 here and reads ptxas's registers and spills."""
    subprocess.run([sys.executable, str(ROOT / 'tools/analysis/kernel_resources.py'), '--head-dims', '96',
                    '--block-n', '16', '--warps', '8', '--dot', 'bf16', '--forms', 'nala_cos',
                    '--kernels', '_forward_output_kernel', '_backward_query_kernel', '--out-dir', str(tmp_path)],
                   check=True, capture_output=True, text=True, timeout=600)
    results = json.loads((tmp_path / 'kernel_resources.json').read_text())
    rows = results['rows']
    assert [r['kernel'] for r in rows] == ['forward_output', 'backward_query']
    for row in rows:
        assert row['status'] == 'ok', row
        assert 0 < row['registers'] <= 255 and row['spill_stores'] >= 0 and row['shared'] > 0
        assert 1 <= row['programs_per_sm'] <= 8  # the program fits on an SM; 8 warps each, 64 per SM
