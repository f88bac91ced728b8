"""The web app does the whole job without the API: spaces, members,
conversations, the inbox's pages, held items and firewall rules, and
credentials. Each action goes through the same services as the API, so
these tests check what the page does and that a refusal changes nothing."""
import html
import re

import pytest

from controlplane import services
from controlplane.models import Conversation, Credential, Membership, Space
from controlplane.tokens import hash_token
from inbox.models import FirewallRule, InboxItem
from inbox.services import send_message

pytestmark = pytest.mark.django_db


def text(response) -> str:
    return response.content.decode()


def submitted(form: str) -> dict:
    """What a browser sends from this form's markup unchanged (a textarea's
    first line break belongs to the markup)."""
    fields = {name: value for name, value in re.findall(r'<input [^>]*name="([^"]+)" value="([^"]*)"', form)}
    fields |= {name: value.removeprefix("\n")
               for name, value in re.findall(r'<textarea [^>]*name="([^"]+)"[^>]*>(.*?)</textarea>', form, re.S)}
    for name, options in re.findall(r'<select [^>]*name="([^"]+)"[^>]*>(.*?)</select>', form, re.S):
        chosen = re.search(r'<option value="([^"]*)" selected>', options)
        fields[name] = chosen.group(1) if chosen else ""
    fields.pop("csrfmiddlewaretoken", None)
    return {name: html.unescape(value) for name, value in fields.items()}


def test_a_member_creates_a_space_and_becomes_its_owner(ann, browser_of):
    client = browser_of(ann)
    response = client.post("/app/spaces/new", {"slug": "lab", "name": "Lab", "visibility": "request",
                                               "send_policy": "explicit_only"})
    assert response.status_code == 302 and response["Location"] == "/app/spaces/lab/"
    space = Space.objects.get(slug="lab")
    assert (space.visibility, space.send_policy) == ("request", "explicit_only")
    assert Membership.objects.get(space=space, member=ann).role == "owner"
    page = text(client.get("/app/spaces/lab/"))
    assert "you are owner" in page and "Add a member" in page and "@ann" in page
    # and bad input is a clear error that creates nothing
    taken = client.post("/app/spaces/new", {"slug": "lab", "name": "Again", "visibility": "open",
                                            "send_policy": "open"})
    bad = client.post("/app/spaces/new", {"slug": "lab2", "name": "Lab", "visibility": "secret",
                                          "send_policy": "open"})
    too_long = client.post("/app/spaces/new", {"slug": "lab3", "name": "n" * 201, "visibility": "open",
                                               "send_policy": "open"})
    assert taken.status_code == 409 and "CONFLICT" in text(taken)
    assert bad.status_code == 400 and too_long.status_code == 400 and Space.objects.count() == 1
    # and each says which field it refused, as the API's details.fields do
    assert 'visibility: "secret" is not a valid choice.' in html.unescape(text(bad))
    assert "name: Ensure this field has no more than 200 characters." in text(too_long)


def test_owners_add_admit_change_roles_and_remove(ann, ben, human, browser_of):
    cat = human("cat")
    space = services.create_space(slug="club", name="Club", visibility="request", send_policy="open", actor=ann)
    services.join_space(space, actor=cat)  # a request waiting for an owner
    owner = browser_of(ann)
    assert "asked to join" in text(owner.get("/app/spaces/club/"))
    # when
    owner.post("/app/spaces/club/members", {"member": "ben", "role": "observer"})
    owner.post("/app/spaces/club/members", {"member": "@cat", "role": "member"})  # admits
    owner.post("/app/spaces/club/members", {"member": "@ben", "role": "member"})  # a new role
    # then
    roles = {m.member.handle: (m.role, m.status) for m in Membership.objects.filter(space=space)}
    assert roles == {"ann": ("owner", "active"), "ben": ("member", "active"), "cat": ("member", "active")}
    # when ann removes cat, and ben (not an owner) tries the same on ann
    owner.post("/app/spaces/club/members/cat/remove")
    refused = browser_of(ben).post("/app/spaces/club/members/ann/remove")
    # then
    assert Membership.objects.get(space=space, member=cat).status == "removed"
    assert refused.status_code == 403 and Membership.objects.get(space=space, member=ann).status == "active"
    assert "Add a member" not in text(browser_of(ben).get("/app/spaces/club/"))
    # and ben leaves on his own
    assert browser_of(ben).post("/app/spaces/club/members/ben/remove")["Location"] == "/app/"
    assert Membership.objects.get(space=space, member=ben).status == "removed"


def test_members_open_channels_direct_messages_and_groups(room, ann, ben, human, browser_of):
    cat = human("cat")
    space, _ = room
    services.add_member(space, cat, actor=ann)
    client = browser_of(ann)
    # when
    channel = client.post("/app/spaces/room/channels", {"name": "#ops"})
    direct = client.post("/app/spaces/room/direct", {"member": "@ben"})
    again = client.post("/app/spaces/room/direct", {"member": "ben"})
    group = client.post("/app/spaces/room/groups", {"members": "@cat, @ben"})
    # then: each opens its conversation's page
    ops = Conversation.objects.get(space=space, name="ops")
    pair = Conversation.objects.get(space=space, kind="direct")
    trio = Conversation.objects.get(space=space, kind="group")
    assert channel["Location"] == f"/app/spaces/room/{ops.public_id}/"
    assert direct["Location"] == again["Location"] == f"/app/spaces/room/{pair.public_id}/"
    assert group["Location"] == f"/app/spaces/room/{trio.public_id}/"
    assert [p.member.handle for p in trio.participants.order_by("ordinal")] == ["ann", "cat", "ben"]
    # and the space page lists them
    page = text(client.get("/app/spaces/room/"))
    assert "#ops" in page and "@ben" in page
    # and an unknown handle is answered as the API answers it, as one not in the space, creating nothing
    unknown = client.post("/app/spaces/room/direct", {"member": "@nobody"})
    assert unknown.status_code == 400 and "active member of the space" in text(unknown) and Conversation.objects.filter(kind="direct").count() == 1
    # and a group too big (the caller and 64 others) is refused before any handle is looked up
    crowd = client.post("/app/spaces/room/groups", {"members": " ".join(f"@m{i:03}" for i in range(64))})
    assert crowd.status_code == 400 and Conversation.objects.filter(kind="group").count() == 1


def test_a_private_space_page_is_a_404_to_outsiders(room, human, browser_of):
    outsider = browser_of(human("eve"))
    assert outsider.get("/app/spaces/room/").status_code == 404
    assert outsider.post("/app/spaces/room/members", {"member": "@eve"}).status_code == 404
    assert not Membership.objects.filter(member__handle="eve").exists()


def test_a_request_space_is_found_by_its_slug_and_asked_to_join(ann, ben, browser_of):
    """SPEC §3: joining a request space creates a request an owner admits;
    the web app listed such a space nowhere and answered its page 404."""
    # given: ann's request space, which ben does not belong to
    club = services.create_space(slug="club", name="Club", visibility="request", send_policy="open", actor=ann)
    services.create_channel(club, "general", actor=ann)
    as_ben = browser_of(ben)
    # when: ben finds it by its slug (a malformed one finds nothing), and asks to join
    found = as_ben.get("/app/spaces/find", {"slug": " Club "})
    page = as_ben.get("/app/spaces/club/")
    assert as_ben.get("/app/spaces/find", {"slug": "no such!"}, HTTP_ACCEPT="text/html").status_code == 404
    as_ben.post("/app/spaces/club/join")
    asked = as_ben.get("/app/spaces/club/")
    # then: its page shows its name and the way in, not its conversations, until ann admits him
    assert found.status_code == 302 and found["Location"] == "/app/spaces/club/"
    assert page.status_code == 200 and "Ask to join club" in text(page) and "general" not in text(page)
    assert "an owner will admit you" in text(asked) and "Ask to join" not in text(asked)
    assert Membership.objects.get(space=club, member=ben).status == Membership.Status.PENDING
    services.add_member(club, ben, actor=ann)
    assert "general" in text(as_ben.get("/app/spaces/club/"))


def test_the_inbox_pages_through_every_item(ann, ben, room, browser_of, monkeypatch):
    monkeypatch.setattr("inbox.delivery.PAGE_ITEMS", 2)
    space, _ = room
    direct, _ = services.get_or_create_direct(space, ben, actor=ann)
    for i in range(5):
        send_message(direct, body=f"note {i}", actor=ann)
    client = browser_of(ben)
    seen, url = [], "/app/inbox/"
    for _ in range(5):
        response = client.get(url)
        page = text(response)
        seen += [f"note {i}" for i in range(5) if f"note {i}" in page]
        if "Next page of your inbox" not in page:
            break
        url = "/app/inbox/?cursor=" + response.context["next_cursor"]
    assert seen == [f"note {i}" for i in range(5)]


def test_held_items_show_their_guidance_and_are_released(ann, ben, room, browser_of):
    space, _ = room
    client = browser_of(ben)
    # when ben holds everything from ann through the page's form
    saved = client.post("/app/inbox/firewall", {
        "rules": "2", "rule-0-action": "hold", "rule-0-sender": "@ann", "rule-0-guidance": "check with ops first",
        "rule-1-action": ""})
    assert saved.status_code == 302
    assert [(r.action, r.sender, r.guidance) for r in FirewallRule.objects.filter(member=ben)] == [
        ("hold", "ann", "check with ops first")]
    direct, _ = services.get_or_create_direct(space, ben, actor=ann)
    send_message(direct, body="rotate the keys", actor=ann)
    from inbox import firewall
    firewall.classify_pending(ben.pk)
    item = InboxItem.objects.get(member=ben)
    page = text(client.get("/app/inbox/"))
    assert item.admission == "held" and "rotate the keys" in page and "check with ops first" in page
    # when
    client.post("/app/inbox/release", {"token": item.token})
    # then
    item.refresh_from_db()
    assert item.admission == "admitted"
    # and a rule the API would refuse is refused here too, keeping the old rules
    bad = client.post("/app/inbox/firewall", {"rules": "1", "rule-0-action": "hold", "rule-0-content_pattern": "("})
    huge = client.post("/app/inbox/firewall", {"rules": "1", "rule-0-action": "hold", "rule-0-guidance": "g" * 2001})
    # (past 4,300 digits Python refuses to make an int: that was a 500)
    long = client.post("/app/inbox/firewall", {"rules": "1", "rule-0-action": "hold", "rule-0-min_bytes": "9" * 5000})
    assert bad.status_code == huge.status_code == long.status_code == 400 and "INVALID_REQUEST" in text(huge)
    assert FirewallRule.objects.filter(member=ben).count() == 1
    cleared = client.post("/app/inbox/firewall", {"rules": "1", "rule-0-action": ""})
    assert cleared.status_code == 302 and not FirewallRule.objects.filter(member=ben).exists()


def test_saving_the_firewall_form_unchanged_keeps_rules_set_through_the_api(ben, browser_of):
    # given rules whose pattern and guidance the API keeps exactly, spaces and line breaks included
    from inbox import firewall
    from inbox.api.delivery_views import parse_rules

    firewall.set_rules(ben, parse_rules({"rules": [
        {"action": "hold", "content_pattern": " "},
        {"action": "allow", "content_pattern": "urgent ", "guidance": "first line\nsecond line"}]}), actor=ben)
    before = list(FirewallRule.objects.filter(member=ben).values_list("action", "content_pattern", "guidance"))
    client = browser_of(ben)
    # when the form goes back as a browser sends it, unchanged
    page = text(client.get("/app/inbox/"))
    fields = submitted(re.search(r'action="/app/inbox/firewall">(.*?)</form>', page, re.S).group(1))
    assert client.post("/app/inbox/firewall", fields).status_code == 302
    # then the rules are as they were: a blank pattern did not become "hold everything"
    assert list(FirewallRule.objects.filter(member=ben).values_list("action", "content_pattern", "guidance")) == before


@pytest.mark.parametrize("count", ["", "x", "1" * 21])
def test_a_firewall_form_with_a_malformed_rule_count_is_refused_and_deletes_nothing(ben, browser_of, count):
    from inbox import firewall

    firewall.set_rules(ben, [{"action": "hold", "sender": "mallory"}], actor=ben)
    response = browser_of(ben).post("/app/inbox/firewall", {"rules": count, "rule-0-action": "allow"})
    assert response.status_code == 400  # it saved no rules, deleting those there were
    assert list(FirewallRule.objects.filter(member=ben).values_list("sender", flat=True)) == ["mallory"]


def test_a_refused_firewall_form_names_each_field_it_refused(ben, browser_of):
    response = browser_of(ben).post("/app/inbox/firewall", {
        "rules": "2", "rule-0-action": "hold", "rule-0-min_bytes": "abc", "rule-1-action": "explode"})
    assert response.status_code == 400 and not FirewallRule.objects.filter(member=ben).exists()
    problems = re.findall(r"<li>(.*?)</li>", text(response).split("field-problems", 1)[1].split("</ul>", 1)[0])
    assert [html.unescape(p) for p in problems] == [
        "rules[0].min_bytes: A valid integer is required.", 'rules[1].action: "explode" is not a valid choice.']


def test_credentials_are_created_named_shown_once_and_revoked(ann, ben, browser_of):
    client = browser_of(ann)
    response = client.post("/app/credentials/new", {"name": "laptop CLI"})
    token = response.context["token"]
    credential = Credential.objects.get(member=ann, name="laptop CLI")
    assert credential.token_hash == hash_token(token) and token in text(response)
    assert "no-store" in response["Cache-Control"]
    listing = text(client.get("/app/credentials/"))
    assert "laptop CLI" in listing and token not in listing
    # someone else's credential is not theirs to revoke
    assert browser_of(ben).post(f"/app/credentials/{credential.public_id}/revoke").status_code == 404
    client.post(f"/app/credentials/{credential.public_id}/revoke")
    assert not Credential.objects.filter(pk=credential.pk).exists()
    # a name the API refuses is refused here too, not cut short: nothing is made
    too_long = client.post("/app/credentials/new", {"name": "n" * 101})
    assert too_long.status_code == 400 and "name: Ensure this field has no more than 100" in text(too_long)
    assert not Credential.objects.filter(member=ann).exists()


def test_who_may_not_write_or_manage_learns_nothing_of_which_handles_exist_from_the_pages(ann, human, browser_of):
    # given: an open space of ann's, which anyone may read, and a stranger to it (and no member @nobody-at-all)
    services.create_space(slug="plaza", name="Plaza", visibility="open", send_policy="open", actor=ann)
    human("dave")
    stranger = browser_of(human("stranger"))

    def answers(handle: str) -> list[int]:
        return [stranger.post(path, form, HTTP_ACCEPT="text/html").status_code for path, form in (
            ("/app/spaces/plaza/direct", {"member": handle}),
            ("/app/spaces/plaza/groups", {"members": handle}),
            ("/app/spaces/plaza/members", {"member": handle}),
            (f"/app/spaces/plaza/members/{handle}/remove", {}))]

    # then: a handle someone holds and one no one does get the same answers (the second was 404 "No such member")
    assert answers("dave") == answers("nobody-at-all") == [403, 403, 403, 403]
