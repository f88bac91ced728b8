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



def test_the_page_offers_each_reader_only_the_moves_the_service_accepts_from_them(ann, ben, human, browser_of):
    """Every reader saw Complete and Reopen on a task in review, and observers
    and readers who never joined an open space the claim buttons and the
    new task form: each answered 403."""
    import re

    from controlplane import services as spaces
    from coordination import services

    # given: an open space of ann's; ben and cy members, dee an observer, eve a reader who never joined
    space = spaces.create_space(slug="yard", name="Yard", visibility="open", send_policy="open", actor=ann)
    cy, dee, eve = human("cy"), human("dee"), human("eve")
    for member in (ben, cy):
        spaces.join_space(space, actor=member)
    spaces.add_member(space, dee, role="observer", actor=ann)
    review = services.create_task(space, title="Review", actor=ann)
    services.claim_task(space, review.public_id, actor=cy)
    services.submit_task(space, review.public_id, actor=cy)
    theirs = services.create_task(space, title="Theirs", assignee="@cy", actor=ann)
    mine = services.create_task(space, title="Mine", actor=ann)
    services.claim_task(space, mine.public_id, actor=ben)

    def offered(member) -> tuple[set[tuple[str, str]], bool]:
        page = browser_of(member).get("/app/spaces/yard/tasks/").content.decode()
        moves = set(re.findall(r"/app/spaces/yard/tasks/(tsk_\w+)/(\w+)\"", page))
        return moves, "/app/spaces/yard/tasks/new" in page

    ids = {review.public_id: "review", theirs.public_id: "theirs", mine.public_id: "mine"}
    # when / then
    offers = {member.handle: offered(member) for member in (ann, ben, cy, dee, eve)}
    named = {handle: ({(ids[task], move) for task, move in moves}, form) for handle, (moves, form) in offers.items()}
    assert named == {
        "ann": ({("review", "complete"), ("review", "reopen"), ("theirs", "claim"), ("mine", "release")}, True),
        "ben": ({("mine", "submit"), ("mine", "release")}, True),
        "cy": ({("theirs", "claim")}, True),
        "dee": (set(), False),
        "eve": (set(), False),
    }
    # and what the page offers, the service accepts
    for member, task, move in ((ann, review, "complete"), (ben, mine, "submit"), (cy, theirs, "claim")):
        assert browser_of(member).post(f"/app/spaces/yard/tasks/{task.public_id}/{move}").status_code == 302
    assert [Task.objects.get(pk=task.pk).status for task in (review, mine, theirs)] == ["done", "in_review", "claimed"]


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
