"""The fused Triton NaLa kernels (nalaformer.kernels) against the PyTorch reference (nalaformer.ops.nala),
and the NaLa backend switch that dispatches to them (nalaformer.ops.backend).

On a machine without a GPU the kernels run in the Triton interpreter. ``TRITON_INTERPRET`` is
read when ``nalaformer.kernels.nala_jit`` is imported, which happens on the first fused call
(importing ``nalaformer`` only registers the kernels), so setting it here, before that import,
works in a full test session too. ``TRITON_INTERPRET=0 pytest tests/test_triton_kernels.py`` runs
the compiled kernels on CUDA instead (scripts/gpu_acceptance.sh does).
"""
import os

os.environ.setdefault('TRITON_INTERPRET', '1')

import functools  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from PIL import Image  # noqa: E402
import torch  # noqa: E402

pytest.importorskip('triton')

import timm  # noqa: E402

from analysis_tools import load_tool  # noqa: E402

from nalaformer.kernels import nala_triton  # noqa: E402
from nalaformer.ops import (  # noqa: E402
    ATTENTION_KERNELS, BACKENDS, build_attention_kernel, linear_attention, nala_backend, nala_cos_feature_maps,
    nala_feature_maps, rope_angles, rope_table, use_nala_backend,
)
from nalaformer.ops import backend, nala_fast  # noqa: E402

INTERPRETED = nala_triton.interpreting()
if not INTERPRETED and not torch.cuda.is_available():
    pytest.skip('TRITON_INTERPRET=0 runs the compiled kernels, which need a CUDA device', allow_module_level=True)
DEVICE = 'cpu' if INTERPRETED else 'cuda'
ROOT = Path(__file__).resolve().parents[1]

# Errors are measured against a float64 reference on the same inputs, relative to the largest
# magnitude of the reference tensor. The kernels compute in float32 throughout (tile products
# included), so the output is within 1e-5 for every input dtype; gradients come back in the input
# dtype and carry its rounding: 2e-3 for float16 (2^-11 relative), 1e-2 for bfloat16 (one unit of
# its last place, 2^-7: the interpreter truncates where a GPU rounds to nearest).
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float64: 1e-12}


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


def fused(q, k, v, rope, alpha=None):
    if alpha is None:
        return nala_triton.nala_attention(q, k, v, rope)
    return nala_triton.nala_cos_attention(q, k, v, rope, alpha)


def assert_close_scaled(actual, expected, rel, what):
    scale = expected.abs().max().item()
    err = (actual.double() - expected).abs().max().item()
    assert err <= rel * scale, f'{what}: max error {err:.3e} > {rel:g} x scale {scale:.3e}'


def check_against_reference(q, k, v, rope, alpha=None):
    """Output and dq, dk, dv of the fused kernels vs the float64 reference, for one random dout,
    within the tolerances of the input dtype."""
    out = fused(q, k, v, rope, alpha)
    ref, ref_inputs = reference(q, k, v, rope, alpha)
    assert out.dtype == (torch.float64 if q.dtype == torch.float64 else torch.float32)
    assert out.shape == q.shape
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref_grads = torch.autograd.grad(ref, ref_inputs, dout.double())
    assert_close_scaled(out, ref, TOLERANCE[torch.float64 if q.dtype == torch.float64 else torch.float32], 'out')
    for name, grad, ref_grad, x in zip('qkv', grads, ref_grads, (q, k, v)):
        assert grad.dtype == x.dtype and grad.shape == x.shape
        assert_close_scaled(grad, ref_grad, TOLERANCE[q.dtype], f'd{name}')


# (batch, heads, H, W, head dim): odd N, N below one block of tokens (16), several blocks,
# non-square grids, padded feature dims (96 -> 128, two value blocks), B * heads > 1. The sums over
# the tokens split each head's blocks into ranges (about 4 programs in all in the interpreter, 2 per
# SM on a GPU): 99 tokens in one head are 4 ranges of 2 blocks, the last one short; 4,355 tokens
# (273 blocks) make ranges of 2 blocks on a GPU too.
SHAPES = [
    (2, 2, 3, 5, 32),
    (1, 3, 7, 11, 64),
    (2, 1, 5, 9, 96),
    (1, 2, 1, 3, 32),
    (1, 1, 9, 11, 32),
    pytest.param(1, 1, 65, 67, 32, marks=pytest.mark.slow),  # 36 s in the interpreter
]


@pytest.mark.parametrize('batch,heads,height,width,d', SHAPES)
def test_nala_matches_reference_fp32(batch, heads, height, width, d):
    check_against_reference(*make_inputs(batch, heads, height, width, d))


@pytest.mark.parametrize('alpha,shape', [(20.0, (2, 2, 3, 5, 32)), (5.0, (1, 2, 4, 7, 96)), (1.0, (1, 1, 9, 8, 64)),
                                         (20.0, (1, 1, 9, 11, 64))])
def test_nala_cos_matches_reference_fp32(alpha, shape):
    check_against_reference(*make_inputs(*shape), alpha=alpha)


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
@pytest.mark.parametrize('alpha', [None, 20.0])
@pytest.mark.parametrize('d', [32, 96])
def test_half_precision_inputs(dtype, alpha, d):
    """Half inputs upcast on load: the output as exact as for float32 inputs, gradients in the input dtype."""
    check_against_reference(*make_inputs(2, 2, 5, 7, d, dtype=dtype), alpha=alpha)


def test_zero_query_and_key_rows():
    """A zero query (direction clamped at 1e-12) and a zero key keep finite, matching gradients."""
    q, k, v, rope = make_inputs(1, 2, 3, 4, 32)
    with torch.no_grad():
        q[0, 0, 5] = 0
        k[0, 1, 2] = 0
    check_against_reference(q, k, v, rope)
    check_against_reference(q, k, v, rope, alpha=20.0)


@pytest.mark.slow
@pytest.mark.skipif(not INTERPRETED, reason='float64 runs in the interpreter only (the GPU path is float32)')
@pytest.mark.parametrize('alpha', [None, 3.0])
def test_gradcheck_float64(alpha):
    """torch.autograd.gradcheck (fast mode: random projections of the Jacobian) in float64."""
    q, k, v, rope = make_inputs(2, 2, 3, 5, 32, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda *x: fused(*x, rope.double(), alpha), (q, k, v), fast_mode=True)


@pytest.mark.parametrize('alpha', [None, 5.0])
def test_custom_operators_pass_opcheck(alpha):
    """torch.library.opcheck: schema, autograd registration, fake (shape-only) versions, AOT dispatch."""
    q, k, v, rope = make_inputs(1, 2, 3, 5, 32)  # strided views of one qkv buffer
    forward_args = (q, k, v, rope, alpha)
    assert set(torch.library.opcheck(torch.ops.nalaformer.nala_attention_forward.default, forward_args).values()) \
        == {'SUCCESS'}
    out, state, mean = torch.ops.nalaformer.nala_attention_forward(*forward_args)
    backward_args = (torch.randn_like(out), *(x.detach() for x in (q, k, v)), rope, state, mean, alpha)
    assert set(torch.library.opcheck(torch.ops.nalaformer.nala_attention_backward.default, backward_args).values()) \
        == {'SUCCESS'}


def test_supported_inputs_and_why_others_are_not():
    q, k, v, rope = make_inputs(1, 2, 3, 5, 32)
    assert nala_triton.triton_supported(q, k, v, rope) and nala_triton.unsupported_reason(q, k, v, rope) is None
    for inputs, reason in [
        ((q, k, v, rope[:, :-1]), 'the RoPE table has shape (2, 14, 32), not (2, 15, 32)'),  # another grid's table
        ((q, k, v, rope.clone().requires_grad_()), 'the RoPE table requires grad'),
        ((q[..., :30], k[..., :30], v[..., :30], rope[..., :30]), 'head dim 30 is not a multiple of 4'),
        (make_inputs(1, 1, 2, 3, 192), 'head dim 192 is above 128'),
        ((q, k.double(), v, rope), 'q, k, v have dtypes torch.float32, torch.float64, torch.float32'),
    ]:
        assert not nala_triton.triton_supported(*inputs)
        assert nala_triton.unsupported_reason(*inputs).startswith(reason)


def test_fused_kernels_are_built_with_the_papers_constants():
    """The Triton kernels do not import nalaformer.ops, which dispatches to them: they hold the same constants."""
    from nalaformer.kernels import nala_jit
    from nalaformer.ops import nala
    for name in ('LAMBDA', 'TAU', 'NORMALISER_EPS', 'DIRECTION_EPS'):
        assert getattr(nala_jit, name) == getattr(nala, name), name


# ----------------------------------------------------------------------------------------------
# The backend switch: which implementation the nala / nala_cos kernels run
# ----------------------------------------------------------------------------------------------
def kernel_outputs(kernel, q, k, v, rope):
    """[out, dq, dk, dv] of one kernel call with dout = 1."""
    out = kernel(q, k, v, rope)
    return [out.detach(), *torch.autograd.grad(out, (q, k, v), torch.ones_like(out))]


def implementation_outputs(q, k, v, rope, alpha=None):
    """[out, dq, dk, dv] of the three implementations called directly: fused, the PyTorch operator, nala.py's chain."""
    def run(function):
        out = function()
        return [out.detach(), *torch.autograd.grad(out, (q, k, v), torch.ones_like(out))]
    qf, kf, vf = (x.float() for x in (q, k, v))
    if alpha is None:
        torch_op = run(lambda: nala_fast.nala_attention(qf, kf, vf, rope))
        chain = run(lambda: linear_attention(*nala_feature_maps(qf, kf), vf, rope))
    else:
        torch_op = run(lambda: nala_fast.nala_cos_attention(qf, kf, vf, rope, alpha))
        chain = run(lambda: linear_attention(*nala_cos_feature_maps(qf, kf, alpha), vf, rope))
    return {'fused': run(lambda: fused(q, k, v, rope, alpha)), 'torch': torch_op, 'reference': chain}


def assert_same(actual, expected):
    for name, a, b in zip(('out', 'dq', 'dk', 'dv'), actual, expected):
        assert torch.equal(a, b), name


@pytest.mark.parametrize('name,alpha', [('nala', None), ('nala_cos', 5.0)])
def test_backend_switch_selects_the_implementation(name, alpha):
    """Each backend runs its implementation: the same bits as calling it directly (and the three differ)."""
    q, k, v, rope = make_inputs(1, 2, 5, 7, 32)
    expected = implementation_outputs(q, k, v, rope, alpha)
    assert not torch.equal(expected['fused'][0], expected['torch'][0])
    assert not torch.equal(expected['torch'][1], expected['reference'][1])
    kernel = build_attention_kernel(name, **({} if alpha is None else dict(alpha=alpha)))
    assert nala_backend() == backend.DEFAULT_BACKEND == 'auto'
    assert_same(kernel_outputs(kernel, q, k, v, rope), expected['torch'])  # 'auto' where q, k, v require grad
    for choice in BACKENDS:
        with use_nala_backend(choice):
            assert nala_backend() == choice
            assert_same(kernel_outputs(kernel, q, k, v, rope), expected['torch' if choice == 'auto' else choice])
    assert nala_backend() == 'auto'


@pytest.mark.parametrize('name,alpha', [('nala', None), ('nala_cos', 5.0)])
def test_auto_runs_the_fused_kernel_where_it_runs_compiled_and_no_gradient_flows(monkeypatch, name, alpha):
    """The default, 'auto': the fused kernel for inference where it runs compiled (a GPU), the PyTorch operator
    where q, k or v requires grad, where the kernel cannot take the inputs (silently) and in the interpreter."""
    kernel = build_attention_kernel(name, **({} if alpha is None else dict(alpha=alpha)))

    def without_grad(function, *inputs):
        with torch.no_grad():
            return function(*inputs)

    torch_op = functools.partial(nala_fast.nala_cos_attention, alpha=alpha) if alpha else nala_fast.nala_attention
    fused_op = functools.partial(fused, alpha=alpha)
    q, k, v, rope = make_inputs(1, 2, 5, 7, 32)
    q6, k6, v6, rope6 = make_inputs(1, 1, 2, 3, 132)  # a head dim above the fused kernel's 128
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # no fallback warning: nobody asked for 'fused'
        assert torch.equal(without_grad(kernel, q6, k6, v6, rope6), without_grad(torch_op, q6, k6, v6, rope6))
        if INTERPRETED:  # the interpreter is exact but slow: never chosen
            assert torch.equal(without_grad(kernel, q, k, v, rope), without_grad(torch_op, q, k, v, rope))
    if INTERPRETED:  # as on a machine whose compiled kernels take these tensors (the interpreter runs them here)
        monkeypatch.setattr(nala_triton, 'INTERPRETED', False)
        monkeypatch.setattr(nala_triton, 'unsupported_reason', lambda *inputs: None)
    assert nala_backend() == 'auto'
    assert torch.equal(without_grad(kernel, q, k, v, rope), without_grad(fused_op, q, k, v, rope))
    frozen = [x.detach() for x in (q, k, v)]  # grad enabled, but none flows into attention (a frozen backbone)
    assert torch.equal(kernel(*frozen, rope), without_grad(fused_op, q, k, v, rope))
    assert_same(kernel_outputs(kernel, q, k, v, rope), implementation_outputs(q, k, v, rope, alpha)['torch'])


def test_triton_names_ask_for_the_fused_backend():
    """nala_triton / nala_cos_triton run fused whatever the switch says, and compute nala / nala_cos."""
    assert {'nala_triton', 'nala_cos_triton'} <= set(ATTENTION_KERNELS)
    q, k, v, rope = make_inputs(1, 2, 3, 5, 32)
    for name, alpha in (('nala_triton', None), ('nala_cos_triton', 5.0)):
        kernel = build_attention_kernel(name, **({} if alpha is None else dict(alpha=alpha)))
        with use_nala_backend('reference'):
            assert_same(kernel_outputs(kernel, q, k, v, rope), implementation_outputs(q, k, v, rope, alpha)['fused'])


def test_fused_backend_falls_back_to_the_pytorch_operator(monkeypatch):
    """Where the fused kernel cannot run (here: a head dim above 128; CPU tensors without the interpreter) the
    fused backend runs the PyTorch operator, bit for bit."""
    kernel = build_attention_kernel('nala')
    q6, k6, v6, rope6 = make_inputs(1, 1, 2, 3, 192)
    with use_nala_backend('fused'):
        assert_same(kernel_outputs(kernel, q6, k6, v6, rope6), implementation_outputs(q6, k6, v6, rope6)['torch'])
    q, k, v, rope = (x.detach().cpu().requires_grad_(x.requires_grad) for x in make_inputs(1, 2, 3, 5, 32))
    monkeypatch.setattr(nala_triton, 'INTERPRETED', False)  # as on a machine running compiled kernels
    assert not nala_triton.triton_supported(q, k, v, rope)
    expected = [kernel_outputs(build_attention_kernel('nala'), q, k, v, rope)]
    with use_nala_backend('fused'):
        assert_same(kernel_outputs(kernel, q, k, v, rope), expected[0])


def test_a_fused_request_that_falls_back_says_why_once():
    kernel = build_attention_kernel('nala')
    q, k, v, rope = make_inputs(1, 1, 2, 3, 132)  # a head dim that no other test asks the fused backend for
    with pytest.warns(UserWarning) as caught, use_nala_backend('fused'):
        for _ in range(3):
            kernel(q, k, v, rope)
    said = [str(w.message) for w in caught if 'NaLa' in str(w.message)]
    assert said == ["the 'fused' NaLa backend runs the PyTorch operator instead: head dim 132 is above 128"]


def test_fused_backend_keeps_half_inputs():
    """The fused backend hands bfloat16 q, k, v to the kernel as they are (the same bits as nala_attention on
    them); the output is float32, as from every kernel."""
    q, k, v, rope = make_inputs(1, 1, 3, 5, 32, dtype=torch.bfloat16)
    with torch.no_grad(), use_nala_backend('fused'):
        out = build_attention_kernel('nala')(q, k, v, rope)
        assert out.dtype == torch.float32
        assert torch.equal(out, nala_triton.nala_attention(q, k, v, rope))


@pytest.mark.slow
def test_exported_graphs_hold_no_fused_operator():
    """torch.export under the fused backend traces the PyTorch operator (an exported graph cannot hold Triton)."""
    model = timm.create_model('nalaformer_xt', attn_types=('nala', 'nala', 'softmax', 'softmax')).eval().to(DEVICE)
    x = torch.randn(1, 3, 32, 32, device=DEVICE)
    with use_nala_backend('fused'), torch.no_grad():
        exported = torch.export.export(model, (x,)).graph_module
    targets = {str(node.target) for module in exported.modules() if isinstance(module, torch.fx.GraphModule)
               for node in module.graph.nodes}  # the attention sits in autocast-off subgraphs
    assert 'nalaformer.nala_attention_forward.default' not in targets
    assert any('nalaformer' in t for t in targets)  # the PyTorch operator


def test_torchscript_runs_the_reference():
    kernel = build_attention_kernel('nala_triton')
    scripted = torch.jit.script(kernel)
    q, k, v, rope = make_inputs(1, 1, 3, 5, 32)
    assert_same(kernel_outputs(scripted, q, k, v, rope), implementation_outputs(q, k, v, rope)['reference'])


@pytest.mark.slow
@pytest.mark.parametrize('value,expected', [('', 'auto'), ('fused', 'fused'), ('Reference', 'reference'),
                                            ('torch', 'torch')])
def test_backend_from_the_environment(value, expected):
    code = 'import nalaformer.ops as ops; print(ops.nala_backend())'
    env = {**os.environ, backend.BACKEND_ENV: value}
    result = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == expected


@pytest.mark.slow
def test_bad_backend_names_fail_clearly():
    with pytest.raises(ValueError, match=r"one of \('auto', 'torch', 'fused', 'reference'\)"):
        with use_nala_backend('triton'):
            pass
    env = {**os.environ, backend.BACKEND_ENV: 'cuda'}
    result = subprocess.run([sys.executable, '-c', 'import nalaformer'], env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode != 0 and "NALAFORMER_NALA_BACKEND is 'cuda'" in result.stderr


# ----------------------------------------------------------------------------------------------
# Models with fused stages
# ----------------------------------------------------------------------------------------------
@pytest.mark.slow
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


@pytest.mark.slow
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


def reference_and_fused(model_name, config=None, **fused_kwargs):
    """(model with the reference kernels, the same model and weights with ``fused_kwargs``), in eval mode on DEVICE."""
    torch.manual_seed(0)
    config = config or {}
    default = timm.create_model(model_name, **config).eval().to(DEVICE)
    fused_model = timm.create_model(model_name, **fused_kwargs, **config)
    fused_model.load_state_dict(default.state_dict())
    return default, fused_model.eval().to(DEVICE)


@pytest.mark.slow
def test_model_with_triton_stages_matches_default():
    """nalaformer_xt with fused NaLa stages gives the default model's logits and input gradients."""
    default, fused_model = reference_and_fused('nalaformer_xt', attn_types=FUSED_XT_STAGES)
    kernels = [type(m).__name__ for name, m in fused_model.named_modules() if name.endswith('attn.kernel')]
    assert kernels[:4] == ['NaLaTritonKernel'] * 4 and 'NaLaTritonKernel' not in kernels[4:]
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
    with torch.no_grad(), use_nala_backend('fused'):  # the default model on the fused backend: the same computation
        assert torch.equal(default(x), fused_model(x))


def test_nala_swin_with_triton_linear_stages_matches_default():
    """NaLa-Swin's global-attention stages with the fused kernel: same logits."""
    default, fused_model = reference_and_fused(
        'nala_swin_tiny', attn_types=('nala_triton', 'nala_triton', 'shifted_window', 'shifted_window'),
        config=dict(embed_dim=16, depths=(1, 1, 1, 1), num_heads=(1, 2, 2, 4)))
    x = torch.randn(2, 3, 64, 96, device=DEVICE)  # linear stages: 16 x 24 and 8 x 12 tokens
    with torch.no_grad():
        torch.testing.assert_close(fused_model(x), default(x), rtol=1e-4, atol=1e-4)


def test_model_with_triton_stages_under_bf16_autocast():
    """Under bfloat16 autocast the logits of the model with fused stages (which take the bf16 q, k, v as they
    are, see test_fused_backend_keeps_half_inputs) stay as close
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




@pytest.mark.slow
def test_benchmark_tool_smoke(tmp_path, capsys):
    """tools/analysis/benchmark.py kernels --tiny writes valid JSON, a PNG and tables with every row measured."""
    from nalaformer.analysis.benchmarks import kernels as tool
    load_tool('benchmark').main(['kernels', '--tiny', '--check', '--device', DEVICE, '--out-dir', str(tmp_path)])
    results = json.loads((tmp_path / 'benchmark_kernels.json').read_text())
    rows = results['rows']
    assert [(r['batch'], r['heads'], r['tokens'], r['head_dim']) for r in rows[::len(tool.METHODS) * 2]] == [
        (1, 2, 9, 32), (2, 1, 25, 32)]
    assert len(rows) == len(tool.TINY_SHAPES) * len(tool.METHODS) * len(tool.MODES)
    assert all(r['status'] == 'ok' and r['ms'] > 0 and r['bandwidth_gbs'] > 0 for r in rows)
    assert results['triton_interpreter'] == INTERPRETED
    assert all(err < 1e-5 for c in results['checks'] for err in c['relative_max_error'].values())
    assert 'forward_backward' in capsys.readouterr().out
    assert nala_backend() == 'auto'
    assert (tmp_path / 'benchmark_kernels.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    # a panel per quantity measured: peak memory only where it was (CUDA), never an empty panel
    with_memory = tmp_path / 'with_memory.png'
    tool.plot(dict(results, rows=[dict(r, peak_mib=1.0) for r in rows]), with_memory)
    panels_drawn = 3 if any(r['peak_mib'] is not None for r in rows) else 2
    width = Image.open(tmp_path / 'benchmark_kernels.png').width
    assert width == pytest.approx(Image.open(with_memory).width * panels_drawn / 3, rel=0.05)
