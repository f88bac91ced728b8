from django.contrib.auth.forms import AuthenticationForm

from web.pages import member_of


class MemberLoginForm(AuthenticationForm):
    """Django's sign-in, for users that are active members. Anyone else is
    told what a wrong password is told: a message of its own would say that
    a suspended member's password was right."""

    def confirm_login_allowed(self, user):
        super().confirm_login_allowed(user)
        if member_of(user) is None:
            raise self.get_invalid_login_error()
