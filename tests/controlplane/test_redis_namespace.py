"""Deployments sharing one Redis server keep apart: every Redis name of a
deployment (channel layer, cache, task queue) is under a prefix derived
from its root key."""
import subprocess
import sys

from tests.servers import ROOT

SHOW = ("from django.conf import settings as s; "
        "print(s.REDIS_NAMESPACE, s.CHANNEL_LAYERS['default']['CONFIG']['prefix'], "
        "s.CACHES['default']['KEY_PREFIX'], s.Q_CLUSTER['name'])")


def names(root_key: str) -> list[str]:
    result = subprocess.run([sys.executable, "-c", f"import django; django.setup(); {SHOW}"], cwd=ROOT,
                            env={"PATH": "/usr/bin:/bin", "DJANGO_SETTINGS_MODULE": "controlplane.settings",
                                 "DEBUG": "1", "SERVER_ADMIN_KEY": root_key, "REDIS_URL": "redis://127.0.0.1:6379/0"},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_each_deployment_has_its_own_redis_names():
    one, again, other = names("a" * 40), names("a" * 40), names("b" * 40)
    assert len(set(one)) == 1 and one[0].startswith("switchboard-")  # one prefix for all three uses
    assert one == again and set(one).isdisjoint(other)
