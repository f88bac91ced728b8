"""A collective request survives its server: killed (SIGKILL) with answers
pending and restarted, it completes once (SPEC §7b)."""
import httpx
import pytest

from inbox.models import Collective, InboxItem
from tests.servers import member_token, serving

pytestmark = pytest.mark.django_db(transaction=True)


def member(handle: str) -> dict:
    return {"Authorization": f"Bearer {member_token(handle)}"}


def test_a_killed_server_loses_no_answer_and_the_operation_completes_once():
    # given: ada asks bo and cy; bo answers; the server is killed
    ada, bo, cy = member("ada"), member("bo"), member("cy")
    with serving() as (base, process):
        assert httpx.post(f"{base}/v0/spaces", json={"slug": "lab", "name": "Lab"}, headers=ada).status_code == 201
        for who in (bo, cy):
            assert httpx.post(f"{base}/v0/spaces/lab/join", headers=who).status_code == 201
        group = httpx.post(f"{base}/v0/spaces/lab/groups", json={"members": ["@ada", "@bo", "@cy"]},
                           headers=ada).json()["conversation"]["id"]
        sent = httpx.post(f"{base}/v0/spaces/lab/conversations/{group}/messages", headers=ada,
                          json={"body": "Ship it?", "collective": {"op": "gather", "deadline_ms": 600_000}})
        message = sent.json()["message"]["id"]
        assert httpx.post(f"{base}/v0/messages/{message}/answer", json={"body": "yes"}, headers=bo).status_code == 201
        process.kill()
        process.wait()
    # when: a new server; cy answers, and bo retries his answer
    with serving() as (base, _):
        answered = httpx.post(f"{base}/v0/messages/{message}/answer", json={"body": "no"}, headers=cy)
        retried = httpx.post(f"{base}/v0/messages/{message}/answer", json={"body": "yes"}, headers=bo)
        inbox = httpx.get(f"{base}/v0/me/inbox", headers=ada).json()["items"]
    # then
    assert answered.status_code == 201 and retried.status_code == 200
    results = [i["item"] for i in inbox if i["item"]["kind"] == "collective.result"]
    assert len(results) == 1
    assert [(a["member"], a["answer"]) for a in results[0]["answers"]] == [("@bo", "yes"), ("@cy", "no")]
    assert Collective.objects.get().state == "completed"
    assert InboxItem.objects.filter(kind="collective.result").count() == 1
