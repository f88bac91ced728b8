"""POST /v0/spaces/{slug}/grants, GET /v0/grants/{id}, revoke (SPEC §5)."""
import pytest

from controlplane import services

from grants.models import Grant
from tests.conftest import error_code

GRANTS = "/v0/spaces/vault/grants"
PAIR = {"id": "grt_bob-carol", "kind": "pair", "sender": "@bob", "recipient": "@carol"}


def test_owner_creates_a_grant_and_the_same_request_returns_it(locked, as_alice):
    # when
    created = as_alice.post(GRANTS, PAIR)
    again = as_alice.post(GRANTS, PAIR)
    # then
    assert created.status_code == 201 and again.status_code == 200
    assert again.json() == created.json()
    body = created.json()["grant"]
    assert body | {"created_at": None} == {
        "id": "grt_bob-carol", "space": "vault", "kind": "pair", "sender": "@bob", "recipient": "@carol",
        "idempotency_key": None, "expires_at": None, "status": "active", "generation": 1, "message": None,
        "created_by": "@alice", "created_at": None, "barrier_started_at": None, "ended_at": None}
    assert Grant.objects.count() == 1


@pytest.mark.parametrize("change", [
    {"kind": "one_message", "idempotency_key": "key-00001"},
    {"recipient": "@alice"},
    {"sender": "@carol", "recipient": "@bob"},
    {"expires_at": "2099-01-01T00:00:00Z"},
])
def test_reusing_an_id_for_a_different_grant_is_a_conflict(locked, as_alice, change):
    # given
    as_alice.post(GRANTS, PAIR)
    # when
    response = as_alice.post(GRANTS, {**PAIR, **change})
    # then
    assert response.status_code == 409 and error_code(response) == "GRANT_CONFLICT"
    assert Grant.objects.get().recipient.handle == "carol" and Grant.objects.count() == 1


def test_an_id_another_space_uses_is_free_and_reveals_nothing(locked, as_alice, make_member, api_for):
    # given: alice's vault uses grt_x; dave owns a space of his own
    dave = make_member("dave")
    as_dave = api_for(dave)
    as_dave.post("/v0/spaces", {"slug": "den", "name": "Den", "visibility": "private", "send_policy": "explicit_only"})
    as_alice.post(GRANTS, {"id": "grt_x", "kind": "project"})
    # when: dave creates a different grant under the same id in his space
    created = as_dave.post("/v0/spaces/den/grants", {"id": "grt_x", "kind": "project",
                                                     "expires_at": "2099-01-01T00:00:00Z"})
    # then: it is his, and every route he can call shows only his
    assert created.status_code == 201, created.text
    assert created.json()["grant"]["space"] == "den"
    assert as_dave.get("/v0/grants/grt_x").json()["grant"]["space"] == "den"
    assert as_dave.get("/v0/spaces/den/grants/grt_x").json() == created.json()
    assert as_dave.get("/v0/spaces/vault/grants/grt_x").status_code == 404
    assert Grant.objects.filter(public_id="grt_x").count() == 2


def test_an_expiry_is_kept_to_the_millisecond_it_is_shown_with(locked, as_alice):
    # given: an expiry given to the microsecond
    created = as_alice.post(GRANTS, {**PAIR, "expires_at": "2099-01-01T00:00:00.123456Z"})
    shown = created.json()["grant"]["expires_at"]
    # when: the same grant again, with the expiry as shown, and as first sent
    again = as_alice.post(GRANTS, {**PAIR, "expires_at": shown})
    first = as_alice.post(GRANTS, {**PAIR, "expires_at": "2099-01-01T00:00:00.123456Z"})
    # then: both are the same request
    assert created.status_code == 201 and shown == "2099-01-01T00:00:00.123Z"
    assert (again.status_code, first.status_code) == (200, 200) and again.json() == first.json() == created.json()


def test_grants_of_an_id_in_others_spaces_cannot_crowd_out_ones_own(locked, as_alice, make_member, api_for,
                                                                     monkeypatch):
    # given: alice's grant grt_x, and dave's grants of the same id in more spaces than a lookup weighs
    from grants import services as grant_services

    monkeypatch.setattr(grant_services, "MAX_SPACES_PER_ID", 2)
    as_dave = api_for(make_member("dave"))
    for n in range(3):
        as_dave.post("/v0/spaces", {"slug": f"den{n}", "name": "Den", "visibility": "private"})
        assert as_dave.post(f"/v0/spaces/den{n}/grants", {"id": "grt_x", "kind": "project"}).status_code == 201
    as_alice.post(GRANTS, {"id": "grt_x", "kind": "project"})
    # when / then: alice still finds hers by id alone
    assert as_alice.get("/v0/grants/grt_x").json()["grant"]["space"] == "vault"


def test_an_id_seen_in_two_spaces_is_asked_for_under_its_space(locked, space, as_alice):
    # given: alice owns both spaces and uses one id in each
    as_alice.post(GRANTS, {"id": "grt_x", "kind": "project"})
    as_alice.post("/v0/spaces/lab/grants", {"id": "grt_x", "kind": "project"})
    # when
    ambiguous = as_alice.get("/v0/grants/grt_x")
    revoke_ambiguous = as_alice.post("/v0/grants/grt_x/revoke", {})
    revoked = as_alice.post("/v0/spaces/lab/grants/grt_x/revoke", {})
    # then: the global routes say which spaces to ask under and change nothing
    assert ambiguous.status_code == 409 and error_code(ambiguous) == "CONFLICT"
    assert ambiguous.json()["error"]["details"] == {"spaces": ["lab", "vault"]}
    assert revoke_ambiguous.status_code == 409
    assert revoked.status_code == 200 and revoked.json()["grant"]["space"] == "lab"
    assert revoked.json()["grant"]["status"] == "revoked"
    assert as_alice.get(f"{GRANTS}/grt_x").json()["grant"]["status"] == "active"


def test_only_owners_and_admins_create_grants(locked, as_bob, as_root):
    # when: bob, the governed sender, tries to authorize himself
    refused = as_bob.post(GRANTS, PAIR)
    by_admin = as_root.post(GRANTS, PAIR)
    # then
    assert refused.status_code == 403 and error_code(refused) == "FORBIDDEN"
    assert by_admin.status_code == 201 and by_admin.json()["grant"]["created_by"] == "@root"


def test_a_grant_never_names_its_creator_as_its_sender(locked, alice, root, as_alice, as_root):
    # when: the owner, and an admin, each name themselves as the sender
    mine = as_alice.post("/v0/spaces/vault/grants", {"id": "grt_self", "kind": "pair", "sender": "@alice",
                                                     "recipient": "@bob"})
    services.join_space(locked, actor=root)
    roots = as_root.post("/v0/spaces/vault/grants", {"id": "grt_root", "kind": "one_message", "sender": "@root",
                                                     "recipient": "@bob", "idempotency_key": "key-00001"})
    # then: 403, and nothing is made; the owner may still grant someone else
    assert error_code(mine) == error_code(roots) == "FORBIDDEN" and not Grant.objects.exists()
    assert as_alice.post("/v0/spaces/vault/grants", {"id": "grt_bob", "kind": "pair", "sender": "@bob",
                                                     "recipient": "@alice"}).status_code == 201


def test_a_project_grant_covers_every_member_but_its_creator(locked, alice, bob, as_alice, as_bob):
    # given: alice, the owner, makes the space's project grant
    assert as_alice.post("/v0/spaces/vault/grants", {"id": "grt_all", "kind": "project"}).status_code == 201
    direct, _ = services.get_or_create_direct(locked, bob, actor=alice)
    path = f"/v0/spaces/vault/conversations/{direct.public_id}/messages"
    # when
    hers, his = as_alice.post(path, {"body": "hi"}), as_bob.post(path, {"body": "hello"})
    # then: it authorizes bob, not her
    assert hers.status_code == 403 and error_code(hers) == "GRANT_REQUIRED"
    assert his.status_code == 201


@pytest.mark.parametrize("body", [
    {"id": "grt_p", "kind": "project", "sender": "@bob"},
    {"id": "grt_p", "kind": "pair", "sender": "@bob"},
    {"id": "grt_p", "kind": "pair", "sender": "@bob", "recipient": "@carol", "idempotency_key": "key-00001"},
    {"id": "grt_p", "kind": "one_message", "sender": "@bob", "recipient": "@carol"},
    {"id": "grt_p", "kind": "one_message", "sender": "@bob", "recipient": "@carol", "idempotency_key": "short"},
    {"id": "grt_p", "kind": "pair", "sender": "@bob", "recipient": "@bob"},
    {"id": "grant-1", "kind": "project"},
    {"id": "grt_" + "x" * 65, "kind": "project"},
    {"id": "grt_p", "kind": "everything"},
    {"id": "grt_p", "kind": "project", "expires_at": "2001-01-01T00:00:00Z"},
    {"id": "grt_p", "kind": "project", "expires_at": "tomorrow"},
    {"id": "grt_p", "kind": "project", "expires_at": 1700000000},
    # not RFC 3339 (SPEC §2), though ISO 8601 takes them: a week, a bare date, a time without an offset
    {"id": "grt_p", "kind": "project", "expires_at": "2099-W01"},
    {"id": "grt_p", "kind": "project", "expires_at": "2099-01-01"},
    {"id": "grt_p", "kind": "project", "expires_at": "2099-01-01T00:00:00"},
    {"id": "grt_p", "kind": "project", "expires_at": "２０９９-01-01T00:00:00Z"},  # digits, but not ASCII's
    {"id": "grt_p", "kind": "project", "scope": "all"},
    {"kind": "project"},
])
def test_malformed_grants_are_400_and_change_nothing(locked, as_alice, body):
    response = as_alice.post(GRANTS, body)
    assert response.status_code == 400 and error_code(response) == "INVALID_REQUEST"
    assert not Grant.objects.exists()


@pytest.mark.parametrize("expires_at", ["2099-01-01T00:00:00Z", "2099-01-01t00:00:00z", "2099-01-01 00:00:00+02:00",
                                        "2099-01-01T00:00:00.25-01:30"])
def test_every_form_of_rfc_3339_is_taken(locked, as_alice, expires_at):
    response = as_alice.post(GRANTS, {"id": "grt_p", "kind": "project", "expires_at": expires_at})
    assert response.status_code == 201, response.json()


def test_an_unknown_member_is_404(locked, as_alice):
    response = as_alice.post(GRANTS, {**PAIR, "recipient": "@nobody"})
    assert response.status_code == 404 and not Grant.objects.exists()


def test_a_grant_is_visible_to_its_parties_owners_and_admins_only(locked, as_alice, as_bob, as_carol, as_root,
                                                                  make_member, api_for):
    # given
    as_alice.post(GRANTS, PAIR)
    dave = make_member("dave")
    # when / then
    for caller in (as_alice, as_bob, as_carol, as_root):
        assert caller.get("/v0/grants/grt_bob-carol").json()["grant"]["id"] == "grt_bob-carol"
    hidden = api_for(dave).get("/v0/grants/grt_bob-carol")
    assert hidden.status_code == 404 and error_code(hidden) == "NOT_FOUND"
    assert as_bob.get(GRANTS).status_code == 403
    assert [g["id"] for g in as_alice.get(GRANTS).json()["grants"]] == ["grt_bob-carol"]


def test_a_party_sees_a_grant_only_while_they_may_read_its_space(as_alice, alice, bob, carol, make_member, api_for):
    # given: a private space alice owns, bob and carol members, dave never one; a grant names each
    vault = services.create_space(slug="vault", name="Vault", visibility="private", send_policy="explicit_only",
                                  actor=alice)
    services.add_member(vault, bob, actor=alice)
    services.add_member(vault, carol, actor=alice)
    as_bob, as_dave = api_for(bob), api_for(make_member("dave"))
    for grant_id, recipient in (("grt_to-dave", "@dave"), ("grt_to-bob", "@bob")):
        created = as_alice.post(GRANTS, {"id": grant_id, "kind": "pair", "sender": "@carol", "recipient": recipient})
        assert created.status_code == 201, created.text
    assert as_bob.get("/v0/grants/grt_to-bob").status_code == 200
    # when
    services.remove_member(vault, bob, actor=alice)
    # then: neither learns of the space through its grants, by either route
    for caller, grant_id in ((as_dave, "grt_to-dave"), (as_bob, "grt_to-bob")):
        for path in (f"/v0/grants/{grant_id}", f"{GRANTS}/{grant_id}"):
            hidden = caller.get(path)
            assert hidden.status_code == 404 and error_code(hidden) == "NOT_FOUND", path
    assert as_alice.get("/v0/grants/grt_to-dave").json()["grant"]["recipient"] == "@dave"


def test_only_owners_and_admins_revoke(locked, as_alice, as_bob):
    # given
    as_alice.post(GRANTS, PAIR)
    # when
    refused = as_bob.post("/v0/grants/grt_bob-carol/revoke")
    revoked = as_alice.post("/v0/grants/grt_bob-carol/revoke")
    again = as_alice.post("/v0/grants/grt_bob-carol/revoke")
    # then: the barrier runs to its end; revoking again changes nothing
    assert refused.status_code == 403 and error_code(refused) == "FORBIDDEN"
    assert revoked.status_code == 200
    grant = revoked.json()["grant"]
    assert grant["status"] == "revoked" and grant["generation"] == 3
    assert grant["barrier_started_at"] is not None and grant["ended_at"] is not None
    assert again.json() == revoked.json()


def test_a_malformed_key_revokes_nothing_and_a_keyed_revocation_answers_its_retry(locked, space, as_alice):
    # given: the grant, and the same id in another space
    as_alice.post(GRANTS, PAIR)
    as_alice.post("/v0/spaces/lab/grants", {"id": "grt_bob-carol", "kind": "project"})
    # when
    malformed = as_alice.post("/v0/grants/grt_bob-carol/revoke", headers={"Idempotency-Key": "short"})
    status = Grant.objects.get(space=locked).status
    keyed = as_alice.post("/v0/spaces/vault/grants/grt_bob-carol/revoke", headers={"Idempotency-Key": "revoke-01"})
    retry = as_alice.post("/v0/spaces/vault/grants/grt_bob-carol/revoke", headers={"Idempotency-Key": "revoke-01"})
    elsewhere = as_alice.post("/v0/spaces/lab/grants/grt_bob-carol/revoke", headers={"Idempotency-Key": "revoke-01"})
    # then: a key is scoped to its route
    assert malformed.status_code == 400 and error_code(malformed) == "INVALID_IDEMPOTENCY_KEY"
    assert status == "active"
    assert keyed.status_code == 200 and keyed.json()["grant"]["status"] == "revoked"
    assert retry.json() == keyed.json()
    assert elsewhere.status_code == 200 and elsewhere.json()["grant"]["space"] == "lab"
    assert sorted(Grant.objects.values_list("status", flat=True)) == ["revoked", "revoked"]


def test_unknown_grant_ids_are_404(as_alice):
    assert as_alice.get("/v0/grants/grt_missing").status_code == 404
    assert as_alice.get("/v0/grants/not-a-grant").status_code == 404


def test_grant_events_reach_the_parties_inbox_feeds_and_no_space_feed(locked, bob, carol, as_alice, as_bob, anon):
    # given
    created = as_alice.post("/v0/spaces/vault/grants", {"id": "grt_bob_carol", "kind": "pair",
                                                        "sender": "@bob", "recipient": "@carol"})
    assert created.status_code == 201, created.text
    # when
    as_alice.post("/v0/grants/grt_bob_carol/revoke", {})
    # then: bob (a party) and alice (its creator) hear of both; the space feed shows neither
    for api in (as_bob, as_alice):
        events = api.get("/v0/me/inbox/events").json()["events"]
        assert [(e["kind"], e["data"]["grant"]["id"]) for e in events if e["kind"].startswith("grant.")] == [
            ("grant.created", "grt_bob_carol"), ("grant.revoked", "grt_bob_carol")]
    for api in (anon, as_bob, as_alice):
        kinds = [e["kind"] for e in api.get("/v0/spaces/vault/events").json()["events"]]
        assert not any(kind.startswith("grant.") for kind in kinds)


def test_grant_events_reach_no_party_outside_the_space(as_alice, alice, bob, make_member, api_for):
    from controlplane.models import EventAddressee

    # given: an open space of alice's that dave never joined, and a private one bob is in
    yard = services.create_space(slug="yard", name="Yard", visibility="open", send_policy="explicit_only",
                                 actor=alice)
    vault = services.create_space(slug="vault", name="Vault", visibility="private", send_policy="explicit_only",
                                  actor=alice)
    services.join_space(yard, actor=bob)
    services.add_member(vault, bob, actor=alice)
    as_bob, as_dave = api_for(bob), api_for(make_member("dave"))
    # when: a grant in the open space names dave
    assert as_alice.post("/v0/spaces/yard/grants", {"id": "grt_to-dave", "kind": "pair", "sender": "@bob",
                                                    "recipient": "@dave"}).status_code == 201
    # then: bob hears of it; dave does not (any space's owner could fill his feed and wake his receivers)
    def grant_events(api):
        return [e["data"]["grant"]["id"] for e in api.get("/v0/me/inbox/events").json()["events"]
                if e["kind"].startswith("grant.")]

    assert grant_events(as_bob) == ["grt_to-dave"] and grant_events(as_dave) == []
    # when: bob is removed from the private space, then a grant naming him there is revoked
    assert as_alice.post(GRANTS, {"id": "grt_bob", "kind": "pair", "sender": "@bob", "recipient": "@alice"}) \
        .status_code == 201
    services.remove_member(vault, bob, actor=alice)
    as_alice.post("/v0/grants/grt_bob/revoke", {})
    # then: the revocation is addressed to alice alone, so it wakes nothing of bob's
    revoked = EventAddressee.objects.filter(event__kind="grant.revoked")
    assert list(revoked.values_list("member__handle", flat=True)) == ["alice"]
    # when: its creator leaves the space (a second owner stays), and that owner revokes her other grant there
    carol = make_member("carol")
    services.add_member(vault, carol, role="owner", actor=alice)
    assert as_alice.post(GRANTS, {"id": "grt_hers", "kind": "pair", "sender": "@carol", "recipient": "@alice"}) \
        .status_code == 201
    services.remove_member(vault, alice, actor=alice)
    assert api_for(carol).post("/v0/grants/grt_hers/revoke", {}).status_code == 200
    # then: nothing of it reaches her (her receivers were woken by it)
    hers = EventAddressee.objects.filter(event__kind="grant.revoked", event__data__grant__id="grt_hers")
    assert list(hers.values_list("member__handle", flat=True)) == ["carol"]


def test_an_owner_removed_while_creating_a_grant_creates_none(locked, alice, carol, monkeypatch):
    # given: a second owner removes alice between her first check and her grant's insert
    from controlplane.errors import Forbidden
    from grants import services as grants

    services.add_member(locked, carol, role="owner", actor=alice)
    looked_up = grants.member_for_handle

    def removed_meanwhile(handle):
        if not removed_meanwhile.done:
            removed_meanwhile.done = True
            services.remove_member(locked, alice, actor=carol)
        return looked_up(handle)

    removed_meanwhile.done = False
    monkeypatch.setattr(grants, "member_for_handle", removed_meanwhile)
    # when / then: the check under the owners' locks refuses it
    with pytest.raises(Forbidden):
        grants.create_grant(locked, grant_id="grt_late", kind="pair", sender="@bob", recipient="@carol",
                            actor=alice)
    assert not Grant.objects.exists()
