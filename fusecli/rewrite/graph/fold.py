"""Folding rules: numpy math that moves BatchNorm, scale/shift and bias into a Conv's W and B.

Every rule computes in float64 and returns arrays in the weight's own dtype.
"""

from __future__ import annotations

import numpy as np

from ...core.budgets import check_elements


def channel_vector(param: np.ndarray, out_rank: int, channels: int, axis: int = 1) -> np.ndarray | None:
    """``param`` as a (channels,) vector when it broadcasts over a rank-``out_rank`` tensor along ``axis``."""
    shape = tuple(param.shape)
    if len(shape) > out_rank:
        return None
    if param.size == 1:
        check_elements((channels,), "a per-channel copy of a scalar")
        return np.full(channels, param.reshape(-1)[0], dtype=param.dtype)
    padded = (1,) * (out_rank - len(shape)) + shape
    sized = [i for i, d in enumerate(padded) if d != 1]
    if sized != [axis] or padded[axis] != channels:
        return None
    return param.reshape(channels)


def fold_batch_norm(w: np.ndarray, b: np.ndarray | None, gamma: np.ndarray, beta: np.ndarray,
                    mean: np.ndarray, var: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """BatchNorm(conv(x, w) + b) as one conv: (w', b')."""
    # w' = w * gamma / sqrt(var + eps) per out channel; b' = (b - mean) * gamma / sqrt(var + eps) + beta
    with np.errstate(all="ignore"):  # var + eps <= 0 gives inf/NaN, as the unfused BatchNorm computes
        s = gamma.astype(np.float64) / np.sqrt(var.astype(np.float64) + eps)
        b0 = np.zeros(w.shape[0]) if b is None else b.astype(np.float64)
        shift = (b0 - mean.astype(np.float64)) * s + beta.astype(np.float64)
        return scaled_weight(w, s), shift.astype(w.dtype)


def fold_scale_shift(w: np.ndarray, b: np.ndarray | None, scale: np.ndarray,
                     shift: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(conv(x, w) + b) * scale + shift (Keras 3's decomposed BatchNorm) as one conv: (w', b')."""
    s = scale.astype(np.float64)
    # w' = w * scale per out channel; b' = b * scale + shift
    b0 = np.zeros(w.shape[0]) if b is None else b.astype(np.float64)
    return scaled_weight(w, s), (b0 * s + shift.astype(np.float64)).astype(w.dtype)


def fold_bias(b: np.ndarray | None, bias: np.ndarray, dtype) -> np.ndarray:
    """conv(x, w) + b + bias as conv(x, w) with one bias."""
    # b' = b + bias
    b0 = np.zeros(bias.shape) if b is None else b.astype(np.float64)
    return (b0 + bias.astype(np.float64)).astype(dtype)


def scaled_weight(w: np.ndarray, s: np.ndarray) -> np.ndarray:
    """w * s along the output-channel axis 0 (OIHW; grouped convs too: O spans all groups)."""
    with np.errstate(all="ignore"):
        return (w.astype(np.float64) * s.reshape((-1,) + (1,) * (w.ndim - 1))).astype(w.dtype)
