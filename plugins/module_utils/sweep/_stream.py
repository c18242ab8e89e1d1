# -*- coding: utf-8 -*-
"""The sweep's streaming hot path: an SSE parser and an HTTP/1.1 keep-alive connection built
on ``asyncio.Protocol``.

Why a transport of its own: a streamed token costs the load generator one wake-up. Through
aiohttp's ``StreamReader`` that wake-up is a chain of Python calls (the protocol feeds the
reader, a future is resolved, the reading task is stepped, ``iter_any`` returns, the next read
creates another future); here the bytes are parsed inside ``data_received``, where the event
loop hands them over, with the time they arrived, and the request's future is resolved once,
when the response ends. Requests are the same bytes aiohttp sends for ``post(data=body)``
(HTTP/1.1, ``Content-Length``, keep-alive); ``http`` and ``https`` base URLs are supported.

The SSE rules live in :class:`SSEStream` and are the same for both transports
(``stream_transport: native`` here, ``aiohttp`` in sweep_client): a line ``data: ...`` that
holds a choice and no usage is a token chunk (counted without parsing its JSON; escaped text
cannot fake the marks), everything else is parsed; ``data: [DONE]`` ends the stream.
"""
from __future__ import annotations

import asyncio
import json
import socket
import ssl
import time
from urllib.parse import urlsplit

# A streamed token chunk of vLLM's OpenAI server holds a choice and no usage (vLLM 0.32 leaves
# "usage" out of token chunks; others send "usage":null); such chunks are counted without
# parsing their JSON (everything else is parsed). Escaped text cannot fake the marks.
TOKEN_CHUNK_MARK = b'"choices":[{'
USAGE_MARK = b'"usage":'
USAGE_NULL = b'"usage":null'
MAX_HEAD_BYTES = 64 * 1024
MAX_LINE_BYTES = 4 * 1024 * 1024   # an SSE line longer than this is an error, not a hang


def _short(text, n=200):
    text = text if isinstance(text, str) else repr(text)
    return text if len(text) <= n else text[:n] + "..."


class SSEStream(object):
    """One response's SSE events, fed as they arrive; fills a ``Record``.

    ``feed(data, now)`` takes body bytes (HTTP framing already removed) and the time they
    arrived; it returns True once the stream is over (``[DONE]`` or an error event). Call
    ``finish()`` when the body ended: it sets the record's token counts, or its error.
    """

    __slots__ = ("rec", "buf", "done", "chat", "chunk_usage", "last_ct", "usage")

    def __init__(self, rec, chat=False, chunk_usage=False):
        self.rec = rec
        self.buf = b""
        self.done = False
        self.chat = chat
        self.chunk_usage = chunk_usage
        self.last_ct = 0
        self.usage = None

    def feed(self, data, now):
        if self.done:
            return True
        buf = self.buf + data if self.buf else data
        if b"\n" not in buf:
            if len(buf) > MAX_LINE_BYTES:
                self.rec.error = "an SSE line longer than %d bytes" % MAX_LINE_BYTES
                self.done = True
            self.buf = buf
            return self.done
        lines = buf.split(b"\n")
        self.buf = lines.pop()
        rec = self.rec
        chunk_usage, chat = self.chunk_usage, self.chat
        for line in lines:
            if not line.startswith(b"data:"):
                continue  # blank separators, comments, event names
            payload = line[5:].strip()
            if not chunk_usage and TOKEN_CHUNK_MARK in payload and (
                    USAGE_MARK not in payload or USAGE_NULL in payload) and \
                    not (chat and b'"role"' in payload):
                # a token chunk (a choice, no usage): no JSON parse needed
                rec.chunk_times.append(now)
                rec.chunk_tokens = None
                continue
            if payload == b"[DONE]":
                self.done = True
                return True
            try:
                obj = json.loads(payload)
            except ValueError as e:
                rec.error = "ValueError: %s" % _short(str(e))
                self.done = True
                return True
            if "error" in obj:
                rec.error = "stream error: %s" % _short(obj["error"])
                self.done = True
                return True
            u = obj.get("usage")
            if obj.get("choices"):
                if u is not None:  # continuous usage: tokens in this chunk
                    ct = u.get("completion_tokens") or 0
                    if ct > self.last_ct:
                        rec.chunk_times.append(now)
                        if rec.chunk_tokens is not None:
                            rec.chunk_tokens.append(ct - self.last_ct)
                        self.last_ct = ct
                else:  # a token chunk; how many tokens it holds is unknown
                    d = obj["choices"][0].get("delta")
                    # (chat: not the opening chunk that only names the role)
                    if d is None or "role" not in d or d.get("content"):
                        rec.chunk_times.append(now)
                        rec.chunk_tokens = None
            elif u is not None:
                self.usage = u
        return False

    def finish(self):
        rec = self.rec
        if rec.error is not None:
            return
        if self.usage is None:
            rec.error = "stream ended without a usage report"
        else:
            rec.completion_tokens = self.usage.get("completion_tokens")
            rec.prompt_tokens = self.usage.get("prompt_tokens")
            if not rec.chunk_times:
                rec.error = "no token chunk received"


class Endpoint(object):
    """Where requests go: scheme, host, port, the path prefix, the Host header, TLS."""

    def __init__(self, base_url):
        u = urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError("base_url must be http:// or https:// with a host, got %r"
                             % (base_url,))
        self.scheme = u.scheme
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.prefix = u.path.rstrip("/")
        self.host_header = u.netloc.rpartition("@")[2]
        self.ssl = ssl.create_default_context() if u.scheme == "https" else None

    def head(self, path, headers, length):
        lines = ["POST %s%s HTTP/1.1" % (self.prefix, path), "Host: %s" % self.host_header,
                 "Content-Type: application/json", "Accept: text/event-stream",
                 "Content-Length: %d" % length]
        lines.extend("%s: %s" % kv for kv in headers.items())
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class _Response(object):
    __slots__ = ("status", "sse", "future", "error_body", "chunked", "remaining",
                 "until_close", "close_after", "phase", "chunk_left")

    def __init__(self, sse, future):
        self.sse = sse
        self.future = future
        self.status = None
        self.error_body = b""
        self.chunked = False
        self.remaining = None
        self.until_close = False
        self.close_after = False
        self.phase = "head"      # head -> body (chunked: size/data/crlf/trailer) -> done
        self.chunk_left = 0


class StreamConnection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection, one request at a time (a closed-loop worker's)."""

    def __init__(self):
        self.transport = None
        self.buf = b""
        self.resp = None
        self.closed = False

    # --- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport):
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except (OSError, AttributeError):
                pass

    def connection_lost(self, exc):
        self.closed = True
        resp = self.resp
        if resp is None:
            return
        if resp.until_close and resp.phase == "body":
            self._end()  # a body delimited by the end of the connection
            return
        what = "%s: %s" % (type(exc).__name__, _short(str(exc))) if exc else \
            "ServerDisconnectedError: the server closed the connection"
        self._fail(what)

    def data_received(self, data):
        resp = self.resp
        if resp is None:  # bytes nobody asked for: the connection cannot be reused
            self.closed = True
            self.transport.close()
            return
        now = time.perf_counter()
        buf = self.buf + data if self.buf else data
        self.buf = b""
        if resp.phase == "head":
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD_BYTES:
                    self._fail("the response head is longer than %d bytes" % MAX_HEAD_BYTES)
                else:
                    self.buf = buf
                return
            if not self._head(buf[:end]):
                return
            buf = buf[end + 4:]
        if resp.chunked:
            self._chunked(buf, now)
        else:
            self._plain(buf, now)

    # --- framing ---------------------------------------------------------------------------
    def _head(self, head):
        resp = self.resp
        lines = head.split(b"\r\n")
        parts = lines[0].split(None, 2)
        try:
            if not parts[0].startswith(b"HTTP/1."):
                raise ValueError(parts[0])
            resp.status = int(parts[1])
        except (IndexError, ValueError):
            self._fail("not an HTTP/1.x response: %s" % _short(lines[0].decode("latin-1")))
            return False
        length = None
        for line in lines[1:]:
            k, _sep, v = line.partition(b":")
            k = k.strip().lower()
            if k == b"transfer-encoding" and b"chunked" in v.lower():
                resp.chunked = True
            elif k == b"content-length":
                try:
                    length = int(v.strip())
                except ValueError:
                    self._fail("bad Content-Length: %s" % _short(v.decode("latin-1")))
                    return False
            elif k == b"connection" and b"close" in v.lower():
                resp.close_after = True
        if resp.chunked:
            resp.phase = "size"
        elif length is not None:
            resp.remaining = length
            resp.phase = "body"
        else:
            resp.until_close = True
            resp.close_after = True
            resp.phase = "body"
        if resp.remaining == 0:
            self._end()
            return False
        return True

    def _body(self, data, now):
        resp = self.resp
        if resp.status == 200:
            # after [DONE] (or an error event) feed() ignores the rest; the body is still read
            # to its end, so that the connection can carry the next request
            resp.sse.feed(data, now)
        elif len(resp.error_body) < 4096:
            resp.error_body += data[:4096]

    def _plain(self, buf, now):
        resp = self.resp
        if resp.remaining is not None:
            take = buf[:resp.remaining]
            resp.remaining -= len(take)
            if take:
                self._body(take, now)
            if resp.remaining == 0:
                self._end()
        elif buf:
            self._body(buf, now)

    def _chunked(self, buf, now):
        resp = self.resp
        pieces = []
        pos, n = 0, len(buf)
        while pos < n or resp.phase == "done":
            phase = resp.phase
            if phase == "data":
                take = min(resp.chunk_left, n - pos)
                pieces.append(buf[pos:pos + take])
                pos += take
                resp.chunk_left -= take
                if resp.chunk_left == 0:
                    resp.phase = "crlf"
                continue
            if phase == "done":
                break
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                self.buf = buf[pos:]
                if len(self.buf) > MAX_HEAD_BYTES:
                    self._fail("a chunk-size or trailer line longer than %d bytes"
                               % MAX_HEAD_BYTES)
                    return
                break
            line = buf[pos:eol]
            pos = eol + 2
            if phase == "size":
                try:
                    size = int(line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    self._fail("bad chunk size line: %s" % _short(line.decode("latin-1")))
                    return
                if size == 0:
                    resp.phase = "trailer"
                else:
                    resp.chunk_left = size
                    resp.phase = "data"
            elif phase == "crlf":
                if line:
                    self._fail("chunk data not followed by CRLF")
                    return
                resp.phase = "size"
            elif phase == "trailer":
                if not line:
                    resp.phase = "done"
        if pieces:
            self._body(b"".join(pieces) if len(pieces) > 1 else pieces[0], now)
        if resp.phase == "done" and self.resp is resp:
            if pos < n:  # bytes after the response: not ours to read
                resp.close_after = True
            self._end()

    # --- completion ------------------------------------------------------------------------
    def _end(self):
        resp, self.resp = self.resp, None
        if resp is None:
            return
        if resp.close_after and not self.closed:
            self.closed = True
            self.transport.close()
        if not resp.future.done():
            resp.future.set_result(resp)

    def _fail(self, what):
        resp, self.resp = self.resp, None
        self.closed = True
        if self.transport is not None:
            self.transport.close()
        if resp is not None and not resp.future.done():
            resp.future.set_exception(ConnectionError(what))

    def abort(self, what):
        """Give up on the request in flight (its timeout): the connection is closed."""
        if self.resp is not None:
            self._fail(what)

    # --- one request -----------------------------------------------------------------------
    def send(self, data, sse):
        fut = asyncio.get_running_loop().create_future()
        self.resp = _Response(sse, fut)
        self.transport.write(data)
        return fut


class NativeClient(object):
    """Streaming requests over one connection per worker (keep-alive, reopened when the
    server closed it). ``on_open`` is called for every TCP connection opened."""

    def __init__(self, base_url, headers, on_open=None):
        self.endpoint = Endpoint(base_url)
        self.headers = dict((k, v) for k, v in headers.items()
                            if k.lower() not in ("content-type", "content-length", "host"))
        self.on_open = on_open
        self.conns = {}

    async def _connection(self, worker):
        conn = self.conns.get(worker)
        if conn is not None and not conn.closed:
            return conn
        loop = asyncio.get_running_loop()
        ep = self.endpoint
        _transport, conn = await loop.create_connection(
            StreamConnection, ep.host, ep.port, ssl=ep.ssl,
            server_hostname=ep.host if ep.ssl else None)
        self.conns[worker] = conn
        if self.on_open is not None:
            self.on_open()
        return conn

    async def stream(self, rec, path, body, timeout_s, chat=False, chunk_usage=False):
        """One streaming POST; fills ``rec`` (start, end, chunk times, counts or error)."""
        loop = asyncio.get_running_loop()
        sse = SSEStream(rec, chat=chat, chunk_usage=chunk_usage)
        data = self.endpoint.head(path, self.headers, len(body)) + body
        rec.start = time.perf_counter()
        conn = None
        timer = None
        state = {"timed_out": False}

        def expire():
            state["timed_out"] = True
            if conn is not None:
                conn.abort("timeout")
        try:
            timer = loop.call_later(timeout_s, expire)
            conn = self.conns.get(rec.worker)
            if conn is None or conn.closed:
                try:
                    conn = await asyncio.wait_for(self._connection(rec.worker), timeout_s)
                except asyncio.TimeoutError:
                    state["timed_out"] = True
                    raise
            if state["timed_out"]:
                raise asyncio.TimeoutError()
            resp = await conn.send(data, sse)
        except asyncio.TimeoutError:
            rec.error = "timeout after %ss (request_timeout_s)" % timeout_s
        except ConnectionError as e:
            rec.error = ("timeout after %ss (request_timeout_s)" % timeout_s
                         if state["timed_out"] else "ClientError: %s" % e)
        except (OSError, ssl.SSLError) as e:
            rec.error = "%s: %s" % (type(e).__name__, _short(str(e)))
        else:
            if resp.status != 200:
                rec.error = "HTTP %d: %s" % (resp.status, _short(
                    resp.error_body.decode("utf-8", "replace")))
        finally:
            rec.end = time.perf_counter()
            if timer is not None:
                timer.cancel()
        if rec.error is None:
            sse.finish()

    def close(self):
        for conn in self.conns.values():
            if conn.transport is not None and not conn.closed:
                conn.closed = True
                conn.transport.close()
        self.conns = {}
