"""The history of the verdicts the report has published, ``results/verdicts.json``, and the report's "What
changed" read from it.

Per claim (:func:`claim_key`: study/bed, claim, grid point) the file lists the verdicts published, oldest
first; each entry holds the verdict word as printed, the adjusted p as printed, the digest of the records the
claim's test read (:func:`~.tables.records_digest`), the statistics' version (:data:`~.stats.STATS_VERSION`),
the digest of the claim's declared test, and the number of the update that published it. ``tokenreduce
report`` appends an entry only where a claim's word differs from its last one (or the claim is new), and then
numbers the update one higher; so a rebuild with no new record and no code change rewrites the file byte for
byte. The file carries a digest of its claims: one edited by hand, or malformed, is refused with one line.

"What changed" shows the latest update: each claim whose word moved in it (before -> now, and why, from the
digests: new runs, the statistics, its declaration, or else the other tests of its multiplicity family), and
the claims it published for the first time, named when at most :data:`LIST_NEW` and otherwise counted per
study: the first update publishes every claim at once, and a page-long list of "new" would bury the moves."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

from ..bench.report import write_text
from . import stats
from .declare import CONFIRMATORY, Expect, Study
from .records import RecordError
from .tables import EXPLORATORY, Judged, Judgement, table_head, table_row, test_keywords, where_text, word

#: the history's file name under the results folder
FILE = "verdicts.json"
#: the most new claims "What changed" names one by one (more are counted per study)
LIST_NEW = 12
ENTRY = {"update": int, "verdict": str, "p": str, "records": str, "statistics": int, "declared": str}
History = dict[str, list[dict[str, Any]]]


def claim_key(study: Study, e: Expect) -> str:
    """A claim's key in the history: its study/bed, its declared text and its grid point, as the rows name it."""
    return f"{study.key} | {e.claim} | {where_text(e.at)}"


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def load(path: Path) -> tuple[int, History]:
    """The history's latest update number and its claims ((0, {}) where there is no file yet); a file that is
    not one ``tokenreduce report`` wrote (malformed, or edited: its digest no longer matches) is refused."""
    if not path.exists():
        return 0, {}

    def refuse(what: str) -> RecordError:
        return RecordError(f"{path}: {what}; the verdict history is written only by tokenreduce report (restore it "
                           "from git, or delete it to start the history again)")
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise refuse(f"not a readable JSON file ({getattr(e, 'msg', None) or e})") from None
    if not isinstance(doc, dict) or set(doc) != {"update", "digest", "claims"} or \
            not isinstance(doc["update"], int) or not isinstance(doc["claims"], dict):
        raise refuse("not a verdict history (it needs exactly the keys update, digest, claims)")
    for key, entries in doc["claims"].items():
        if not isinstance(entries, list) or not entries or not all(
                isinstance(x, dict) and set(x) == set(ENTRY) and all(type(x[k]) is t for k, t in ENTRY.items())
                for x in entries):
            raise refuse(f"the claim {key!r} has a malformed entry (each needs {', '.join(ENTRY)})")
        ups = [x["update"] for x in entries]
        if ups != sorted(set(ups)) or ups[0] < 1 or ups[-1] > doc["update"]:
            raise refuse(f"the claim {key!r} has entries out of the order of the updates")
    if doc["digest"] != _digest(doc["claims"]):
        raise refuse("its digest does not match its claims (edited by hand?)")
    return doc["update"], doc["claims"]


def entry(j: Judged) -> dict[str, Any]:
    """What the report publishes for ``j`` now, as a history entry without its update number (an exploratory
    claim: the word "exploratory", no p: it has no verdict); ``declared``: the digest of what its test is (its
    contrast, metric and :func:`~.tables.test_keywords`)."""
    e = j.expect
    p = j.verdict.p("claim") if j.verdict and e.confirmatory else None
    return {"verdict": word(j) if e.confirmatory else EXPLORATORY, "p": f"{p[1]:.3g}" if p else "-",
            "records": j.read, "statistics": stats.STATS_VERSION,
            "declared": _digest([e.arm, e.baseline, e.metric, *test_keywords(e).values()])}


def record(path: Path, studies: list[tuple[Study, dict[str, dict]]], judgement: Judgement) -> tuple[int, History]:
    """Read the history at ``path``; append an entry for each judged claim whose word differs from its last
    entry, or that has a verdict and no entry yet (a claim never run, or exploratory, is not in the history; one
    with verdicts from before it was declared exploratory gets one entry saying so), numbered one higher than
    the latest update only if something was appended; write it back (atomically, sorted keys: the same history
    gives the same bytes). Returns the update number and the claims."""
    update_no, claims = load(path)
    out = {k: list(v) for k, v in claims.items()}
    now: dict[str, dict[str, Any]] = {}
    for study, _ in studies:
        for j in judgement.judged[study.key]:
            key = claim_key(study, j.expect)
            if key in now:
                raise RecordError(f"study {study.key}: two claims share the history key {key!r}; give one a "
                                  "distinct text")
            now[key] = entry(j)
            if (key in out and out[key][-1]["verdict"] != now[key]["verdict"]) or \
                    (key not in out and j.verdict is not None and j.expect.confirmatory):
                out.setdefault(key, []).append({**now[key], "update": update_no + 1})
    if out != claims:
        update_no, claims = update_no + 1, out
    doc = {"update": update_no, "digest": _digest(claims), "claims": claims}
    write_text(path, json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return update_no, claims


def _why(before: dict[str, Any], now: dict[str, Any]) -> str:
    if now["verdict"] == EXPLORATORY:  # its one entry after the verdicts it had: no verdict from here on
        return f"declared exploratory (not {CONFIRMATORY}): it left the families"
    causes = [what for key, what in (
        ("records", "new runs"),
        ("statistics", f"the statistics changed (version {before['statistics']} -> {now['statistics']})"),
        ("declared", "its declared test changed")) if before[key] != now[key]]
    return " and ".join(causes) or "the other tests of its multiplicity family (its own records unchanged)"


def what_changed(update_no: int, claims: History, studies: list[tuple[Study, dict[str, dict]]],
                 judgement: Judgement) -> list[str]:
    """The report's "What changed": the latest update of the history (see the module docstring)."""
    if not update_no:
        return ["No verdict published yet."]
    moved, new = table_head(["study", "test bed", "claim", "where", "before", "now", "why"]), []
    for study, _ in studies:
        for j in judgement.judged[study.key]:
            e, entries = j.expect, claims.get(claim_key(study, j.expect), [])
            if not entries or entries[-1]["update"] != update_no:
                continue
            if len(entries) == 1:
                new.append((study, j))
                continue
            b, n = entries[-2:]
            moved.append(table_row([study.name, study.bed_name, j.claim, where_text(e.at),
                                    f"{b['verdict']} (adjusted p {b['p']})",
                                    f"**{n['verdict']}** (adjusted p {n['p']})", _why(b, n)]))
    since = "the history starts here" if update_no == 1 else f"against update {update_no - 1}"
    lines = [f"Update {update_no} of the verdict history (`{FILE}` beside this page: every verdict the report "
             "has published, appended by `tokenreduce report` when a claim's verdict word changes; its git "
             f"log names the commit of each update), {since}: a verdict moves because of new runs (the records "
             "its test reads changed), because the statistics changed (their version), or, with neither, because "
             "of the other tests of its multiplicity family; a claim declared exploratory leaves the families and "
             "is not judged from then on.", ""]
    lines += moved if len(moved) > 2 else ["No published verdict moved."]
    if len(new) <= LIST_NEW:
        lines += ["", *(f"- new: {s.name} ({s.bed_name}): {j.claim} ({where_text(j.expect.at, 'all')})"
                        for s, j in new)] if new else []
    else:
        lines += ["", f"New in this update: {len(new)} claims published for the first time ("
                  + ", ".join(f"{k} {v}" for k, v in Counter(s.name for s, _ in new).items()) + ")."]
    return lines
