from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError

from web.pages import member_of


class MemberLoginForm(AuthenticationForm):
    """Django's sign-in, for users that are active members."""

    def confirm_login_allowed(self, user):
        super().confirm_login_allowed(user)
        if member_of(user) is None:
            raise ValidationError("This account is not an active member of Switchboard.", code="not_member")
