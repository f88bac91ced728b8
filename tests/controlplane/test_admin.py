"""Every model is in the Django admin; history is read-only; secrets stay out."""
import datetime as dt
import time

import pytest
from django.apps import apps
from django.conf import settings
from django.contrib import admin
from django.test import Client

from controlplane import bearer, services
from controlplane.clock import now
from controlplane.api import authentication
from inbox.services import send_message


@pytest.fixture
def staff_client(make_member):
    make_member("root", kind="human", is_admin=True, password="pw-for-tests-1")
    client = Client()
    assert client.login(username="root", password="pw-for-tests-1")
    return client


def test_every_model_is_registered():
    for app in ("controlplane", "inbox", "grants", "coordination", "webhooks"):
        for model in apps.get_app_config(app).get_models():
            assert admin.site.is_registered(model), model


def test_changelists_render_without_secrets(staff_client, general, alice, bob):
    # given: a row in every kind of list
    from coordination import services as tasks
    from inbox import collectives

    _, token = bearer.issue_credential(alice, actor=None)
    send_message(general, body="hello", actor=alice)
    task = tasks.create_task(general.space, title="t", actor=alice)
    tasks.claim_task(general.space, task.public_id, actor=bob)
    group, _ = services.get_or_create_group(general.space, [alice, bob], actor=alice)
    asked = send_message(group, body="q", collective={"op": "gather", "deadline_ms": 5000}, actor=alice).message
    collectives.answer(asked, "a", actor=bob)
    # when / then
    for app in ("controlplane", "inbox", "grants", "coordination", "webhooks"):
        for model in apps.get_app_config(app).get_models():
            url = f"/admin/{app}/{model._meta.model_name}/"
            response = staff_client.get(url)
            assert response.status_code == 200, url
            assert token not in response.content.decode()
    credential_page = staff_client.get("/admin/controlplane/credential/").content.decode()
    assert "token_hash" not in credential_page and "Token hash" not in credential_page


def test_event_log_is_read_only(staff_client, general, alice):
    send_message(general, body="hello", actor=alice)
    assert staff_client.get("/admin/controlplane/event/add/").status_code == 403
    assert staff_client.get("/admin/inbox/message/add/").status_code == 403


@pytest.mark.parametrize("change", ["suspended", "demoted", "suspended behind the service's back"])
def test_admin_powers_end_at_once_when_an_admin_is_suspended_or_demoted(make_member, api_for, change, monkeypatch):
    # given: an admin signed in to the admin site, with a credential
    from controlplane.errors import NotFound
    from controlplane.models import Member
    from grants import approvals
    root = make_member("root", kind="human", is_admin=True, password="pw-for-tests-1")
    client = Client()
    assert client.login(username="root", password="pw-for-tests-1")
    api = api_for(root)
    assert client.get("/admin/").status_code == 200
    assert client.get("/staff/approvals/").status_code == 200
    assert api.get("/v0/approval-requests").status_code == 200
    # when
    if change == "suspended":
        services.update_member(root, status=Member.Status.SUSPENDED, actor=None)
    elif change == "demoted":
        services.update_member(root, is_admin=False, actor=None)
    else:  # the Django user keeps is_staff and is_superuser
        Member.objects.filter(pk=root.pk).update(status=Member.Status.SUSPENDED)
        # No service moved the credential cache's epoch: a bearer lookup this
        # process remembers (with Redis) holds until it expires, and no longer.
        monkeypatch.setattr(authentication, "_clock", lambda: time.monotonic() + settings.CREDENTIAL_CACHE_SECONDS)
    root.refresh_from_db()
    # then: no admin page, no staff queue, no admin route, no approval
    assert client.get("/admin/").status_code == 302
    assert client.get("/staff/approvals/").status_code in (302, 403)
    assert api.get("/v0/approval-requests").status_code == (403 if change == "demoted" else 401)
    with pytest.raises(NotFound):
        approvals.deny(approvals.ApprovalRequest(), "no", actor=root)
    if change != "suspended behind the service's back":
        root.user.refresh_from_db()
        assert not root.user.is_staff and not root.user.is_superuser
        assert root.user.is_active == (change == "demoted")


def test_member_changes_in_the_admin_go_through_the_service(staff_client, make_member):
    # given
    from controlplane.models import AuditEntry, Member
    bob = make_member("bob", kind="human", is_admin=True, password="pw-for-tests-2")
    page = staff_client.get(f"/admin/controlplane/member/{bob.pk}/change/")
    assert page.status_code == 200
    form = {"handle": "bob", "display_name": "bob", "kind": "human", "status": "suspended", "is_admin": "on",
            "user": bob.user_id}
    # when
    response = staff_client.post(f"/admin/controlplane/member/{bob.pk}/change/", form)
    # then
    assert response.status_code == 302, response.content.decode()[:2000]
    bob.refresh_from_db(), bob.user.refresh_from_db()
    assert bob.status == Member.Status.SUSPENDED and not bob.user.is_active
    assert AuditEntry.objects.filter(action="member.updated", target=bob.public_id, actor__handle="root").exists()


def test_names_changed_in_the_admin_are_checked_as_the_services_check_them(staff_client, space, bob):
    """The admin saved a display name or a space name the API refuses (a
    right-to-left override, a control character)."""
    from controlplane.models import Member, Space

    before = bob.display_name
    refused = [
        staff_client.post(f"/admin/controlplane/member/{bob.pk}/change/",
                          {"display_name": "evil\u202eexe.txt", "status": "active"}),
        staff_client.post(f"/admin/controlplane/space/{space.pk}/change/",
                          {"name": "Ops\x1b[31m", "visibility": "open", "send_policy": "open"}),
    ]
    assert [response.status_code for response in refused] == [200, 200]  # the form again, with the error
    assert all("no control or reordering characters" in r.content.decode() for r in refused)
    assert Member.objects.get(pk=bob.pk).display_name == before and Space.objects.get(pk=space.pk).name == "Lab"
    # and an ordinary name still saves
    assert staff_client.post(f"/admin/controlplane/space/{space.pk}/change/",
                             {"name": "Lab \u05e9\u200f", "visibility": "open", "send_policy": "open"}).status_code == 302


@pytest.mark.parametrize("path", [
    "/admin/controlplane/member/add/", "/admin/controlplane/space/add/", "/admin/controlplane/membership/add/",
    "/admin/inbox/firewallrule/add/", "/admin/django_q/schedule/add/",
])
def test_rows_the_services_make_are_not_added_in_the_admin(staff_client, path):
    """A member added here had no user to sign in with and no audit entry, a
    space no owner, a membership no event, a firewall rule none of set_rules'
    checks; a schedule names any function a worker will run (`os.system`)."""
    assert staff_client.get(path).status_code == 403


def test_the_admin_deletes_and_renames_nothing_the_services_keep(staff_client, space, alice, bob):
    from controlplane.models import AuditEntry, Credential, Member, Membership, Space
    from controlplane.schedules import ensure_schedules
    from django_q.models import Schedule

    # given
    ensure_schedules()
    credential, _ = bearer.issue_credential(alice, actor=None)
    membership = Membership.objects.get(space=space, member=bob)
    expiry = Schedule.objects.get(name="expire-grants")
    # when: deletes, renames and a membership edit are posted
    deletes = [staff_client.post(f"/admin/{path}/delete/", {"post": "yes"}).status_code for path in (
        f"controlplane/member/{bob.pk}", f"controlplane/space/{space.pk}", f"controlplane/membership/{membership.pk}",
        f"controlplane/credential/{credential.pk}", f"django_q/schedule/{expiry.pk}")]
    staff_client.post(f"/admin/controlplane/member/{bob.pk}/change/",
                      {"handle": "Bob Smith", "display_name": "Bob", "status": "active"})
    staff_client.post(f"/admin/controlplane/space/{space.pk}/change/", {
        "slug": "Lab Space", "name": "Lab Two", "visibility": "open", "send_policy": "open",
        "memberships-TOTAL_FORMS": "0", "memberships-INITIAL_FORMS": "0"})
    edited = staff_client.post(f"/admin/controlplane/membership/{membership.pk}/change/",
                               {"space": space.pk, "member": bob.pk, "role": "owner", "status": "removed"})
    # then: nothing was deleted, and the names and the membership stand
    assert deletes == [403] * 5 and edited.status_code == 403
    assert Member.objects.get(pk=bob.pk).handle == "bob" and Space.objects.get(pk=space.pk).slug == "lab"
    assert Member.objects.get(pk=bob.pk).display_name == "Bob" and Space.objects.get(pk=space.pk).name == "Lab Two"
    # and: what changed is on record, as no event records it
    changes = {(e.action, e.target): e.detail for e in AuditEntry.objects.filter(actor__handle="root")}
    assert changes[("member.updated", bob.public_id)] == {"display_name": "Bob"}
    assert changes[("space.updated", space.public_id)] == {"name": "Lab Two"}
    membership.refresh_from_db()
    assert (membership.role, membership.status) == ("member", "active")
    assert Credential.objects.filter(pk=credential.pk).exists() and Schedule.objects.filter(pk=expiry.pk).exists()
    # and a credential is revoked through the service, which records it
    staff_client.post("/admin/controlplane/credential/", {"action": "revoke", "_selected_action": [credential.pk]})
    assert not Credential.objects.filter(pk=credential.pk).exists()
    assert AuditEntry.objects.filter(action="credential.revoked", target=alice.public_id, actor__handle="root").exists()


def test_a_members_account_gets_only_a_password_in_the_admin_and_that_is_recorded(staff_client, make_member):
    """Accounts are made and flagged by the services: the user admin added
    accounts, renamed them and set their flags unrecorded, around them (and
    their names and e-mail, unchecked)."""
    from django.contrib.auth.models import User

    from controlplane.models import AuditEntry

    # given
    noor = make_member("noor", kind="human", password="pw-for-tests-3")
    user = noor.user
    # when: an account is added, deleted, renamed and made a superuser, and given a new password
    added = staff_client.get("/admin/auth/user/add/").status_code
    deleted = staff_client.post(f"/admin/auth/user/{user.pk}/delete/", {"post": "yes"}).status_code
    staff_client.post(f"/admin/auth/user/{user.pk}/change/", {
        "username": "someone", "is_superuser": "on", "is_staff": "on", "is_active": "on",
        "first_name": "\u202eNoor", "last_name": "x", "email": "a@example.com", "date_joined_0": "2026-01-01",
        "date_joined_1": "00:00"})
    password = staff_client.post(f"/admin/auth/user/{user.pk}/password/",
                                 {"password1": "a new long password", "password2": "a new long password"})
    # then: only the password changed, and it is on record
    assert (added, deleted, password.status_code) == (403, 403, 302)
    user = User.objects.get(pk=user.pk)
    assert (user.username, user.is_superuser, user.is_staff) == ("noor", False, False)
    assert (user.first_name, user.last_name, user.email) == ("", "", "")  # saved unchecked and unrecorded, before
    assert user.check_password("a new long password")
    assert AuditEntry.objects.filter(action="member.password_set", target=noor.public_id,
                                     actor__handle="root").exists()


def test_no_list_filters_on_a_secret_through_any_relation(staff_client, alice, general):
    """A filter in a list's URL answers whether a row matches: on a token's
    hash or a secret's ciphertext, a probe a character at a time."""
    from webhooks.models import Endpoint, SigningKey
    from webhooks.crypto import active_signing_key

    bearer.issue_credential(alice, actor=None)
    active_signing_key()
    Endpoint.objects.create(owner=alice, url="https://example.test/hook", secret="sealed")
    assert SigningKey.objects.exists()
    probes = ["controlplane/credential/?token_hash__startswith=0", "controlplane/member/?credentials__token_hash=0",
              "webhooks/endpoint/?secret__startswith=s", "webhooks/endpoint/?previous_secret__isnull=1",
              "webhooks/subscription/?endpoint__secret__startswith=s", "webhooks/signingkey/?private_key__gt=0",
              "controlplane/usersession/?session_key__startswith=a", "auth/user/?password__startswith=p",
              # `pk` stands for a session's key: the same probe under another name
              "controlplane/usersession/?pk__startswith=a", "controlplane/usersession/?pk__gt=a",
              "controlplane/usersession/?pk__regex=^a"]
    for probe in probes:
        assert staff_client.get(f"/admin/{probe}").status_code == 400, probe
    # the lists' own filters still work, and a pk that is no secret
    assert staff_client.get("/admin/controlplane/member/?status__exact=active").status_code == 200
    assert staff_client.get("/admin/controlplane/usersession/?user_id=1").status_code == 200
    assert staff_client.get("/admin/controlplane/member/?pk__gt=0").status_code == 200


def test_sessions_and_finished_tasks_are_shown_without_keys_or_actions(staff_client):
    from django_q.models import Success

    from controlplane.models import UserSession

    (session,) = UserSession.objects.all()  # the staff client's own
    Success.objects.create(id="a" * 32, name="sweep", func="coordination.tasks.sweep_claims", started=now(),
                           stopped=now(), success=True)
    sessions = staff_client.get("/admin/controlplane/usersession/").content.decode()
    successes = staff_client.get("/admin/django_q/success/")
    assert session.session_key not in sessions and str(session.user_id) in sessions
    assert successes.status_code == 200 and "resubmit" not in successes.content.decode().lower()
    assert staff_client.post("/admin/django_q/success/", {"action": "resubmit_task",
                                                           "_selected_action": ["a" * 32]}).status_code == 200
    assert staff_client.get(f"/admin/django_q/success/{'a' * 32}/delete/").status_code == 403


def test_suspension_ends_the_members_web_sessions_for_good(make_member):
    """Django refuses an inactive user's sessions, and took them back when
    the member was reinstated: a stolen cookie outlived the suspension."""
    from controlplane.models import Member

    # given: bob and ann signed in
    bob = make_member("bob", kind="human", password="pw-for-tests-2")
    make_member("ann", kind="human", password="pw-for-tests-3")
    bobs, anns = Client(), Client()
    assert bobs.login(username="bob", password="pw-for-tests-2")
    assert anns.login(username="ann", password="pw-for-tests-3")
    assert bobs.get("/app/").status_code == anns.get("/app/").status_code == 200
    # when: bob is suspended, then reinstated
    services.update_member(bob, status=Member.Status.SUSPENDED, actor=None)
    services.update_member(bob, status=Member.Status.ACTIVE, actor=None)
    # then: his session is gone, hers stands, and he signs in afresh
    assert bobs.get("/app/").status_code == 302 and anns.get("/app/").status_code == 200
    assert bobs.login(username="bob", password="pw-for-tests-2") and bobs.get("/app/").status_code == 200


def test_the_upgrade_carries_signed_in_sessions_over(make_member):
    """Migration controlplane/0009 moves the default table's live sessions
    into the one that names their user: the upgrade signs nobody out."""
    import importlib

    from django.apps import apps as registry
    from django.contrib.sessions.backends.db import SessionStore as DefaultStore
    from django.contrib.sessions.models import Session

    from controlplane.models import UserSession

    # given: bob signed in under the default engine, and a session long expired
    bob = make_member("bob", kind="human", password="pw-for-tests-2")
    client = Client()
    assert client.login(username="bob", password="pw-for-tests-2")
    key = client.cookies["sessionid"].value
    signed_in = UserSession.objects.get(session_key=key)
    UserSession.objects.all().delete()
    old = DefaultStore(session_key=key)
    old._session_cache = DefaultStore().decode(signed_in.session_data)
    old.save(must_create=True)
    Session.objects.create(session_key="x" * 32, session_data="", expire_date=now() - dt.timedelta(days=1))
    # when
    importlib.import_module("controlplane.migrations.0009_user_sessions").carry_over_sessions(registry, None)
    # then: his session names him, and still signs him in
    assert list(UserSession.objects.values_list("session_key", "user_id")) == [(key, bob.user_id)]
    assert client.get("/app/").status_code == 200


def test_a_space_of_many_members_is_saved_and_its_page_costs_the_same_queries(staff_client, space, make_member):
    """Its members were rows of the change form: one query each, two fields
    each posted back, and a space of about 490 could not be saved."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    page = f"/admin/controlplane/space/{space.pk}/change/"

    def cost() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert staff_client.get(page).status_code == 200
        return len(captured)

    few = cost()
    for n in range(20):
        services.join_space(space, actor=make_member(f"joiner{n}"))
    # then: the same queries, and a link to the members' list
    assert cost() == few
    text = staff_client.get(page).content.decode()
    assert f"?space__id__exact={space.pk}" in text and "memberships" in text
    assert staff_client.get(f"/admin/controlplane/membership/?space__id__exact={space.pk}").status_code == 200
    # and: saved with its own fields only
    form = {"name": "Renamed", "visibility": space.visibility, "send_policy": space.send_policy}
    assert staff_client.post(page, form).status_code == 302
    space.refresh_from_db()
    assert space.name == "Renamed"


def test_the_log_and_audit_lists_cost_the_same_queries_however_many_rows(staff_client, general, alice):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    paths = ("/admin/controlplane/event/", "/admin/controlplane/eventaddressee/", "/admin/controlplane/auditentry/")

    def cost() -> list[int]:
        counts = []
        for path in paths:
            with CaptureQueriesContext(connection) as captured:
                assert staff_client.get(path).status_code == 200
            counts.append(len(captured))
        return counts

    send_message(general, body="one", actor=alice)
    few = cost()
    for n in range(5):
        send_message(general, body=f"more {n}", actor=alice)
        services.create_channel(general.space, f"extra-{n}", actor=alice)
    assert cost() == few


def test_a_search_of_a_thousand_words_is_answered(staff_client, general):
    """Each word was a condition on every search field: SQLite refused the
    query as too deep, and it was answered 503 as a lost database."""
    response = staff_client.get("/admin/controlplane/event/", {"q": " ".join(["zz"] * 1000)})
    assert response.status_code == 200
