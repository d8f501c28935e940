"""FISH-style per-image hash targets: the +-1 codes EET trains its hash head toward.

EET (arXiv 2504.16691; official code github.com/WhiteJiang/EET, ``utils.py: calc_train_codes``)
solves, once before training, one code per training image from the labels alone:

    min_{P, V, R, B}  sigma * ||L - P V||_F^2 + delta * ||B - R V||_F^2
    L (C, n) one-hot labels,  V (k, n) real latent codes,  P (C, k) class proxies,
    R (k, k) orthogonal rotation,  B (k, n) in {-1, +1},  k = bits,  sigma = 1, delta = 1e-4
    (the official values; :func:`fish_codes` takes others, and the ``eet`` task passes its
    ``fish_sigma``, ``fish_delta``, ``fish_iters``).

Initialisation: V ~ N(0, 1), B random signs, R by Procrustes from B V^T. Then 15 iterations of
block-coordinate descent, each step the exact minimiser of the objective in its block:

    B = sign(R V)                                  (0 -> +1; the argmax of Tr(B^T R V))
    P = L V^T (V V^T)^+                            (least squares, normal equations)
    V = (sigma P^T P + delta I)^-1 (sigma P^T L + delta R^T B)     (ridge solve; R^T R = I)
    R = U W^T,  U S W^T = svd(B V^T)               (orthogonal Procrustes)

so the objective never increases (:func:`objective`, recorded after each iteration). The codes
are B^T (n, k). Everything runs in float64 with a seeded generator (same labels, bits and seed ->
the same codes on every machine).

Deviations (both corrections of the paper, none of the official code): the paper's Eq. 14
writes P = Y V^T (Y V^T)^-1, which is only defined when classes = bits (then it is the identity,
not the least-squares proxies); we use the normal equations, as the official code does. Its
Eq. 16 *minimises* Tr(B^T R V); B = sign(R V) maximises it, which is what the code computes. The
official code inverts sigma P^T P + delta R^T R with a pseudo-inverse; with R orthogonal this is
the same positive-definite matrix, solved directly here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ..core.errors import TokenReduceError

SIGMA = 1.0
DELTA = 1e-4
ITERS = 15


@dataclass(frozen=True)
class FishResult:
    """``codes`` (n, k) int8 +-1 (row i = the code of training item i); ``objective`` the value of
    the objective after each iteration (``iters`` floats); the final ``rotation`` R (k, k),
    ``latent`` V (k, n) and ``proxies`` P (C, k), float64."""

    codes: Tensor
    objective: list[float]
    rotation: Tensor
    latent: Tensor
    proxies: Tensor


def one_hot_labels(labels: Tensor, num_classes: int | None = None) -> Tensor:
    """L (C, n) float64 from class ids (n,) or multi-hot labels (n, C)."""
    labels = torch.as_tensor(labels)
    if labels.dim() == 2:
        return labels.double().T.contiguous()
    if labels.dim() != 1 or labels.numel() == 0:
        raise TokenReduceError(f"FISH targets need labels (n,) or multi-hot (n, C) with n >= 1, got shape "
                               f"{tuple(labels.shape)}")
    labels = labels.long()
    if int(labels.min()) < 0:
        raise TokenReduceError("FISH targets: labels must be >= 0")
    c = int(labels.max()) + 1 if num_classes is None else int(num_classes)
    if int(labels.max()) >= c:
        raise TokenReduceError(f"FISH targets: label {int(labels.max())} outside 0..{c - 1}")
    return torch.nn.functional.one_hot(labels, c).double().T.contiguous()


def sign(x: Tensor) -> Tensor:
    """sign with 0 -> +1 (float, same shape)."""
    return torch.where(x >= 0, 1.0, -1.0).to(x.dtype)


def procrustes(b: Tensor, v: Tensor) -> Tensor:
    """The orthogonal R (k, k) minimising ||B - R V||_F: R = U W^T from svd(B V^T) = U S W^T."""
    u, _, wt = torch.linalg.svd(b @ v.T)
    return u @ wt


def proxies(labels: Tensor, v: Tensor) -> Tensor:
    """P = L V^T (V V^T)^+ (C, k): the least-squares minimiser of ||L - P V||_F (L (C, n), V (k, n))."""
    return labels @ v.T @ torch.linalg.pinv(v @ v.T)


def objective(labels: Tensor, p: Tensor, v: Tensor, r: Tensor, b: Tensor, sigma: float = SIGMA,
              delta: float = DELTA) -> float:
    """sigma ||L - P V||_F^2 + delta ||B - R V||_F^2."""
    return float(sigma * (labels - p @ v).pow(2).sum() + delta * (b - r @ v).pow(2).sum())


def fish_codes(labels: Tensor, bits: int, *, num_classes: int | None = None, seed: int = 0, iters: int = ITERS,
               sigma: float = SIGMA, delta: float = DELTA) -> FishResult:
    """Per-item +-1 target codes (n, bits) from ``labels`` (n,) class ids or (n, C) multi-hot
    (module docstring: the objective, the four exact steps, the deviations from the paper)."""
    if not isinstance(bits, int) or bits < 1:
        raise TokenReduceError(f"FISH targets need bits >= 1, got {bits!r}")
    if not (iters >= 1 and 0 < sigma < math.inf and 0 < delta < math.inf):
        raise TokenReduceError(f"FISH targets need iters >= 1, sigma > 0, delta > 0; got {iters}, {sigma}, {delta}")
    lab = one_hot_labels(labels, num_classes)  # (C, n)
    n = lab.shape[1]
    g = torch.Generator().manual_seed(int(seed))
    v = torch.randn(bits, n, generator=g, dtype=torch.float64)  # (k, n)
    b = sign(torch.randn(bits, n, generator=g, dtype=torch.float64))  # (k, n)
    r = procrustes(b, v)
    eye = torch.eye(bits, dtype=torch.float64)
    history = []
    for _ in range(iters):
        b = sign(r @ v)
        p = proxies(lab, v)  # (C, k)
        v = torch.linalg.solve(sigma * p.T @ p + delta * eye, sigma * p.T @ lab + delta * r.T @ b)
        r = procrustes(b, v)
        history.append(objective(lab, p, v, r, b, sigma, delta))
    return FishResult(b.T.to(torch.int8).contiguous(), history, r, v, p)


__all__ = ["DELTA", "ITERS", "SIGMA", "FishResult", "fish_codes", "objective", "one_hot_labels", "procrustes",
           "proxies", "sign"]
