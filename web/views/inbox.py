"""The inbox page: pending items, acknowledged one at a time."""
from __future__ import annotations

from django.contrib import messages as flash
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.views.decorators.http import require_POST

from inbox.delivery import acknowledge_delivery, pending_count, read_inbox
from inbox.models import InboxItem
from web.pages import member_page


def _items(member) -> list[dict]:
    page = read_inbox(member)
    conversations = {i.pk: i for i in InboxItem.objects.filter(pk__in=[i.pk for i in page.items])
                     .select_related("conversation__space")}
    return [{"item": item, "payload": item.payload, "conversation": conversations[item.pk].conversation}
            for item in page.items]


@member_page
def inbox_page(request, member):
    template = "web/_inbox_items.html" if request.headers.get("HX-Request") else "web/inbox.html"
    return render(request, template, {"items": _items(member), "pending": pending_count(member)})


@member_page
@require_POST
def acknowledge(request, member):
    acknowledge_delivery(member, request.POST.get("token", ""), actor=member)
    if request.headers.get("HX-Request"):
        # The item leaves the list; the count updates out of band.
        return HttpResponse(render_to_string("web/_inbox_count.html", {"pending": pending_count(member),
                                                                       "oob": True}))
    flash.success(request, "Acknowledged.")
    return redirect("web-inbox")
