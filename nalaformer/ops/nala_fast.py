"""NaLa attention as one operator with a hand-written backward: the default path of ``nala`` / ``nala_cos``.

It computes exactly what :mod:`nalaformer.ops.nala` computes (read that module first; the
formulas, constants and helpers are the same)::

    nala:      phi_q = [d(q)+, d(q)-]^p(|q|)          phi_k = [k+, k-]^lambda
    nala_cos:  phi_q = |d(q)|^p(|q|) [cos a, sin a]   phi_k = |k|^lambda [cos b, sin b]
    out_i = R_i phi_q_i . (sum_j R_j phi_k_j v_j / N) / (phi_q_i . mean_j phi_k_j + eps)

but runs it with fewer passes over memory and keeps much less for the backward:

* For backward it keeps only q, k, v (views of the caller's projection, kept alive anyway), the
  (2d x d) state, the normaliser (one number per token) and the key mean (2d): never the
  (N, 2d) feature maps, their rotated copies or the power's intermediates. The backward
  recomputes the feature maps and applies the chain rule written out below.
* RoPE is one complex multiplication per feature map: each interleaved pair (x0, x1) is the
  complex number x0 + i x1 and its rotation by theta is a product with e^{i theta}; the two
  d-sized parts of a feature map (sign parts, or cos / sin parts) are rotated together, in place.
* The power |d(q)|^p is taken once over d values (not over the 2d sign parts) and split after;
  the key's power is the cube written as products (``pow`` with exponent 3 is x * x * x).
* No ``torch.where`` (slow on CPU): sign selections are products with 0/1 masks or ``lerp``.

Shapes (per call): q, k, v (..., N, d) with any leading dims (batch, heads); rope (2, N, d) as made by
:func:`~nalaformer.ops.nala.rope_table` (the two entries of a pair share one angle);
output (..., N, d). float32 or float64, on any device; the kernels' ``forward`` casts to float32.

The backward of the data-dependent power, for one token (n = |q|, n_c = max(n, eps),
u = q / n_c, p = lambda (tau + tanh n), a_j = |u_j|^p, s_j = sign(u_j) |u_j|^(p-1))::

    da_j / du_j = p s_j                              (direct, n held fixed)
    dL/dp       = sum_j dL/da_j  a_j log|u_j|  = sum_j w_j u_j log|u_j|,  w_j = dL/da_j s_j
    dp / dn     = lambda (1 - tanh^2 n)
    du_j / dq   = e_j / n_c - [n >= eps] u_j q / (n_c n)      (through the clamped norm)
    dn / dq     = q / n                                      (0 at n = 0, as torch's norm)

so dL/dq = r / n_c + q (dL/dn) / n with r_j = dL/du_j = p w_j (+ the angle term of ``nala_cos``) and
dL/dn = lambda (1 - tanh^2 n) sum_j w_j u_j log|u_j| - [n >= eps] (sum_j r_j u_j) / n_c.

Which of this operator, the fused Triton kernel and nala.py's reference runs the kernels is one
switch, :mod:`nalaformer.ops.backend`. TorchScript always runs the reference (``torch.jit.script``
cannot call this operator's Python implementation).
"""
import math
from typing import Optional, Tuple

import torch
from torch.utils.flop_counter import register_flop_formula

from .nala import (
    DIRECTION_EPS, LAMBDA, NORMALISER_EPS, cosine_inhibit, norm_and_direction, query_power,
)

__all__ = ['nala_attention', 'nala_cos_attention']


# ----------------------------------------------------------------------------------------------
# RoPE as complex multiplication
# ----------------------------------------------------------------------------------------------
def rope_phases(rope: torch.Tensor) -> torch.Tensor:
    """(2, N, d) (sin, cos) table -> e^{i theta} of shape (N, 1, d/2), one per interleaved pair.

    The size-1 dim broadcasts over the two d-sized parts of a feature map.
    """
    sin, cos = rope[0, :, 0::2], rope[1, :, 0::2]
    return torch.complex(cos, sin).unsqueeze(-2)


def rotate_(features: torch.Tensor, phases: torch.Tensor) -> torch.Tensor:
    """Rotate both d-sized parts of ``features`` (..., N, 2, d), contiguous, in place:
    (x0, x1) -> (x0 cos - x1 sin, x1 cos + x0 sin) as nala.py's ``apply_rope``. With
    ``phases.conj()`` it rotates back (the transpose, used in the backward)."""
    torch.view_as_complex(features.unflatten(-1, (-1, 2))).mul_(phases)
    return features


def _rotated(features: torch.Tensor, phases: torch.Tensor) -> torch.Tensor:
    """A rotated copy of ``features`` (..., N, 2, d), flattened to (..., N, 2d)."""
    return torch.view_as_real(torch.view_as_complex(features.unflatten(-1, (-1, 2))) * phases).flatten(-3)


# ----------------------------------------------------------------------------------------------
# Feature maps, laid out (..., N, 2, d): part 0 / 1 = positive / negative (nala) or cos / sin (nala_cos)
# ----------------------------------------------------------------------------------------------
def _positive(x: torch.Tensor) -> torch.Tensor:
    """[x > 0] as 0/1 in x's dtype (products with it replace torch.where, which is slow on CPU)."""
    return torch.gt(x, 0, out=torch.empty_like(x))


def _sign_split_(features: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """features (..., N, 2, d) holding a magnitude m in part 1 (0 wherever x is 0) -> [m [x > 0], m [x < 0]],
    in place: nala.py's ``sign_split`` of the signed power whose magnitude is m."""
    positive, magnitude = features[..., 0, :], features[..., 1, :]
    torch.gt(x, 0, out=positive).mul_(magnitude)
    magnitude.sub_(positive)
    return features


def _split_power(x: torch.Tensor, power, divisor: Optional[torch.Tensor] = None) -> torch.Tensor:
    """sign_split(sign(y) |y|^power), y = x / divisor, as (..., N, 2, d) computed in its own storage."""
    features = x.new_empty(*x.shape[:-1], 2, x.shape[-1])
    magnitude = features[..., 1, :]
    if divisor is None:
        torch.abs(x, out=magnitude)
    else:
        torch.div(x, divisor, out=magnitude).abs_()
    magnitude.pow_(power)
    return _sign_split_(features, x)


def _angles(direction: torch.Tensor, alpha: float) -> torch.Tensor:
    """[cos a; sin a], a = (pi/4) tanh(alpha u), as (..., N, 2, d) (nala.py's ``cosine_inhibit``)."""
    return cosine_inhibit(direction, alpha).unflatten(-1, (2, -1))


def _query_parts(q: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """|q| (..., N, 1), its direction u = q / max(|q|, eps) (..., N, d) and the power p(|q|) (..., N, 1)."""
    q_norm, direction = norm_and_direction(q)
    return q_norm, direction, query_power(q_norm)


def _features(q: torch.Tensor, k: torch.Tensor, alpha: Optional[float]) -> Tuple[torch.Tensor, torch.Tensor]:
    """phi_q, phi_k (..., N, 2, d), contiguous: nala.py's ``nala_feature_maps`` (alpha None) or
    ``nala_cos_feature_maps``, with the query's power taken over d values, not 2d; the ``nala``
    maps are built in their own storage, without (N, d) temporaries."""
    if alpha is None:
        q_norm = torch.linalg.vector_norm(q, dim=-1, keepdim=True)  # as norm_and_direction
        power = query_power(q_norm)
        return _split_power(q, power, q_norm.clamp_min(DIRECTION_EPS)), _split_power(k, LAMBDA)
    _, direction, power = _query_parts(q)
    q_magnitude = direction.abs().pow_(power)
    k_magnitude = k.abs().pow_(LAMBDA)
    phi_q = _angles(direction, alpha).mul_(q_magnitude.unsqueeze(-2))
    phi_k = _angles(norm_and_direction(k)[1], alpha).mul_(k_magnitude.unsqueeze(-2))
    return phi_q, phi_k


# ----------------------------------------------------------------------------------------------
# Chain rule through the feature maps (see the module docstring)
# ----------------------------------------------------------------------------------------------
def _slope(direction: torch.Tensor, power: torch.Tensor) -> torch.Tensor:
    """s = sign(u) |u|^(p-1), so that a = |u|^p = s u and da/du = p s (one ``pow`` for both)."""
    return direction.abs().pow_(power - 1).copysign_(direction)


def _x_log_abs(x: torch.Tensor) -> torch.Tensor:
    """x log|x|, 0 at x = 0 (as torch.xlogy(x, |x|), which is slow on CPU)."""
    return x.abs().clamp_min_(torch.finfo(x.dtype).tiny).log_().mul_(x)


def _through_direction(x: torch.Tensor, norm: torch.Tensor, direction: torch.Tensor, d_direction: torch.Tensor,
                       d_norm: torch.Tensor) -> torch.Tensor:
    """dL/dx for direction = x / max(|x|, eps) and norm = |x|, given dL/d(direction) (consumed) and
    the rest of dL/d|x| (..., N, 1). Below eps the clamp stops the direction's own norm term; at
    |x| = 0 the norm passes no gradient (both as torch's ``clamp_min`` and ``vector_norm`` backward)."""
    clamped = norm.clamp_min(DIRECTION_EPS)
    radial = torch.linalg.vecdot(d_direction, direction).unsqueeze(-1)
    d_norm = d_norm - (norm >= DIRECTION_EPS) * radial / clamped
    per_norm = torch.where(norm > 0, d_norm / norm, 0.)  # (..., N, 1): small
    return d_direction.div_(clamped).addcmul_(x, per_norm)


def _query_backward(q: torch.Tensor, q_norm: torch.Tensor, direction: torch.Tensor, power: torch.Tensor,
                    slope: torch.Tensor, d_magnitude: torch.Tensor, d_angle: Optional[torch.Tensor]) -> torch.Tensor:
    """dL/dq from dL/da, a = |u|^p(|q|) (consumed), and for nala_cos dL/du through the angles."""
    w = d_magnitude.mul_(slope)                                        # w_j = dL/da_j s_j
    d_power = torch.linalg.vecdot(w, _x_log_abs(direction)).unsqueeze(-1)
    d_norm = d_power * (LAMBDA * (1 - torch.tanh(q_norm).square()))    # through p(|q|)
    d_direction = w.mul_(power)                                        # r_j = p w_j (+ the angles' term)
    if d_angle is not None:
        d_direction.add_(d_angle)
    return _through_direction(q, q_norm, direction, d_direction, d_norm)


def _key_slope(k: torch.Tensor) -> torch.Tensor:
    """d|k|^lambda/dk divided by lambda: sign(k) |k|^(lambda-1) (k |k| for the cube)."""
    if LAMBDA == 3.0:
        return k.abs().mul_(k)
    return k.abs().pow_(LAMBDA - 1).copysign_(k)


def _angle_backward(angles: torch.Tensor, magnitude: torch.Tensor, direction: torch.Tensor, d_phi: torch.Tensor,
                    alpha: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """phi = m [cos a, sin a], a = (pi/4) tanh(alpha u): (dL/dm, dL/du) from dL/dphi (..., N, 2, d)."""
    cos, sin = angles[..., 0, :], angles[..., 1, :]
    d_cos, d_sin = d_phi[..., 0, :], d_phi[..., 1, :]
    d_magnitude = torch.mul(d_cos, cos).addcmul_(d_sin, sin)
    d_a = torch.mul(d_sin, cos).addcmul_(d_cos, sin, value=-1).mul_(magnitude)
    da_du = torch.tanh(direction * alpha).square_().neg_().add_(1).mul_(math.pi / 4 * alpha)
    return d_magnitude, d_a.mul_(da_du)


# ----------------------------------------------------------------------------------------------
# Forward and backward (nala.py's ``linear_attention`` with the feature maps)
# ----------------------------------------------------------------------------------------------
def _forward_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: torch.Tensor, alpha: Optional[float]
                  ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """out (..., N, d), state S (..., 2d, d), normaliser z (..., N, 1), key mean (..., 1, 2d)."""
    n = v.shape[-2]
    phases = rope_phases(rope)
    phi_q, phi_k = _features(q, k, alpha)
    mean = phi_k.flatten(-2).mean(-2, keepdim=True)
    normaliser = (phi_q.flatten(-2) @ mean.transpose(-2, -1)).add_(NORMALISER_EPS)
    state = (rotate_(phi_k, phases).flatten(-2).transpose(-2, -1) @ v).mul_(1.0 / n)
    out = (rotate_(phi_q, phases).flatten(-2) @ state).div_(normaliser)
    return out, state, normaliser, mean


def _backward_impl(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: torch.Tensor,
                   state: torch.Tensor, normaliser: torch.Tensor, mean: torch.Tensor, alpha: Optional[float]
                   ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv): the feature maps are recomputed, the query side first, then the key side."""
    n, d = q.shape[-2:]
    phases = rope_phases(rope)
    back = phases.conj()

    # Query side. out = (R phi_q) S / z, z = phi_q . mean + eps:
    #   dS = (R phi_q)^T g,  dL/dphi_q = R^T (g S^T) + dL/dz mean,  dL/dz = -phi_q . R^T (g S^T) / z,  g = dout / z
    q_norm, direction, power = _query_parts(q)
    slope = _slope(direction, power)
    if alpha is None:
        phi_q = direction.new_empty(*direction.shape[:-1], 2, direction.shape[-1])
        torch.mul(slope, direction, out=phi_q[..., 1, :])  # a = |u|^p
        _sign_split_(phi_q, direction)
    else:
        q_magnitude = slope * direction
        q_angles = _angles(direction, alpha)
        phi_q = q_angles * q_magnitude.unsqueeze(-2)
    g = dout / normaliser
    d_state = _rotated(phi_q, phases).transpose(-2, -1) @ g                           # (..., 2d, d)
    d_phi_q = rotate_((g @ state.transpose(-2, -1)).unflatten(-1, (2, d)), back)     # (..., N, 2, d)
    del g
    d_normaliser = torch.linalg.vecdot(phi_q.flatten(-2), d_phi_q.flatten(-2)).unsqueeze(-1).div_(normaliser).neg_()
    d_mean = d_normaliser.transpose(-2, -1) @ phi_q.flatten(-2)                        # (..., 1, 2d)
    del phi_q
    d_phi_q.flatten(-2).addcmul_(d_normaliser, mean)
    if alpha is None:  # phi_q = (a [u > 0], a [u < 0]): dL/da is the part of u's sign
        d_magnitude, d_angle = torch.lerp(d_phi_q[..., 1, :], d_phi_q[..., 0, :], _positive(direction)), None
    else:
        d_magnitude, d_angle = _angle_backward(q_angles, q_magnitude, direction, d_phi_q, alpha)
        del q_angles, q_magnitude
    del d_phi_q
    dq = _query_backward(q, q_norm, direction, power, slope, d_magnitude, d_angle)
    del direction, slope, d_magnitude, d_angle

    # Key side. S = (R phi_k)^T v / N, mean = sum_j phi_k / N: dv = (R phi_k) dS / N,
    # dL/dphi_k = R^T (v dS^T) / N + dL/dmean / N, here kept multiplied by lambda (d|k|^lambda/dk = lambda s).
    if alpha is None:
        phi_k = _split_power(k, LAMBDA)
    else:
        k_magnitude = k.abs().pow_(LAMBDA)
        k_norm, k_direction = norm_and_direction(k)
        k_angles = _angles(k_direction, alpha)
        phi_k = k_angles * k_magnitude.unsqueeze(-2)
    dv = rotate_(phi_k, phases).flatten(-2) @ (d_state / n)
    del phi_k
    d_phi_k = rotate_((v @ d_state.transpose(-2, -1)).mul_(LAMBDA / n).unflatten(-1, (2, d)), back)
    d_phi_k.flatten(-2).add_(d_mean, alpha=LAMBDA / n)
    if alpha is None:
        dk = torch.lerp(d_phi_k[..., 1, :], d_phi_k[..., 0, :], _positive(k)).mul_(_key_slope(k))
    else:
        d_magnitude, d_direction = _angle_backward(k_angles, k_magnitude, k_direction, d_phi_k, alpha)
        del k_angles, k_magnitude, d_phi_k
        dk = _through_direction(k, k_norm, k_direction, d_direction.div_(LAMBDA), torch.zeros_like(k_norm))
        dk.addcmul_(d_magnitude, _key_slope(k))
    return dq, dk, dv


# ----------------------------------------------------------------------------------------------
# The operator: torch.library custom ops (opaque to torch.compile) with autograd
# ----------------------------------------------------------------------------------------------
@torch.library.custom_op('nalaformer::nala_fast_forward', mutates_args=())
def _forward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: torch.Tensor,
                alpha: Optional[float]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out (..., N, d), state (..., 2d, d), normaliser (..., N, 1), key mean (..., 1, 2d))."""
    return _forward_impl(q, k, v, rope, alpha)


@_forward_op.register_fake
def _forward_fake(q, k, v, rope, alpha):
    lead, (n, d) = q.shape[:-2], q.shape[-2:]
    return (q.new_empty(*lead, n, d), q.new_empty(*lead, 2 * d, d), q.new_empty(*lead, n, 1),
            q.new_empty(*lead, 1, 2 * d))


@torch.library.custom_op('nalaformer::nala_fast_backward', mutates_args=())
def _backward_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: torch.Tensor,
                 state: torch.Tensor, normaliser: torch.Tensor, mean: torch.Tensor,
                 alpha: Optional[float]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv), recomputing the feature maps from q and k."""
    return _backward_impl(dout, q, k, v, rope, state, normaliser, mean, alpha)


@_backward_op.register_fake
def _backward_fake(dout, q, k, v, rope, state, normaliser, mean, alpha):
    return tuple(torch.empty_like(x, memory_format=torch.contiguous_format) for x in (q, k, v))


def _product_flops(q_shape) -> int:
    """FLOPs of the products the reference runs (and torch's counter counts there): the normaliser
    phi_q . mean(phi_k) (N x 2d . 2d), the state phi_k^T v (2d x N . N x d), the output phi_q . state."""
    *lead, n, d = q_shape
    return 2 * math.prod(lead) * (n * 2 * d + 2 * d * n * d + n * 2 * d * d)


@register_flop_formula(torch.ops.nalaformer.nala_fast_forward)
def _forward_flops(q_shape, *args, **kwargs) -> int:
    return _product_flops(q_shape)


@register_flop_formula(torch.ops.nalaformer.nala_fast_backward)
def _backward_flops(dout_shape, q_shape, *args, **kwargs) -> int:
    return 2 * _product_flops(q_shape)  # each product's two input gradients


def _setup_context(ctx, inputs, output):
    q, k, v, rope, alpha = inputs
    _, state, normaliser, mean = output
    ctx.save_for_backward(q, k, v, rope, state, normaliser, mean)
    ctx.mark_non_differentiable(state, normaliser, mean)
    ctx.alpha = alpha


def _backward(ctx, dout, _d_state, _d_normaliser, _d_mean):
    q, k, v, rope, state, normaliser, mean = ctx.saved_tensors
    dq, dk, dv = _backward_op(dout, q, k, v, rope, state, normaliser, mean, ctx.alpha)
    return dq, dk, dv, None, None


_forward_op.register_autograd(_backward, setup_context=_setup_context)


def nala_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """Released NaLa attention (the ``nala`` kernel): q, k, v (..., N, d), rope (2, N, d) -> (..., N, d)."""
    return _forward_op(q, k, v, rope, None)[0]


def nala_cos_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: torch.Tensor,
                       alpha: float = 20.0) -> torch.Tensor:
    """Cosine-inhibit NaLa attention (the ``nala_cos`` kernel, sharpness ``alpha``), same shapes."""
    return _forward_op(q, k, v, rope, float(alpha))[0]
