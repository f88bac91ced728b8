"""The signed-in member's bearer credentials: create (named), list, revoke.
A new token is shown once, in the answer to the form that made it (never
cached, never again); the list shows names and dates only."""
from __future__ import annotations

from django.contrib import messages as flash
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from controlplane import bearer
from controlplane.api.fields import validated
from controlplane.api.serializers import CredentialCreateIn
from controlplane.errors import NotFound
from controlplane.models import Credential
from web.pages import member_page


def _page(request, member, **extra):
    credentials = Credential.objects.filter(member=member).order_by("created_at")
    return render(request, "web/credentials.html", {"credentials": credentials, "limit": bearer.MAX_CREDENTIALS,
                                                    **extra})


@member_page
def credentials_page(request, member):
    return _page(request, member)


@member_page
@require_POST
def create_credential(request, member):
    name = validated(CredentialCreateIn, {"name": request.POST.get("name", "").strip()})["name"]  # the API's rule
    credential, token = bearer.issue_credential(member, actor=member, name=name)
    return _page(request, member, token=token, created=credential)


@member_page
@require_POST
def revoke_credential(request, member, credential_id):
    credential = Credential.objects.filter(member=member, public_id=credential_id).first()
    if credential is None:
        raise NotFound("No such credential.")
    bearer.revoke_credential(credential, actor=member)
    flash.success(request, f"Credential {credential.name or credential.public_id} was revoked; it no longer works.")
    return redirect("web-credentials")
