from django.contrib.auth import views as auth_views
from django.urls import path

from controlplane.ratelimit import throttle_signin
from web.forms import MemberLoginForm
from web.views import conversations, credentials, inbox, spaces, subscriptions, tasks

urlpatterns = [
    path("login/", throttle_signin(auth_views.LoginView.as_view(
        template_name="web/login.html", authentication_form=MemberLoginForm, redirect_authenticated_user=True)),
        name="web-login"),
    path("logout/", auth_views.LogoutView.as_view(), name="web-logout"),
    path("", conversations.home, name="web-home"),
    path("spaces/new", spaces.create_space, name="web-space-create"),
    path("spaces/find", spaces.find_space, name="web-space-find"),
    path("spaces/<space:slug>/", spaces.space_page, name="web-space"),
    path("spaces/<space:slug>/join", conversations.join, name="web-join"),
    path("spaces/<space:slug>/members", spaces.add_member, name="web-member-add"),
    path("spaces/<space:slug>/members/<handle:handle>/remove", spaces.remove_member, name="web-member-remove"),
    path("spaces/<space:slug>/channels", spaces.create_channel, name="web-channel-create"),
    path("spaces/<space:slug>/direct", spaces.start_direct, name="web-direct"),
    path("spaces/<space:slug>/groups", spaces.start_group, name="web-group"),
    path("spaces/<space:slug>/tasks/", tasks.tasks_page, name="web-tasks"),
    path("spaces/<space:slug>/tasks/new", tasks.create_task, name="web-task-create"),
    path("spaces/<space:slug>/tasks/<pid:task_id>/<str:action>", tasks.task_action, name="web-task-action"),
    path("spaces/<space:slug>/<pid:conversation_id>/", conversations.conversation_page, name="web-conversation"),
    path("spaces/<space:slug>/<pid:conversation_id>/history", conversations.history, name="web-history"),
    path("spaces/<space:slug>/<pid:conversation_id>/send", conversations.send, name="web-send"),
    path("inbox/", inbox.inbox_page, name="web-inbox"),
    path("inbox/acknowledge", inbox.acknowledge, name="web-acknowledge"),
    path("inbox/release", inbox.release, name="web-release"),
    path("inbox/firewall", inbox.set_rules, name="web-firewall"),
    path("credentials/", credentials.credentials_page, name="web-credentials"),
    path("credentials/new", credentials.create_credential, name="web-credential-create"),
    path("credentials/<pid:credential_id>/revoke", credentials.revoke_credential, name="web-credential-revoke"),
    path("subscriptions/", subscriptions.subscriptions_page, name="web-subscriptions"),
    path("subscriptions/receivers", subscriptions.create_endpoint, name="web-endpoint-create"),
    path("subscriptions/receivers/<pid:endpoint_id>/verify", subscriptions.endpoint_action, {"action": "verify"},
         name="web-endpoint-verify"),
    path("subscriptions/receivers/<pid:endpoint_id>/delete", subscriptions.endpoint_action, {"action": "delete"},
         name="web-endpoint-delete"),
    path("subscriptions/new", subscriptions.create_subscription, name="web-subscription-create"),
    path("subscriptions/<pid:subscription_id>/<str:action>", subscriptions.subscription_action,
         name="web-subscription-action"),
]
