"""Every model is in the Django admin; history is read-only; secrets stay out."""
import pytest
from django.apps import apps
from django.contrib import admin
from django.test import Client

from controlplane import services
from inbox.services import send_message


@pytest.fixture
def staff_client(make_member):
    make_member("root", kind="human", is_admin=True, password="pw-for-tests-1")
    client = Client()
    assert client.login(username="root", password="pw-for-tests-1")
    return client


def test_every_model_is_registered():
    for app in ("controlplane", "inbox", "grants", "webhooks"):
        for model in apps.get_app_config(app).get_models():
            assert admin.site.is_registered(model), model


def test_changelists_render_without_secrets(staff_client, general, alice):
    # given
    _, token = services.issue_credential(alice, actor=None)
    send_message(general, body="hello", actor=alice)
    # when / then
    for app in ("controlplane", "inbox", "grants", "webhooks"):
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
