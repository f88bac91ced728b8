"""Helpers of the delivery engine's tests: the endpoint's secret, and the
engine run by the test (tests/webhooks/conftest.py has the scene)."""
import asyncio
import base64

from webhooks import pump as timer_loop

SECRET = "whsec_" + base64.b64encode(b"s" * 32).decode()


def pump(wait=False, seconds=10.0):
    return asyncio.run(timer_loop.run(seconds=seconds, wait=wait))
