"""Retrieval metrics over binary codes: Hamming ranking, mAP, precision@k, precision-recall curve.

Pure functions of tensors (no model, no plotting at import). Codes are +-1 tensors (n, bits) of
any dtype; labels are either class ids (n,) (relevant = same class) or multi-hot (n, L)
(relevant = at least one label in common, as EET's ``calc_map_k``). Every metric is vectorised
in torch and chunked over queries, so 10 000 queries x 60 000 database items run on a CPU in a few
hundred MB; tensors stay on the device they come on.

Hamming distance: ``d(q, x) = (bits - q . x) / 2`` for +-1 codes, an integer in 0..bits.

**Tie rule** (the ranking every metric here uses): database items are ranked by increasing
Hamming distance; items at EQUAL distance keep their database order (lower database index
first), i.e. a stable sort. This is deterministic on every device; EET's code uses an unstable
``torch.sort``, whose order among ties is unspecified, so its mAP can differ from ours in ties.

**Average precision** of one query over a ranking of the database (first ``k`` items when
``topk=k``, all items otherwise), ``rel(i)`` = 1 when the item at rank i (1-based) is relevant:

    AP = (1 / R) * sum_i rel(i) * P(i),   P(i) = (sum_{j <= i} rel(j)) / i,   R = sum_i rel(i)

(R counts the relevant items inside the ranking considered; with ``topk`` this is the usual
"mAP@k" of DPSH/HashNet; AP = 0 for a query with no relevant item in its top k). mAP is the mean
over queries. A query with NO relevant item in the whole database has no AP: it is left out of
the mean (EET's code counts it as 0; with single-label data and a database covering every class
it never happens). If no query has a relevant item a TokenReduceError is raised.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..core.errors import TokenReduceError
from ..models.checkpoint import atomic_write

#: Elements (queries x database items) handled at once; ~40 bytes each during a sort.
CHUNK_ELEMENTS = 1 << 22


def _check_codes(codes: Tensor, what: str) -> Tensor:
    if codes.dim() != 2 or codes.shape[1] < 1:
        raise TokenReduceError(f"{what} must be a (n, bits) tensor of +-1, got shape {tuple(codes.shape)}")
    codes = codes.float()
    if not bool((codes.abs() == 1).all()):
        raise TokenReduceError(f"{what} must hold only -1 and +1 (binarise with sign first)")
    return codes


def _check_pair(query_codes: Tensor, db_codes: Tensor) -> tuple[Tensor, Tensor]:
    q, db = _check_codes(query_codes, "query codes"), _check_codes(db_codes, "database codes")
    if q.shape[1] != db.shape[1]:
        raise TokenReduceError(f"query codes have {q.shape[1]} bits, database codes {db.shape[1]}")
    if db.shape[0] == 0:
        raise TokenReduceError("the database is empty")
    return q, db.to(q.device)


def _chunk(n_db: int, chunk: int | None) -> int:
    return chunk if chunk is not None else max(1, CHUNK_ELEMENTS // max(n_db, 1))


def hamming_distance(query_codes: Tensor, db_codes: Tensor) -> Tensor:
    """(q, n) long Hamming distances ``(bits - Q X^T) / 2`` between +-1 codes (q, bits), (n, bits)."""
    q, db = _check_pair(query_codes, db_codes)
    return _distance(q, db)


def _distance(q: Tensor, db: Tensor) -> Tensor:
    # float32 dot products of +-1 vectors are exact integers for any bits < 2**24
    return ((q.shape[1] - q @ db.T) / 2).round().long()  # (q, n)


def hamming_rank(query_codes: Tensor, db_codes: Tensor) -> Tensor:
    """(q, n) database indices of each query's ranking: increasing Hamming distance, ties by lower
    database index first (stable sort). Materialises the full (q, n) matrix: for large sets use
    the metric functions, which rank chunk by chunk."""
    q, db = _check_pair(query_codes, db_codes)
    return _rank(_distance(q, db))


def _rank(dist: Tensor) -> Tensor:
    """(q, n) -> (q, n) order by increasing ``dist``, ties by index (stable)."""
    return torch.sort(dist, dim=1, stable=True).indices


def _relevance(query_labels: Tensor, db_labels: Tensor) -> Tensor:
    """(q, n) bool: same class for (q,)/(n,) ids; a shared label for (q, L)/(n, L) multi-hot."""
    if query_labels.dim() != db_labels.dim() or query_labels.dim() not in (1, 2):
        raise TokenReduceError("labels must be class ids (n,) for queries and database alike, or multi-hot (n, L); "
                               f"got shapes {tuple(query_labels.shape)} and {tuple(db_labels.shape)}")
    if query_labels.dim() == 1:
        return query_labels[:, None] == db_labels[None, :]
    return (query_labels.float() @ db_labels.float().T) > 0


def _check_labels(codes: Tensor, labels: Tensor, what: str) -> Tensor:
    if labels.shape[0] != codes.shape[0]:
        raise TokenReduceError(f"{what}: {codes.shape[0]} codes but {labels.shape[0]} labels")
    return labels.to(codes.device)


def ranked_average_precision(dist: Tensor, relevant: Tensor, topk: int | None = None) -> Tensor:
    """Average precision per query from a distance matrix, under the module's tie rule.

    dist (q, n) any real or integer distances (smaller = closer; equal values ranked by lower
    index first), relevant (q, n) bool. Returns (q,) float64 AP (formula in the module docstring;
    ``topk`` restricts the ranking to its first k items); NaN for a query with no relevant item in
    the whole database.
    """
    n = dist.shape[1]
    k = n if topk is None else min(int(topk), n)
    return _ap(_ranked_relevance(dist, relevant, k), relevant)


def _ranked_relevance(dist: Tensor, relevant: Tensor, k: int) -> Tensor:
    """(q, k) float64 relevance of the first k items of each query's ranking (one sort)."""
    return relevant.gather(1, _rank(dist)[:, :k]).double()


def _ap(rel: Tensor, relevant: Tensor) -> Tensor:
    """(q,) AP from the ranked relevance ``rel`` (q, k); NaN where ``relevant`` (q, n) has none."""
    hits = rel.cumsum(1)  # relevant items up to and including each rank
    ranks = torch.arange(1, rel.shape[1] + 1, device=rel.device, dtype=torch.float64)
    ap = (rel * hits / ranks).sum(1) / rel.sum(1).clamp_min(1)
    return torch.where(relevant.any(1), ap, torch.full_like(ap, float("nan")))


def _precision(rel: Tensor, relevant: Tensor, ks: Sequence[int]) -> Tensor:
    """(q, len(ks)) precision@k from the ranked relevance ``rel`` (q, >= max k clipped to n)."""
    n = relevant.shape[1]
    hits = rel[:, : min(max(ks), n)].cumsum(1)
    out = torch.stack([hits[:, min(k, n) - 1] / min(k, n) for k in ks], 1)
    return torch.where(relevant.any(1, keepdim=True), out, torch.full_like(out, float("nan")))


def _per_query(query_codes: Tensor, query_labels: Tensor, db_codes: Tensor, db_labels: Tensor,
               chunk: int | None, fn) -> list[Any]:
    """Apply ``fn(dist (c, n), relevant (c, n))`` to chunks of queries; returns the list of results."""
    q, db = _check_pair(query_codes, db_codes)
    ql = _check_labels(q, query_labels, "queries")
    dl = _check_labels(db, db_labels, "database")
    step = _chunk(db.shape[0], chunk)
    return [fn(_distance(q[s:s + step], db), _relevance(ql[s:s + step], dl)) for s in range(0, q.shape[0], step)]


def mean_defined(values: Tensor, what: str) -> float:
    """The mean of ``values`` over the queries that have one (NaN: no relevant item)."""
    ok = ~torch.isnan(values)
    if not bool(ok.any()):
        raise TokenReduceError(f"{what}: no query has a relevant item in the database")
    return float(values[ok].mean())


def mean_average_precision(query_codes: Tensor, query_labels: Tensor, db_codes: Tensor, db_labels: Tensor,
                           topk: int | None = None, *, chunk: int | None = None) -> float:
    """mAP in [0, 1] of Hamming ranking (module docstring: formula, tie rule, queries left out).

    query_codes (q, bits) +-1, query_labels (q,) or (q, L); db_codes (n, bits), db_labels (n,) or
    (n, L); ``topk`` None = the whole database; ``chunk`` queries per step (default: fits
    ``CHUNK_ELEMENTS``).
    """
    if topk is not None and topk < 1:
        raise TokenReduceError(f"topk must be a positive number of items or None, got {topk}")
    aps = _per_query(query_codes, query_labels, db_codes, db_labels, chunk,
                     lambda d, r: ranked_average_precision(d, r, topk))
    return mean_defined(torch.cat(aps), "mAP")


def precision_at_k(query_codes: Tensor, query_labels: Tensor, db_codes: Tensor, db_labels: Tensor,
                   ks: Sequence[int] = (1, 10, 100, 1000), *, chunk: int | None = None) -> dict[int, float]:
    """{k: mean over queries of (relevant items among the first k of the ranking) / k}, in [0, 1].

    Same ranking, tie rule and query set (queries with a relevant database item) as
    :func:`mean_average_precision`. A k larger than the database is evaluated at k = n (the
    whole database) and reported under the k asked for.
    """
    ks = [int(k) for k in ks]
    if not ks or min(ks) < 1:
        raise TokenReduceError(f"precision@k needs positive k values, got {ks}")
    top = min(max(ks), db_codes.shape[0])

    def fn(dist: Tensor, relevant: Tensor) -> Tensor:
        return _precision(_ranked_relevance(dist, relevant, top), relevant, ks)

    prec = torch.cat(_per_query(query_codes, query_labels, db_codes, db_labels, chunk, fn))  # (q, len(ks))
    return {k: mean_defined(prec[:, i], f"precision@{k}") for i, k in enumerate(ks)}


def map_and_precision(query_codes: Tensor, query_labels: Tensor, db_codes: Tensor, db_labels: Tensor,
                      ks: Sequence[int] = (1, 10, 100, 1000), *, chunk: int | None = None
                      ) -> tuple[float, dict[int, float]]:
    """(:func:`mean_average_precision` over the whole database, :func:`precision_at_k`) from ONE
    ranking per chunk of queries: the same numbers as calling both, with half the sorting (the
    sort of every query's distances is what an evaluation of 10 000 x 60 000 spends its time on)."""
    both = per_query_ap_and_precision(query_codes, query_labels, db_codes, db_labels, ks, chunk=chunk)
    return mean_defined(both[:, 0], "mAP"), {k: mean_defined(both[:, 1 + i], f"precision@{k}")
                                             for i, k in enumerate(ks)}


def per_query_ap_and_precision(query_codes: Tensor, query_labels: Tensor, db_codes: Tensor, db_labels: Tensor,
                               ks: Sequence[int] = (1, 10, 100, 1000), *, chunk: int | None = None) -> Tensor:
    """Each query's average precision over the whole database and its precision@k, from one ranking:
    (Q, 1 + len(ks)), NaN where a query has no relevant item (what :func:`map_and_precision` averages)."""
    ks = [int(k) for k in ks]
    if not ks or min(ks) < 1:
        raise TokenReduceError(f"precision@k needs positive k values, got {ks}")
    n = db_codes.shape[0]

    def fn(dist: Tensor, relevant: Tensor) -> Tensor:
        rel = _ranked_relevance(dist, relevant, n)
        return torch.cat([_ap(rel, relevant)[:, None], _precision(rel, relevant, ks)], 1)  # (c, 1 + len(ks))

    return torch.cat(_per_query(query_codes, query_labels, db_codes, db_labels, chunk, fn))


def pr_curve(query_codes: Tensor, query_labels: Tensor, db_codes: Tensor, db_labels: Tensor, *,
             chunk: int | None = None) -> dict[str, list[Any]]:
    """Precision and recall of Hamming-ball retrieval at every radius r = 0..bits.

    For one query, the items retrieved at radius r are those with ``d <= r``;
    precision(r) = relevant retrieved / retrieved, recall(r) = relevant retrieved / relevant.
    Each is averaged over the queries where it is defined (queries with a relevant database item;
    for precision also at least one item retrieved), so at r = bits recall = 1 and precision =
    the mean fraction of relevant items in the database. Returns ``{'radius', 'precision', 'recall'}``
    as lists of bits+1 floats (precision None at a radius where no query retrieves anything).
    """
    bits = query_codes.shape[1]

    def fn(dist: Tensor, relevant: Tensor) -> Tensor:
        c = dist.shape[0]
        # per query, items and relevant items at each distance 0..bits, then cumulated over radii
        found = torch.zeros(c, bits + 1, dtype=torch.float64, device=dist.device)
        hits = torch.zeros_like(found)
        found.scatter_add_(1, dist, torch.ones_like(dist, dtype=torch.float64))
        hits.scatter_add_(1, dist, relevant.double())
        found, hits = found.cumsum(1), hits.cumsum(1)  # (c, bits+1)
        total = relevant.sum(1, keepdim=True).double()  # (c, 1)
        ok = total > 0
        nan = torch.full_like(found, float("nan"))
        prec = torch.where(ok & (found > 0), hits / found.clamp_min(1), nan)
        rec = torch.where(ok, hits / total.clamp_min(1), nan)
        return torch.stack([prec, rec])  # (2, c, bits+1)

    both = torch.cat(_per_query(query_codes, query_labels, db_codes, db_labels, chunk, fn), 1)  # (2, q, bits+1)
    if bool(torch.isnan(both[1]).all()):
        raise TokenReduceError("PR curve: no query has a relevant item in the database")
    prec, rec = both[0].nanmean(0), both[1].nanmean(0)  # (bits+1,) each, over the queries where defined
    precision = [None if p != p else p for p in prec.tolist()]  # None (JSON null), not NaN, where undefined
    return {"radius": list(range(bits + 1)), "precision": precision, "recall": rec.tolist()}


def plot_pr_curve(curves: dict[str, dict[str, Sequence[float]]], path: str | os.PathLike, title: str = "") -> Path:
    """Write a PNG with one precision-recall line per entry of ``curves`` (label -> :func:`pr_curve`
    output, or any dict with 'precision' and 'recall' lists); points whose precision is None or
    NaN are skipped. matplotlib (Agg) is imported here only."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not curves:
        raise TokenReduceError("plot_pr_curve needs at least one curve")
    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    for label, c in curves.items():
        # points whose precision is undefined (None, or NaN from a caller) are left out
        pts = [(r, p) for r, p in zip(c["recall"], c["precision"], strict=True) if p is not None and p == p]
        ax.plot([r for r, _ in pts], [p for _, p in pts], marker=".", linewidth=1.3, label=label)
    ax.set_xlabel("recall")
    ax.set_ylabel("precision")
    ax.set_xlim(0, 1.02)
    ax.set_ylim(0, 1.02)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=120)
    plt.close(fig)
    return atomic_write(path, png.getvalue())


__all__ = ["CHUNK_ELEMENTS", "hamming_distance", "hamming_rank", "map_and_precision", "mean_average_precision",
           "mean_defined", "per_query_ap_and_precision", "plot_pr_curve", "pr_curve", "precision_at_k",
           "ranked_average_precision"]
