"""Retrieval metrics: mAP against scikit-learn, the tie rule on a hand example, P@k, the PR curve."""

from __future__ import annotations

import math

import pytest
import torch

from tokenreduce.core.errors import TokenReduceError
from tokenreduce.tasks import retrieval as R

sklearn_metrics = pytest.importorskip("sklearn.metrics")

# Hand example, 4 bits. Query 0 = (+1,+1,+1,+1) label 0; query 1 = all -1, label 1; query 2 has
# label 3, which no database item has (left out of every mean).
Q = torch.tensor([[1, 1, 1, 1], [-1, -1, -1, -1], [1, -1, 1, -1]])
QL = torch.tensor([0, 1, 3])
DB = torch.tensor([
    [-1, 1, 1, 1],   # 0: d(q0)=1  d(q1)=3  label 0
    [1, -1, 1, 1],   # 1: d(q0)=1  d(q1)=3  label 2
    [1, 1, 1, 1],    # 2: d(q0)=0  d(q1)=4  label 1
    [1, 1, 1, -1],   # 3: d(q0)=1  d(q1)=3  label 0
    [-1, -1, 1, 1],  # 4: d(q0)=2  d(q1)=2  label 0
])
DBL = torch.tensor([0, 2, 1, 0, 0])


def test_hand_ranking_follows_tie_rule():
    # equal distance -> lower database index first
    assert R.hamming_distance(Q[:2], DB).tolist() == [[1, 1, 0, 1, 2], [3, 3, 4, 3, 2]]
    assert R.hamming_rank(Q[:2], DB).tolist() == [[2, 0, 1, 3, 4], [4, 0, 1, 3, 2]]


def test_hand_map_with_ties():
    # q0: distance 0 item 2 (irrelevant), then the tie at distance 1 in index order 0 (relevant),
    # 1 (irrelevant), 3 (relevant), then item 4 (relevant): relevance 0,1,0,1,1
    #   AP = (1/2 + 2/4 + 3/5) / 3 = 8/15   (relevant-first ties: 0,1,1,0,1 -> 53/90;
    #                                         irrelevant-first ties: 0,0,1,1,1 -> 43/90)
    # q1 ranked relevance 0,0,0,0,1 -> AP = 1/5;  q2 has no relevant item: left out
    assert R.mean_average_precision(Q, QL, DB, DBL) == pytest.approx((8 / 15 + 1 / 5) / 2, abs=1e-12)
    # mAP@3: q0 top 3 relevance 0,1,0 -> 1/2; q1 nothing relevant in its top 3 -> 0
    assert R.mean_average_precision(Q, QL, DB, DBL, topk=3) == pytest.approx(1 / 4, abs=1e-12)


def test_tie_rule_is_not_relevant_first():
    # two items at the same distance, the relevant one at the higher index: it comes second
    q = torch.tensor([[1, 1]])
    db = torch.tensor([[1, -1], [-1, 1]])
    assert R.mean_average_precision(q, torch.tensor([0]), db, torch.tensor([1, 0])) == pytest.approx(0.5)
    assert R.mean_average_precision(q, torch.tensor([0]), db, torch.tensor([0, 1])) == pytest.approx(1.0)


def test_hand_precision_at_k():
    # q0 relevance 0,1,0,1,1; q1 0,0,0,0,1; k=10 > 5 items is evaluated at k=5
    p = R.precision_at_k(Q, QL, DB, DBL, ks=(1, 2, 3, 5, 10))
    assert p[1] == pytest.approx(0.0)
    assert p[2] == pytest.approx((1 / 2 + 0) / 2)
    assert p[3] == pytest.approx((1 / 3 + 0) / 2)
    assert p[5] == pytest.approx((3 / 5 + 1 / 5) / 2)
    assert p[10] == pytest.approx(p[5])


def test_hand_pr_curve():
    c = R.pr_curve(Q, QL, DB, DBL)
    assert c["radius"] == [0, 1, 2, 3, 4]
    # q0: found 1,4,5,5,5 hits 0,2,3,3,3 of 3; q1: found 0,0,1,4,5 hits 0,0,0,0,1 of 1
    assert c["precision"] == pytest.approx([0.0, 0.5, 0.3, 0.3, 0.4])
    assert c["recall"] == pytest.approx([0.0, 1 / 3, 0.5, 0.5, 1.0])


def test_pr_curve_endpoints_random():
    g = torch.Generator().manual_seed(0)
    q = torch.randint(0, 2, (20, 12), generator=g) * 2 - 1
    db = torch.randint(0, 2, (50, 12), generator=g) * 2 - 1
    ql, dl = torch.randint(0, 4, (20,), generator=g), torch.randint(0, 4, (50,), generator=g)
    c = R.pr_curve(q, ql, db, dl)
    assert len(c["recall"]) == 13 and c["recall"][-1] == pytest.approx(1.0)
    frac = (ql[:, None] == dl[None]).double().mean(1)
    assert c["precision"][-1] == pytest.approx(float(frac[frac > 0].mean()))
    rec = c["recall"]
    assert all(a <= b + 1e-12 for a, b in zip(rec[:-1], rec[1:], strict=True))  # recall grows with the radius


def _sk_map(dist: torch.Tensor, rel: torch.Tensor) -> float:
    ap = sklearn_metrics.average_precision_score
    aps = [ap(r.numpy(), -d.numpy()) for d, r in zip(dist, rel, strict=True) if r.any()]
    return sum(aps) / len(aps)


def test_ranked_ap_matches_sklearn_without_ties():
    g = torch.Generator().manual_seed(1)
    dist = torch.rand(30, 200, generator=g, dtype=torch.float64)  # continuous: no ties
    rel = torch.rand(30, 200, generator=g) < 0.2
    rel[0] = False  # a query without relevant items is left out
    ours = R.ranked_average_precision(dist, rel)
    assert math.isnan(ours[0].item())
    assert float(ours[1:].mean()) == pytest.approx(_sk_map(dist, rel), abs=1e-10)


def test_map_on_codes_matches_sklearn_when_distances_are_distinct():
    # per query: a database of bits+1 codes at Hamming distances 0..bits (in shuffled order)
    g = torch.Generator().manual_seed(2)
    bits, ours, ref = 16, [], []
    for _ in range(6):
        q = torch.randint(0, 2, (1, bits), generator=g) * 2 - 1
        db = q.repeat(bits + 1, 1)
        for j, dj in enumerate(torch.randperm(bits + 1, generator=g).tolist()):
            db[j, torch.randperm(bits, generator=g)[:dj]] *= -1
        dl = torch.randint(0, 3, (bits + 1,), generator=g)
        dl[0] = 1
        ql = torch.tensor([1])
        ours.append(R.mean_average_precision(q, ql, db, dl))
        ref.append(_sk_map(R.hamming_distance(q, db).double(), ql[:, None] == dl[None]))
    assert ours == pytest.approx(ref, abs=1e-10)


def test_map_with_ties_equals_sklearn_on_tie_broken_scores():
    # many ties (8 bits, 300 items): the documented rule = score -(d * n + index), all distinct
    g = torch.Generator().manual_seed(3)
    q = torch.randint(0, 2, (40, 8), generator=g) * 2 - 1
    db = torch.randint(0, 2, (300, 8), generator=g) * 2 - 1
    ql, dl = torch.randint(0, 5, (40,), generator=g), torch.randint(0, 5, (300,), generator=g)
    d = R.hamming_distance(q, db).double()
    broken = d * 300 + torch.arange(300, dtype=torch.float64)
    ref = _sk_map(broken, ql[:, None] == dl[None])
    assert R.mean_average_precision(q, ql, db, dl) == pytest.approx(ref, abs=1e-10)
    # chunking over queries changes nothing
    assert R.mean_average_precision(q, ql, db, dl, chunk=7) == pytest.approx(ref, abs=1e-12)
    # multi-hot labels (one-hot here) are the same relevance
    oh = torch.nn.functional.one_hot
    assert R.mean_average_precision(q, oh(ql, 5), db, oh(dl, 5)) == pytest.approx(ref, abs=1e-12)


def test_topk_full_database_equals_no_topk_and_p_at_k_chunked():
    g = torch.Generator().manual_seed(4)
    q = torch.randint(0, 2, (10, 6), generator=g) * 2 - 1
    db = torch.randint(0, 2, (40, 6), generator=g) * 2 - 1
    ql, dl = torch.randint(0, 3, (10,), generator=g), torch.randint(0, 3, (40,), generator=g)
    assert R.mean_average_precision(q, ql, db, dl, topk=40) == pytest.approx(R.mean_average_precision(q, ql, db, dl))
    assert R.precision_at_k(q, ql, db, dl, ks=(1, 5), chunk=3) == pytest.approx(R.precision_at_k(q, ql, db, dl, (1, 5)))


def test_bad_input_is_a_clear_error():
    with pytest.raises(TokenReduceError, match="-1 and \\+1"):
        R.mean_average_precision(torch.zeros(2, 4), torch.zeros(2), DB, DBL)
    with pytest.raises(TokenReduceError, match="bits"):
        R.mean_average_precision(Q[:, :3], QL, DB, DBL)
    with pytest.raises(TokenReduceError, match="no query has a relevant"):
        R.mean_average_precision(Q[2:], QL[2:], DB, DBL)
    with pytest.raises(TokenReduceError, match="labels"):
        R.mean_average_precision(Q, QL[:2], DB, DBL)


def test_plot_pr_curve_writes_png(tmp_path):
    c = R.pr_curve(Q, QL, DB, DBL)
    out = R.plot_pr_curve({"asym": c, "sym": c}, tmp_path / "pr.png", title="x")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_map_and_precision_share_one_ranking_and_equal_the_separate_functions() -> None:
    g = torch.Generator().manual_seed(3)
    q = torch.randint(0, 2, (37, 12), generator=g) * 2 - 1
    db = torch.randint(0, 2, (301, 12), generator=g) * 2 - 1
    ql, dl = torch.randint(0, 4, (37,), generator=g), torch.randint(0, 4, (301,), generator=g)
    mean_ap, prec = R.map_and_precision(q, ql, db, dl, ks=(1, 5, 400), chunk=7)
    assert mean_ap == pytest.approx(R.mean_average_precision(q, ql, db, dl))
    assert prec == pytest.approx(R.precision_at_k(q, ql, db, dl, ks=(1, 5, 400)))
