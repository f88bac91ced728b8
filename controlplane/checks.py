"""Deployment checks of our own, beside Django's (`manage.py check --deploy`,
docs/deploy.md): what its security checks do not see."""
from __future__ import annotations

from django.conf import settings
from django.core.checks import Tags, Warning, register


@register(Tags.security, deploy=True)
def any_host(app_configs, **kwargs) -> list[Warning]:
    """`ALLOWED_HOSTS=*` turns off the Host check, which is also what guards
    `/mcp` and the live pages' sockets against DNS rebinding."""
    if settings.DEBUG or "*" not in settings.ALLOWED_HOSTS:
        return []
    return [Warning("ALLOWED_HOSTS accepts any host.",
                    hint="Name the public URL's host (the default when ALLOWED_HOSTS is unset): with '*', "
                         "a page on any domain that resolves to this server may call /mcp and open live "
                         "sockets (DNS rebinding).", id="switchboard.W001")]
