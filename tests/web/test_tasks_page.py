"""The tasks page: list, create, claim and the rest, with the API's rules."""
import pytest

from coordination.models import Task

pytestmark = pytest.mark.django_db


def test_create_claim_submit_and_discuss_from_the_page(room, ann, ben, browser_of):
    # given
    space, _ = room
    as_ann, as_ben = browser_of(ann), browser_of(ben)
    # when: ann creates a task, ben claims and submits it
    created = as_ann.post("/app/spaces/room/tasks/new", {"title": "Draft the plan", "description": "One page."})
    task = Task.objects.get()
    claimed = as_ben.post(f"/app/spaces/room/tasks/{task.public_id}/claim")
    page = as_ben.get("/app/spaces/room/tasks/").content.decode()
    as_ben.post(f"/app/spaces/room/tasks/{task.public_id}/submit")
    in_review = as_ann.get("/app/spaces/room/tasks/?status=in_review").content.decode()
    # then
    assert created.status_code == claimed.status_code == 302
    assert "Draft the plan" in page and "claimed by @ben" in page
    assert f"/app/spaces/room/{task.conversation.public_id}/" in page  # the discussion
    assert f"/app/spaces/room/tasks/{task.public_id}/submit" in page
    assert "Draft the plan" in in_review and f"/app/spaces/room/tasks/{task.public_id}/complete" in in_review
    discussion = as_ben.get(f"/app/spaces/room/{task.conversation.public_id}/").content.decode()
    assert "Task: Draft the plan" in discussion
    # the home page lists the tasks page, not every task's discussion
    home = as_ann.get("/app/").content.decode()
    assert "/app/spaces/room/tasks/" in home and "Task: Draft the plan" not in home


def test_a_refused_action_is_a_clear_error_and_changes_nothing(room, ann, ben, human, browser_of):
    # given: ben claimed it; ann (not the claimant) tries to submit it
    space, _ = room
    browser_of(ann).post("/app/spaces/room/tasks/new", {"title": "Mine"})
    task = Task.objects.get()
    browser_of(ben).post(f"/app/spaces/room/tasks/{task.public_id}/claim")
    # when
    response = browser_of(ann).post(f"/app/spaces/room/tasks/{task.public_id}/submit")
    outsider = browser_of(human("cy")).get("/app/spaces/room/tasks/")
    unknown = browser_of(ann).post(f"/app/spaces/room/tasks/{task.public_id}/explode")
    empty = browser_of(ann).post("/app/spaces/room/tasks/new", {"title": "  "})
    # then
    assert response.status_code == 403 and Task.objects.get().status == "claimed"
    assert outsider.status_code == 404 and unknown.status_code == 404
    assert empty.status_code == 400 and Task.objects.count() == 1



def test_every_task_can_be_reached_page_by_page_newest_first(room, ann, ben, browser_of, monkeypatch):
    """The page showed the newest 200 and no more, with no way on: the API
    listed the rest, the web app could neither show nor claim them."""
    import html
    import re

    from coordination import services

    monkeypatch.setattr("web.views.tasks.PAGE_TASKS", 2)
    space, _ = room
    for n in range(5):
        services.create_task(space, title=f"task {n}", actor=ann)
    as_ben, pages, url = browser_of(ben), [], "/app/spaces/room/tasks/?status=open"
    # when: ben follows the older-tasks link to the end
    while url:
        page = as_ben.get(url).content.decode()
        pages.append(re.findall(r'<span class="title">(.*?)</span>', page))
        older = re.search(r'<a href="(\?[^"]*older=[^"]*)">Older tasks</a>', page)
        url = "/app/spaces/room/tasks/" + html.unescape(older.group(1)) if older else None
    # then: each once, newest first, the filter kept; the last page leads back
    assert pages == [["task 4", "task 3"], ["task 2", "task 1"], ["task 0"]]
    assert "Back to the newest tasks" in page
    # and: a cursor is its member's, on its list
    mine = re.search(r"older=([^\"&]+)", as_ben.get("/app/spaces/room/tasks/?status=open").content.decode()).group(1)
    assert browser_of(ann).get(f"/app/spaces/room/tasks/?status=open&older={mine}").status_code == 400
    assert as_ben.get(f"/app/spaces/room/tasks/?older={mine}").status_code == 400
