"""The NaLa math (nalaformer/ops/nala.py) against naive O(N^2) formulations written out here."""
import math

import pytest
import torch

from extreme_tokens import make_extreme_
from nalaformer.ops import ATTENTION_KERNELS, apply_rope, build_attention_kernel, rope_angles, rope_table

H, W = 3, 5  # non-square token grid, N = 15


def qkv(d=32, heads=2, n=H * W, q_scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, heads, n, d, generator=g) * q_scale * torch.linspace(0.02, 0.6, n)[:, None]
    k = torch.randn(2, heads, n, d, generator=g) * 0.7
    v = torch.randn(2, heads, n, d, generator=g)
    return q.double(), k.double(), v.double()


def rotation_matrices(d, height, width):
    """R[i] (N, d, d): the RoPE rotation of token i as an explicit matrix (row then column halves)."""
    freqs = (1.0 / (10000 ** torch.linspace(0, 1, d // 4))).double()  # float32 frequencies, as released
    mats = torch.zeros(height * width, d, d, dtype=torch.float64)
    for t in range(height * width):
        pos = (t // width, t % width)
        for half in range(2):
            for f in range(d // 4):
                theta = pos[half] * freqs[f]
                i = half * d // 2 + 2 * f
                c, s = math.cos(theta), math.sin(theta)
                mats[t, i:i + 2, i:i + 2] = torch.tensor([[c, -s], [s, c]], dtype=torch.float64)
    return mats


def rotate_naive(x, mats):
    """x (..., N, F) with F a multiple of d: rotate each d-chunk of token t by mats[t]."""
    d = mats.shape[-1]
    chunks = x.unflatten(-1, (-1, d))
    return torch.einsum('tij,...tcj->...tci', mats, chunks).flatten(-2)


def naive_linear(phi_q, phi_k, v, mats):
    """out_i = sum_j (R_i phi_q_i . R_j phi_k_j) v_j / N / (phi_q_i . mean_j phi_k_j + 1e-6)."""
    n = v.shape[-2]
    scores = rotate_naive(phi_q, mats) @ rotate_naive(phi_k, mats).transpose(-2, -1) / n  # (B, h, N, N)
    norm = phi_q @ phi_k.mean(-2, keepdim=True).transpose(-2, -1) + 1e-6
    return (scores @ v) / norm


def naive_features(name, q, k):
    """Each kernel's feature maps, written elementwise from the paper / the cited methods."""
    relu = torch.relu
    if name in ('nala', 'const_power'):
        qn = q.norm(dim=-1, keepdim=True)
        p = 3 * (0.5 + torch.tanh(qn)) if name == 'nala' else 3.0
        qd = q / qn
        return torch.cat([relu(qd) ** p, relu(-qd) ** p], -1), torch.cat([relu(k) ** 3, relu(-k) ** 3], -1)
    if name == 'relu':
        return relu(q), relu(k)
    if name == 'elu':
        return torch.where(q > 0, q + 1, q.exp()), torch.where(k > 0, k + 1, k.exp())
    if name == 'focused':
        def focus(x):
            x = relu(x)
            return x ** 3 * x.norm(dim=-1, keepdim=True) / (x ** 3).norm(dim=-1, keepdim=True)
        return focus(q), focus(k)
    raise KeyError(name)


@pytest.mark.parametrize('name', ['nala', 'const_power', 'relu', 'elu', 'focused'])
@pytest.mark.parametrize('d', [32, 64, 96])
def test_linear_kernels_match_naive_quadratic_form(name, d):
    q, k, v = qkv(d)
    mats = rotation_matrices(d, H, W)
    expected = naive_linear(*naive_features(name, q, k), v, mats)
    kernel = build_attention_kernel(name)
    out = kernel.attend(q, k, v, rope_table(rope_angles(d).double(), H, W))
    torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-9)


def test_nala_similarity_is_same_sign_product():
    """phi_q . phi_k = sum_i |d(q)_i|^p |k_i|^3 [sign q_i == sign k_i]."""
    from nalaformer.ops import nala_feature_maps
    q, k, _ = qkv(32)
    phi_q, phi_k = nala_feature_maps(q, k)
    qd = q / q.norm(dim=-1, keepdim=True)
    p = 3 * (0.5 + torch.tanh(q.norm(dim=-1, keepdim=True)))
    terms = (qd.abs() ** p).unsqueeze(-2) * (k.abs() ** 3).unsqueeze(-3)  # (B, h, Nq, Nk, d)
    same = (torch.sign(qd).unsqueeze(-2) == torch.sign(k).unsqueeze(-3))
    torch.testing.assert_close(phi_q @ phi_k.transpose(-2, -1), (terms * same).sum(-1))


def test_polarity_matches_naive_same_and_opposite_sign_streams():
    q, k, v = qkv(32)
    mats = rotation_matrices(32, H, W)
    qp, qm, kp, km = (torch.relu(t) ** 3 for t in (q, -q, k, -k))
    phi_q = torch.cat([qp, qm], -1)
    expected = torch.cat([
        naive_linear(phi_q, torch.cat([kp, km], -1), v[..., :16], mats),
        naive_linear(phi_q, torch.cat([km, kp], -1), v[..., 16:], mats),
    ], -1)
    out = build_attention_kernel('polarity').attend(q, k, v, rope_table(rope_angles(32).double(), H, W))
    torch.testing.assert_close(out, expected)


def test_softmax_kernel_matches_naive_softmax_with_rope():
    q, k, v = qkv(32)
    mats = rotation_matrices(32, H, W)
    scores = rotate_naive(q, mats) @ rotate_naive(k, mats).transpose(-2, -1) / math.sqrt(32)
    expected = scores.softmax(-1) @ v
    out = build_attention_kernel('softmax').attend(q, k, v, rope_table(rope_angles(32).double(), H, W))
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize('d', [32, 96])
def test_nala_cos_approaches_nala_as_alpha_grows(d):
    q, k, v = qkv(d)
    rope = rope_table(rope_angles(d).double(), H, W)
    nala = build_attention_kernel('nala').attend(q, k, v, rope)
    errors = [(build_attention_kernel('nala_cos', alpha=a).attend(q, k, v, rope) - nala).abs().max().item()
              for a in (1.0, 20.0, 1e3, 1e6)]
    assert errors[0] > 1e-2  # a soft inhibit is a different kernel ...
    assert all(a > b for a, b in zip(errors, errors[1:]))  # ... that converges monotonically ...
    assert errors[-1] < 1e-6  # ... to the released hard split


def test_nala_cos_features_are_nonnegative_cosines():
    from nalaformer.ops import nala_cos_feature_maps
    q, k, _ = qkv(32)
    phi_q, phi_k = nala_cos_feature_maps(q, k, alpha=5.0)
    sim = phi_q @ phi_k.transpose(-2, -1)
    assert (sim >= 0).all()


def test_rope_table_non_square_rows_then_columns():
    d, height, width = 32, 3, 7
    sin, cos = rope_table(rope_angles(d), height, width)
    assert sin.shape == (height * width, d)
    theta = torch.atan2(sin, cos)
    token = 2 * width + 5  # row 2, column 5
    freqs = 1.0 / (10000 ** torch.linspace(0, 1, d // 4))
    expected_rows = torch.remainder(2 * freqs.repeat_interleave(2) + math.pi, 2 * math.pi) - math.pi
    expected_cols = torch.remainder(5 * freqs.repeat_interleave(2) + math.pi, 2 * math.pi) - math.pi
    torch.testing.assert_close(theta[token, :d // 2], expected_rows)
    torch.testing.assert_close(theta[token, d // 2:], expected_cols)


def test_rope_scores_depend_only_on_relative_position():
    d, height, width = 32, 4, 6
    rope = rope_table(rope_angles(d).double(), height, width)
    x, y = torch.randn(2, d, dtype=torch.float64)
    rx = apply_rope(x.expand(height * width, d), rope)
    ry = apply_rope(y.expand(height * width, d), rope)
    score = lambda i, j: (rx[i] * ry[j]).sum()  # noqa: E731
    tok = lambda r, c: r * width + c  # noqa: E731
    torch.testing.assert_close(score(tok(0, 1), tok(2, 4)), score(tok(1, 2), tok(3, 5)))
    assert not torch.allclose(score(tok(0, 1), tok(2, 4)), score(tok(0, 1), tok(2, 5)))
    torch.testing.assert_close(rx.norm(dim=-1), x.norm().expand(height * width))


def test_rope_needs_head_dim_divisible_by_four():
    with pytest.raises(ValueError, match='divisible by 4'):
        rope_angles(30)


@pytest.mark.parametrize('name', sorted(set(ATTENTION_KERNELS) - {'nala_triton', 'nala_cos_triton'}))
def test_kernels_finite_for_zero_huge_and_tiny_tokens(name):
    d, n = 32, H * W
    q, k, v = (t.float() for t in qkv(d))
    make_extreme_(q, k)
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    out = build_attention_kernel(name)(q, k, v, rope_table(rope_angles(d), H, W))
    assert out.shape == (2, 2, n, d) and torch.isfinite(out).all()
    out.square().sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()


@pytest.mark.parametrize('name', ['nala', 'softmax', 'nala_cos'])
def test_kernels_run_in_fp32_under_autocast(name):
    q, k, v = (t.float() for t in qkv(32))
    rope = rope_table(rope_angles(32), H, W)
    kernel = build_attention_kernel(name)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = kernel(q.bfloat16(), k.bfloat16(), v.bfloat16(), rope)
    assert out.dtype == torch.float32
    exact = kernel(q.bfloat16().float(), k.bfloat16().float(), v.bfloat16().float(), rope)
    torch.testing.assert_close(out, exact, rtol=1e-6, atol=1e-6)  # no bf16 matmuls inside


def test_unknown_kernel_name_lists_known_ones():
    with pytest.raises(ValueError, match=r"unknown attention kernel 'nala2'.*'nala'.*'softmax'"):
        build_attention_kernel('nala2')
