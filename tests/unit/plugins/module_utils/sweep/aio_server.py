"""A real HTTP server (aiohttp.web) on 127.0.0.1 in a thread and event loop of its own, for the
unit tests of the sweep client: subclasses add their routes in ``routes(app)``."""
import asyncio
import threading

from aiohttp import web


class ThreadedServer(object):
    def __init__(self):
        self.runner = None
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.port = self._call(self._start())
        self.base_url = "http://127.0.0.1:%d" % self.port

    def routes(self, app):
        raise NotImplementedError

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    async def _start(self):
        app = web.Application()
        self.routes(app)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return site._server.sockets[0].getsockname()[1]

    def stop(self):
        self._call(self.runner.cleanup())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


def servers(cls):
    """The body of a pytest fixture: yields make(*args) -> a started ``cls`` server, and stops
    every server made once the test ends (``yield from servers(MyServer)``)."""
    made = []

    def make(*args, **kw):
        s = cls(*args, **kw)
        made.append(s)
        return s
    yield make
    for s in made:
        s.stop()


def sweep_params(base_url, model, **kw):
    """The sweep client's parameters for one short level against ``base_url``."""
    p = {"base_url": base_url, "model": model, "levels": [1], "input_len": 8, "output_len": 8,
         "duration_s": 1.0, "request_timeout_s": 10.0, "saturation_threshold": 0.1,
         "endpoint": "completions", "vocab_size": None}
    p.update(kw)
    return p
