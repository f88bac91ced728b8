"""A collective request sent under a grant fails once the grant is revoked (SPEC §7b)."""
from controlplane import services
from grants import services as grants
from inbox.models import Collective, InboxItem
from tests.conftest import error_code


def test_revoked_authority_fails_the_operation(locked, alice, bob, carol, grant, as_alice, as_bob):
    # given: a project grant lets alice's collective request through
    project = grant("grt_project", "project")
    group, _ = services.get_or_create_group(locked, [alice, bob, carol], actor=alice)
    sent = as_alice.post(f"/v0/spaces/vault/conversations/{group.public_id}/messages",
                         {"body": "Vote?", "collective": {"op": "gather", "deadline_ms": 60_000}})
    assert sent.status_code == 201
    # when
    grants.revoke_grant(project, actor=alice)
    late = as_bob.post(f"/v0/messages/{sent.json()['message']['id']}/answer", {"body": "yes"})
    # then
    assert late.status_code == 409 and error_code(late) == "CONFLICT"
    assert late.json()["error"]["details"] == {"state": "failed", "reason": "authority_revoked"}
    assert Collective.objects.get().reason == "authority_revoked"
    (failed,) = InboxItem.objects.filter(member=alice, kind="operationFailed")
    assert failed.payload["reason"] == "authority_revoked"
