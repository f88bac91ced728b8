"""Django's ASGI handler, with one thread hop per request.

Django's own handler runs a sync view through the sync hooks of every
middleware, each a hop between the event loop and a thread made for that
request: about a dozen hops and a new thread per request, which on two cores
cost more than the send itself (docs/benchmarks.md, round two). Here a
sync view runs as under WSGI, in one call on a pool of long-lived threads
(`controlplane.db.in_pool`): the `request_started` signal, the request, the
whole sync middleware chain, and the response's close with its
`request_finished` signal. Django's handler sends each signal from the
event loop, with a hop each to the one thread all of a process's requests
share, and races a task that listens for a disconnect (which cannot stop a
sync view) against one that serves. Async views (the long-polls) keep
Django's handler and its async chain. Either way the thread's database
connection goes back to the pool when the call returns.
"""
from __future__ import annotations

import functools

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.base import BaseHandler
from django.db import close_old_connections
from django.urls import Resolver404, URLResolver, get_resolver, set_script_prefix

from controlplane import turns
from controlplane.db import in_pool
from controlplane.ratelimit import scope_address, source


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
        # for async views, the little sync work outside the pool (signal
        # receivers, closing the response) shares asgiref's long-lived thread.
        # Its work on the pool takes its client address's turns (controlplane.turns).
        key = turns.caller.set(source(scope_address(scope)))
        try:
            await self.handle(scope, receive, send)
        finally:
            turns.caller.reset(key)

    @staticmethod
    @functools.lru_cache(maxsize=4096)
    def _view_is_async(resolver: URLResolver, path_info: str) -> bool:
        """Whether `path_info` names an async view. Remembered per path: on
        the event loop, resolving the URL cost a tenth of a request's time
        there (the sync chain resolves it again for the view); a path that
        fell out of the cache is resolved again."""
        try:
            match = resolver.resolve(path_info)
        except Resolver404:
            return False  # the sync chain answers 404 as WSGI would
        return iscoroutinefunction(match.func)

    async def handle(self, scope, receive, send):
        path, root = scope["path"], scope.get("root_path", "")
        if self._view_is_async(get_resolver(), path.removeprefix(root) if root else path):
            return await super().handle(scope, receive, send)
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(get_script_prefix(scope))
        try:
            response = await self._run_sync(scope, body_file)
            await self.send_response(response, send)
            if response.streaming:  # closed once its content is sent
                await sync_to_async(response.close)()
        finally:
            body_file.close()

    def _get_response_sync(self, scope, body_file):
        try:
            signals.request_started.send(sender=self.__class__, scope=scope)
            request, response = self.create_request(scope, body_file)
            if request is not None:
                response = self.sync_chain.get_response(request)
                response._handler_class = self.__class__
            if not response.streaming:
                response.close()  # request_finished, as WSGI servers send it
            return response
        finally:
            close_old_connections()
