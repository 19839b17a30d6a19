"""Plan validation: one test per code, many problems at once, and a property test against a
separate, deliberately naive reference checker."""

from __future__ import annotations

import string
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.domain.plans import (
    CODES,
    check_update,
    content_digest,
    find_cycle,
    parse_plan,
    status_counts,
    validate_plan,
)
from orchestrator.errors import ValidationFailed


def node(node_id: str, status: str = "pending", **extra: Any) -> dict[str, Any]:
    return {"id": node_id, "title": f"step {node_id}", "actor": "agent", "status": status, **extra}


def plan(nodes: list[Any], edges: list[Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {"request_id": "req-1", "title": "plan", "reason": "", "nodes": nodes,
            "edges": edges or [], **extra}  # fmt: skip


def refused(payload: Any, previous: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    with pytest.raises(ValidationFailed) as caught:
        validate_plan(payload, previous)
    error = caught.value
    assert error.http_status == 422
    assert error.code == error.details[0]["code"]
    return error.details


def codes(payload: Any, previous: list[dict[str, Any]] | None = None) -> list[str]:
    return [detail["code"] for detail in refused(payload, previous)]


def test_a_valid_plan_with_parallel_and_conditional_branches_passes() -> None:
    draft = validate_plan(
        plan(
            [node("a", "completed", evidence="ph 7.2"), node("b"), node("c"), node("d")],
            [
                {"from": "a", "to": "b"},
                {"from": "a", "to": "c", "label": "if turbid"},
                {"from": "b", "to": "d"},
                {"from": "c", "to": "d"},
            ],
        )
    )
    assert [n["id"] for n in draft.nodes] == ["a", "b", "c", "d"]
    assert draft.edges[1]["label"] == "if turbid"


def test_too_many_nodes() -> None:
    assert codes(plan([node(f"n{i}") for i in range(41)])) == ["too_many_nodes"]
    validate_plan(plan([node(f"n{i}") for i in range(40)]))


def test_too_many_edges() -> None:
    nodes = [node(f"n{i}") for i in range(40)]
    edges = [{"from": f"n{i}", "to": f"n{j}"} for i in range(40) for j in range(i + 1, 40)]
    assert codes(plan(nodes, edges[:81])) == ["too_many_edges"]
    validate_plan(plan(nodes, edges[:80]))


def test_empty_plan() -> None:
    assert codes(plan([])) == ["empty_plan"]


def test_duplicate_node_id_is_reported_once_per_id() -> None:
    details = refused(plan([node("a"), node("a"), node("a"), node("b")]))
    assert [(d["code"], d["node_id"]) for d in details] == [("duplicate_node_id", "a")]


def test_dangling_edge_names_the_edge() -> None:
    details = refused(plan([node("a")], [{"from": "a", "to": "ghost"}]))
    assert details[0]["code"] == "dangling_edge"
    assert details[0]["edge"] == {"index": 0, "from": "a", "to": "ghost"}


def test_self_loop() -> None:
    assert codes(plan([node("a")], [{"from": "a", "to": "a"}])) == ["self_loop"]


def test_cycle_names_the_nodes_of_one_cycle() -> None:
    edges = [{"from": "a", "to": "b"}, {"from": "b", "to": "c"}, {"from": "c", "to": "a"}]
    details = refused(plan([node("a"), node("b"), node("c"), node("d")], edges))
    assert [d["code"] for d in details] == ["cycle"]
    cycle = details[0]["node_ids"]
    assert cycle[0] == cycle[-1]
    assert sorted(cycle[:-1]) == ["a", "b", "c"]


def test_a_duplicate_edge_is_refused_once_per_pair_whatever_its_label() -> None:
    edges = [
        {"from": "a", "to": "b"},
        {"from": "a", "to": "b", "label": "if turbid"},
        {"from": "a", "to": "b"},
        {"from": "b", "to": "a"},
    ]
    details = refused(plan([node("a"), node("b")], edges))
    assert [(d["code"], d.get("edge")) for d in details if d["code"] == "duplicate_edge"] == [
        ("duplicate_edge", {"index": 1, "from": "a", "to": "b"})
    ]
    # The reverse edge is not a duplicate: it is a cycle.
    assert {d["code"] for d in details} == {"duplicate_edge", "cycle"}
    validate_plan(plan([node("a"), node("b")], [{"from": "a", "to": "b", "label": "if turbid"}]))


def test_invalid_status() -> None:
    assert codes(plan([node("a", "done")])) == ["invalid_status"]


def test_invalid_actor() -> None:
    assert codes(plan([node("a", actor="robot")])) == ["invalid_actor"]


@pytest.mark.parametrize("evidence", [None, "", "   "])
def test_evidence_required_for_completed(evidence: str | None) -> None:
    extra = {} if evidence is None else {"evidence": evidence}
    assert codes(plan([node("a", "completed", **extra)])) == ["evidence_required"]


@pytest.mark.parametrize("status", ["failed", "waiting"])
def test_reason_required_for_failed_and_waiting(status: str) -> None:
    assert codes(plan([node("a", status)])) == ["reason_required"]
    validate_plan(plan([node("a", status, reason="sampler on site at 14:00")]))


def test_node_removed() -> None:
    previous = [node("a"), node("b")]
    details = refused(plan([node("a")]), previous)
    assert [(d["code"], d["node_id"]) for d in details] == [("node_removed", "b")]
    validate_plan(plan([node("a"), node("b", "skipped")]), previous)


def test_completed_node_changed_title_or_evidence() -> None:
    previous = [node("a", "completed", evidence="ph 7.2")]
    assert codes(plan([node("a", "completed", evidence="ph 6.0")]), previous) == [
        "completed_node_changed"
    ]
    retitled = node("a", "completed", evidence="ph 7.2", title="other")
    assert codes(plan([retitled]), previous) == ["completed_node_changed"]
    review = node("a-review", "pending", description="recheck ph")
    validate_plan(plan([node("a", "completed", evidence="ph 7.2"), review]), previous)


@pytest.mark.parametrize("status", ["pending", "running", "failed", "skipped", "cancelled"])
def test_a_completed_node_cannot_go_back(status: str) -> None:
    previous = [node("a", "completed", evidence="ph 7.2")]
    back = node("a", status, evidence="ph 7.2", reason="recheck")
    assert codes(plan([back]), previous) == ["completed_node_changed"]
    review = node("a-review", "running", reason="ph looked off", description="recheck ph")
    validate_plan(plan([node("a", "completed", evidence="ph 7.2"), review]), previous)


@pytest.mark.parametrize("status", ["pending", "running", "waiting", "completed"])
def test_a_failed_node_is_never_reopened_a_retry_is_a_new_node(status: str) -> None:
    previous = [node("a", "failed", reason="sampler broke")]
    again = node("a", status, evidence="ph 7.2", reason="trying again")
    details = refused(plan([again]), previous)
    assert [(d["code"], d["node_id"]) for d in details] == [("failed_node_reopened", "a")]
    # The retry is a new node; the failed one stays failed, or no longer applies.
    retry = node("a-retry", "running", description="sample again")
    validate_plan(plan([node("a", "failed", reason="sampler broke"), retry]), previous)
    for closed in ("skipped", "cancelled"):
        validate_plan(plan([node("a", closed, reason="replaced by a-retry"), retry]), previous)


@pytest.mark.parametrize("bad_id", [["a"], {"id": "a"}, 7, None, True])
def test_a_wrongly_typed_node_id_against_history_is_a_problem_not_a_crash(bad_id: Any) -> None:
    previous = [node("a"), node("b", "completed", evidence="seen")]
    payload = plan([{**node("a"), "id": bad_id}, node("b", "completed", evidence="seen")])
    found = codes(payload, previous)
    assert found[0] in ("invalid_type", "missing_field")
    assert found[1:] == ["node_removed"]
    assert check_update([{"id": bad_id}, 5, None], previous) == [
        {"code": "node_removed", "message": check_update([], previous)[0]["message"],
         "node_id": "a"},
        {"code": "node_removed", "message": check_update([], previous)[1]["message"],
         "node_id": "b"},
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        (plan([node("x" * 65)]), "id"),
        (plan([node("has space")]), "id"),
        (plan([node("a", title="t" * 201)]), "title"),
        (plan([node("a", description="d" * 2001)]), "description"),
        (plan([node("a", "completed", evidence="e" * 2001)]), "evidence"),
        (plan([node("a", "failed", reason="r" * 2001)]), "reason"),
        (plan([node("a")], title="t" * 201), "title"),
        (plan([node("a")], reason="r" * 2001), "reason"),
        (plan([node("a")], request_id="r" * 129), "request_id"),
    ],
)
def test_field_too_long(payload: dict[str, Any], field: str) -> None:
    details = refused(payload)
    assert [(d["code"], d["field"]) for d in details] == [("field_too_long", field)]


def test_limits_themselves_are_accepted() -> None:
    validate_plan(
        plan(
            [node("x" * 64, "completed", title="t" * 200, description="d" * 2000,
                  evidence="e" * 2000)],
            reason="r" * 2000,
        )
    )  # fmt: skip


def test_wrong_types_missing_and_unknown_fields() -> None:
    assert codes("not an object") == ["invalid_type"]
    assert codes({"title": "p", "nodes": [node("a")]}) == ["missing_field"]
    assert codes(plan([node("a")], nodes_extra=1)) == ["unknown_field"]
    assert codes(plan([node("a", colour="red")])) == ["unknown_field"]
    assert codes(plan([node("a", title=5)])) == ["invalid_type"]
    assert codes(plan("abc")) == ["invalid_type"]  # type: ignore[arg-type]
    assert codes(plan([7])) == ["invalid_type"]


@pytest.mark.parametrize("field", ["html", "script", "svg", "mermaid", "style", "layout"])
def test_presentation_a_model_might_send_is_refused_at_every_level(field: str) -> None:
    """Seed 004: the front end draws from the structured data and takes no HTML, script or
    drawing instructions from the model, so none of them is stored to be shown."""
    extra = {field: "<b onmouseover=alert(1)>x</b>"}
    edge = {"from": "a", "to": "b"}
    for payload in (
        plan([node("a"), node("b")], [edge], **extra),
        plan([node("a", **extra), node("b")], [edge]),
        plan([node("a"), node("b")], [{**edge, **extra}]),
    ):
        assert [(d["code"], d["field"]) for d in refused(payload)] == [("unknown_field", field)]


def test_server_set_fields_sent_back_are_ignored() -> None:
    stored = {
        "schema_version": "execution-plan@1",
        "session_id": "s-1",
        "revision": 3,
        "status_counts": {"pending": 1},
        "updated_at": "2024-05-01T10:00:00+00:00",
        "task_id": None,
        "generation": None,
    }
    draft = validate_plan(plan([node("a")], **stored))
    assert draft.digest == validate_plan(plan([node("a")])).digest
    # Whatever their value: the server assigns them, so they are not checked either.
    validate_plan(plan([node("a")], revision="seven", status_counts=[], updated_at=None))
    assert codes(plan([node("a")], revisions=[1])) == ["unknown_field"]
    assert codes(plan([node("a", revision=1)])) == ["unknown_field"]  # nodes have none


def test_nul_characters_are_refused_on_every_store() -> None:
    assert codes(plan([node("a", title="a\x00b")])) == ["invalid_character"]
    assert codes(plan([node("a"), node("b")], [{"from": "a", "to": "b", "label": "\x00"}])) == [
        "invalid_character"
    ]
    assert codes(plan([node("a")], reason="\x00")) == ["invalid_character"]


def test_several_problems_are_reported_at_once() -> None:
    payload = plan(
        [node("a", "completed"), node("a", "waiting"), node("b", actor="robot"), node("c", "?")]
        + [node(f"n{i}") for i in range(40)],
        [{"from": "a", "to": "ghost"}, {"from": "b", "to": "b"}, {"from": "n1", "to": "n2"},
         {"from": "n2", "to": "n1"}],
    )  # fmt: skip
    found = codes(payload, previous=[node("gone"), node("n3", "completed", evidence="x")])
    assert found[0] == "too_many_nodes"
    assert set(found) == {
        "too_many_nodes",
        "evidence_required",
        "reason_required",
        "invalid_actor",
        "invalid_status",
        "duplicate_node_id",
        "dangling_edge",
        "self_loop",
        "cycle",
        "node_removed",
        "completed_node_changed",
    }
    assert set(found) <= set(CODES)


def test_status_counts_list_every_status() -> None:
    counts = status_counts([node("a", "completed"), node("b"), node("c")])
    assert counts == {
        "pending": 2,
        "running": 0,
        "waiting": 0,
        "completed": 1,
        "failed": 0,
        "skipped": 0,
        "cancelled": 0,
    }


def test_digest_depends_on_content_not_key_order() -> None:
    a = validate_plan(plan([node("a")]))
    b = validate_plan({"edges": [], "nodes": [{"status": "pending", "actor": "agent",
                       "title": "step a", "id": "a"}], "reason": "", "title": "plan",
                       "request_id": "other"})  # fmt: skip
    c = validate_plan(plan([node("a", description="more")]))
    assert a.digest == b.digest
    assert a.digest != c.digest
    assert a.digest == content_digest(a.title, a.reason, a.nodes, a.edges)


def test_check_update_without_history_is_empty() -> None:
    assert check_update([node("a")], None) == []
    assert find_cycle(["a", "b"], [("a", "b")]) is None


# --- property: the validator agrees with a naive reference checker ---------------------------

_ID_CHARS = set(string.ascii_letters + string.digits + "_.:-")
_STATUSES = ["pending", "running", "waiting", "completed", "failed", "skipped", "cancelled", "x"]
#: JSON values of the wrong type, for any field: null, numbers, booleans, lists, objects.
_WRONG_TYPES: list[Any] = [None, 0, 2.5, True, [], ["n0"], {}, {"id": "n0"}]
#: The revision 1 a publish may meet: a completed node and a pending one.
PREVIOUS: list[dict[str, Any]] = [
    {"id": "n0", "title": "t", "actor": "agent", "description": "", "evidence": "seen",
     "status": "completed", "reason": None},
    {"id": "n1", "title": "t", "actor": "human", "description": "", "evidence": "",
     "status": "pending", "reason": None},
    {"id": "n2", "title": "t", "actor": "agent", "description": "", "evidence": "",
     "status": "failed", "reason": "why"},
]  # fmt: skip


def _text_code(value: Any, *, required: bool, limit: int, an_id: bool = False) -> str | None:
    """What is wrong with one string field, read plainly (null is absence)."""
    if value is None:
        return "missing_field" if required else None
    if not isinstance(value, str):
        return "invalid_type"
    if required and not value.strip():
        return "missing_field"
    if len(value) > limit or (an_id and not all(ch in _ID_CHARS for ch in value)):
        return "field_too_long"
    return None


def _blank(value: Any) -> bool:
    """An optional text that is absent or empty (a wrong type is its own problem)."""
    return value is None or (isinstance(value, str) and not value.strip())


def reference_codes(payload: dict[str, Any]) -> set[str]:
    """What a plain reading of the rules says is wrong (structure only, no history)."""
    found: set[str] = set()

    def text(value: Any, required: bool, limit: int, an_id: bool = False) -> bool:
        code = _text_code(value, required=required, limit=limit, an_id=an_id)
        if code:
            found.add(code)
        return code is None

    text(payload.get("request_id"), True, 128, an_id=True)
    text(payload.get("title"), True, 200)
    text(payload.get("reason"), False, 2000)
    nodes, edges = payload.get("nodes"), payload.get("edges")
    if nodes is None:
        found.add("missing_field")
        nodes = []
    elif not isinstance(nodes, list):
        found.add("invalid_type")
        nodes = []
    elif not nodes:
        found.add("empty_plan")
    if edges is None:
        edges = []
    elif not isinstance(edges, list):
        found.add("invalid_type")
        edges = []
    if len(nodes) > 40:
        found.add("too_many_nodes")
    if len(edges) > 80:
        found.add("too_many_edges")
    ids = [n["id"] for n in nodes if isinstance(n, dict) and isinstance(n.get("id"), str)]
    if len(set(ids)) != len(ids):
        found.add("duplicate_node_id")
    for n in nodes:
        if not isinstance(n, dict):
            found.add("invalid_type")
            continue
        text(n.get("id"), True, 64, an_id=True)
        text(n.get("title"), True, 200)
        evidence, reason, status = n.get("evidence"), n.get("reason"), n.get("status")
        text(evidence, False, 2000)
        text(reason, False, 2000)
        if not any(n.get("actor") == actor for actor in ("agent", "human")):
            found.add("invalid_actor")
        if not any(status == known for known in _STATUSES[:-1]) or type(status) is not str:
            found.add("invalid_status")
        elif status == "completed" and _blank(evidence):
            found.add("evidence_required")
        elif status in ("failed", "waiting") and _blank(reason):
            found.add("reason_required")
    good = []
    pairs: set[tuple[str, str]] = set()
    for e in edges:
        if not isinstance(e, dict):
            found.add("invalid_type")
            continue
        ends_ok = [text(e.get(end), True, 64) for end in ("from", "to")]
        label_ok = text(e.get("label"), False, 200)  # checked even when an end is bad
        if not (all(ends_ok) and label_ok):
            continue
        if (e["from"], e["to"]) in pairs:
            found.add("duplicate_edge")
        pairs.add((e["from"], e["to"]))
        if e["from"] not in ids or e["to"] not in ids:
            found.add("dangling_edge")
        if e["from"] == e["to"]:
            found.add("self_loop")
        elif e["from"] in ids and e["to"] in ids:
            good.append((e["from"], e["to"]))
    # Kahn: repeatedly remove nodes without incoming edges; anything left sits on a cycle.
    remaining, links = set(ids), set(good)
    while True:
        sources = {v for v in remaining if not any(t == v for _, t in links)}
        if not sources:
            break
        remaining -= sources
        links = {(f, t) for f, t in links if f not in sources}
    if remaining:
        found.add("cycle")
    return found


def reference_update_codes(payload: dict[str, Any], previous: list[dict[str, Any]]) -> set[str]:
    """The history rules read plainly: every old node stays; a completed one never changes; a
    failed one is never reopened or completed (a retry is a new node)."""
    nodes = payload.get("nodes")
    by_id: dict[str, Any] = {}
    for n in nodes if isinstance(nodes, list) else []:
        if isinstance(n, dict) and isinstance(n.get("id"), str):
            by_id[n["id"]] = n  # with duplicate ids (refused anyway) the last one is compared
    found: set[str] = set()
    for old in previous:
        new = by_id.get(old["id"])
        if new is None:
            found.add("node_removed")
        elif old["status"] == "completed" and (
            new.get("title") != old["title"]
            or new.get("evidence") != old["evidence"]
            or new.get("status") != "completed"
        ):
            found.add("completed_node_changed")
        elif old["status"] == "failed" and new.get("status") in (
            "pending",
            "running",
            "waiting",
            "completed",
        ):
            found.add("failed_node_reopened")
    return found


def reference_retry_codes(payload: dict[str, Any], previous: list[dict[str, Any]]) -> set[str]:
    """The retry rule read plainly, for a plan that passed the checks that need no history (the
    rule reads its parsed edges): a retry is a new node, so a new edge may not make a node of
    the previous revision one. From a node of the same actor, no new edge goes into a node that
    was completed or failed; from a failed node, none goes into any node of the previous
    revision (`retry_not_new`). The previous revision here has no edges, so every edge is new."""
    if reference_codes(payload):
        return set()
    before = {old["id"]: old for old in previous}
    now = {n["id"]: n for n in payload["nodes"]}
    for edge in payload.get("edges") or []:
        old, origin = before.get(edge["to"]), now.get(edge["from"], {})
        if old is None or origin.get("actor") != old["actor"]:
            continue
        if old["status"] in ("completed", "failed") or origin.get("status") == "failed":
            return {"retry_not_new"}
    return set()


def reference_authority_codes(
    payload: dict[str, Any], previous: list[dict[str, Any]] | None
) -> set[str]:
    """Who may change what, read plainly, for an agent's publish: an actor never changes; only
    a person completes, fails or skips a human node (keeping a status it had is no change), and
    a human node a person closed keeps its status, reason and evidence."""
    nodes = payload.get("nodes")
    before = {old["id"]: old for old in previous or []}
    found: set[str] = set()
    for n in nodes if isinstance(nodes, list) else []:
        if not isinstance(n, dict) or not isinstance(n.get("id"), str):
            continue
        old = before.get(n["id"])
        if old is not None and n.get("actor") != old["actor"]:
            found.add("actor_changed")
        status = n.get("status")
        human = n.get("actor") == "human" or (old is not None and old["actor"] == "human")
        kept = old is not None and old["status"] == status
        if human and status in ("completed", "failed", "skipped") and not kept:
            found.add("human_node")
        closed_before = old is not None and old["status"] in ("completed", "failed", "skipped")
        # No reason is None, no evidence "": both are how the store keeps nothing.
        rewritten = old is not None and any(
            (n.get(field) or None) != (old.get(field) or None)
            for field in ("reason", "evidence", "evidence_ids")
        )
        if human and closed_before and (not kept or rewritten):
            # What a person closed stays as the person left it: its status, reason and evidence.
            found.add("human_node")
    return found


@st.composite
def plans(draw: st.DrawFn) -> dict[str, Any]:
    """Random plans, from clean to messy: each field goes wrong with a per-plan probability,
    into a wrong value or a value of the wrong type (null, number, list, object)."""
    rate = draw(st.sampled_from([0, 1, 4, 20]))  # out of 40

    def pick(clean: Any, messy: list[Any]) -> Any:
        return draw(st.sampled_from(messy)) if draw(st.integers(0, 39)) < rate else clean

    count = draw(st.one_of(st.integers(0, 8), st.integers(38, 43)))
    pool = [f"n{i}" for i in range(count)]
    nodes: list[Any] = []
    for i in range(count):
        status = pick(draw(st.sampled_from(_STATUSES[:-1])), ["x", *_WRONG_TYPES])
        item = {
            "id": pick(pool[i], ["n0", "bad id", "x" * 65, "", "naïve", *_WRONG_TYPES]),
            "title": pick("t", [" ", "y" * 201, *_WRONG_TYPES]),
            "actor": pick(draw(st.sampled_from(["agent", "human"])), ["robot", *_WRONG_TYPES]),
            "status": status,
        }
        if status == "completed" or draw(st.booleans()):
            item["evidence"] = pick("seen", ["", "  ", *_WRONG_TYPES])
        if status in ("failed", "waiting") or draw(st.booleans()):
            item["reason"] = pick("why", [" ", *_WRONG_TYPES])
        nodes.append(pick(item, [7, None, "node", [item]]))
    targets = [*pool, "ghost"]
    edges: list[Any] = []
    if pool:
        index = st.integers(0, count - 1)
        for a, b in draw(st.lists(st.tuples(index, index), max_size=pick(8, [85]))):
            lo, hi = sorted((a, b))
            if lo == hi and draw(st.integers(0, 39)) >= rate:
                continue
            edge: dict[str, Any] = {
                "from": pick(pool[lo], _WRONG_TYPES),
                "to": pick(pool[hi], _WRONG_TYPES),
            }
            if draw(st.integers(0, 39)) < rate:
                edge["label"] = draw(st.sampled_from([None, "if high", 3, [], {}]))
            edges.append(pick(edge, [None, 3, "a->b", [edge]]))
    for _ in range(pick(0, [1, 2])):
        edges.append({"from": draw(st.sampled_from(targets)), "to": draw(st.sampled_from(targets))})
    return {
        "request_id": pick("r", [None, 5, [], {}, "bad id", "r" * 129]),
        "title": pick("p", [None, 5, {}, " "]),
        "reason": pick("", [None, 5, ["why"]]),
        "nodes": pick(nodes, [None, "nodes", {"n0": nodes}]),
        "edges": pick(edges, [None, "edges", {}]),
    }


@settings(max_examples=400, deadline=None)
@given(payload=plans())
def test_accepted_exactly_when_the_reference_says_valid(payload: dict[str, Any]) -> None:
    expected = reference_codes(payload)
    draft, problems = parse_plan(payload)
    assert {p["code"] for p in problems} == expected
    assert (draft is not None) == (not expected)


@settings(max_examples=300, deadline=None)
@given(payload=plans())
def test_against_a_previous_revision_the_reference_agrees_and_nothing_crashes(
    payload: dict[str, Any],
) -> None:
    expected = reference_codes(payload) | reference_update_codes(payload, PREVIOUS)
    if not expected:
        validate_plan(payload, PREVIOUS)
        return
    assert set(codes(payload, PREVIOUS)) == expected
