"""The `switchboard` command, run as a subprocess with a config folder of
its own, against a real server: login, send, inbox, ack, tail, --json, and
the exit code of each error class."""
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from switchboard_client import cli, errors

from tests.client.conftest import member_token
from tests.servers import free_port

pytestmark = pytest.mark.django_db(transaction=True)
SWITCHBOARD = Path(sys.executable).parent / "switchboard"  # the console script `pip install` made


def shell(config: Path, *args: str, input: str | None = None, **env) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_")}
    environment.update(XDG_CONFIG_HOME=str(config), **env)
    return subprocess.run([str(SWITCHBOARD), *args], input=input, capture_output=True, text=True, env=environment,
                          timeout=90)


def test_login_stores_the_token_privately_and_never_prints_it(server, tmp_path):
    token = member_token("alice")
    # when: a bad token first, then the right one on stdin
    refused = shell(tmp_path, "login", "--host", server, input="sbt_" + "x" * 43 + "\n")
    accepted = shell(tmp_path, "login", "--host", server, input=token + "\n")
    # then
    assert refused.returncode == 3 and "UNAUTHENTICATED" in refused.stderr
    assert accepted.returncode == 0, accepted.stderr
    assert "@alice" in accepted.stdout and token not in accepted.stdout + accepted.stderr
    path = tmp_path / "switchboard" / "config.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert json.loads(path.read_text()) == {"hosts": {server: {"token": token}}, "default_host": server}
    # and later commands use it, on the host of the last login
    whoami = shell(tmp_path, "whoami", "--json")
    assert whoami.returncode == 0 and json.loads(whoami.stdout)["handle"] == "@alice"
    assert token not in whoami.stdout


def test_send_inbox_tail_and_ack_from_the_shell(server, tmp_path):
    # given: alice and bob logged in, each with a config of their own
    alice, bob = tmp_path / "alice", tmp_path / "bob"
    assert shell(alice, "login", "--host", server, "--token", member_token("alice")).returncode == 0
    assert shell(bob, "login", "--host", server, input=member_token("bob")).returncode == 0
    assert shell(alice, "spaces", "create", "lab", "Lab").returncode == 0
    assert shell(bob, "spaces", "join", "lab").returncode == 0
    # when: bob writes to alice (the body from stdin)
    sent = shell(bob, "send", "lab", "@alice", "--json", input="hello from the shell")
    assert sent.returncode == 0, sent.stderr
    message = json.loads(sent.stdout)
    # then: alice's inbox has it, as a table and as JSON
    table = shell(alice, "inbox")
    assert table.returncode == 0 and table.stdout.splitlines()[0].split() == ["TOKEN", "KIND", "FROM", "WHERE",
                                                                               "CONTENT"]
    assert "hello from the shell" in table.stdout and "@bob" in table.stdout
    (item,) = json.loads(shell(alice, "inbox", "--json").stdout)["items"]
    assert item["item"]["postId"] == message["id"]
    # and her inbox feed, followed until one event came
    tail = shell(alice, "tail", "--inbox", "--count", "1", "--json")
    assert tail.returncode == 0
    (event,) = [json.loads(line) for line in tail.stdout.splitlines()]
    assert event["kind"] == "message.created" and event["data"]["message"]["id"] == message["id"]
    assert tail.stderr.startswith("cursor: ")
    human_tail = shell(alice, "tail", "--space", "lab", "--count", "2")
    assert "member.joined" in human_tail.stdout or "conversation.created" in human_tail.stdout
    # when she acknowledges it, it is gone
    # (with an unknown token after it: --json still says what was acknowledged before the refusal)
    ack = shell(alice, "ack", item["deliveryToken"], "dlv_" + "A" * 43, "--json")
    assert ack.returncode == 4 and json.loads(ack.stdout) == {"acknowledged": [item["deliveryToken"]]}
    assert json.loads(shell(alice, "inbox", "--json").stdout)["items"] == []
    # and the spaces list shows her role
    spaces = json.loads(shell(alice, "spaces", "--json").stdout)["spaces"]
    assert [(s["slug"], s["role"]) for s in spaces] == [("lab", "owner")]


def test_tail_with_a_count_pages_on_from_the_cursor_it_prints(server, tmp_path):
    # given: six messages in alice's inbox feed
    alice, bob = tmp_path / "alice", tmp_path / "bob"
    assert shell(alice, "login", "--host", server, "--token", member_token("alice")).returncode == 0
    assert shell(bob, "login", "--host", server, "--token", member_token("bob")).returncode == 0
    assert shell(alice, "spaces", "create", "lab", "Lab").returncode == 0
    assert shell(bob, "spaces", "join", "lab").returncode == 0
    for n in range(6):
        assert shell(bob, "send", "lab", "@alice", f"number {n}").returncode == 0
    # when: she tails two at a time, each run from the cursor the one before printed
    seen, after = [], []
    for _ in range(3):
        run = shell(alice, "tail", "--inbox", "--count", "2", "--json", "--wait-ms", "0", *after)
        assert run.returncode == 0, run.stderr
        seen += [json.loads(line)["data"]["message"]["body"] for line in run.stdout.splitlines()]
        after = ["--after", run.stderr.removeprefix("cursor: ").strip()]
    # then: each run went on where the last stopped (each printed the same events again)
    assert seen == [f"number {n}" for n in range(6)]
    # and a cursor that is none is told as such, not printed back as where to resume
    refused = shell(alice, "tail", "--inbox", "--after", "not-a-cursor", "--wait-ms", "0")
    assert refused.returncode != 0 and "INVALID_CURSOR" in refused.stderr and "cursor: " not in refused.stderr


def test_a_list_longer_than_a_page_says_the_command_for_the_next(server, tmp_path):
    # given: more grants in lab than a page holds
    from switchboard_client import Client

    alice = tmp_path / "alice"
    token = member_token("alice")
    assert shell(alice, "login", "--host", server, "--token", token).returncode == 0
    api = Client(server, token)
    api.create_space("lab", "Lab")
    for n in range(51):
        api.create_grant("lab", f"grt_g{n:02d}", "project")
    # when: the first page is listed
    first = shell(alice, "grants", "list", "lab")
    # then: it ends saying how to see the rest, and that command shows them
    more = first.stderr.strip().removeprefix("more: ")
    assert first.returncode == 0 and more.startswith("switchboard grants list lab --cursor ")
    rest = shell(alice, *more.split()[1:])
    assert rest.returncode == 0 and "more:" not in rest.stderr
    rows = [line.split()[0] for line in first.stdout.splitlines()[1:] + rest.stdout.splitlines()[1:]]
    assert sorted(rows) == [f"grt_g{n:02d}" for n in range(51)]


@pytest.mark.parametrize("words", [["grants", "list", "lab", "--cursor", "-Qw0boK39"],
                                   ["tail", "--inbox", "--after", "-Qw0boK39", "--count", "3"]])
def test_a_cursor_that_begins_with_a_dash_is_a_cursor(words):
    """A cursor is base64url: one in 64 begins with "-", which argparse
    took for an option ("expected one argument"), and the command the last
    page printed failed."""
    args = cli.build_parser().parse_args(cli.joined_cursors(words))
    assert (getattr(args, "cursor", None) or args.after) == "-Qw0boK39"
    assert cli.joined_cursors(["send", "lab", "@bo", "--", "--cursor", "x"])[-2:] == ["--cursor", "x"]


def test_the_next_page_command_replaces_a_cursor_given_either_way():
    assert cli.next_page_command("c2", ["webhooks", "deliveries", "whs_1", "--cursor", "c1"]) == \
        "switchboard webhooks deliveries whs_1 --cursor c2"
    assert cli.next_page_command("c2", ["spaces", "--cursor=c1", "--host", "http://h"]) == \
        "switchboard spaces --host http://h --cursor c2"


def test_each_error_class_has_its_exit_code(server, tmp_path):
    alice = tmp_path / "alice"
    assert shell(alice, "login", "--host", server, "--token", member_token("alice")).returncode == 0
    shell(alice, "spaces", "create", "lab", "Lab")
    bob = tmp_path / "bob"
    assert shell(bob, "login", "--host", server, "--token", member_token("bob")).returncode == 0
    assert shell(bob, "spaces", "join", "lab").returncode == 0
    # 1: usage, and not logged in
    assert shell(alice, "tail").returncode == 1
    assert shell(alice, "nonsense").returncode == 1
    nobody = shell(tmp_path / "nobody", "inbox", "--host", server)
    assert nobody.returncode == 1 and "not logged in" in nobody.stderr
    # 2: a bad request (a body over 8 KiB)
    large = shell(alice, "send", "lab", "@bob", "x" * 9000)
    assert large.returncode == 2 and "BODY_TOO_LARGE" in large.stderr
    # 2: bytes that are not UTF-8, on the command line (was a traceback and 1)
    undecodable = shell(alice, "send", "lab", "@bob", "ok\udcff")
    assert undecodable.returncode == 2 and "INVALID_BODY" in undecodable.stderr
    # 3: a bad credential
    guessed = "sbt_" + "y" * 43
    assert shell(tmp_path / "nobody", "inbox", SWITCHBOARD_URL=server, SWITCHBOARD_TOKEN=guessed).returncode == 3
    # 4: not found
    unknown = shell(alice, "ack", "dlv_" + "A" * 43, "--json")
    assert unknown.returncode == 4 and json.loads(unknown.stderr)["error"]["code"] == "UNKNOWN_DELIVERY"
    # 5: a conflict (one key, two bodies)
    assert shell(alice, "send", "lab", "@bob", "a", "--idempotency-key", "cli-key-1").returncode == 0
    assert shell(alice, "send", "lab", "@bob", "b", "--idempotency-key", "cli-key-1").returncode == 5
    # 7: no server there (after the client's retries)
    down = shell(alice, "inbox", "--host", f"http://127.0.0.1:{free_port()}")
    assert down.returncode == 1 and "not logged in" in down.stderr  # a token is per host
    down = shell(alice, "inbox", SWITCHBOARD_URL=f"http://127.0.0.1:{free_port()}", SWITCHBOARD_TOKEN="sbt_" + "z" * 43)
    assert down.returncode == 7 and "CONNECTION_FAILED" in down.stderr


def test_the_exit_codes_follow_the_error_groups(tmp_path):
    # the mapping is by group, the same for every code in it
    assert {cls.exit_code for cls in errors.BY_CODE.values()} == {2, 3, 4, 5, 6, 7}
    assert errors.RateLimited.exit_code == 6 and errors.Unavailable.exit_code == 7
    assert "6 rate limited" in cli.__doc__
    # and 6 from a command: a server that rate-limits everything, with no wait asked (so no test waits)
    from tests.client.test_signing_keys import Answering

    limiting = Answering(429, {"Retry-After": "0"}, {"error": {"code": "RATE_LIMITED", "message": "slow down",
                                                                "details": {"retry_after": 0}}})
    limited = shell(tmp_path, "whoami", SWITCHBOARD_URL=limiting.base_url, SWITCHBOARD_TOKEN="sbt_" + "x" * 43)
    limiting.close()
    assert limited.returncode == 6 and "RATE_LIMITED" in limited.stderr and limiting.requests == 5


def test_a_subscribe_whose_activation_is_refused_leaves_no_subscription_behind(server, tmp_path):
    from controlplane.models import Member
    from webhooks.models import Endpoint, Subscription

    # given: an endpoint its receiver never verified
    assert shell(tmp_path, "login", "--host", server, "--token", member_token("alice")).returncode == 0
    endpoint = Endpoint.objects.create(owner=Member.objects.get(handle="alice"), url="https://hooks.example/in")
    # when: subscribed twice, each refused at activation
    failed = [shell(tmp_path, "webhooks", "subscribe", "--inbox", "--endpoint", endpoint.public_id)
              for _ in range(2)]
    # then: a conflict each time, and no inactive subscription left to count against the limits
    assert [f.returncode for f in failed] == [5, 5], failed[0].stderr
    assert not Subscription.objects.exclude(status=Subscription.Status.DELETED).exists()


def test_grants_approvals_and_webhooks_from_the_shell(server, tmp_path):
    # given: alice, an admin, owns an explicit_only space that bob joined
    alice, bob = tmp_path / "alice", tmp_path / "bob"
    assert shell(alice, "login", "--host", server, "--token", member_token("alice", admin=True)).returncode == 0
    assert shell(bob, "login", "--host", server, "--token", member_token("bob")).returncode == 0
    assert shell(alice, "spaces", "create", "strict", "Strict", "--send-policy", "explicit_only").returncode == 0
    assert shell(bob, "spaces", "join", "strict").returncode == 0
    # when: bob's send needs a grant, and asks for approval
    refused = shell(bob, "send", "strict", "@alice", "may I?", "--request-approval", "--json")
    # then: exit 3, and the approval request is in alice's queue
    assert refused.returncode == 3
    request_id = json.loads(refused.stderr)["error"]["details"]["approval_request"]["id"]
    pending = json.loads(shell(alice, "approvals", "--status", "pending", "--json").stdout)["approval_requests"]
    assert [r["id"] for r in pending] == [request_id]
    approved = shell(alice, "approvals", "approve", request_id, "--json")
    assert approved.returncode == 0 and json.loads(approved.stdout)["status"] == "approved"
    # grants: create, list, revoke
    assert shell(alice, "grants", "create", "strict", "grt_cli-1", "--kind", "project").returncode == 0
    listed = json.loads(shell(alice, "grants", "list", "strict", "--json").stdout)["grants"]
    assert "grt_cli-1" in [g["id"] for g in listed]
    revoked = json.loads(shell(alice, "grants", "revoke", "grt_cli-1", "--json").stdout)
    assert revoked["status"] in ("revoking", "revoked")
    # webhooks: nothing registered yet; a plain-http loopback URL is refused (INVALID_URL: exit 2)
    assert json.loads(shell(alice, "webhooks", "endpoints", "--json").stdout)["endpoints"] == []
    assert json.loads(shell(alice, "webhooks", "subscriptions", "--json").stdout)["subscriptions"] == []
    assert shell(alice, "webhooks", "add", "http://127.0.0.1:9/hook").returncode == 2
