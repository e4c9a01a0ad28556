"""Workflows in the admin, the status command and the gauges (decision 0022 §6, increment 10): the
layout's layers (pure); the list with its derived states in one query per page and the live filter;
a diamond's page drawn as SVG (boxes, links to the steps' jobs, states, dashed allow_failure edges);
cancel and redrive refused without their permissions and working with them; workflows counted by
state in ``stats``, ``workhorse_status`` and the gauge."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from html import unescape
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from django_workhorse import EnqueueOptions, EnqueueRequest, Idempotency
from django_workhorse.admin.workflows import redrive_request_id
from django_workhorse.models import Job, JobEvent, Redrive
from django_workhorse.operations import stats
from django_workhorse.workflows import Workflow
from django_workhorse.workflows.layout import BOX_WIDTH, layers, layout
from django_workhorse.workflows.operations import WorkflowStatus, workflow_state
from tests.test_admin import action_choices, body, change_url, login, messages_of, post_action, result_ids
from tests.worker_tasks import run_worker

WORKFLOWS = "/admin/workhorse/workflow/"
VIEW = ("view_workflow", "view_job")


def request(job_type: str = "tests.record", n: int = 1, max_attempts: int = 3) -> EnqueueRequest:
    return EnqueueRequest(job_type, {"n": n}, EnqueueOptions(max_attempts=max_attempts))


def diamond(name: str = "fulfil", *, tolerant_sink: bool = False, key: str | None = None) -> tuple[int, dict[str, int]]:
    """a -> (b, c) -> d; with ``tolerant_sink``, d runs after b's or c's death too (dashed edges)."""
    wf = Workflow(name, idempotency=Idempotency(key) if key else None)
    wf.add("a", request())
    wf.add("b", request(n=2), after="a")
    wf.add("c", request(n=3), after="a")
    wf.add("d", request(n=4), after=["b", "c"], allow_failure=tolerant_sink)
    result = wf.enqueue()
    return result.workflow_id, dict(result.jobs)


def chain_with_a_dying_middle() -> tuple[int, dict[str, int]]:
    wf = Workflow("chain")
    wf.add("a", request())
    wf.add("b", request("tests.always_fail", max_attempts=1), after="a")
    wf.add("c", request(n=3), after="b")
    result = wf.enqueue()
    return result.workflow_id, dict(result.jobs)


def set_status(job_id: int, status: str, finished_at: datetime | None = None) -> None:
    finished = finished_at or (timezone.now() if status in ("succeeded", "dead", "cancelled") else None)
    Job.objects.filter(pk=job_id).update(status=status, finished_at=finished, pending_parents=0)


def statuses(jobs: dict[str, int]) -> dict[str, str]:
    found = dict(Job.objects.filter(pk__in=jobs.values()).values_list("id", "status"))
    return {step: found[job_id] for step, job_id in jobs.items()}


# -- the layout (pure) -------------------------------------------------------------------------------


def test_a_diamond_is_three_layers_and_a_chain_one_step_per_layer():
    assert layers(["a", "b", "c", "d"], [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")]) == [["a"], ["b", "c"], ["d"]]
    assert layers(["a", "b", "c"], [("a", "b"), ("b", "c")]) == [["a"], ["b"], ["c"]]


def test_a_step_sits_below_its_longest_path_from_a_source():
    # a -> b -> c, and a -> c: c is two layers down, not one.
    assert layers(["a", "b", "c"], [("a", "b"), ("b", "c"), ("a", "c")]) == [["a"], ["b"], ["c"]]


def test_each_layer_is_ordered_by_its_parents_mean_position():
    # Sources x, y; y's child comes first among the steps given, but goes after x's child.
    assert layers(["x", "y", "from_y", "from_x"], [("y", "from_y"), ("x", "from_x")]) == [
        ["x", "y"],
        ["from_x", "from_y"],
    ]
    # A child of both sources sits between their children.
    given = ["x", "y", "both", "of_y", "of_x"]
    edges = [("x", "both"), ("y", "both"), ("y", "of_y"), ("x", "of_x")]
    assert layers(given, edges) == [["x", "y"], ["of_x", "both", "of_y"]]


def test_the_layout_puts_a_layer_in_one_column_centred_and_draws_each_edge_from_left_to_right():
    drawn = layout(["a", "b", "c", "d"], [("a", "b", False), ("a", "c", False), ("b", "d", True), ("c", "d", True)])
    boxes = {box.step: box for box in drawn.boxes}

    assert boxes["b"].x == boxes["c"].x > boxes["a"].x and boxes["d"].x > boxes["b"].x
    assert boxes["b"].y < boxes["c"].y and boxes["a"].center_y == boxes["d"].center_y == drawn.height // 2
    assert all(box.x >= 0 and box.x + box.width <= drawn.width and box.y + box.height <= drawn.height
               for box in drawn.boxes)  # fmt: skip
    arrow = next(a for a in drawn.arrows if (a.parent, a.child) == ("b", "d"))
    assert (arrow.x1, arrow.y1, arrow.x2, arrow.y2) == (boxes["b"].x + BOX_WIDTH, boxes["b"].center_y,
                                                        boxes["d"].x, boxes["d"].center_y)  # fmt: skip
    assert arrow.allow_failure and arrow.path.startswith(f"M {arrow.x1} {arrow.y1} C ")


# -- the list ----------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_list_shows_each_workflows_state_from_one_state_query_per_page(client, django_user_model):
    login(client, django_user_model, "viewer", VIEW)
    running_id, _ = diamond("running")
    blocked_id, blocked = diamond("blocked", key="order:4242-secret-tail")
    set_status(blocked["a"], "succeeded")
    set_status(blocked["b"], "dead")
    done_id, done = diamond("done")
    for job_id in done.values():
        set_status(job_id, "succeeded")

    statements: list[str] = []

    def capture(execute: Any, sql: Any, params: Any, many: bool, context: Any) -> Any:
        statements.append(str(sql))  # the text as sent (captured_queries has none for raw statements on Django 5.2)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        response = client.get(WORKFLOWS)

    page = unescape(body(response))
    assert result_ids(response) == {running_id, blocked_id, done_id}
    assert sum("DISTINCT ON (workflow_id, step_name)" in sql for sql in statements) == 1
    rows = dict(re.findall(r'<tr>.*?href="/admin/workhorse/workflow/(\d+)/change/.*?workhorse-flow-(\w+)', page, re.S))
    assert rows == {str(running_id): "running", str(blocked_id): "blocked", str(done_id): "succeeded"}
    assert "order:42…tail" in page and "secret" not in page and "(4/4 done)" in page


@pytest.mark.django_db
def test_a_long_workflow_name_is_cut_to_its_cell_and_whole_on_hover(client, django_user_model):
    login(client, django_user_model, "viewer", VIEW)
    name = "nightly-reconciliation-" + "y" * 177
    diamond(name)

    page = unescape(body(client.get(WORKFLOWS)))

    assert f'<span class="workhorse-cut wide" title="{name}">{name}</span>' in page


@pytest.mark.django_db
def test_the_live_filter_tells_live_workflows_from_finished_ones(client, django_user_model):
    login(client, django_user_model, "viewer", VIEW)
    live_id, _ = diamond("live")
    done_id, done = diamond("done")
    for job_id in done.values():
        set_status(job_id, "cancelled")

    assert result_ids(client.get(f"{WORKFLOWS}?live=yes")) == {live_id}
    assert result_ids(client.get(f"{WORKFLOWS}?live=no")) == {done_id}


# -- a workflow's page -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_diamonds_page_draws_its_steps_as_svg_boxes_linking_to_their_jobs(client, django_user_model):
    login(client, django_user_model, "viewer", VIEW)
    workflow_id, jobs = diamond(tolerant_sink=True)
    set_status(jobs["a"], "succeeded")
    set_status(jobs["b"], "running")
    set_status(jobs["c"], "dead")

    page = body(client.get(change_url(WORKFLOWS, workflow_id)))

    graph = page[page.index('id="workhorse-graph"') :]
    svg = graph[graph.index("<svg") : graph.index("</svg>")]
    boxes = re.findall(r'<a href="([^"]+)" class="workhorse-box" data-step="(\w)" data-status="(\w+)"', svg)
    assert sorted(boxes) == sorted(
        (f"/admin/workhorse/job/{jobs[step]}/change/", step, status)
        for step, status in (("a", "succeeded"), ("b", "running"), ("c", "dead"), ("d", "waiting"))
    )
    assert svg.count('<rect class="workhorse-step workhorse-step-') == 4
    assert 'class="workhorse-step workhorse-step-dead"' in svg
    edges = re.findall(r'data-parent="(\w)" data-child="(\w)" d="[^"]+"( stroke-dasharray="6 4")?', svg)
    assert {(p, c) for p, c, dashed in edges if dashed} == {("b", "d"), ("c", "d")}
    assert {(p, c) for p, c, dashed in edges if not dashed} == {("a", "b"), ("a", "c")}
    assert "<script" not in graph[: graph.index("</svg>")]  # drawn on the server, no JavaScript
    assert "workhorse-flow-running" in page  # d still waits on b: running, not blocked


@pytest.mark.django_db
def test_a_redriven_steps_box_is_its_latest_job_and_its_edges_stay_its_steps(client, django_user_model):
    from django_workhorse import redrive

    login(client, django_user_model, "viewer", VIEW)
    workflow_id, jobs = diamond()
    set_status(jobs["a"], "succeeded")
    set_status(jobs["b"], "dead")
    copy = redrive(jobs["b"], request_id="r1")

    svg = body(client.get(change_url(WORKFLOWS, workflow_id)))

    assert re.search(
        rf'href="/admin/workhorse/job/{copy}/change/" class="workhorse-box" data-step="b" data-status="queued"', svg
    )
    assert f"/admin/workhorse/job/{jobs['b']}/change/" not in svg
    assert sorted(re.findall(r'data-parent="(\w)" data-child="(\w)"', svg)) == [
        ("a", "b"),
        ("a", "c"),
        ("b", "d"),
        ("c", "d"),
    ]


@pytest.mark.django_db
def test_a_long_step_name_is_cut_in_its_box_and_whole_in_its_hover_text(client, django_user_model):
    login(client, django_user_model, "viewer", VIEW)
    long_name = "charge_the_customer_and_reserve_the_stock_" + "x" * 100
    wf = Workflow("long")
    wf.add(long_name, request())
    workflow_id = wf.enqueue().workflow_id

    page = unescape(body(client.get(change_url(WORKFLOWS, workflow_id))))

    assert f"<title>{long_name}: queued" in page
    assert re.search(r'class="workhorse-step-label"[^>]*>charge_the_customer_and_r…</text>', page)


# -- actions -----------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_cancel_and_redrive_are_refused_without_their_permissions(client, django_user_model):
    login(client, django_user_model, "viewer", VIEW)
    workflow_id, jobs = diamond()
    set_status(jobs["a"], "dead")  # b and c wait behind it: blocked, and redrivable

    page = body(client.get(change_url(WORKFLOWS, workflow_id)))
    listing = client.get(WORKFLOWS)
    before = statuses(jobs)
    for action in ("cancel_workflows", "redrive_dead_steps"):
        post_action(client, WORKFLOWS, action, [workflow_id])

    assert 'id="workhorse-workflow-actions"' not in page
    assert not action_choices(listing) & {"cancel_workflows", "redrive_dead_steps"}
    assert statuses(jobs) == before and not Redrive.objects.exists()


@pytest.mark.django_db
def test_each_action_needs_its_own_permission(client, django_user_model):
    login(client, django_user_model, "canceller", (*VIEW, "cancel_job"))
    workflow_id, jobs = diamond()
    set_status(jobs["a"], "dead")

    page = body(client.get(change_url(WORKFLOWS, workflow_id)))

    assert action_choices(client.get(WORKFLOWS)) >= {"cancel_workflows"}
    assert "redrive_dead_steps" not in action_choices(client.get(WORKFLOWS))
    assert 'value="cancel_workflows"' in page and 'value="redrive_dead_steps"' not in page


@pytest.mark.django_db
def test_cancelling_a_workflow_from_the_admin_cascades_to_every_step_and_records_who(client, django_user_model):
    login(client, django_user_model, "ops", (*VIEW, "cancel_job"))
    workflow_id, jobs = diamond()
    untouched_id, untouched = diamond("other")

    response = post_action(client, WORKFLOWS, "cancel_workflows", [workflow_id])

    assert response.status_code == 302
    assert statuses(jobs) == dict.fromkeys("abcd", "cancelled")
    assert set(statuses(untouched).values()) == {"queued", "waiting"}
    assert workflow_state(workflow_id).status == WorkflowStatus.CANCELLED
    who = JobEvent.objects.filter(job_id__in=jobs.values(), kind="cancelled").values_list(
        "details__requested_by", flat=True
    )
    assert set(who) == {"admin:ops"}
    assert messages_of(client.get(WORKFLOWS)) == [
        "Cancelled or asked to stop 4 step(s) of 1 workflow(s); 0 had nothing left to cancel."
    ]


@pytest.mark.django_db(transaction=True)
def test_redriving_dead_steps_from_the_admin_resumes_the_workflow_once_however_often_submitted(
    client, django_user_model
):
    login(client, django_user_model, "ops", (*VIEW, "redrive_job"))
    workflow_id, jobs = chain_with_a_dying_middle()
    run_worker()
    assert workflow_state(workflow_id).status == WorkflowStatus.BLOCKED
    Job.objects.filter(pk=jobs["b"]).update(job_type="tests.record")  # the operator fixed the bug

    for _ in range(2):  # a double submit
        post_action(client, WORKFLOWS, "redrive_dead_steps", [workflow_id])

    redrive_row = Redrive.objects.get()
    assert (redrive_row.source_id, redrive_row.requested_by) == (jobs["b"], "admin:ops")
    assert redrive_row.request_id == redrive_request_id(workflow_id, "b", jobs["b"])
    assert workflow_state(workflow_id).status == WorkflowStatus.RUNNING
    run_worker()
    assert workflow_state(workflow_id).status == WorkflowStatus.SUCCEEDED
    assert statuses(jobs) == {"a": "succeeded", "b": "dead", "c": "succeeded"}


def test_a_redrive_request_id_names_the_workflow_step_and_job_within_its_bound():
    first = redrive_request_id(7, "x" * 200, 2**63 - 1)
    assert len(first) <= 200 and first.startswith("admin:workflow:7:step:") and first.endswith(f":job:{2**63 - 1}")
    assert redrive_request_id(7, "a", 9) != redrive_request_id(7, "b", 9) != redrive_request_id(7, "a", 10)


# -- status and metrics ------------------------------------------------------------------------------


def workflows_in_each_state(now: datetime) -> dict[str, int]:
    """Two running, one blocked, and one each of succeeded, failed and cancelled within the hour;
    one succeeded two hours ago (outside the window)."""
    diamond("running-1")
    running_id, running = diamond("running-2")
    set_status(running["a"], "succeeded", now - timedelta(days=1))  # an old step of a live workflow
    _, blocked = diamond("blocked")
    set_status(blocked["a"], "dead", now - timedelta(minutes=5))
    for name, status, ago in (("ok", "succeeded", 5), ("failed", "dead", 10), ("stopped", "cancelled", 15),
                              ("long ago", "succeeded", 120)):  # fmt: skip
        wf = Workflow(name)
        wf.add("only", request())
        set_status(wf.enqueue().jobs["only"], status, now - timedelta(minutes=ago))
    return {"running": 2, "blocked": 1, "succeeded": 1, "failed": 1, "cancelled": 1}


@pytest.mark.django_db
def test_workflow_counts_count_live_workflows_by_state_and_finished_ones_over_the_window():
    now = timezone.now()
    expected = workflows_in_each_state(now)

    counts = stats.workflow_counts(now=now)

    assert {state: getattr(counts, state) for state in stats.WORKFLOW_STATES} == expected
    assert counts.minutes == stats.THROUGHPUT_MINUTES
    assert stats.workflow_counts(now=now, minutes=180).succeeded == 2
    assert not stats.WorkflowCounts() and counts


@pytest.mark.django_db
def test_the_status_command_prints_workflows_by_state_and_puts_them_in_its_json():
    workflows_in_each_state(timezone.now())

    text, raw = StringIO(), StringIO()
    call_command("workhorse_status", stdout=text)
    call_command("workhorse_status", "--json", stdout=raw)

    assert (
        "\nWorkflows\n2 running, 1 blocked (a dead step holds the rest back); "
        "finished in the last 60 min: 1 succeeded, 1 failed, 1 cancelled\n\n" in text.getvalue()
    )
    assert json.loads(raw.getvalue())["workflows"] == {
        "running": 2, "blocked": 1, "succeeded": 1, "failed": 1, "cancelled": 1, "finished_window_minutes": 60,
    }  # fmt: skip


@pytest.mark.django_db
def test_the_status_command_says_nothing_of_workflows_in_a_project_without_any():
    text = StringIO()
    call_command("workhorse_status", stdout=text)
    assert "Workflows" not in text.getvalue()
