"""Signing in to the web app: who may, what a suspension does to a session,
and how guesses are throttled (per account, per address, look-alike names)."""
import re

import pytest
from django.test import Client

from controlplane import services
from controlplane.models import Member
from tests.conftest import clear_of_window_edge
from tests.web.conftest import PASSWORD

pytestmark = pytest.mark.django_db


def test_pages_send_signed_out_visitors_to_sign_in():
    response = Client().get("/app/inbox/")
    assert response.status_code == 302 and response["Location"] == "/app/login/?next=/app/inbox/"


def test_a_human_member_signs_in_with_handle_and_password(ann):
    client = Client()
    response = client.post("/app/login/", {"username": "ann", "password": PASSWORD})
    assert response.status_code == 302 and response["Location"] == "/app/"
    assert "Conversations" in client.get("/app/").content.decode()


@pytest.mark.parametrize("password", ["wrong", PASSWORD])
def test_a_suspended_member_or_a_wrong_password_cannot_sign_in(ann, password):
    Member.objects.filter(pk=ann.pk).update(status=Member.Status.SUSPENDED)
    client = Client()
    response = client.post("/app/login/", {"username": "ann", "password": password})
    assert response.status_code == 200 and 'role="alert"' in response.content.decode()
    assert client.get("/app/").status_code == 302
    # the answer is the same either way: it tells no one that a suspended member's password is right
    alert = re.search(r'class="error" role="alert">(.*?)</div>', response.content.decode(), re.S).group(1)
    assert "Please enter a correct username and password" in alert and "member" not in alert


def test_a_session_of_a_member_suspended_as_admins_do_is_signed_out(ann, browser_of):
    # given a signed-in member, suspended through the service the admin and the API use
    client = browser_of(ann)
    services.update_member(ann, status=Member.Status.SUSPENDED, actor=None)
    # then the session no longer opens pages (docs/web.md: it is signed out)
    assert client.get("/app/")["Location"].startswith("/app/login/")
    response = client.get("/app/", HTTP_ACCEPT="application/json")
    assert response.status_code == 401 and response.json()["error"]["code"] == "UNAUTHENTICATED"


def test_a_session_of_a_member_suspended_later_no_longer_opens_pages(ann, browser_of):
    client = browser_of(ann)
    Member.objects.filter(pk=ann.pk).update(status=Member.Status.SUSPENDED)
    # a page says why and offers to sign out (the sign-in page would send the session straight back)
    page = client.get("/app/", follow=True)
    assert page.status_code == 403 and "not an active member" in page.content.decode()
    assert 'action="/app/logout/"' in page.content.decode()
    response = client.get("/app/", HTTP_ACCEPT="application/json")
    assert response.status_code == 401 and response.json()["error"]["code"] == "UNAUTHENTICATED"


def test_sign_in_is_throttled_per_account_even_for_the_right_password(ann, settings):
    settings.SIGNIN_PER_ACCOUNT, settings.SIGNIN_PER_ADDRESS = 3, 100
    clear_of_window_edge(15 * 60)
    client = Client()
    statuses = [client.post("/app/login/", {"username": "ann", "password": "guess"}).status_code for _ in range(3)]
    blocked = client.post("/app/login/", {"username": "ann", "password": PASSWORD})
    assert statuses == [200, 200, 200]
    assert blocked.status_code == 429 and 1 <= int(blocked["Retry-After"]) <= 900
    assert client.get("/app/").status_code == 302  # not signed in
    # another account from the same address is unaffected
    assert Client().post("/app/login/", {"username": "ben", "password": "guess"}).status_code == 200


@pytest.mark.parametrize("path", ["/app/login/", "/admin/login/"])
def test_a_handles_look_alike_forms_count_as_the_account_they_sign_in_to(ann, settings, path):
    # given: ann's attempts spent from one address
    settings.SIGNIN_PER_ACCOUNT, settings.SIGNIN_PER_ADDRESS = 2, 1000
    clear_of_window_edge(15 * 60)
    client = Client(REMOTE_ADDR="198.51.100.7")
    guesses = [client.post(path, {"username": "ann", "password": "guess"}).status_code for _ in range(2)]
    # when: the same account, named in full-width or capital letters, which the form resolves to "ann" (NFKC)
    variants = [client.post(path, {"username": name, "password": PASSWORD}).status_code
                for name in ("\uff41nn", " ANN", "\U0001d41anN")]
    # then: each counts against ann's spent attempts
    assert guesses == [200, 200] and variants == [429, 429, 429]


@pytest.mark.parametrize("path", ["/app/login/", "/admin/login/"])
def test_guesses_from_one_address_do_not_lock_the_owner_out_from_another(ann, settings, path):
    # given: one address spends its attempts at ann's account
    from controlplane.ratelimit import SIGNIN_ACCOUNT_EVERYWHERE

    settings.SIGNIN_PER_ACCOUNT, settings.SIGNIN_PER_ADDRESS = 2, 1000
    clear_of_window_edge(15 * 60)
    guesser = Client(REMOTE_ADDR="198.51.100.7")
    statuses = [guesser.post(path, {"username": "ann", "password": "guess"}).status_code for _ in range(3)]
    # when: ann signs in from her own address
    ann_signs_in = Client(REMOTE_ADDR="198.51.100.8").post("/app/login/", {"username": "ann", "password": PASSWORD})
    # then
    assert statuses == [200, 200, 429]
    assert ann_signs_in.status_code == 302
    # and guesses spread over many addresses still meet the account's own bound
    spread = [Client(REMOTE_ADDR=f"203.0.113.{n}").post(path, {"username": "ann", "password": "guess"}).status_code
              for n in range(settings.SIGNIN_PER_ACCOUNT * SIGNIN_ACCOUNT_EVERYWHERE)]
    everywhere = settings.SIGNIN_PER_ACCOUNT * SIGNIN_ACCOUNT_EVERYWHERE
    assert spread.index(429) == everywhere - 3  # after the three guesses (ann's own sign-in was given back)


@pytest.mark.parametrize("path", ["/app/login/", "/admin/login/"])
def test_an_owner_who_signs_in_often_keeps_the_accounts_attempts_but_spends_the_addresss(human, settings, path):
    # given: two attempts per account and six per address; an admin, who may sign in to both
    human("ada", is_admin=True)
    settings.SIGNIN_PER_ACCOUNT, settings.SIGNIN_PER_ADDRESS = 2, 6
    clear_of_window_edge(15 * 60)
    address = {"REMOTE_ADDR": "198.51.100.7"}
    # when: the owner signs in three times from one address, in fresh sessions
    signed_in = [Client(**address).post(path, {"username": "ada", "password": PASSWORD}).status_code
                 for _ in range(3)]
    # then: each succeeded, and the account's two guesses from there are still to spend
    assert signed_in == [302, 302, 302]
    guesses = [Client(**address).post(path, {"username": "ada", "password": "guess"}).status_code for _ in range(3)]
    assert guesses == [200, 200, 429]
    # but the sign-ins were the address's: its seventh attempt, at any account, is refused
    assert Client(**address).post(path, {"username": "ben", "password": "guess"}).status_code == 429
    assert Client(REMOTE_ADDR="198.51.100.8").post(path, {"username": "ben", "password": "guess"}).status_code == 200


@pytest.mark.parametrize("path", ["/app/login/", "/admin/login/"])
def test_sign_in_is_throttled_per_client_address(ann, settings, path):
    settings.SIGNIN_PER_ACCOUNT, settings.SIGNIN_PER_ADDRESS = 100, 2
    clear_of_window_edge(15 * 60)
    client = Client(REMOTE_ADDR="198.51.100.7")
    statuses = [client.post(path, {"username": name, "password": "guess"}).status_code
                for name in ("ann", "ben", "cid")]
    assert statuses == [200, 200, 429]
    assert Client(REMOTE_ADDR="198.51.100.8").post(path, {"username": "cid", "password": "x"}).status_code == 200
    # an IPv6 host is counted by its /64, from which it may take any address
    v6 = [Client(REMOTE_ADDR=f"2001:db8:1:2::{n:x}").post(path, {"username": "cid", "password": "x"}).status_code
          for n in range(1, 4)]
    assert v6 == [200, 200, 429]


def test_a_flood_of_names_from_another_address_does_not_reset_an_addresss_guesses(ann, settings):
    """Without Redis the counters live in a local cache that held 300 entries,
    and each refused attempt under a new name made two: another address's
    flood of names pushed the guesser's counts out, and ann's password was
    guessed 70 times in 30 seconds against a limit of 10 per 15 minutes."""
    settings.SIGNIN_PER_ACCOUNT, settings.SIGNIN_PER_ADDRESS = 5, 10
    clear_of_window_edge(15 * 60)
    guesser, flooder = Client(REMOTE_ADDR="198.51.100.7"), Client(REMOTE_ADDR="198.51.100.8")
    # given: the guesser spent ann's attempts from its address
    guesses = [guesser.post("/app/login/", {"username": "ann", "password": "guess"}).status_code for _ in range(6)]
    # when: another address sends 400 attempts under new names
    flood = {flooder.post("/app/login/", {"username": f"name{n}", "password": "x"}).status_code for n in range(400)}
    # then: the guesser is still refused
    assert guesses == [200] * 5 + [429] and flood == {200, 429}
    assert guesser.post("/app/login/", {"username": "ann", "password": PASSWORD}).status_code == 429
