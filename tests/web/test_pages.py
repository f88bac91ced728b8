"""The web app's pages: access exactly as the API, conversations, the composer."""
import json
import re

import pytest
from django.test import Client

from controlplane import services
from controlplane.models import Space
from inbox.models import Message
from inbox.services import send_message
from tests.conftest import clear_of_window_edge, error_code

pytestmark = pytest.mark.django_db


def post_json(client, url, data):
    return client.post(url, json.dumps(data), content_type="application/json", HTTP_ACCEPT="application/json")


def page_url(space, conversation):
    return f"/app/spaces/{space.slug}/{conversation.public_id}/"


# --- spaces and conversations ----------------------------------------------------------

def test_a_space_of_many_conversations_lists_some_on_home_and_the_rest_a_page_at_a_time(ann, ben, room, browser_of,
                                                                                         monkeypatch):
    """Both pages listed every conversation of every space: an owner who
    adds someone to a space of 1,000 channels made their home page 2 s and
    800 KB on every load."""
    from web.views import spaces
    from web.views.conversations import HOME_LISTED

    # given ben in ann's space, which has more channels than home lists
    space, _ = room
    for n in range(HOME_LISTED + 4):
        services.create_channel(space, f"c{n:02}", actor=ann)
    monkeypatch.setattr(spaces, "LISTED", 10)
    client = browser_of(ben)
    # when he opens his home page, then the space's pages
    home = client.get("/app/").content.decode()
    pages, url = [], "/app/spaces/room/"
    while url:
        page = client.get(url).content.decode()
        pages.append(re.findall(r">#(c\d\d|general)</a>", page))
        found = re.search(r'<a href="(\?from=\d+)">More conversations', page)
        url = found and f"/app/spaces/room/{found[1]}"
    # then home lists the first of them with a way to the rest, and the space's pages list every one once
    assert len(re.findall(r">#(?:c\d\d|general)</a>", home)) == HOME_LISTED
    assert "All conversations of Room" in home
    assert [len(listed) for listed in pages] == [10, 10, 5]
    assert sorted(sum(pages, [])) == sorted([f"c{n:02}" for n in range(HOME_LISTED + 4)] + ["general"])



def test_home_costs_the_same_however_many_spaces_and_lists_only_so_many_open_ones(ann, ben, browser_of):
    """Home listed every open space on the host with its channels, two
    queries a space: any member could make everyone's home page slow."""
    from web.views.conversations import OPEN_LISTED

    def home_queries() -> int:
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        with CaptureQueriesContext(connection) as queries:
            assert browser_of(ann).get("/app/").status_code == 200
        return len(queries)

    # given: ann in three spaces with channels; ben's open spaces, more than are listed
    for n in range(3):
        space = services.create_space(slug=f"ann-{n}", name=f"Ann {n}", visibility="open", send_policy="open",
                                      actor=ann)
        services.create_channel(space, "general", actor=ann)
    few = home_queries()
    for n in range(OPEN_LISTED + 5):
        services.create_space(slug=f"ben-{n:03}", name=f"Ben {n}", visibility="open", send_policy="open", actor=ben)
    for n in range(3, 13):
        space = services.create_space(slug=f"ann-{n}", name=f"Ann {n}", visibility="open", send_policy="open",
                                      actor=ann)
        services.create_channel(space, "general", actor=ann)
    # when
    page = browser_of(ann).get("/app/").content.decode()
    # then: all of her spaces with their channels, the first open ones, and a way to the rest
    assert all(f"/app/spaces/ann-{n}/" in page for n in range(13)) and page.count("#general") == 13
    assert "ben-000" in page and f"ben-{OPEN_LISTED - 1:03}" in page and f"ben-{OPEN_LISTED:03}" not in page
    assert "find one by its slug" in page
    assert home_queries() == few


def test_home_lists_only_what_the_member_can_read(ann, ben, human, room, browser_of):
    space, channel = room
    cid = human("cid")
    direct, _ = services.get_or_create_direct(space, ben, actor=ann)
    services.create_space(slug="secret", name="Secret", visibility="private", send_policy="open", actor=cid)
    # when
    page = browser_of(ben).get("/app/").content.decode()
    outsider = browser_of(cid).get("/app/").content.decode()
    # then
    assert page_url(space, channel) in page and page_url(space, direct) in page and "@ann" in page
    assert "secret" not in page
    assert page_url(space, channel) not in outsider and "secret" in outsider


def test_a_conversation_the_member_cannot_read_is_a_404_page(ann, human, room, browser_of):
    space, channel = room
    response = browser_of(human("cid")).get(page_url(space, channel))
    assert response.status_code == 404 and "NOT_FOUND" in response.content.decode()


def test_direct_conversations_are_for_their_two_members_only(ann, ben, human, room, browser_of):
    space, _ = room
    cid = human("cid")
    services.add_member(space, cid, actor=ann)
    direct, _ = services.get_or_create_direct(space, ben, actor=ann)
    assert browser_of(ben).get(page_url(space, direct)).status_code == 200
    assert browser_of(cid).get(page_url(space, direct)).status_code == 404


def test_history_pages_upward_without_overlap(ann, ben, room, browser_of, settings):
    space, channel = room
    sent = [send_message(channel, body=f"message {i}", actor=ann).message for i in range(120)]
    client = browser_of(ben)
    # when: the page shows the newest 50, then the pager walks up
    page = client.get(page_url(space, channel)).content.decode()
    older = client.get(f"{page_url(space, channel)}history?before={sent[70].position}",
                       HTTP_ACCEPT="application/json").json()
    oldest = client.get(f"{page_url(space, channel)}history?before={older['rows'][0]['position']}",
                        HTTP_ACCEPT="application/json").json()
    # then
    assert "message 119" in page and "message 70" in page and "message 69" not in page
    assert [r["id"] for r in older["rows"]] == [m.public_id for m in sent[20:70]] and older["more"]
    assert [r["id"] for r in oldest["rows"]] == [m.public_id for m in sent[:20]] and not oldest["more"]
    assert f'data-after="{sent[-1].position}"' in page


def test_a_bad_history_position_is_a_clear_400(ann, room, browser_of):
    space, channel = room
    response = browser_of(ann).get(f"{page_url(space, channel)}history?before=abc", HTTP_ACCEPT="application/json")
    assert response.status_code == 400 and response.json()["error"]["code"] == "INVALID_REQUEST"


def test_message_bodies_are_escaped(ann, ben, room, browser_of):
    space, channel = room
    send_message(channel, body="<script>alert(1)</script>", actor=ann)
    page = browser_of(ben).get(page_url(space, channel)).content.decode()
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page



def test_the_web_apps_pages_allow_no_inline_script_and_no_framing(ann, human, room, browser_of):
    from web.pages import CONTENT_SECURITY_POLICY

    space, channel = room
    staff = browser_of(human("root", is_admin=True))
    answers = [browser_of(ann).get(path) for path in ("/app/", page_url(space, channel), "/app/inbox/")]
    answers += [Client().get("/app/login/"), Client().get("/app/"), staff.get("/staff/approvals/")]
    assert [a.headers.get("Content-Security-Policy") for a in answers] == [CONTENT_SECURITY_POLICY] * 6
    assert "script-src" not in CONTENT_SECURITY_POLICY and "'unsafe-inline'" not in CONTENT_SECURITY_POLICY
    # the admin (inline scripts of its own) and the API go without
    assert "Content-Security-Policy" not in staff.get("/admin/").headers
    assert "Content-Security-Policy" not in Client().get("/v0/spaces/lab").headers


def test_pages_of_a_members_own_are_never_kept_by_a_browser_or_a_cache(ann, human, room, browser_of):
    space, channel = room
    staff = browser_of(human("root", is_admin=True))
    member = browser_of(ann)
    answers = [member.get(path) for path in ("/app/", page_url(space, channel), "/app/inbox/", "/app/credentials/",
                                             "/app/subscriptions/", "/app/spaces/nowhere/")]
    answers.append(staff.get("/staff/approvals/"))
    assert [a.status_code for a in answers] == [200] * 5 + [404, 200]
    assert all({"no-store", "private"} <= set(a.headers["Cache-Control"].replace(" ", "").split(",")) for a in answers)


# --- the composer ----------------------------------------------------------------------------

def test_the_composer_sends_the_exact_body_once_per_key(ann, room, browser_of):
    space, channel = room
    client = browser_of(ann)
    body = "line one\nline two  \n\n— ünïcode"
    # when
    first = post_json(client, f"{page_url(space, channel)}send", {"body": body, "idempotency_key": "web-key-000001"})
    again = post_json(client, f"{page_url(space, channel)}send", {"body": body, "idempotency_key": "web-key-000001"})
    # then
    assert first.status_code == 201 and again.status_code == 200
    assert first.json()["message"]["id"] == again.json()["message"]["id"]
    assert Message.objects.get().body == body
    assert f'id="m-{first.json()["message"]["position"]}"' in first.json()["message"]["html"]


def test_the_composer_answers_a_retry_with_the_original_after_its_sender_left(ann, ben, room, browser_of):
    # given: ben sent with a key, and was removed from the private space since
    space, channel = room
    client, form = browser_of(ben), {"body": "before I left", "idempotency_key": "web-left-0001"}
    first = post_json(client, f"{page_url(space, channel)}send", form)
    services.remove_member(space, ben, actor=ann)
    # when: the page retries the same send
    again = post_json(client, f"{page_url(space, channel)}send", form)
    # then: the original, as the API answers it; a new send is refused
    assert first.status_code == 201 and again.status_code == 200
    assert again.json()["message"]["id"] == first.json()["message"]["id"]
    assert post_json(client, f"{page_url(space, channel)}send", {"body": "new", "idempotency_key": "web-left-0002"}
                     ).status_code == 404


def test_the_form_without_scripts_sends_line_breaks_as_typed(ann, room, browser_of):
    space, channel = room
    response = browser_of(ann).post(f"{page_url(space, channel)}send",
                                    {"body": "a\r\nb", "idempotency_key": "web-nojs-1"})
    assert response.status_code == 302 and Message.objects.get().body == "a\nb"


def test_a_draft_given_back_without_scripts_keeps_its_first_line_break(ann, room, browser_of):
    # given a draft that starts with a line break, refused (too long)
    space, channel = room
    draft = "\nsecond line " + "x" * 8192
    response = browser_of(ann).post(f"{page_url(space, channel)}send", {"body": draft, "idempotency_key": "web-nojs-2"})
    # then the page gives it back whole: an HTML parser drops one line break right after <textarea>
    assert response.status_code == 413
    given = re.search(r'<textarea id="body"[^>]*>(.*?)</textarea>', response.content.decode(), re.S).group(1)
    assert given == "\n" + draft


@pytest.mark.parametrize("data, code", [
    ({"body": ""}, "INVALID_BODY"),
    ({"body": "x" * 8193}, "BODY_TOO_LARGE"),
    ({"body": "a\u0000b"}, "INVALID_BODY"),
    ({"body": "hi", "idempotency_key": "short"}, "INVALID_IDEMPOTENCY_KEY"),
    ({"text": "hi"}, "INVALID_REQUEST"),
])
def test_bad_sends_are_clear_errors_and_change_nothing(ann, room, browser_of, data, code):
    space, channel = room
    response = post_json(browser_of(ann), f"{page_url(space, channel)}send", data)
    assert 400 <= response.status_code < 500 and response.json()["error"]["code"] == code
    assert not Message.objects.exists()


@pytest.mark.parametrize("body", ["   ", "\n", "", "x" * 8193, "a\u0000b", "ok"])
def test_the_composer_accepts_and_refuses_exactly_what_the_api_does(ann, room, browser_of, api_for, body):
    # given
    space, channel = room
    api = api_for(ann)
    # when: the same body through the API and through the composer
    by_api = api.post(f"/v0/spaces/{space.slug}/conversations/{channel.public_id}/messages", {"body": body})
    by_web = post_json(browser_of(ann), f"{page_url(space, channel)}send", {"body": body})
    # then
    assert by_web.status_code == by_api.status_code
    if by_api.status_code >= 400:
        assert by_web.json()["error"]["code"] == by_api.json()["error"]["code"]
    else:
        assert Message.objects.filter(body=body).count() == 2


def test_an_action_that_lost_redis_is_a_503_to_retry_in_every_form_and_changes_nothing(
        ann, room, browser_of, lost_redis):
    # given: the cache the actions' rate limit counts in refuses connections (lost_redis)
    space, channel = room
    client, url = browser_of(ann), f"{page_url(space, channel)}send"
    form = {"body": "hi", "idempotency_key": "web-lost-0001"}
    # when: the same send from a browser's form, from htmx and from a script
    page = client.post(url, form, headers={"Accept": "text/html"})
    fragment = client.post(url, form, headers={"HX-Request": "true"})
    scripted = post_json(client, url, form)
    # then: each says retry, the way it can show it, and nothing was sent
    for response in (page, fragment, scripted):
        assert response.status_code == 503 and response["Retry-After"] == "1"
    assert b"briefly unavailable" in page.content and b"UNAVAILABLE" in page.content
    assert fragment["HX-Retarget"] == "#htmx-error" and b"UNAVAILABLE" in fragment.content
    assert error_code(scripted) == "UNAVAILABLE" and scripted.json()["error"]["details"] == {"retry_after": 1}
    assert not Message.objects.exists()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_page_that_lost_the_database_before_its_session_is_a_503_that_reads_nothing(ann, room, browser_of):
    # given: a signed-in browser, and every connection to the database cut
    # before each request (as a restart does), so its session cannot be read
    from django.db import connection

    from tests.servers import cut_every_database_connection
    space, channel = room
    client = browser_of(ann)
    answers = []
    for headers in ({"Accept": "text/html"}, {"HX-Request": "true"}, {"Accept": "application/json"}):
        cut_every_database_connection()
        # when
        answers.append(client.get(page_url(space, channel), headers=headers))
    page, fragment, scripted = answers
    # then: each form says retry; the page and the fragment were rendered without the database
    for response in answers:
        assert response.status_code == 503 and response["Retry-After"] == "1"
    assert b"briefly unavailable" in page.content
    assert fragment["HX-Retarget"] == "#htmx-error" and b"UNAVAILABLE" in fragment.content
    assert error_code(scripted) == "UNAVAILABLE"
    connection.close()
    connection.close_pool()  # the pool's other cut connections would fail the test's own teardown


def test_observers_and_outsiders_cannot_send(ann, human, room, browser_of):
    space, channel = room
    watcher = human("watcher")
    services.add_member(space, watcher, role="observer", actor=ann)
    observer = post_json(browser_of(watcher), f"{page_url(space, channel)}send", {"body": "hi"})
    outsider = post_json(browser_of(human("cid")), f"{page_url(space, channel)}send", {"body": "hi"})
    assert observer.status_code == 403 and observer.json()["error"]["code"] == "FORBIDDEN"
    assert outsider.status_code == 404
    assert not Message.objects.exists()


def test_an_archived_spaces_pages_offer_no_write_forms(ann, room, browser_of):
    space, channel = room
    client = browser_of(ann)
    assert 'id="composer"' in client.get(page_url(space, channel)).content.decode()
    Space.objects.filter(pk=space.pk).update(archived=True)
    page = client.get(page_url(space, channel)).content.decode()
    assert 'id="composer"' not in page and "This space is archived" in page


def test_without_a_grant_the_composer_offers_and_files_an_approval_request(ann, ben, browser_of):
    from grants.models import ApprovalRequest

    space = services.create_space(slug="guarded", name="Guarded", visibility="private", send_policy="explicit_only",
                                  actor=ann)
    services.add_member(space, ben, actor=ann)
    direct, _ = services.get_or_create_direct(space, ann, actor=ben)
    url = f"{page_url(space, direct)}send"
    client = browser_of(ben)
    # when
    refused = post_json(client, url, {"body": "may I?", "idempotency_key": "web-approval-1"})
    requested = post_json(client, url, {"body": "may I?", "idempotency_key": "web-approval-1",
                                        "request_approval": True})
    # then
    assert refused.status_code == 403 and refused.json()["error"]["details"]["recipients"] == ["@ann"]
    assert requested.json()["error"]["details"]["approval_request"]["body"] == "may I?"
    assert ApprovalRequest.objects.get().body == "may I?" and not Message.objects.exists()
    # and without scripts the page says what happened and offers the button
    page = client.post(url, {"body": "may I?", "idempotency_key": "web-approval-2"}).content.decode()
    assert "GRANT_REQUIRED" in page and 'name="request_approval"' in page and "may I?" in page
    kept = client.post(url, {"body": "may I?", "idempotency_key": "web-approval-2", "request_approval": "1"})
    assert "Sent to an admin for approval" in kept.content.decode()
    assert ">may I?</textarea>" not in kept.content.decode() and "web-approval-2" not in kept.content.decode()


def test_an_expired_form_is_a_clear_page(ann, room):
    space, channel = room
    client = Client(enforce_csrf_checks=True)
    client.force_login(ann.user)
    response = client.post(f"{page_url(space, channel)}send", {"body": "hi"}, HTTP_ACCEPT="text/html")
    assert response.status_code == 403 and "Reload the page" in response.content.decode()
    assert not Message.objects.exists()


def test_joining_an_open_space_from_home(ann, ben, browser_of):
    space = services.create_space(slug="plaza", name="Plaza", visibility="open", send_policy="open", actor=ann)
    response = browser_of(ben).post(f"/app/spaces/{space.slug}/join", follow=True)
    assert response.redirect_chain[0][1] == 302 and "You joined plaza." in response.content.decode()
    assert space.memberships.filter(member=ben, status="active").exists()
    # and again, or by the owner of a private space, it says so (the owner's was a 404 page)
    again = browser_of(ben).post(f"/app/spaces/{space.slug}/join", follow=True)
    assert "You are in plaza already." in again.content.decode()
    vault = services.create_space(slug="vault", name="Vault", visibility="private", send_policy="open", actor=ann)
    assert "You are in vault already." in browser_of(ann).post(f"/app/spaces/{vault.slug}/join",
                                                                 follow=True).content.decode()


def test_deeply_nested_json_to_the_composer_is_400_as_in_the_api(ann, room, browser_of):
    space, channel = room
    raw = b'{"body": "hi", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    response = browser_of(ann).post(f"{page_url(space, channel)}send", raw, content_type="application/json",
                                    HTTP_ACCEPT="application/json")
    assert response.status_code == 400 and response.json()["error"]["code"] == "INVALID_REQUEST"
    assert not Message.objects.exists()


def test_web_actions_share_the_members_api_rate_limit(ann, room, browser_of, api_for, settings):
    settings.RATE_LIMIT_PER_MINUTE = 2
    space, channel = room
    clear_of_window_edge()
    assert api_for(ann).get("/v0/me").status_code == 200
    assert post_json(browser_of(ann), f"{page_url(space, channel)}send", {"body": "one"}).status_code == 201
    limited = post_json(browser_of(ann), f"{page_url(space, channel)}send", {"body": "two"})
    assert limited.status_code == 429 and limited.json()["error"]["code"] == "RATE_LIMITED"
    assert int(limited["Retry-After"]) >= 1
    assert Message.objects.count() == 1
    # page reads count too: a page can cost more than an API call
    assert browser_of(ann).get("/app/").status_code == 429


@pytest.mark.parametrize("method,url,data", [
    ("get", "/app/spaces/room/?after=%00", None),
    ("get", "/app/subscriptions/?conversation=cnv_%00", None),
    ("post", "/app/inbox/acknowledge", {"token": "dlv_\x00"}),
    ("post", "/app/inbox/release", {"token": "dlv_\x00"}),
    ("post", "/app/credentials/new", {"name": "lap\x00top"}),
    ("post", "/app/spaces/room/tasks/new", {"title": "t\x00"}),
    ("post", "/app/subscriptions/new", {"endpoint": "whe_\x00", "target": "inbox"}),
    ("post", "/app/subscriptions/new", {"endpoint": "whe_x", "target": "space:\x00"}),
])
def test_a_nul_in_a_query_or_form_value_is_a_clear_4xx_and_changes_nothing(ann, room, browser_of, method, url, data):
    """As in the API: on PostgreSQL such values reached the database and
    answered 500 on seven pages."""
    from controlplane.models import Credential

    page = browser_of(ann)
    before = Credential.objects.count()
    response = getattr(page, method)(url, data or {}, HTTP_ACCEPT="text/html")
    assert 400 <= response.status_code < 500, (url, data, response.status_code)
    assert Credential.objects.count() == before


def test_an_htmx_action_refused_by_its_csrf_check_lands_in_the_error_area(ann, ben, room):
    """htmx asks with `Accept: */*`: the refusal was plain JSON, which the
    page swapped over the item (hx-swap="delete") as if acknowledged."""
    from inbox.models import InboxItem

    space, _ = room
    direct, _ = services.get_or_create_direct(space, ben, actor=ann)
    send_message(direct, body="for ben", actor=ann)
    item = InboxItem.objects.get(member=ben)
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(ben.user)
    response = browser.post("/app/inbox/acknowledge", {"token": item.token}, HTTP_HX_REQUEST="true",
                            HTTP_ACCEPT="*/*")
    assert response.status_code == 403 and response["HX-Retarget"] == "#htmx-error"
    item.refresh_from_db()
    assert item.state == InboxItem.State.PENDING
