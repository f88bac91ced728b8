"""django.contrib.admin, installed with the site that admits active admin
members only (controlplane.admin_site). A module of its own: INSTALLED_APPS
loads it before any model exists."""
from django.contrib.admin.apps import AdminConfig


class SwitchboardAdminConfig(AdminConfig):
    default_site = "controlplane.admin_site.SwitchboardAdminSite"
