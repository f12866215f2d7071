"""Triton kernels of the fused NaLa attention and their launchers.

Imported by :mod:`nalaformer.kernels.nala_triton` on the first fused call. The ``triton.jit``
decorators below build compiled or interpreted kernels from ``TRITON_INTERPRET`` at that
import, and must agree with triton's own language functions, built when triton was imported.

Per (batch, head), with phi = [h1, h2] split into two d-sized halves (each zero-padded to
BLOCK_D, a power of two) and R_i the RoPE rotation of token i:

    state = sum_j R_j phi_k(k_j) v_j^T / N      (2, BLOCK_D, DV_PAD)
    mean  = sum_j phi_k(k_j) / N                (2, BLOCK_D)
    out_i = (R_i phi_q(q_i))^T state / (phi_q(q_i) . mean + eps)

Half 1 / half 2 are the positive / negative parts (release form) or the cos / sin parts
(cosine-inhibit form, ``COS``). Sums over tokens are split across programs and the small
partial states added up in PyTorch. All arithmetic runs in ``ACC`` (float32, or float64), except
that the operands of the tile products may be rounded first (``DOT``, see :mod:`.tuning`).
"""
import math
from typing import Optional, Sequence, Tuple

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from nalaformer.ops.nala import DIRECTION_EPS, LAMBDA, NORMALISER_EPS, TAU

from .nala_triton import INTERPRETED
from .tuning import Tuning, feature_blocks, resolve_dot

# The @triton.jit below builds interpreted kernels when TRITON_INTERPRET is set now; triton's own
# language functions were built for the mode of its first import (INTERPRETED): they must agree.
if triton.knobs.runtime.interpret != INTERPRETED:
    raise RuntimeError(
        f'TRITON_INTERPRET={triton.knobs.runtime.interpret:d} now, but triton was imported with the other setting: '
        'set it before triton is first imported (importing timm or nalaformer imports it; tests set it in '
        'tests/conftest.py)')
_LAMBDA = tl.constexpr(LAMBDA)
_TAU = tl.constexpr(TAU)
_NORM_EPS = tl.constexpr(NORMALISER_EPS)
_DIR_EPS = tl.constexpr(DIRECTION_EPS)
_QUARTER_PI = tl.constexpr(math.pi / 4)
_INTERPRETED = tl.constexpr(INTERPRETED)


# ----------------------------------------------------------------------------------------------
# Tile helpers
# ----------------------------------------------------------------------------------------------
@triton.jit
def _rounded(x, DROPPED: tl.constexpr):
    """float32 x rounded to nearest (ties to even) without its low DROPPED mantissa bits, kept in float32.

    DROPPED = 16: bfloat16, 13: TF32. For the interpreter, whose own float32 -> bfloat16
    conversion truncates and which has no TF32; a GPU rounds.
    """
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + ((1 << (DROPPED - 1)) - 1) + ((bits >> DROPPED) & 1)) & (0xFFFFFFFF ^ ((1 << DROPPED) - 1))
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _load_rows(base, row0, n_rows, n_cols, stride_n, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr,
               ACC: tl.constexpr):
    """(BLOCK_N, BLOCK_C) tile at rows row0.. of a (n_rows, n_cols) row-major view, zero padded."""
    rows = row0 + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_C)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    return tl.load(base + rows[:, None] * stride_n + cols[None, :], mask=mask, other=0.0).to(ACC)


@triton.jit
def _store_rows(base, tile, row0, n_rows, n_cols, stride_n, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr):
    """Store a (BLOCK_N, BLOCK_C) tile at rows row0.., keeping inside (n_rows, n_cols)."""
    rows = row0 + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_C)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    if _INTERPRETED and base.dtype.element_ty == tl.bfloat16:
        tile = _rounded(tile, 16)  # exact in bfloat16 now: stored as a GPU would round it
    tl.store(base + rows[:, None] * stride_n + cols[None, :], tile.to(base.dtype.element_ty), mask=mask)


@triton.jit
def _head(ptr, bh, H, stride_b, stride_h):
    """Pointer to the (batch, head) = divmod(bh, H) slice of a (B, H, ...) strided tensor."""
    return ptr + (bh // H) * stride_b + (bh % H) * stride_h


@triton.jit
def _store_partial_state(base, part, vblock, acc1, acc2, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                         DV_PAD: tl.constexpr):
    """Store value block ``vblock`` of both halves of partial state ``part`` in a (parts, 2, BLOCK_D, DV_PAD) buffer."""
    base += part * 2 * BLOCK_D * DV_PAD + vblock * BLOCK_DV
    _store_rows(base, acc1, 0, BLOCK_D, BLOCK_DV, DV_PAD, BLOCK_D, BLOCK_DV)
    _store_rows(base + BLOCK_D * DV_PAD, acc2, 0, BLOCK_D, BLOCK_DV, DV_PAD, BLOCK_D, BLOCK_DV)


@triton.jit
def _state_block(base, half, block, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, DV_PAD: tl.constexpr,
                 ACC: tl.constexpr):
    """Block ``block`` of value columns of half ``half`` of a (2, BLOCK_D, DV_PAD) state: (BLOCK_D, BLOCK_DV)."""
    return _load_rows(base + half * BLOCK_D * DV_PAD + block * BLOCK_DV, 0, BLOCK_D, BLOCK_DV, DV_PAD,
                      BLOCK_D, BLOCK_DV, ACC)


@triton.jit
def _load_vec(base, BLOCK_D: tl.constexpr, ACC: tl.constexpr):
    return tl.load(base + tl.arange(0, BLOCK_D)).to(ACC)


@triton.jit
def _operand(x, DOT: tl.constexpr):
    """x as the tile products take it (idempotent): rounded to bfloat16 or TF32 where ``DOT`` says."""
    if _INTERPRETED and (DOT == 'bf16' or DOT == 'tf32'):
        # The interpreter has neither bfloat16 tile products nor TF32: round here, and multiply in
        # float32, where the products of rounded values are exact (the tensor-core result up to
        # summation order).
        return _rounded(x.to(tl.float32), 16 if DOT == 'bf16' else 13)
    elif DOT == 'bf16':
        return x.to(tl.bfloat16)
    else:
        return x


@triton.jit
def _mm(a, b, acc, ACC: tl.constexpr, DOT: tl.constexpr):
    """acc + a @ b, accumulated in ACC, with operands as the resolved ``dot`` tuning says (see :class:`Tuning`)."""
    if _INTERPRETED and (DOT == 'bf16' or DOT == 'tf32'):
        out = tl.dot(_operand(a, DOT), _operand(b, DOT), acc, input_precision='ieee', out_dtype=ACC)
    elif DOT == 'bf16':
        out = tl.dot(_operand(a, DOT), _operand(b, DOT), acc, out_dtype=ACC)
    else:
        out = tl.dot(a, b, acc, input_precision=DOT, out_dtype=ACC)
    return out


@triton.jit
def _state_operand(held, base, half, block, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, DV_PAD: tl.constexpr,
                   ACC: tl.constexpr):
    """Value block ``block`` of half ``half`` of a (2, BLOCK_D, DV_PAD) state as a tile-product operand.

    A state of one value block (head dims up to 64) is loaded once by a program and ``held`` for
    all its token blocks; a wider one is loaded here, where it is used (``held`` unused).
    """
    if DV_PAD == BLOCK_DV:
        return held
    else:
        return _state_block(base, half, block, BLOCK_D, BLOCK_DV, DV_PAD, ACC)


@triton.jit
def _held_state(base, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, DV_PAD: tl.constexpr, ACC: tl.constexpr,
                DOT: tl.constexpr):
    """Both halves of a (2, BLOCK_D, BLOCK_DV) state of one value block, as tile-product operands to hold."""
    return (_operand(_state_block(base, 0, 0, BLOCK_D, BLOCK_DV, DV_PAD, ACC), DOT),
            _operand(_state_block(base, 1, 0, BLOCK_D, BLOCK_DV, DV_PAD, ACC), DOT))


@triton.jit
def _block_range(part, blocks_per_program, N, BLOCK_N: tl.constexpr):
    """(first, end) token blocks of range ``part``: ``blocks_per_program`` of them, fewer in the last range."""
    first = part * blocks_per_program
    return first, tl.minimum(first + blocks_per_program, tl.cdiv(N, BLOCK_N))


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
def _load_rope(rope_ptr, row0, N, D, rope_group, rope_period, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
               ACC: tl.constexpr):
    """(sin, cos) tiles for tokens row0.. from the (2, N, D) table; zero in padding.

    Token n's first D / 2 channels are read from the table row of token n // rope_group * rope_group,
    its other channels from that of token n % rope_period. rope_group = 1, rope_period = N reads row
    n itself (any table); rope_group = rope_period = W, for a table of ``rope_table(angles, H, W)``
    (whose first half turns with the grid row and second half with the column), reads the same
    values from only H + W distinct rows, which stay in cache.
    """
    tokens = row0 + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_D)
    source = tl.where(cols[None, :] < D // 2, (tokens // rope_group * rope_group)[:, None],
                      (tokens % rope_period)[:, None])
    offsets = source * D + cols[None, :]
    mask = (tokens[:, None] < N) & (cols[None, :] < D)
    sin = tl.load(rope_ptr + offsets, mask=mask, other=0.0).to(ACC)
    cos = tl.load(rope_ptr + N * D + offsets, mask=mask, other=0.0).to(ACC)
    return sin, cos


@triton.jit
def _query_tile(q_base, rope_ptr, mean_base, row0, N, D, rope_group, rope_period, stride_qn, alpha,
                COS: tl.constexpr, ACC: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Query-side quantities of rows row0..: (q, phi halves, rotated halves, normaliser z (BLOCK_N,), sin, cos)."""
    q = _load_rows(q_base, row0, N, D, stride_qn, BLOCK_N, BLOCK_D, ACC)
    sin, cos = _load_rope(rope_ptr, row0, N, D, rope_group, rope_period, BLOCK_N, BLOCK_D, ACC)
    h1, h2 = _query_halves(q, alpha, COS)
    mean1 = _load_vec(mean_base, BLOCK_D, ACC)
    mean2 = _load_vec(mean_base + BLOCK_D, BLOCK_D, ACC)
    z = tl.sum(h1 * mean1[None, :], axis=1) + tl.sum(h2 * mean2[None, :], axis=1) + _NORM_EPS
    r1 = _rope(h1, sin, cos, BLOCK_N, BLOCK_D)
    r2 = _rope(h2, sin, cos, BLOCK_N, BLOCK_D)
    return q, h1, h2, r1, r2, z, sin, cos


# ----------------------------------------------------------------------------------------------
# One token block of the kernels that go through the tokens block by block (forward output,
# query and key gradients). ``held1``, ``held2``: see _state_operand.
# ----------------------------------------------------------------------------------------------
@triton.jit
def _output_rows(q_base, rope_ptr, mean_base, state_base, held1, held2, out_base, row0, N, D, rope_group,
                 rope_period, stride_qn, alpha, COS: tl.constexpr, ACC: tl.constexpr, DOT: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, DV_PAD: tl.constexpr):
    """Output rows row0.. = R phi_q . state / (phi_q . mean + eps)."""
    _, _, _, r1, r2, z, _, _ = _query_tile(q_base, rope_ptr, mean_base, row0, N, D, rope_group, rope_period,
                                           stride_qn, alpha, COS, ACC, BLOCK_N, BLOCK_D)
    for c in tl.static_range(DV_PAD // BLOCK_DV):
        num = _mm(r1, _state_operand(held1, state_base, 0, c, BLOCK_D, BLOCK_DV, DV_PAD, ACC),
                  tl.zeros((BLOCK_N, BLOCK_DV), ACC), ACC, DOT)
        num = _mm(r2, _state_operand(held2, state_base, 1, c, BLOCK_D, BLOCK_DV, DV_PAD, ACC), num, ACC, DOT)
        _store_rows(out_base + c * BLOCK_DV, num / z[:, None], row0, N, D - c * BLOCK_DV, D, BLOCK_N, BLOCK_DV)


@triton.jit
def _query_grad_rows(q_base, g_base, rope_ptr, mean_base, state_base, held1, held2, dstate1, dstate2, dq_base, row0,
                     N, D, rope_group, rope_period, stride_qn, stride_gn, alpha, COS: tl.constexpr,
                     ACC: tl.constexpr, DOT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                     BLOCK_DV: tl.constexpr, DV_PAD: tl.constexpr):
    """Store dq of rows row0..; return their parts of d mean = -sum_i (g_i . out_i / z_i) phi_q_i, per half, and
    the d state accumulators (BLOCK_D, BLOCK_DV) dstate1, dstate2 plus sum_i R_i phi_q_i (g_i / z_i)^T.

    With g the output gradient: d(R phi_q)_i = state g_i / z_i, d phi_q_i (normaliser) = -(g_i . out_i / z_i) mean.
    The d state sums only for a state of one value block (with it held); a wider one's gradient is
    summed by _backward_state_kernel, and dstate1, dstate2 come back as they came.
    """
    q, h1, h2, r1, r2, z, sin, cos = _query_tile(q_base, rope_ptr, mean_base, row0, N, D, rope_group, rope_period,
                                                 stride_qn, alpha, COS, ACC, BLOCK_N, BLOCK_D)
    inv_z = (1.0 / z)[:, None]
    sg1 = tl.zeros((BLOCK_N, BLOCK_D), ACC)  # state g, per half
    sg2 = tl.zeros((BLOCK_N, BLOCK_D), ACC)
    for c in tl.static_range(DV_PAD // BLOCK_DV):
        g = _load_rows(g_base + c * BLOCK_DV, row0, N, D - c * BLOCK_DV, stride_gn, BLOCK_N, BLOCK_DV, ACC)
        sg1 = _mm(g, tl.trans(_state_operand(held1, state_base, 0, c, BLOCK_D, BLOCK_DV, DV_PAD, ACC)), sg1, ACC,
                  DOT)
        sg2 = _mm(g, tl.trans(_state_operand(held2, state_base, 1, c, BLOCK_D, BLOCK_DV, DV_PAD, ACC)), sg2, ACC,
                  DOT)
        if DV_PAD == BLOCK_DV:
            dstate1 = _mm(tl.trans(r1), g * inv_z, dstate1, ACC, DOT)
            dstate2 = _mm(tl.trans(r2), g * inv_z, dstate2, ACC, DOT)
    t1 = _rope_t(sg1, sin, cos, BLOCK_N, BLOCK_D)  # R^T state g
    t2 = _rope_t(sg2, sin, cos, BLOCK_N, BLOCK_D)
    # g . out z = g . (R phi_q)^T state = phi_q . R^T state g: the numerator is not needed again.
    w = tl.sum(h1 * t1 + h2 * t2, axis=1)[:, None] * inv_z * inv_z
    d1 = t1 * inv_z - w * _load_vec(mean_base, BLOCK_D, ACC)[None, :]
    d2 = t2 * inv_z - w * _load_vec(mean_base + BLOCK_D, BLOCK_D, ACC)[None, :]
    _store_rows(dq_base, _query_halves_bwd(q, d1, d2, alpha, COS), row0, N, D, D, BLOCK_N, BLOCK_D)
    return -tl.sum(w * h1, axis=0), -tl.sum(w * h2, axis=0), dstate1, dstate2


@triton.jit
def _key_grad_rows(k_base, v_base, rope_ptr, dstate_base, held1, held2, dmean_base, dk_base, dv_base, row0, N, D,
                   rope_group, rope_period, stride_kn, stride_vn, alpha, COS: tl.constexpr, ACC: tl.constexpr,
                   DOT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                   DV_PAD: tl.constexpr):
    """Store dv_j = d state^T R_j phi_k_j / N and dk_j from d phi_k_j = (R_j^T d state v_j + d mean) / N, rows row0.."""
    inv_n = 1.0 / N.to(ACC)
    k = _load_rows(k_base, row0, N, D, stride_kn, BLOCK_N, BLOCK_D, ACC)
    sin, cos = _load_rope(rope_ptr, row0, N, D, rope_group, rope_period, BLOCK_N, BLOCK_D, ACC)
    h1, h2 = _key_halves(k, alpha, COS)
    r1 = _rope(h1, sin, cos, BLOCK_N, BLOCK_D)
    r2 = _rope(h2, sin, cos, BLOCK_N, BLOCK_D)
    for c in tl.static_range(DV_PAD // BLOCK_DV):
        dv = _mm(r1, _state_operand(held1, dstate_base, 0, c, BLOCK_D, BLOCK_DV, DV_PAD, ACC),
                 tl.zeros((BLOCK_N, BLOCK_DV), ACC), ACC, DOT)
        dv = _mm(r2, _state_operand(held2, dstate_base, 1, c, BLOCK_D, BLOCK_DV, DV_PAD, ACC), dv, ACC, DOT)
        _store_rows(dv_base + c * BLOCK_DV, dv * inv_n, row0, N, D - c * BLOCK_DV, D, BLOCK_N, BLOCK_DV)
    # dk is linear in the gradients of the two halves: taking them one at a time keeps a single
    # (BLOCK_N, BLOCK_D) gradient tile live (fewer spills at d = 96).
    zero = tl.zeros((BLOCK_N, BLOCK_D), ACC)
    dk = zero
    for half in tl.static_range(2):
        dr = zero
        for c in tl.static_range(DV_PAD // BLOCK_DV):
            v = _load_rows(v_base + c * BLOCK_DV, row0, N, D - c * BLOCK_DV, stride_vn, BLOCK_N, BLOCK_DV, ACC)
            if half == 0:
                dstate = _state_operand(held1, dstate_base, 0, c, BLOCK_D, BLOCK_DV, DV_PAD, ACC)
            else:
                dstate = _state_operand(held2, dstate_base, 1, c, BLOCK_D, BLOCK_DV, DV_PAD, ACC)
            dr = _mm(v, tl.trans(dstate), dr, ACC, DOT)
        dmean = _load_vec(dmean_base + half * BLOCK_D, BLOCK_D, ACC)
        dh = (_rope_t(dr, sin, cos, BLOCK_N, BLOCK_D) + dmean[None, :]) * inv_n
        if half == 0:
            dk += _key_halves_bwd(k, dh, zero, alpha, COS)
        else:
            dk += _key_halves_bwd(k, zero, dh, alpha, COS)
    _store_rows(dk_base, dk, row0, N, D, D, BLOCK_N, BLOCK_D)


# ----------------------------------------------------------------------------------------------
# Kernels. Program axis 0 is batch * head; q, k, v, dout are addressed by (batch, head, token)
# strides with a unit stride over the head dim; state-like buffers are contiguous. The kernels over
# token blocks hold a state of one value block (d <= 64) in registers and go through a range of
# token blocks with it: loaded for each block instead, it would be 32 KB from L2 per 16 tokens at
# d = 64, several times the bytes of q, k, v; the query gradient then also sums d state, which
# needs its phi_q, rotation, g and z. A wider state does not fit: one block per program, the state
# read where it is used (a loop there made ptxas spill kilobytes at d = 96), and d state summed
# in a pass of its own.
# ----------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=['N'])
def _forward_state_kernel(
        k_ptr, v_ptr, rope_ptr, state_ptr, ksum_ptr, H, N, D, rope_group, rope_period,
        stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn, alpha, blocks_per_program,
        COS: tl.constexpr, ACC: tl.constexpr, DOT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
        BLOCK_DV: tl.constexpr, DV_PAD: tl.constexpr):
    """Pass 1, grid (B*H, token ranges, value blocks): partial state (2, BLOCK_D, BLOCK_DV), key sums (2, BLOCK_D)."""
    bh = tl.program_id(0).to(tl.int64)  # offsets past 2^31 elements
    split = tl.program_id(1)
    vblock = tl.program_id(2)
    inv_sqrt_n = 1.0 / tl.sqrt(N.to(ACC))
    k_base = _head(k_ptr, bh, H, stride_kb, stride_kh)
    v_base = _head(v_ptr, bh, H, stride_vb, stride_vh) + vblock * BLOCK_DV
    acc1 = tl.zeros((BLOCK_D, BLOCK_DV), ACC)
    acc2 = tl.zeros((BLOCK_D, BLOCK_DV), ACC)
    sum1 = tl.zeros((BLOCK_D,), ACC)
    sum2 = tl.zeros((BLOCK_D,), ACC)
    first, end = _block_range(split, blocks_per_program, N, BLOCK_N)
    for block in range(first, end):
        row0 = block * BLOCK_N
        k = _load_rows(k_base, row0, N, D, stride_kn, BLOCK_N, BLOCK_D, ACC)
        v = _load_rows(v_base, row0, N, D - vblock * BLOCK_DV, stride_vn, BLOCK_N, BLOCK_DV, ACC) * inv_sqrt_n
        sin, cos = _load_rope(rope_ptr, row0, N, D, rope_group, rope_period, BLOCK_N, BLOCK_D, ACC)
        h1, h2 = _key_halves(k, alpha, COS)
        sum1 += tl.sum(h1, axis=0)
        sum2 += tl.sum(h2, axis=0)
        acc1 = _mm(tl.trans(_rope(h1, sin, cos, BLOCK_N, BLOCK_D) * inv_sqrt_n), v, acc1, ACC, DOT)
        acc2 = _mm(tl.trans(_rope(h2, sin, cos, BLOCK_N, BLOCK_D) * inv_sqrt_n), v, acc2, ACC, DOT)
    part = bh * tl.num_programs(1) + split
    _store_partial_state(state_ptr, part, vblock, acc1, acc2, BLOCK_D, BLOCK_DV, DV_PAD)
    if vblock == 0:
        offs = tl.arange(0, BLOCK_D)
        tl.store(ksum_ptr + part * 2 * BLOCK_D + offs, sum1)
        tl.store(ksum_ptr + part * 2 * BLOCK_D + BLOCK_D + offs, sum2)


@triton.jit
def _forward_output_kernel(
        q_ptr, rope_ptr, state_ptr, mean_ptr, out_ptr, H, N, D, rope_group, rope_period,
        stride_qb, stride_qh, stride_qn, alpha, blocks_per_program,
        COS: tl.constexpr, ACC: tl.constexpr, DOT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
        BLOCK_DV: tl.constexpr, DV_PAD: tl.constexpr):
    """Pass 2, grid (B*H, token ranges): out = R phi_q . state / (phi_q . mean + eps)."""
    bh = tl.program_id(0).to(tl.int64)  # offsets past 2^31 elements
    q_base = _head(q_ptr, bh, H, stride_qb, stride_qh)
    mean_base = mean_ptr + bh * 2 * BLOCK_D
    state_base = state_ptr + bh * 2 * BLOCK_D * DV_PAD
    out_base = out_ptr + bh * N * D
    if DV_PAD == BLOCK_DV:
        held1, held2 = _held_state(state_base, BLOCK_D, BLOCK_DV, DV_PAD, ACC, DOT)
        first, end = _block_range(tl.program_id(1), blocks_per_program, N, BLOCK_N)
        for block in range(first, end):
            _output_rows(q_base, rope_ptr, mean_base, state_base, held1, held2, out_base, block * BLOCK_N, N, D,
                         rope_group, rope_period, stride_qn, alpha, COS, ACC, DOT, BLOCK_N, BLOCK_D, BLOCK_DV, DV_PAD)
    else:
        _output_rows(q_base, rope_ptr, mean_base, state_base, 0.0, 0.0, out_base, tl.program_id(1) * BLOCK_N, N, D,
                     rope_group, rope_period, stride_qn, alpha, COS, ACC, DOT, BLOCK_N, BLOCK_D, BLOCK_DV, DV_PAD)


@triton.jit
def _backward_query_kernel(
        q_ptr, g_ptr, rope_ptr, state_ptr, mean_ptr, dq_ptr, dmean_ptr, dstate_ptr, H, N, D, rope_group, rope_period,
        stride_qb, stride_qh, stride_qn, stride_gb, stride_gh, stride_gn, alpha, blocks_per_program,
        COS: tl.constexpr, ACC: tl.constexpr, DOT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
        BLOCK_DV: tl.constexpr, DV_PAD: tl.constexpr):
    """Grid (B*H, token ranges): dq of the range, its part of d mean (2, BLOCK_D) and, for a state of one
    value block, its partial d state (2, BLOCK_D, DV_PAD) (else _backward_state_kernel sums that)."""
    bh = tl.program_id(0).to(tl.int64)  # offsets past 2^31 elements
    part = bh * tl.num_programs(1) + tl.program_id(1)
    q_base = _head(q_ptr, bh, H, stride_qb, stride_qh)
    g_base = _head(g_ptr, bh, H, stride_gb, stride_gh)
    mean_base = mean_ptr + bh * 2 * BLOCK_D
    state_base = state_ptr + bh * 2 * BLOCK_D * DV_PAD
    dq_base = dq_ptr + bh * N * D
    if DV_PAD == BLOCK_DV:
        held1, held2 = _held_state(state_base, BLOCK_D, BLOCK_DV, DV_PAD, ACC, DOT)
        dmean1 = tl.zeros((BLOCK_D,), ACC)
        dmean2 = tl.zeros((BLOCK_D,), ACC)
        dstate1 = tl.zeros((BLOCK_D, BLOCK_DV), ACC)
        dstate2 = tl.zeros((BLOCK_D, BLOCK_DV), ACC)
        first, end = _block_range(tl.program_id(1), blocks_per_program, N, BLOCK_N)
        for block in range(first, end):
            part1, part2, dstate1, dstate2 = _query_grad_rows(
                q_base, g_base, rope_ptr, mean_base, state_base, held1, held2, dstate1, dstate2, dq_base,
                block * BLOCK_N, N, D, rope_group, rope_period, stride_qn, stride_gn, alpha, COS, ACC, DOT, BLOCK_N,
                BLOCK_D, BLOCK_DV, DV_PAD)
            dmean1 += part1
            dmean2 += part2
        _store_partial_state(dstate_ptr, part, 0, dstate1, dstate2, BLOCK_D, BLOCK_DV, DV_PAD)
    else:
        dmean1, dmean2, _, _ = _query_grad_rows(
            q_base, g_base, rope_ptr, mean_base, state_base, 0.0, 0.0, 0.0, 0.0, dq_base, tl.program_id(1) * BLOCK_N,
            N, D, rope_group, rope_period, stride_qn, stride_gn, alpha, COS, ACC, DOT, BLOCK_N, BLOCK_D, BLOCK_DV,
            DV_PAD)
    offs = tl.arange(0, BLOCK_D)
    tl.store(dmean_ptr + part * 2 * BLOCK_D + offs, dmean1)
    tl.store(dmean_ptr + part * 2 * BLOCK_D + BLOCK_D + offs, dmean2)


@triton.jit
def _backward_state_kernel(
        q_ptr, g_ptr, rope_ptr, mean_ptr, dstate_ptr, H, N, D, rope_group, rope_period,
        stride_qb, stride_qh, stride_qn, stride_gb, stride_gh, stride_gn, alpha, blocks_per_program,
        COS: tl.constexpr, ACC: tl.constexpr, DOT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
        BLOCK_DV: tl.constexpr, DV_PAD: tl.constexpr):
    """Grid (B*H, token ranges, value blocks), for a state of several value blocks: partial d state
    = sum_i R_i phi_q_i (g_i / z_i)^T."""
    bh = tl.program_id(0).to(tl.int64)  # offsets past 2^31 elements
    split = tl.program_id(1)
    vblock = tl.program_id(2)
    q_base = _head(q_ptr, bh, H, stride_qb, stride_qh)
    g_base = _head(g_ptr, bh, H, stride_gb, stride_gh) + vblock * BLOCK_DV
    acc1 = tl.zeros((BLOCK_D, BLOCK_DV), ACC)
    acc2 = tl.zeros((BLOCK_D, BLOCK_DV), ACC)
    first, end = _block_range(split, blocks_per_program, N, BLOCK_N)
    for block in range(first, end):
        row0 = block * BLOCK_N
        _, _, _, r1, r2, z, _, _ = _query_tile(q_base, rope_ptr, mean_ptr + bh * 2 * BLOCK_D, row0, N, D,
                                               rope_group, rope_period, stride_qn, alpha, COS, ACC, BLOCK_N, BLOCK_D)
        g = _load_rows(g_base, row0, N, D - vblock * BLOCK_DV, stride_gn, BLOCK_N, BLOCK_DV, ACC) / z[:, None]
        acc1 = _mm(tl.trans(r1), g, acc1, ACC, DOT)
        acc2 = _mm(tl.trans(r2), g, acc2, ACC, DOT)
    _store_partial_state(dstate_ptr, bh * tl.num_programs(1) + split, vblock, acc1, acc2, BLOCK_D, BLOCK_DV, DV_PAD)


@triton.jit(do_not_specialize=['N'])
def _backward_key_kernel(
        k_ptr, v_ptr, rope_ptr, dstate_ptr, dmean_ptr, dk_ptr, dv_ptr, H, N, D, rope_group, rope_period,
        stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn, alpha, blocks_per_program,
        COS: tl.constexpr, ACC: tl.constexpr, DOT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
        BLOCK_DV: tl.constexpr, DV_PAD: tl.constexpr):
    """Grid (B*H, token ranges): dk and dv of the range."""
    bh = tl.program_id(0).to(tl.int64)  # offsets past 2^31 elements
    k_base = _head(k_ptr, bh, H, stride_kb, stride_kh)
    v_base = _head(v_ptr, bh, H, stride_vb, stride_vh)
    dstate_base = dstate_ptr + bh * 2 * BLOCK_D * DV_PAD
    dmean_base = dmean_ptr + bh * 2 * BLOCK_D
    if DV_PAD == BLOCK_DV:
        held1, held2 = _held_state(dstate_base, BLOCK_D, BLOCK_DV, DV_PAD, ACC, DOT)
        first, end = _block_range(tl.program_id(1), blocks_per_program, N, BLOCK_N)
        for block in range(first, end):
            _key_grad_rows(k_base, v_base, rope_ptr, dstate_base, held1, held2, dmean_base, dk_ptr + bh * N * D,
                           dv_ptr + bh * N * D, block * BLOCK_N, N, D, rope_group, rope_period, stride_kn, stride_vn,
                           alpha, COS, ACC, DOT, BLOCK_N, BLOCK_D, BLOCK_DV, DV_PAD)
    else:
        _key_grad_rows(k_base, v_base, rope_ptr, dstate_base, 0.0, 0.0, dmean_base, dk_ptr + bh * N * D,
                       dv_ptr + bh * N * D, tl.program_id(1) * BLOCK_N, N, D, rope_group, rope_period, stride_kn,
                       stride_vn, alpha, COS, ACC, DOT, BLOCK_N, BLOCK_D, BLOCK_DV, DV_PAD)


# ----------------------------------------------------------------------------------------------
# Launchers: (B, H, N, d) tensors with a unit last stride; rope (2, N, d) contiguous, in the
# compute dtype; ``grid_width`` W when the tokens are an (N / W, W) grid and rope its
# ``rope_table`` (read through its row and column factors, see _load_rope), else None.
# ``alpha`` None selects the release form, a float the cosine-inhibit form; ``tune`` gives block
# sizes, warps and dot operands.
# ----------------------------------------------------------------------------------------------
class _Launch:
    """Block sizes and grid shapes for one (B, H, N, d) problem under one tuning."""

    def __init__(self, x: torch.Tensor, grid_width: Optional[int], alpha: Optional[float], tune: Tuning):
        self.tuning = tune
        self.batch, self.heads, self.n, self.d = x.shape
        self.rope_args = (grid_width, grid_width) if grid_width else (1, self.n)  # rope_group, rope_period
        self.bh = self.batch * self.heads
        self.block_d, self.block_dv, self.dv_pad = feature_blocks(self.d)
        self.value_blocks = self.dv_pad // self.block_dv
        self.block_n = tune.block_n
        self.token_blocks = triton.cdiv(self.n, self.block_n)
        wide = x.dtype == torch.float64
        self.acc_dtype = torch.float64 if wide else torch.float32
        self.device = x.device
        self.alpha = 0.0 if alpha is None else float(alpha)
        on_gpu = x.is_cuda and not INTERPRETED
        self.dot = resolve_dot(tune.dot, x.dtype, torch.cuda.get_device_capability(x.device) if on_gpu else None)
        self.meta = dict(
            COS=alpha is not None, ACC=tl.float64 if wide else tl.float32, DOT=self.dot,
            BLOCK_N=self.block_n, BLOCK_D=self.block_d, BLOCK_DV=self.block_dv, DV_PAD=self.dv_pad,
            num_warps=tune.num_warps, num_stages=tune.num_stages)

    def token_ranges(self, value_blocks: int = 1) -> Tuple[int, int]:
        """(token blocks per program, programs per head and value block) of a launch over the tokens.

        The tokens of each head are split into ranges of whole blocks so that the launch has about
        ``tuning.programs`` programs (None: two per SM on a GPU, else one range per head).
        """
        programs = self.bh * value_blocks
        target = self.tuning.programs
        if target is None and not INTERPRETED and self.device.type == 'cuda':
            target = 2 * torch.cuda.get_device_properties(self.device).multi_processor_count
        wanted = (target or programs) // programs
        per_program = triton.cdiv(self.token_blocks, max(1, min(wanted, self.token_blocks)))
        return per_program, triton.cdiv(self.token_blocks, per_program)

    @property
    def holds_state(self) -> bool:
        """Whether the kernels over token blocks hold the state (one value block: d <= 64), see the kernels."""
        return self.value_blocks == 1

    def block_ranges(self) -> Tuple[int, int]:
        """:meth:`token_ranges` of the kernels over token blocks, which take ranges only when they hold the
        state, else one token block per program."""
        return self.token_ranges() if self.holds_state else (1, self.token_blocks)

    def empty(self, *shape: int) -> torch.Tensor:
        return torch.empty(*shape, device=self.device, dtype=self.acc_dtype)

    def run(self, kernel, grid: Tuple[int, ...], tensors: Sequence, strides: Sequence[int],
            blocks_per_program: int) -> None:
        """``kernel[grid](*tensors, H, N, D, rope_group, rope_period, *strides, alpha, blocks_per_program)``.

        A tuning whose programs need more on-chip memory than this GPU has fails saying what to change.
        """
        try:
            kernel[grid](*tensors, self.heads, self.n, self.d, *self.rope_args, *strides, self.alpha,
                         blocks_per_program, **self.meta)
        except OutOfResources as err:
            raise RuntimeError(
                f'{kernel.__name__} at head dim {self.d} with {self.tuning} (products: {self.dot!r}) needs '
                f'{err.required} B of {err.name} per program, but this GPU has {err.limit} B. Products with '
                f"dot='tf32x3' need the most (split operands): use dot='tf32', 'bf16' or 'ieee'; fewer num_stages "
                'or num_warps need less') from err


def _strides(x: torch.Tensor) -> Tuple[int, int, int]:
    assert x.stride(-1) == 1, 'the head dim must be contiguous'
    return x.stride(0), x.stride(1), x.stride(2)


def forward_state(k: torch.Tensor, v: torch.Tensor, rope: torch.Tensor, grid_width: Optional[int],
                  alpha: Optional[float], tune: Tuning):
    """Pass 1: (state (B*H, 2, BLOCK_D, DV_PAD), mean of phi_k (B*H, 2, BLOCK_D)), padded with zeros."""
    cfg = _Launch(k, grid_width, alpha, tune)
    per_program, ranges = cfg.token_ranges(cfg.value_blocks)
    state = cfg.empty(cfg.bh, ranges, 2, cfg.block_d, cfg.dv_pad)
    ksum = cfg.empty(cfg.bh, ranges, 2, cfg.block_d)
    cfg.run(_forward_state_kernel, (cfg.bh, ranges, cfg.value_blocks), (k, v, rope, state, ksum),
            _strides(k) + _strides(v), per_program)
    return state.sum(1), ksum.sum(1) / cfg.n


def forward_output(q: torch.Tensor, rope: torch.Tensor, grid_width: Optional[int], state: torch.Tensor,
                   mean: torch.Tensor, alpha: Optional[float], tune: Tuning) -> torch.Tensor:
    """Pass 2: out (B, H, N, d) in the compute dtype."""
    cfg = _Launch(q, grid_width, alpha, tune)
    per_program, ranges = cfg.block_ranges()
    out = cfg.empty(cfg.batch, cfg.heads, cfg.n, cfg.d)
    cfg.run(_forward_output_kernel, (cfg.bh, ranges), (q, rope, state, mean, out), _strides(q), per_program)
    return out


def backward_query(q, dout, rope, grid_width, state, mean, alpha, tune):
    """(dq like q, d mean (B*H, 2, BLOCK_D), d state (B*H, 2, BLOCK_D, DV_PAD)).

    The query kernel sums d state too where it holds the state; else _backward_state_kernel does.
    """
    cfg = _Launch(q, grid_width, alpha, tune)
    per_program, ranges = cfg.block_ranges()
    dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    dmean = cfg.empty(cfg.bh, ranges, 2, cfg.block_d)
    dstate = cfg.empty(cfg.bh, ranges, 2, cfg.block_d, cfg.dv_pad) if cfg.holds_state else None
    cfg.run(_backward_query_kernel, (cfg.bh, ranges), (q, dout, rope, state, mean, dq, dmean, dstate),
            _strides(q) + _strides(dout), per_program)
    if cfg.holds_state:
        return dq, dmean.sum(1), dstate.sum(1)
    return dq, dmean.sum(1), _backward_state(q, dout, rope, cfg, mean)


def _backward_state(q, dout, rope, cfg: _Launch, mean):
    """d state (B*H, 2, BLOCK_D, DV_PAD) from its own pass over the tokens (a state of several value blocks)."""
    per_program, ranges = cfg.token_ranges(cfg.value_blocks)
    dstate = cfg.empty(cfg.bh, ranges, 2, cfg.block_d, cfg.dv_pad)
    cfg.run(_backward_state_kernel, (cfg.bh, ranges, cfg.value_blocks), (q, dout, rope, mean, dstate),
            _strides(q) + _strides(dout), per_program)
    return dstate.sum(1)


def backward_key(k, v, rope, grid_width, dstate, dmean, alpha, tune):
    """(dk like k, dv like v)."""
    cfg = _Launch(k, grid_width, alpha, tune)
    per_program, ranges = cfg.block_ranges()
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    dv = torch.empty_like(v, memory_format=torch.contiguous_format)
    cfg.run(_backward_key_kernel, (cfg.bh, ranges), (k, v, rope, dstate, dmean, dk, dv), _strides(k) + _strides(v),
            per_program)
    return dk, dv
