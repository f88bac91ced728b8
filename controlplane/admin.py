import django_q.admin
from django import forms
from django.contrib import admin
from django.contrib.auth import admin as auth_admin
from django.contrib.auth.models import Group, User
from django.core.exceptions import FieldDoesNotExist, ValidationError
from django.db.models.constants import LOOKUP_SEP
from django.urls import reverse
from django.utils.html import format_html
from django.utils.text import smart_split
from django_q.models import Failure, OrmQ, Schedule, Success

from controlplane import audit, bearer, services
from controlplane.access import admin_member
from controlplane.errors import InvalidRequest
from controlplane.models import (AuditEntry, Conversation, Credential, Event, EventAddressee, IdempotencyRecord,
                                 LogHead, Member, Membership, Participant, Space, UserSession)
from controlplane.names import checked_name

# Fields that hold a secret, its hash or its ciphertext: never shown, and
# never a list's filter, on any model or through any relation (a filter in
# the URL, `?token_hash__startswith=0`, would probe one a character at a
# time; Django's own UserAdmin refuses it for `password`).
SECRET_FIELDS = frozenset({"token_hash", "secret", "previous_secret", "private_key", "session_key", "session_data",
                           "password"})
SEARCH_TERMS = 10  # words of a list's search


def _fields_named(model, lookup: str) -> list[str]:
    """The fields a list filter's `lookup` names, model by model through its
    relations, `pk` read as the name of the key it stands for (a session's
    `pk` is its `session_key`)."""
    names = []
    for part in lookup.split(LOOKUP_SEP):
        if model is not None and part == "pk":
            part = model._meta.pk.name
        names.append(part)
        try:
            model = model._meta.get_field(part).related_model if model is not None else None
        except FieldDoesNotExist:
            model = None  # a lookup (`startswith`) or a transform: nothing further is a field
    return names


class Guarded(admin.ModelAdmin):
    def lookup_allowed(self, lookup, value, request=None):
        if SECRET_FIELDS.intersection(_fields_named(self.model, lookup)):
            return False
        return super().lookup_allowed(lookup, value, request)

    def get_search_results(self, request, queryset, search_term):
        """The first SEARCH_TERMS words only: each is a condition on every
        search field, and a thousand made a query SQLite refused as too
        deep (answered as a lost database)."""
        return super().get_search_results(request, queryset, " ".join(list(smart_split(search_term))[:SEARCH_TERMS]))


class ReadOnlyAdmin(Guarded):
    """History must not change: these records are shown, never edited."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class ThroughTheServices(Guarded):
    """Rows the services make and remove (with their events, hooks, checks
    and audit entries): the admin may change only what its own code routes
    through them, and adds and deletes none."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


def _name_form(model, field: str, *, blank: bool = False) -> type[forms.ModelForm]:
    """A change form whose `field` is checked as the services check the
    names they store (controlplane.names): the admin saved what the API,
    the web app and the commands refuse."""
    def clean(form):
        value = form.cleaned_data[field]
        try:
            return checked_name(field, value, model._meta.get_field(field).max_length, blank=blank)
        except InvalidRequest as refused:
            raise ValidationError(refused.message) from None
    return type(f"{model.__name__}Form", (forms.ModelForm,), {
        "Meta": type("Meta", (), {"model": model, "fields": "__all__"}), f"clean_{field}": clean})


@admin.register(Member)
class MemberAdmin(ThroughTheServices):
    """Members are made by `createmember`, the API or the web app, and
    suspended rather than deleted; a handle is a URL and a sign-in name."""
    list_display = ["handle", "public_id", "kind", "status", "is_admin", "created_at"]
    list_filter = ["kind", "status", "is_admin"]
    search_fields = ["handle", "public_id", "display_name"]
    readonly_fields = ["public_id", "handle", "kind", "user", "created_at"]
    form = _name_form(Member, "display_name", blank=True)

    def save_model(self, request, obj, form, change):
        """Suspension and admin powers change through `update_member`, so
        sessions, sockets and the user's flags follow."""
        wanted = {name: form.cleaned_data[name] for name in ("status", "is_admin") if name in form.changed_data}
        others = [name for name in form.changed_data if name not in wanted]
        if others:
            obj.save(update_fields=others)
            audit.record("member.updated", obj.public_id, actor=admin_member(request.user),
                         **{name: form.cleaned_data[name] for name in others})
        if wanted:
            services.update_member(obj, **wanted, actor=admin_member(request.user))


@admin.register(Credential)
class CredentialAdmin(ThroughTheServices):
    """Tokens are issued through the API or `issuecredential` (shown once),
    and revoked here through `revoke_credential`, which records it. Only a
    hash is stored, and even that is not shown."""
    list_display = ["public_id", "member", "created_at"]
    fields = ["public_id", "member", "created_at"]
    readonly_fields = ["public_id", "member", "created_at"]
    search_fields = ["public_id", "member__handle"]
    actions = ["revoke"]

    @admin.action(description="Revoke the selected credentials")
    def revoke(self, request, queryset):
        actor = admin_member(request.user)
        for credential in queryset.select_related("member"):
            bearer.revoke_credential(credential, actor=actor)
        self.message_user(request, "Revoked.")


@admin.register(Space)
class SpaceAdmin(ThroughTheServices):
    """Spaces are made by `create_space` (its owner and event); a slug is a
    URL. The rest may change here, the send policy only tightening."""
    list_display = ["slug", "name", "visibility", "send_policy", "archived", "created_at"]
    list_filter = ["visibility", "send_policy", "archived"]
    search_fields = ["slug", "name"]
    readonly_fields = ["public_id", "slug", "created_by", "created_at", "members"]
    form = _name_form(Space, "name")

    @admin.display(description="members")
    def members(self, obj: Space) -> str:
        """How many, and a link to their list: who joins and leaves, and in
        which role, goes through the services (through the API or the web
        app, where an admin may act in any space). Listed inline here, every
        member was a row of the form, and a space of about 490 could no
        longer be saved (DATA_UPLOAD_MAX_NUMBER_FIELDS)."""
        url = reverse("admin:controlplane_membership_changelist")
        count = Membership.objects.filter(space=obj).count()
        return format_html('<a href="{}?space__id__exact={}">{} memberships</a>', url, obj.pk, count)

    def save_model(self, request, obj, form, change):
        """Recorded, as no event records it: who changed which setting (a
        space made open shows its channels to everyone)."""
        super().save_model(request, obj, form, change)
        if form.changed_data:
            audit.record("space.updated", obj.public_id, actor=admin_member(request.user),
                         **{name: form.cleaned_data[name] for name in form.changed_data})
        if change and "archived" in form.changed_data and not obj.archived:
            services.space_unarchived.send(sender=Space, space=obj)


@admin.register(UserSession)
class UserSessionAdmin(ReadOnlyAdmin):
    """Who is signed in to the web app, until when. A session's key signs
    its holder in, so it is in no link, checkbox or column."""
    list_display = ["user_id", "expire_date"]
    list_display_links = None
    actions = None


@admin.register(Membership)
class MembershipAdmin(ReadOnlyAdmin):
    list_display = ["space", "member", "role", "status", "updated_at"]
    list_filter = ["role", "status"]
    search_fields = ["space__slug", "member__handle"]
    raw_id_fields = ["space", "member"]


class ParticipantInline(admin.TabularInline):
    model = Participant
    extra = 0
    can_delete = False
    readonly_fields = ["member", "ordinal"]

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Conversation)
class ConversationAdmin(ReadOnlyAdmin):
    list_display = ["public_id", "space", "kind", "name", "created_at"]
    list_filter = ["kind"]
    search_fields = ["public_id", "name", "space__slug"]
    inlines = [ParticipantInline]


@admin.register(Participant)
class ParticipantAdmin(ReadOnlyAdmin):
    list_display = ["conversation", "member", "ordinal"]


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = ["position", "kind", "space", "conversation", "actor", "restricted", "created_at"]
    list_select_related = ["space", "conversation", "actor"]  # nullable: not followed unless named
    list_filter = ["kind", "restricted"]
    search_fields = ["kind", "space__slug"]


@admin.register(EventAddressee)
class EventAddresseeAdmin(ReadOnlyAdmin):
    list_display = ["event", "member", "space"]
    list_select_related = ["event", "member", "space"]


@admin.register(LogHead)
class LogHeadAdmin(ReadOnlyAdmin):
    list_display = ["position", "floor"]


@admin.register(IdempotencyRecord)
class IdempotencyRecordAdmin(ReadOnlyAdmin):
    list_display = ["owner", "scope", "status_code", "created_at"]
    exclude = ["body"]


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    list_display = ["at", "actor", "action", "target"]
    list_select_related = ["actor"]
    list_filter = ["action"]
    search_fields = ["target", "actor__handle"]


# django_q's own models: a schedule names a function a worker runs, so one
# added here ran any callable (`os.system`), and one deleted here (expiry
# barriers, sweeps) stayed gone until a worker restarted; the queue holds
# tasks the recovery paths count on. Shown, never changed.
class ScheduleAdmin(ReadOnlyAdmin, django_q.admin.ScheduleAdmin):
    pass


class QueueAdmin(ReadOnlyAdmin, django_q.admin.QueueAdmin):
    pass


# Finished tasks are history: resubmitting one ran a sweep or a delivery
# again with its stored arguments.
class SuccessAdmin(ReadOnlyAdmin, django_q.admin.TaskAdmin):
    actions = None


class FailureAdmin(ReadOnlyAdmin, django_q.admin.FailAdmin):
    actions = None


for model, shown in ((Schedule, ScheduleAdmin), (OrmQ, QueueAdmin), (Success, SuccessAdmin),
                     (Failure, FailureAdmin)):
    if admin.site.is_registered(model):
        admin.site.unregister(model)
        admin.site.register(model, shown)


class UserAdmin(Guarded, auth_admin.UserAdmin):
    """The web sign-in accounts of human members: made, named and flagged by
    the services (`create_member`, `update_member`), so here an admin only
    sets a password (a member's account recovery), which is recorded."""
    # Its name and e-mail too: the member's display name is the name shown,
    # and these were saved unchecked and unrecorded (the admin's greeting
    # showed a right-to-left override).
    readonly_fields = ["username", "first_name", "last_name", "email", "is_active", "is_staff", "is_superuser",
                       "groups", "user_permissions", "last_login", "date_joined"]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def user_change_password(self, request, id, form_url=""):
        response = super().user_change_password(request, id, form_url)
        if request.method == "POST" and response.status_code == 302:
            member = getattr(self.get_object(request, id), "member", None)
            audit.record("member.password_set", member.public_id if member else f"user:{id}",
                         actor=admin_member(request.user))
        return response


admin.site.unregister(Group)  # permissions are the members' roles, not Django's groups
admin.site.unregister(User)
admin.site.register(User, UserAdmin)
