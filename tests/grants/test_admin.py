"""An approver finds, reads and decides requests in the admin pages and on
the staff approval queue, without the API."""
import html
import re

import pytest
from django.test import Client

from controlplane import services
from grants.models import ApprovalRequest, Grant
from inbox.models import Message
from tests.grants.conftest import send_path

BODY = "Ship <b>it</b> & tell @carol\nline two"


@pytest.fixture
def pending(bob_to_carol, as_bob):
    response = as_bob.post(send_path(bob_to_carol), {"body": BODY, "request_approval": True},
                           headers={"Idempotency-Key": "ship-00001"})
    return ApprovalRequest.objects.get(public_id=response.json()["error"]["details"]["approval_request"]["id"])


@pytest.fixture
def approver(root):
    """A browser session that signed in through the admin's login form."""
    client = Client(enforce_csrf_checks=True)
    page = client.get("/admin/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode()).group(1)
    signed_in = client.post("/admin/login/?next=/admin/", {"username": "root", "password": "root-pass-123",
                                                           "csrfmiddlewaretoken": token})
    assert signed_in.status_code == 302 and signed_in["Location"] == "/admin/"
    return client


def csrf(client, page) -> str:
    return re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode()).group(1)


def test_an_approver_finds_reads_and_approves_in_the_admin(pending, approver, carol):
    # when: the approver opens the pending queue
    queue = approver.get("/admin/grants/approvalrequest/?status__exact=pending")
    # then: the request is listed, with a link to its page
    assert queue.status_code == 200
    link = re.search(rf'href="(/admin/grants/approvalrequest/\d+/change/[^"]*)">{pending.public_id}<',
                     queue.content.decode()).group(1)
    # when: they open it
    page = approver.get(html.unescape(link))
    text = page.content.decode()
    # then: the whole retained message is shown (escaped), and nothing is editable
    assert html.escape(BODY) in text and "@bob" in text and "@carol" in text and "ship-00001" in text
    assert pending.fingerprint in text
    assert 'name="body"' not in text and "_save" not in text
    # when: they approve it
    approved = approver.post(f"/admin/grants/approvalrequest/{pending.pk}/approve/",
                             {"csrfmiddlewaretoken": csrf(approver, page)})
    # then: the message is sent exactly, under a one-message grant, and the decision recorded
    assert approved.status_code == 302
    pending.refresh_from_db()
    assert pending.status == "approved" and pending.decided_by.handle == "root" and pending.decided_at
    assert Message.objects.get().body == BODY and pending.message == Message.objects.get()
    assert Grant.objects.get().message == pending.message
    after = approver.get(approved["Location"]).content.decode()
    assert "the message was sent" in after and "Approve and send" not in after


def test_deny_from_the_list_asks_for_a_reason(pending, approver):
    # given
    listing = approver.get("/admin/grants/approvalrequest/")
    token = csrf(approver, listing)
    selection = {"action": "deny_selected", "_selected_action": [pending.pk], "csrfmiddlewaretoken": token}
    # when: the action is chosen, a page asks why
    asked = approver.post("/admin/grants/approvalrequest/", selection)
    assert asked.status_code == 200 and "Reason" in asked.content.decode()
    assert html.escape(BODY) in asked.content.decode()
    # when: the reason is given
    done = approver.post("/admin/grants/approvalrequest/", {**selection, "reason": "Not now."})
    # then
    assert done.status_code == 302
    pending.refresh_from_db()
    assert (pending.status, pending.reason, pending.decided_by.handle) == ("denied", "Not now.", "root")
    assert not Message.objects.exists()


def test_the_staff_queue_shows_and_decides_requests(pending, approver):
    # when
    page = approver.get("/staff/approvals/")
    text = page.content.decode()
    # then
    assert page.status_code == 200 and pending.public_id in text and html.escape(BODY) in text
    # when
    approver.post(f"/staff/approvals/{pending.public_id}/approve", {"csrfmiddlewaretoken": csrf(approver, page)})
    # then
    pending.refresh_from_db()
    assert pending.status == "approved" and Message.objects.get().body == BODY
    assert "No request is waiting." in approver.get("/staff/approvals/").content.decode()


@pytest.mark.parametrize("reason, status, code", [("no\x00", 422, "INVALID_BODY"), ("", 400, "INVALID_REQUEST"),
                                                  ("r" * 5000, 400, "INVALID_REQUEST")])
def test_a_refused_denial_is_a_clear_4xx_on_the_queue_and_decides_nothing(pending, approver, reason, status, code):
    """A refused decision was a 302 back to the queue, the reason in a flash."""
    page = approver.get("/staff/approvals/")
    answer = approver.post(f"/staff/approvals/{pending.public_id}/deny",
                           {"csrfmiddlewaretoken": csrf(approver, page), "reason": reason})
    pending.refresh_from_db()
    assert answer.status_code == status and pending.status == "pending"
    text = answer.content.decode()
    assert f"Request {pending.public_id}: " in text and f"({code})" in text and 'name="reason"' in text


def test_the_staff_queue_says_how_many_more_wait_past_its_page(pending, grant, approver, monkeypatch):
    # given: a page of one, two grants in force
    from grants import views

    grant("grt_one", "project")
    grant("grt_two", "pair", sender="@bob", recipient="@carol")
    monkeypatch.setattr(views, "QUEUE_PAGE", 1)
    alone = approver.get("/staff/approvals/").content.decode()
    ApprovalRequest.objects.create(**{f.attname: getattr(pending, f.attname) for f in ApprovalRequest._meta.fields
                                      if f.attname not in ("id", "public_id", "idempotency_key")},
                                   idempotency_key="ship-00002")
    # when
    text = approver.get("/staff/approvals/").content.decode()
    # then: the oldest request and the newest grant, and how many more there are, with where to find them
    assert "The oldest 1 of 2 waiting requests are shown" in text and "more-requests" not in alone
    assert "The newest 1 of 2 grants in force are shown" in text and "grt_two" in text and "grt_one" not in text
    assert 'href="/admin/grants/approvalrequest/?status__exact=pending"' in text
    assert 'href="/admin/grants/grant/"' in text


def test_the_staff_queue_is_for_staff_only(pending, make_member):
    make_member("walt", kind="human", password="walt-pass-123")
    client = Client()
    assert client.login(username="walt", password="walt-pass-123")
    page = client.get("/staff/approvals/")
    assert page.status_code == 302 and "/admin/login/" in page["Location"]
    client.post(f"/staff/approvals/{pending.public_id}/approve")
    assert ApprovalRequest.objects.get().status == "pending"


def test_the_staff_page_lists_grants_in_force_and_revokes_them(grant, approver, make_member, bob, carol):
    # given
    pair = grant("grt_pair-bob-carol", "pair", sender="@bob", recipient="@carol")
    page = approver.get("/staff/approvals/")
    assert pair.public_id in page.content.decode()
    # when a staff user who is not an admin member tries, and then the approver does
    make_member("walt", kind="human", password="walt-pass-123")
    other = Client()
    assert other.login(username="walt", password="walt-pass-123")
    other.post(f"/staff/grants/{pair.space.slug}/{pair.public_id}/revoke")
    unchanged = Grant.objects.get(pk=pair.pk).status
    approver.post(f"/staff/grants/{pair.space.slug}/{pair.public_id}/revoke",
                  {"csrfmiddlewaretoken": csrf(approver, page)})
    # then
    assert unchanged == "active" and Grant.objects.get(pk=pair.pk).status == "revoked"
    after = approver.get("/staff/approvals/").content.decode()
    assert f"Grant {pair.public_id} is revoked." in after and "No grant is in force." in after


def test_the_staff_page_names_the_message_a_grant_was_spent_on_and_asks_before_revoking(grant, approver, bob, carol):
    """A spent one-message grant is still in force (revoking it withdraws
    its message), but it looked like any other, one click from revoking."""
    from inbox.services import send_message

    spent = grant("grt_once", "one_message", sender="@bob", recipient="@carol", idempotency_key="key-once-1")
    direct, _ = services.get_or_create_direct(spent.space, carol, actor=bob)
    message = send_message(direct, body="approved", idempotency_key="key-once-1", actor=bob).message
    assert Grant.objects.get(pk=spent.pk).message_id == message.pk
    page = approver.get("/staff/approvals/").content.decode()
    assert f"spent on {message.public_id}" in page
    assert f'data-confirm="Revoke grt_once? The message it was spent on, {message.public_id}, is withdrawn' in page


def test_the_staff_page_revokes_the_grant_of_its_space_where_two_spaces_use_one_id(grant, approver, carol):
    # given: the same id in another space (ids are unique within a space only)
    from controlplane import services
    from grants import services as grants

    other = services.create_space(slug="other", name="Other", visibility="open", send_policy="explicit_only",
                                  actor=carol)
    mine = grant("grt_shared", "project")
    theirs, _ = grants.create_grant(other, grant_id="grt_shared", kind="project", actor=carol)
    page = approver.get("/staff/approvals/")
    # when
    response = approver.post("/staff/grants/other/grt_shared/revoke", {"csrfmiddlewaretoken": csrf(approver, page)})
    # then: that space's grant, and no other
    assert response.status_code == 302
    assert Grant.objects.get(pk=theirs.pk).status == "revoked" and Grant.objects.get(pk=mine.pk).status == "active"


def test_the_queue_and_the_lists_cost_the_same_queries_however_many_requests_and_grants(pending, grant, approver,
                                                                                       as_root, make_member):
    """Each request's recipients were a query of their own (the staff queue,
    the API's list, the admin's list), and each grant's members three; the
    admin's lists also offered every space of the host as a filter."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from controlplane.models import Space

    def queries() -> dict[str, int]:
        counts = {}
        for path in ("/staff/approvals/", "/admin/grants/approvalrequest/", "/admin/grants/grant/"):
            with CaptureQueriesContext(connection) as captured:
                assert approver.get(path).status_code == 200
            counts[path] = len(captured)
        with CaptureQueriesContext(connection) as captured:
            assert as_root.get("/v0/approval-requests").status_code == 200
        counts["GET /v0/approval-requests"] = len(captured)
        return counts

    def more(n: int, start: int) -> None:
        fields = {f.attname: getattr(pending, f.attname) for f in ApprovalRequest._meta.fields
                  if f.attname not in ("id", "public_id", "idempotency_key")}
        for i in range(start, start + n):
            ApprovalRequest.objects.create(**fields, idempotency_key=f"ship-{i:05d}")
            handle = f"m{i}"
            make_member(handle)
            services.join_space(pending.space, actor=type(pending.sender).objects.get(handle=handle))
            grant(f"grt_g{i}", "pair", sender=f"@{handle}", recipient="@carol")

    more(1, 100)
    queries()  # the first asks for what is then remembered (on Redis: the credential)
    few = queries()
    more(5, 200)
    many = queries()
    assert many == few
    Space.objects.create(slug="other-space", name="Other", created_by=pending.sender)
    assert "other-space" not in approver.get("/admin/grants/grant/").content.decode()  # no list of every space
