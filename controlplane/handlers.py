"""Django's ASGI handler, with one thread hop per request.

Django's own handler runs a sync view through the sync hooks of every
middleware, each a hop between the event loop and a thread made for that
request: about a dozen hops and a new thread per request, which on two cores
cost more than the send itself (docs/benchmarks.md, round two). Here a
sync view runs with the whole sync middleware chain, exactly as under WSGI,
in one call on a pool of long-lived threads (`controlplane.db.in_pool`);
async views (the long-polls) keep Django's async chain. Either way the
thread's database connection goes back to the pool when the call returns.
"""
from __future__ import annotations

from asgiref.sync import iscoroutinefunction
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.base import BaseHandler
from django.db import close_old_connections
from django.urls import Resolver404, get_resolver

from controlplane.db import in_pool


class PooledASGIHandler(ASGIHandler):
    def __init__(self) -> None:
        super().__init__()  # the async chain, for async views
        self.sync_chain = BaseHandler()
        self.sync_chain.load_middleware(is_async=False)
        self._run_sync = in_pool(self._get_response_sync)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        # No ThreadSensitiveContext (which would make a thread per request):
        # the little sync work left outside the pool (signal receivers,
        # closing the response) shares asgiref's one long-lived thread.
        await self.handle(scope, receive, send)

    @staticmethod
    def _view_is_async(request) -> bool:
        try:
            match = get_resolver().resolve(request.path_info)
        except Resolver404:
            return False  # the sync chain answers 404 as WSGI would
        return iscoroutinefunction(match.func)

    async def run_get_response(self, request):
        if self._view_is_async(request):
            return await super().run_get_response(request)
        response = await self._run_sync(request)
        response._handler_class = self.__class__
        return response

    def _get_response_sync(self, request):
        try:
            return self.sync_chain.get_response(request)
        finally:
            close_old_connections()
