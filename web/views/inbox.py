"""The inbox page: pending items page by page, acknowledged one at a time;
the items the firewall holds, with their guidance, released one at a time;
and the firewall's rules, edited in one form. Each goes through the same
functions as the API's routes (inbox.reads, inbox.firewall)."""
from __future__ import annotations

from django.contrib import messages as flash
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.views.decorators.http import require_POST

from controlplane.errors import InvalidRequest
from inbox import firewall, reads
from inbox.api.delivery_views import parse_rules
from inbox.delivery import acknowledge_delivery, pending_count
from inbox.models import FirewallRule, InboxItem
from inbox.render import RULE_FIELDS
from web.pages import digits, member_page

# A rule's pattern and guidance are kept as typed, as the API keeps them.
VERBATIM = {"content_pattern", "guidance"}

BLANK_RULES = 1  # empty rows the form offers for new rules


def _entries(items: list[InboxItem]) -> list[dict]:
    conversations = {i.pk: i.conversation for i in InboxItem.objects.filter(pk__in=[i.pk for i in items])
                     .select_related("conversation__space")}
    return [{"item": item, "payload": item.payload, "conversation": conversations[item.pk]} for item in items]


@member_page
def inbox_page(request, member):
    items, next_cursor = reads.pending_items(member, request.GET.get("cursor") or None)
    context = {"items": _entries(items), "next_cursor": next_cursor, "pending": pending_count(member),
               "paged": bool(request.GET.get("cursor"))}
    if request.headers.get("HX-Request"):
        return render(request, "web/_inbox_items.html", context)
    held, next_held = reads.held_items(member, request.GET.get("held") or None)
    rules = list(FirewallRule.objects.filter(member=member).order_by("ordinal"))
    return render(request, "web/inbox.html", {
        **context, "held": _entries(held), "next_held": next_held,
        "rules": [*rules, *[FirewallRule(action="") for _ in range(BLANK_RULES)]],
        "actions": FirewallRule.Action.values, "kinds": ["channel", "direct", "group"],
    })


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


@member_page
@require_POST
def release(request, member):
    firewall.release_item(member, request.POST.get("token", ""), actor=member)
    flash.success(request, "Released: the item is in your inbox now.")
    return redirect("web-inbox")


@member_page
@require_POST
def set_rules(request, member):
    """Rows `rule-N-FIELD`, in order; a row without an action is dropped."""
    rows, count = [], digits(request.POST.get("rules", ""))
    if count is None:  # (it read as none, and saving deleted every rule)
        raise InvalidRequest("The form's rule count is missing or malformed.")
    count = min(count, firewall.MAX_RULES + BLANK_RULES)
    for n in range(count):
        row = {f: value if f in VERBATIM else value.strip()
               for f in RULE_FIELDS for value in [request.POST.get(f"rule-{n}-{f}", "")]}
        if not row["action"]:
            continue
        rule = {f: v for f, v in row.items() if v}
        if "min_bytes" in rule:
            value = rule["min_bytes"]
            rule["min_bytes"] = value if (number := digits(value)) is None else number  # else: a 400
        rows.append(rule)
    saved = firewall.set_rules(member, parse_rules({"rules": rows}), actor=member)
    flash.success(request, f"Firewall saved: {len(saved)} rule{'' if len(saved) == 1 else 's'}.")
    return redirect("web-inbox")
