"""Triton kernels of the fused NaLa attention and their launchers.

Imported by :mod:`nalaformer.kernels.nala_triton` on the first fused call. The ``triton.jit``
decorators below build compiled or interpreted kernels from ``TRITON_INTERPRET`` at that import,
and must agree with triton's own language functions, built when triton was imported
(:mod:`nalaformer.kernels.interpreter`).

Per (batch, head), with phi = [h1, h2] split into two d-wide halves (each zero-padded to
BLOCK_D, a power of two) and R_i the RoPE rotation of token i::

    state = sum_j R_j phi_k(k_j) v_j^T / N      (2, BLOCK_D, DV_PAD)
    mean  = sum_j phi_k(k_j) / N                (2, BLOCK_D)
    out_i = (R_i phi_q(q_i))^T state / (phi_q(q_i) . mean + eps)

Half 1 / half 2 are the positive / negative parts (release form) or the cos / sin parts
(cosine-inhibit form, ``COS``). Four kernels: one sum over the tokens (state, or d state with
``QUERIES``), split into token ranges whose partial sums PyTorch adds up, and three passes of one token block per
program (output; dq; dk and dv) that read the state where they multiply by it. All arithmetic,
the tile products' operands included, runs in ``ACC`` (float32, or float64).
"""
import math
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from .interpreter import INTERPRETED

# The paper's constants, as in nalaformer.ops.nala: the kernels import nothing from nalaformer.ops, which
# dispatches to them (tests/test_triton_kernels.py checks that the two agree). The keys' power LAMBDA = 3
# is written as products in _key_halves and _key_halves_bwd.
LAMBDA = 3.0
TAU = 0.5
NORMALISER_EPS = 1e-6
DIRECTION_EPS = 1e-12

# The @triton.jit below builds interpreted kernels when TRITON_INTERPRET is set now; triton's own
# language functions were built for the mode of its first import (INTERPRETED): they must agree.
if triton.knobs.runtime.interpret != INTERPRETED:
    raise RuntimeError(
        f'TRITON_INTERPRET={triton.knobs.runtime.interpret:d} now, but triton was imported with the other setting: '
        'set it before triton is first imported (importing timm or nalaformer imports it; tests set it in '
        'tests/conftest.py)')

# Tokens per tile and warps per program, with full-precision tile products: the one launch setting
# timed on a GPU (kernels/README.md).
BLOCK_N = 16
NUM_WARPS = 4

_LAMBDA = tl.constexpr(LAMBDA)
_TAU = tl.constexpr(TAU)
_NORM_EPS = tl.constexpr(NORMALISER_EPS)
_DIR_EPS = tl.constexpr(DIRECTION_EPS)
_QUARTER_PI = tl.constexpr(math.pi / 4)


# ----------------------------------------------------------------------------------------------
# Tiles
# ----------------------------------------------------------------------------------------------
@triton.jit
def _load_rows(base, row0, n_rows, n_cols, stride_n, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
               ACC: tl.constexpr):
    """(BLOCK_R, BLOCK_C) tile at rows row0.. of a (n_rows, n_cols) view with row stride stride_n, zero padded."""
    rows = row0 + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_C)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    return tl.load(base + rows[:, None] * stride_n + cols[None, :], mask=mask, other=0.0).to(ACC)


@triton.jit
def _store_rows(base, tile, row0, n_rows, n_cols, stride_n, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """Store a (BLOCK_R, BLOCK_C) tile at rows row0.., keeping inside (n_rows, n_cols)."""
    rows = row0 + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_C)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    tl.store(base + rows[:, None] * stride_n + cols[None, :], tile.to(base.dtype.element_ty), mask=mask)


@triton.jit
def _head(ptr, bh, H, stride_b, stride_h):
    """Pointer to the (batch, head) = divmod(bh, H) slice of a (B, H, ...) strided tensor."""
    return ptr + (bh // H) * stride_b + (bh % H) * stride_h


@triton.jit
def _load_vec(base, BLOCK_D: tl.constexpr, ACC: tl.constexpr):
    return tl.load(base + tl.arange(0, BLOCK_D)).to(ACC)


@triton.jit
def _state_block(base, half, block, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, DV_PAD: tl.constexpr,
                 ACC: tl.constexpr):
    """Value columns block * BLOCK_DV.. of half ``half`` of a (2, BLOCK_D, DV_PAD) state: (BLOCK_D, BLOCK_DV)."""
    return _load_rows(base + half * BLOCK_D * DV_PAD + block * BLOCK_DV, 0, BLOCK_D, BLOCK_DV, DV_PAD,
                      BLOCK_D, BLOCK_DV, ACC)


@triton.jit
def _mm(a, b, acc):
    """acc + a @ b with full-precision operands (no TF32, no bfloat16), accumulated in acc's dtype."""
    return tl.dot(a, b, acc, input_precision='ieee')


@triton.jit
def _token_range(N, tokens_per_range, BLOCK_N: tl.constexpr):
    """(first, end) token blocks of this program's range along grid axis 1; the last range may be shorter."""
    blocks = tokens_per_range // BLOCK_N
    first = tl.program_id(1) * blocks
    return first, tl.minimum(first + blocks, tl.cdiv(N, BLOCK_N))


# ----------------------------------------------------------------------------------------------
# Elementwise math and its derivatives
# ----------------------------------------------------------------------------------------------
@triton.jit
def _tanh(x):
    e = tl.exp(-2.0 * tl.abs(x))  # in (0, 1]: no overflow
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def _abs_pow(a, p):
    """a ** p for a >= 0, p > 0 (0 where a == 0)."""
    positive = a > 0
    return tl.where(positive, tl.exp2(p * tl.log2(tl.where(positive, a, 1.0))), 0.0)


@triton.jit
def _query_power(tanh_norm):
    """p(|q|) = lambda (tau + tanh |q|), from tanh |q|.  (Constants go on the right of tensors.)"""
    return (tanh_norm + _TAU) * _LAMBDA


@triton.jit
def _row_norm(x):
    """Euclidean norm of each row of (BLOCK_N, BLOCK_D): (BLOCK_N, 1)."""
    return tl.sqrt(tl.sum(x * x, axis=1))[:, None]


@triton.jit
def _gates(s, alpha, COS: tl.constexpr):
    """Half weights: ([s > 0], [s < 0]) (sign split) or (cos a, sin a), a = pi/4 tanh(alpha s)."""
    if COS:
        angle = _tanh(alpha * s) * _QUARTER_PI
        g1 = tl.cos(angle)
        g2 = tl.sin(angle)
    else:
        g1 = (s > 0).to(s.dtype)
        g2 = (s < 0).to(s.dtype)
    return g1, g2


@triton.jit
def _gates_bwd(s, mag, d1, d2, alpha, COS: tl.constexpr):
    """For halves (mag * g1, mag * g2) with gradients d1, d2: (d mag, d s through the gates)."""
    if COS:
        t = _tanh(alpha * s)
        angle = t * _QUARTER_PI
        c = tl.cos(angle)
        sn = tl.sin(angle)
        dmag = d1 * c + d2 * sn
        ds = mag * (d2 * c - d1 * sn) * (1.0 - t * t) * alpha * _QUARTER_PI
    else:
        dmag = tl.where(s > 0, d1, 0.0) + tl.where(s < 0, d2, 0.0)
        ds = tl.zeros_like(s)
    return dmag, ds


@triton.jit
def _direction_bwd(x, norm, ds, dnorm):
    """Gradient wrt x (BLOCK_N, BLOCK_D) given ds for s = x / max(|x|, eps) and dnorm (BLOCK_N, 1) for |x|."""
    safe = tl.maximum(norm, _DIR_EPS)
    dnorm = dnorm - tl.where(norm > _DIR_EPS, tl.sum(ds * x, axis=1)[:, None] / (safe * safe), 0.0)
    return ds / safe + dnorm * x / tl.where(norm > 0, norm, 1.0)


@triton.jit
def _query_halves(q, alpha, COS: tl.constexpr):
    """phi_q halves of a (BLOCK_N, BLOCK_D) query tile: |s|^p(|q|) * gates(s), s = q / |q|."""
    norm = _row_norm(q)
    s = q / tl.maximum(norm, _DIR_EPS)
    mag = _abs_pow(tl.abs(s), _query_power(_tanh(norm)))
    g1, g2 = _gates(s, alpha, COS)
    return mag * g1, mag * g2


@triton.jit
def _query_halves_bwd(q, d1, d2, alpha, COS: tl.constexpr):
    """dq (BLOCK_N, BLOCK_D) from the gradients d1, d2 of the phi_q halves, through p(|q|) too."""
    norm = _row_norm(q)
    s = q / tl.maximum(norm, _DIR_EPS)
    t = _tanh(norm)
    p = _query_power(t)
    a = tl.abs(s)
    a_pow_m1 = _abs_pow(a, p - 1.0)  # p - 1 >= 0.5, so this is 0 at a == 0 like p a^(p-1)
    mag = a * a_pow_m1
    dmag, ds = _gates_bwd(s, mag, d1, d2, alpha, COS)
    ds += dmag * p * a_pow_m1 * tl.where(s < 0, -1.0, 1.0)
    dp = tl.sum(dmag * mag * tl.log(tl.where(a > 0, a, 1.0)), axis=1)[:, None]
    return _direction_bwd(q, norm, ds, dp * _LAMBDA * (1.0 - t * t))


@triton.jit
def _key_halves(k, alpha, COS: tl.constexpr):
    """phi_k halves of a (BLOCK_N, BLOCK_D) key tile: |k|^3 * gates(k) (gates of k / |k| for COS)."""
    mag = tl.abs(k) * k * k
    if COS:
        s = k / tl.maximum(_row_norm(k), _DIR_EPS)
    else:
        s = k
    g1, g2 = _gates(s, alpha, COS)
    return mag * g1, mag * g2


@triton.jit
def _key_halves_bwd(k, d1, d2, alpha, COS: tl.constexpr):
    """dk (BLOCK_N, BLOCK_D) from the gradients d1, d2 of the phi_k halves."""
    mag = tl.abs(k) * k * k
    if COS:
        norm = _row_norm(k)
        dmag, ds = _gates_bwd(k / tl.maximum(norm, _DIR_EPS), mag, d1, d2, alpha, COS)
        dk = _direction_bwd(k, norm, ds, tl.zeros_like(norm))
    else:
        dmag, ds = _gates_bwd(k, mag, d1, d2, alpha, COS)
        dk = ds
    return dk + 3.0 * tl.abs(k) * k * dmag


@triton.jit
def _swap_pairs(x, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """(x0, x1) -> (-x1, x0) on the interleaved pairs of the last dim."""
    even, odd = tl.split(tl.reshape(x, (BLOCK_N, BLOCK_D // 2, 2)))
    return tl.reshape(tl.join(-odd, even), (BLOCK_N, BLOCK_D))


@triton.jit
def _rope(x, sin, cos, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """RoPE of the rows of x, as :func:`nalaformer.ops.nala.apply_rope`."""
    return x * cos + _swap_pairs(x, BLOCK_N, BLOCK_D) * sin


@triton.jit
def _rope_t(x, sin, cos, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """The transposed rotation (the gradient of :func:`_rope`)."""
    return x * cos - _swap_pairs(x * sin, BLOCK_N, BLOCK_D)


@triton.jit
def _load_rope(rope_ptr, row0, N, D, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, ACC: tl.constexpr):
    """(sin, cos) tiles for tokens row0.. from the (2, N, D) table; zero in padding."""
    sin = _load_rows(rope_ptr, row0, N, D, D, BLOCK_N, BLOCK_D, ACC)
    cos = _load_rows(rope_ptr + N * D, row0, N, D, D, BLOCK_N, BLOCK_D, ACC)
    return sin, cos


@triton.jit
def _query_tile(q_base, rope_ptr, mean_base, row0, N, D, stride_qn, alpha, COS: tl.constexpr, ACC: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Query-side quantities of rows row0..: (q, phi halves, rotated halves, normaliser z (BLOCK_N,), sin, cos)."""
    q = _load_rows(q_base, row0, N, D, stride_qn, BLOCK_N, BLOCK_D, ACC)
    sin, cos = _load_rope(rope_ptr, row0, N, D, BLOCK_N, BLOCK_D, ACC)
    h1, h2 = _query_halves(q, alpha, COS)
    z = (tl.sum(h1 * _load_vec(mean_base, BLOCK_D, ACC)[None, :], axis=1)
         + tl.sum(h2 * _load_vec(mean_base + BLOCK_D, BLOCK_D, ACC)[None, :], axis=1) + _NORM_EPS)
    r1 = _rope(h1, sin, cos, BLOCK_N, BLOCK_D)
    r2 = _rope(h2, sin, cos, BLOCK_N, BLOCK_D)
    return q, h1, h2, r1, r2, z, sin, cos


# ----------------------------------------------------------------------------------------------
# Kernels. Program axis 0 is batch * head; q, k, v, dout are addressed by (batch, head, token)
# strides with a unit stride over the head dim; state-like buffers are contiguous.
# ----------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=['N'])
def _state_kernel(
        x_ptr, y_ptr, rope_ptr, mean_ptr, state_ptr, H, N, D, stride_xb, stride_xh, stride_xn,
        stride_yb, stride_yh, stride_yn, alpha, tokens_per_range, QUERIES: tl.constexpr,
        COS: tl.constexpr, ACC: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
        BLOCK_DV: tl.constexpr, DV_PAD: tl.constexpr):
    """Grid (B*H, token ranges, value blocks): the range's partial sum (2, BLOCK_D, BLOCK_DV) of R phi_x y^T into a
    (B*H, ranges, 2, BLOCK_D, DV_PAD) buffer. Keys (x = k, y = v): the state, sum R phi_k v^T / N, and the key
    sums (2, BLOCK_D) into a (B*H, ranges, 2, BLOCK_D) buffer at mean_ptr. QUERIES (x = q, y = g = d out): the
    d state, sum_i R_i phi_q_i (g_i / z_i)^T, with z from the key mean (B*H, 2, BLOCK_D) at mean_ptr."""
    bh = tl.program_id(0).to(tl.int64)  # offsets past 2^31 elements
    vblock = tl.program_id(2)
    inv_sqrt_n = 1.0 / tl.sqrt(N.to(ACC))
    x_base = _head(x_ptr, bh, H, stride_xb, stride_xh)
    y_base = _head(y_ptr, bh, H, stride_yb, stride_yh) + vblock * BLOCK_DV
    acc1 = tl.zeros((BLOCK_D, BLOCK_DV), ACC)
    acc2 = tl.zeros((BLOCK_D, BLOCK_DV), ACC)
    sum1 = tl.zeros((BLOCK_D,), ACC)
    sum2 = tl.zeros((BLOCK_D,), ACC)
    first, end = _token_range(N, tokens_per_range, BLOCK_N)
    for block in range(first, end):
        row0 = block * BLOCK_N
        y = _load_rows(y_base, row0, N, D - vblock * BLOCK_DV, stride_yn, BLOCK_N, BLOCK_DV, ACC)
        if QUERIES:
            _, _, _, r1, r2, z, _, _ = _query_tile(x_base, rope_ptr, mean_ptr + bh * 2 * BLOCK_D, row0, N, D,
                                                   stride_xn, alpha, COS, ACC, BLOCK_N, BLOCK_D)
            y = y / z[:, None]
        else:
            k = _load_rows(x_base, row0, N, D, stride_xn, BLOCK_N, BLOCK_D, ACC)
            sin, cos = _load_rope(rope_ptr, row0, N, D, BLOCK_N, BLOCK_D, ACC)
            h1, h2 = _key_halves(k, alpha, COS)
            sum1 += tl.sum(h1, axis=0)
            sum2 += tl.sum(h2, axis=0)
            r1 = _rope(h1, sin, cos, BLOCK_N, BLOCK_D) * inv_sqrt_n
            r2 = _rope(h2, sin, cos, BLOCK_N, BLOCK_D) * inv_sqrt_n
            y = y * inv_sqrt_n
        acc1 = _mm(tl.trans(r1), y, acc1)
        acc2 = _mm(tl.trans(r2), y, acc2)
    part = bh * tl.num_programs(1) + tl.program_id(1)
    base = state_ptr + part * 2 * BLOCK_D * DV_PAD + vblock * BLOCK_DV
    _store_rows(base, acc1, 0, BLOCK_D, BLOCK_DV, DV_PAD, BLOCK_D, BLOCK_DV)
    _store_rows(base + BLOCK_D * DV_PAD, acc2, 0, BLOCK_D, BLOCK_DV, DV_PAD, BLOCK_D, BLOCK_DV)
    if not QUERIES:
        if vblock == 0:
            offs = tl.arange(0, BLOCK_D)
            tl.store(mean_ptr + part * 2 * BLOCK_D + offs, sum1)
            tl.store(mean_ptr + part * 2 * BLOCK_D + BLOCK_D + offs, sum2)


@triton.jit(do_not_specialize=['N'])
def _output_kernel(
        q_ptr, rope_ptr, state_ptr, mean_ptr, out_ptr, H, N, D, stride_qb, stride_qh, stride_qn, alpha,
        COS: tl.constexpr, ACC: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
        BLOCK_DV: tl.constexpr, DV_PAD: tl.constexpr):
    """Grid (B*H, token blocks): out = R phi_q . state / (phi_q . mean + eps)."""
    bh = tl.program_id(0).to(tl.int64)
    row0 = tl.program_id(1) * BLOCK_N
    state_base = state_ptr + bh * 2 * BLOCK_D * DV_PAD
    _, _, _, r1, r2, z, _, _ = _query_tile(_head(q_ptr, bh, H, stride_qb, stride_qh), rope_ptr,
                                           mean_ptr + bh * 2 * BLOCK_D, row0, N, D, stride_qn, alpha, COS, ACC,
                                           BLOCK_N, BLOCK_D)
    for c in tl.static_range(DV_PAD // BLOCK_DV):
        num = _mm(r1, _state_block(state_base, 0, c, BLOCK_D, BLOCK_DV, DV_PAD, ACC),
                  tl.zeros((BLOCK_N, BLOCK_DV), ACC))
        num = _mm(r2, _state_block(state_base, 1, c, BLOCK_D, BLOCK_DV, DV_PAD, ACC), num)
        _store_rows(out_ptr + bh * N * D + c * BLOCK_DV, num / z[:, None], row0, N, D - c * BLOCK_DV, D, BLOCK_N,
                    BLOCK_DV)


@triton.jit(do_not_specialize=['N'])
def _dq_kernel(
        q_ptr, g_ptr, rope_ptr, state_ptr, mean_ptr, dq_ptr, dmean_ptr, H, N, D, stride_qb, stride_qh, stride_qn,
        stride_gb, stride_gh, stride_gn, alpha,
        COS: tl.constexpr, ACC: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
        BLOCK_DV: tl.constexpr, DV_PAD: tl.constexpr):
    """Grid (B*H, token blocks): dq of the block and its part of d mean = -sum_i (g_i . out_i / z_i) phi_q_i.

    d(R phi_q)_i = state g_i / z_i and d phi_q_i = R_i^T state g_i / z_i - (g_i . out_i / z_i) mean, where
    g_i . out_i z_i = phi_q_i . R_i^T state g_i: one product with the state serves both.
    """
    bh = tl.program_id(0).to(tl.int64)
    row0 = tl.program_id(1) * BLOCK_N
    mean_base = mean_ptr + bh * 2 * BLOCK_D
    state_base = state_ptr + bh * 2 * BLOCK_D * DV_PAD
    g_base = _head(g_ptr, bh, H, stride_gb, stride_gh)
    q, h1, h2, _, _, z, sin, cos = _query_tile(_head(q_ptr, bh, H, stride_qb, stride_qh), rope_ptr, mean_base, row0,
                                               N, D, stride_qn, alpha, COS, ACC, BLOCK_N, BLOCK_D)
    sg1 = tl.zeros((BLOCK_N, BLOCK_D), ACC)  # state g, per half
    sg2 = tl.zeros((BLOCK_N, BLOCK_D), ACC)
    for c in tl.static_range(DV_PAD // BLOCK_DV):
        g = _load_rows(g_base + c * BLOCK_DV, row0, N, D - c * BLOCK_DV, stride_gn, BLOCK_N, BLOCK_DV, ACC)
        sg1 = _mm(g, tl.trans(_state_block(state_base, 0, c, BLOCK_D, BLOCK_DV, DV_PAD, ACC)), sg1)
        sg2 = _mm(g, tl.trans(_state_block(state_base, 1, c, BLOCK_D, BLOCK_DV, DV_PAD, ACC)), sg2)
    inv_z = (1.0 / z)[:, None]
    t1 = _rope_t(sg1, sin, cos, BLOCK_N, BLOCK_D)  # R^T state g
    t2 = _rope_t(sg2, sin, cos, BLOCK_N, BLOCK_D)
    w = tl.sum(h1 * t1 + h2 * t2, axis=1)[:, None] * inv_z * inv_z
    d1 = t1 * inv_z - w * _load_vec(mean_base, BLOCK_D, ACC)[None, :]
    d2 = t2 * inv_z - w * _load_vec(mean_base + BLOCK_D, BLOCK_D, ACC)[None, :]
    _store_rows(dq_ptr + bh * N * D, _query_halves_bwd(q, d1, d2, alpha, COS), row0, N, D, D, BLOCK_N, BLOCK_D)
    part = (bh * tl.num_programs(1) + tl.program_id(1)) * 2 * BLOCK_D
    offs = tl.arange(0, BLOCK_D)
    tl.store(dmean_ptr + part + offs, -tl.sum(w * h1, axis=0))
    tl.store(dmean_ptr + part + BLOCK_D + offs, -tl.sum(w * h2, axis=0))


@triton.jit(do_not_specialize=['N'])
def _dkv_kernel(
        k_ptr, v_ptr, rope_ptr, dstate_ptr, dmean_ptr, dk_ptr, dv_ptr, H, N, D, stride_kb, stride_kh, stride_kn,
        stride_vb, stride_vh, stride_vn, alpha,
        COS: tl.constexpr, ACC: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
        BLOCK_DV: tl.constexpr, DV_PAD: tl.constexpr):
    """Grid (B*H, token blocks): dv_j = d state^T R_j phi_k_j / N and dk_j from d phi_k_j = (R_j^T d state v_j
    + d mean) / N."""
    bh = tl.program_id(0).to(tl.int64)
    row0 = tl.program_id(1) * BLOCK_N
    inv_n = 1.0 / N.to(ACC)
    dstate_base = dstate_ptr + bh * 2 * BLOCK_D * DV_PAD
    dmean_base = dmean_ptr + bh * 2 * BLOCK_D
    v_base = _head(v_ptr, bh, H, stride_vb, stride_vh)
    k = _load_rows(_head(k_ptr, bh, H, stride_kb, stride_kh), row0, N, D, stride_kn, BLOCK_N, BLOCK_D, ACC)
    sin, cos = _load_rope(rope_ptr, row0, N, D, BLOCK_N, BLOCK_D, ACC)
    h1, h2 = _key_halves(k, alpha, COS)
    r1 = _rope(h1, sin, cos, BLOCK_N, BLOCK_D)
    r2 = _rope(h2, sin, cos, BLOCK_N, BLOCK_D)
    dr1 = tl.zeros((BLOCK_N, BLOCK_D), ACC)  # d (R phi_k) = v d state^T, per half
    dr2 = tl.zeros((BLOCK_N, BLOCK_D), ACC)
    for c in tl.static_range(DV_PAD // BLOCK_DV):
        dstate1 = _state_block(dstate_base, 0, c, BLOCK_D, BLOCK_DV, DV_PAD, ACC)
        dstate2 = _state_block(dstate_base, 1, c, BLOCK_D, BLOCK_DV, DV_PAD, ACC)
        dv = _mm(r2, dstate2, _mm(r1, dstate1, tl.zeros((BLOCK_N, BLOCK_DV), ACC)))
        _store_rows(dv_ptr + bh * N * D + c * BLOCK_DV, dv * inv_n, row0, N, D - c * BLOCK_DV, D, BLOCK_N, BLOCK_DV)
        v = _load_rows(v_base + c * BLOCK_DV, row0, N, D - c * BLOCK_DV, stride_vn, BLOCK_N, BLOCK_DV, ACC)
        dr1 = _mm(v, tl.trans(dstate1), dr1)
        dr2 = _mm(v, tl.trans(dstate2), dr2)
    dh1 = (_rope_t(dr1, sin, cos, BLOCK_N, BLOCK_D) + _load_vec(dmean_base, BLOCK_D, ACC)[None, :]) * inv_n
    dh2 = (_rope_t(dr2, sin, cos, BLOCK_N, BLOCK_D) + _load_vec(dmean_base + BLOCK_D, BLOCK_D, ACC)[None, :]) * inv_n
    _store_rows(dk_ptr + bh * N * D, _key_halves_bwd(k, dh1, dh2, alpha, COS), row0, N, D, D, BLOCK_N, BLOCK_D)


# ----------------------------------------------------------------------------------------------
# Launchers: (B, H, N, d) tensors with a unit last stride; rope (2, N, d) contiguous, in the
# compute dtype. ``alpha`` None selects the release form, a float the cosine-inhibit form.
# ----------------------------------------------------------------------------------------------
def feature_blocks(head_dim: int) -> Tuple[int, int, int]:
    """(BLOCK_D, BLOCK_DV, DV_PAD) for a head dim d.

    Each feature half is padded to BLOCK_D, the next power of two >= max(d, 16); the value dim is
    processed in blocks of BLOCK_DV = min(BLOCK_D, 64) columns, DV_PAD of them in all (a multiple
    of BLOCK_DV). A head's state is (2, BLOCK_D, DV_PAD), its key mean (2, BLOCK_D).
    """
    block_d = max(16, 1 << (head_dim - 1).bit_length())
    block_dv = min(block_d, 64)
    return block_d, block_dv, -(-head_dim // block_dv) * block_dv


class _Problem:
    """Block sizes, grids and buffers of one (B, H, N, d) call."""

    def __init__(self, x: torch.Tensor, alpha: Optional[float]):
        self.batch, self.heads, self.n, self.d = x.shape
        self.bh = self.batch * self.heads
        self.block_d, self.block_dv, self.dv_pad = feature_blocks(self.d)
        self.value_blocks = self.dv_pad // self.block_dv
        self.token_blocks = triton.cdiv(self.n, BLOCK_N)
        self.acc_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        self.device = x.device
        self.alpha = 0.0 if alpha is None else float(alpha)
        self.meta = dict(COS=alpha is not None, ACC=tl.float64 if x.dtype == torch.float64 else tl.float32,
                         BLOCK_N=BLOCK_N, BLOCK_D=self.block_d, BLOCK_DV=self.block_dv,
                         DV_PAD=self.dv_pad, num_warps=NUM_WARPS)

    def token_ranges(self) -> Tuple[int, int]:
        """(tokens per range, ranges per head) of the two sums over the tokens.

        Each head's tokens are split into ranges of whole blocks so that all heads and value blocks
        together make about two programs per SM (four in the interpreter, so that tests see several).
        """
        target = 4 if INTERPRETED else 2 * torch.cuda.get_device_properties(self.device).multi_processor_count
        wanted = max(1, min(self.token_blocks, target // (self.bh * self.value_blocks)))
        blocks = triton.cdiv(self.token_blocks, wanted)
        return blocks * BLOCK_N, triton.cdiv(self.token_blocks, blocks)

    def empty(self, *shape: int) -> torch.Tensor:
        return torch.empty(*shape, device=self.device, dtype=self.acc_dtype)


def _strides(x: torch.Tensor) -> Tuple[int, int, int]:
    assert x.stride(-1) == 1, 'the head dim must be contiguous'
    return x.stride(0), x.stride(1), x.stride(2)


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: torch.Tensor, alpha: Optional[float]
            ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out (B, H, N, d), state (B*H, 2, BLOCK_D, DV_PAD), mean of phi_k (B*H, 2, BLOCK_D)), in the compute dtype."""
    p = _Problem(q, alpha)
    tokens_per_range, ranges = p.token_ranges()
    partial_state = p.empty(p.bh, ranges, 2, p.block_d, p.dv_pad)
    partial_ksum = p.empty(p.bh, ranges, 2, p.block_d)
    _state_kernel[(p.bh, ranges, p.value_blocks)](
        k, v, rope, partial_ksum, partial_state, p.heads, p.n, p.d, *_strides(k), *_strides(v), p.alpha,
        tokens_per_range, QUERIES=False, **p.meta)
    state, mean = partial_state.sum(1), partial_ksum.sum(1) / p.n
    out = p.empty(p.batch, p.heads, p.n, p.d)
    _output_kernel[(p.bh, p.token_blocks)](
        q, rope, state, mean, out, p.heads, p.n, p.d, *_strides(q), p.alpha, **p.meta)
    return out, state, mean


def backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: torch.Tensor,
             state: torch.Tensor, mean: torch.Tensor, alpha: Optional[float]
             ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv), each like its input, from the saved inputs, state and mean (feature maps recomputed)."""
    p = _Problem(q, alpha)
    tokens_per_range, ranges = p.token_ranges()
    partial_dstate = p.empty(p.bh, ranges, 2, p.block_d, p.dv_pad)
    _state_kernel[(p.bh, ranges, p.value_blocks)](
        q, dout, rope, mean, partial_dstate, p.heads, p.n, p.d, *_strides(q), *_strides(dout), p.alpha,
        tokens_per_range, QUERIES=True, **p.meta)
    dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    partial_dmean = p.empty(p.bh, p.token_blocks, 2, p.block_d)
    _dq_kernel[(p.bh, p.token_blocks)](
        q, dout, rope, state, mean, dq, partial_dmean, p.heads, p.n, p.d, *_strides(q), *_strides(dout), p.alpha,
        **p.meta)
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    dv = torch.empty_like(v, memory_format=torch.contiguous_format)
    _dkv_kernel[(p.bh, p.token_blocks)](
        k, v, rope, partial_dstate.sum(1), partial_dmean.sum(1), dk, dv, p.heads, p.n, p.d, *_strides(k),
        *_strides(v), p.alpha, **p.meta)
    return dq, dk, dv
