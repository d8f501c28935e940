"""FISH-style hash targets (tasks/fish.py): the corrected algebra, checked step by step, against the
official algorithm, and the paper's literal Eq. 14 failing."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from tokenreduce.core.errors import TokenReduceError
from tokenreduce.tasks import fish as F


@pytest.mark.parametrize(("classes", "bits", "seed"), [(10, 16, 0), (10, 64, 1), (3, 2, 2), (16, 16, 3)])
def test_objective_never_increases_and_codes_are_signs(classes, bits, seed):
    labels = torch.randint(0, classes, (300,), generator=torch.Generator().manual_seed(seed))
    res = F.fish_codes(labels, bits, num_classes=classes, seed=seed)
    obj = res.objective
    assert len(obj) == F.ITERS
    assert all(b <= a * (1 + 1e-9) + 1e-12 for a, b in itertools.pairwise(obj)), obj
    assert obj[-1] < obj[0]
    assert res.codes.shape == (300, bits) and res.codes.dtype == torch.int8
    assert set(res.codes.unique().tolist()) <= {-1, 1}
    r = res.rotation
    assert torch.allclose(r @ r.T, torch.eye(bits, dtype=torch.float64), atol=1e-10)  # R stays orthogonal
    assert torch.equal(res.codes, F.fish_codes(labels, bits, num_classes=classes, seed=seed).codes)  # seeded


def test_every_step_is_the_minimiser_of_its_block():
    """Each update is the exact minimiser of the objective in its block with the others fixed: a
    random perturbation of the result (an orthogonal one for R) never does better. (B: the brute
    force test below.)"""
    g = torch.Generator().manual_seed(0)
    lab = F.one_hot_labels(torch.randint(0, 5, (40,), generator=g), 5)  # (C, n)
    res = F.fish_codes(lab.T, 8, seed=0)
    v, r = res.latent, res.rotation
    b = F.sign(r @ v)
    eye = torch.eye(8, dtype=torch.float64)
    p = F.proxies(lab, v)  # P given V
    v_new = torch.linalg.solve(p.T @ p + F.DELTA * eye, p.T @ lab + F.DELTA * r.T @ b)  # V given P, R, B
    r_new = F.procrustes(b, v_new)  # R given B, V

    def rand(shape):
        return 1e-3 * torch.randn(shape, generator=g, dtype=torch.float64)

    for _ in range(20):
        assert F.objective(lab, p + rand(p.shape), v, r, b) >= F.objective(lab, p, v, r, b)
        assert F.objective(lab, p, v_new + rand(v.shape), r, b) >= F.objective(lab, p, v_new, r, b)
        q, _ = torch.linalg.qr(eye + 10 * rand((8, 8)))
        assert F.objective(lab, p, v_new, r_new @ q, b) >= F.objective(lab, p, v_new, r_new, b) - 1e-12
    assert F.objective(lab, p, v_new, r_new, b) <= F.objective(lab, p, v, r, b)


def test_sign_of_rv_maximises_the_trace_over_every_sign_matrix():
    """B = sign(RV) is the argmax of Tr(B^T R V) over {-1, +1}^{k x n} (the paper's Eq. 16 says
    argmin): brute force over all 2^(k n) sign matrices of a tiny case."""
    res = F.fish_codes(torch.tensor([0, 1, 1]), 3, num_classes=2, seed=5)
    rv = res.rotation @ res.latent  # (3, 3)
    best = F.sign(rv)
    value = float((best * rv).sum())  # Tr(B^T R V)
    others = [float((torch.tensor(s, dtype=torch.float64).view(3, 3) * rv).sum())
              for s in itertools.product((-1.0, 1.0), repeat=9)]
    assert len(others) == 512 and value == pytest.approx(max(others))
    assert sum(o >= value - 1e-12 for o in others) == 1  # the unique maximiser (no zero entries here)
    assert min(others) == pytest.approx(-value)  # what the paper's argmin would pick: -sign(RV)


def test_matches_the_official_algorithm():
    """The official loop (numpy; pseudo-inverses; B first, then P, V, R) from the same initial V and
    B gives the same codes."""
    labels = torch.randint(0, 7, (120,), generator=torch.Generator().manual_seed(3))
    bits, seed = 12, 4
    ours = F.fish_codes(labels, bits, num_classes=7, seed=seed).codes
    g = torch.Generator().manual_seed(seed)  # the same draws, in the same order, as fish_codes
    v = torch.randn(bits, 120, generator=g, dtype=torch.float64).numpy()
    b = F.sign(torch.randn(bits, 120, generator=g, dtype=torch.float64)).numpy()
    lab = F.one_hot_labels(labels, 7).numpy()
    u, _, wt = np.linalg.svd(b @ v.T)
    r = u @ wt
    for _ in range(15):
        b = np.where(r @ v >= 0, 1.0, -1.0)
        p = lab @ v.T @ np.linalg.pinv(v @ v.T)
        v = np.linalg.pinv(p.T @ p + 1e-4 * r.T @ r) @ (p.T @ lab + 1e-4 * r.T @ b)
        u, _, wt = np.linalg.svd(b @ v.T)
        r = u @ wt
    assert np.array_equal(ours.numpy().astype(np.float64), b.T)


def test_the_papers_literal_eq14_fails_when_classes_differ_from_bits():
    """Eq. 14 as printed, P = Y V^T (Y V^T)^-1: the inverse of a C x k matrix, which exists only
    for C = k; and there it is the identity, not the least-squares proxies."""
    labels = torch.arange(40) % 10
    lab = F.one_hot_labels(labels, 10)
    v = torch.randn(16, 40, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    yv = lab @ v.T  # (10, 16)
    with pytest.raises(RuntimeError):  # torch.linalg.LinAlgError: not square
        _ = yv @ torch.linalg.inv(yv)
    ok = F.proxies(lab, v)  # the normal equations work for any C, k
    assert ok.shape == (10, 16)
    v10 = v[:10]
    literal = (lab @ v10.T) @ torch.linalg.inv(lab @ v10.T)
    assert torch.allclose(literal, torch.eye(10, dtype=torch.float64), atol=1e-8)
    assert (lab - F.proxies(lab, v10) @ v10).pow(2).sum() < (lab - literal @ v10).pow(2).sum()


def test_bad_inputs_are_clear_errors():
    with pytest.raises(TokenReduceError, match="bits"):
        F.fish_codes(torch.tensor([0, 1]), 0)
    with pytest.raises(TokenReduceError, match="outside"):
        F.fish_codes(torch.tensor([0, 5]), 4, num_classes=3)
    with pytest.raises(TokenReduceError, match="labels"):
        F.fish_codes(torch.zeros(0, dtype=torch.long), 4)
    assert F.sign(torch.tensor([-1.0, 0.0, 2.0])).tolist() == [-1.0, 1.0, 1.0]
