"""One ext_proc stream: Envoy's messages about one request in, the EPP's answers out.

Envoy (``request_body_mode: FULL_DUPLEX_STREAMED``) sends the request headers, then the body in
chunks without waiting for answers, the last with ``end_of_stream`` (or request trailers
after it). The EPP answers nothing until the body is whole, since the decision reads it; then
it answers the headers (the endpoint), hands the body back, and answers the trailers if they
came. At the response headers (``response_header_mode: SEND``) it adds the router's own
headers, as the proxy does (``x-spec-router-pool``, ``x-spec-router-reason``). Response bodies
never come here (``response_body_mode: NONE``): that is what keeps the EPP cheap. A refusal is
one immediate response, after which Envoy closes the stream.
"""

from __future__ import annotations

from urllib.parse import unquote

from router.account.outcome import Outcome
from router.errors import RouterError
from router.gateway import messages
from router.gateway.messages import Message
from router.gateway.picker import Picker, Routed


class Exchange:
    def __init__(self, picker: Picker, source: str = "") -> None:
        self.picker = picker
        self.source = source  # the gateway connection it came over (its gRPC peer)
        self.headers: messages.Headers = []
        self.request_id = ""
        self.path = "/"
        self.subset: frozenset[str] | None = None
        self.body: list[bytes] = []
        self.size = 0
        self.out: Outcome | None = None
        self.routed: Routed | None = None
        self.finished = False  # answered with an immediate response: nothing more to say

    async def on(self, message: Message) -> list[Message]:
        """The answers to one message from Envoy (none until the request can be decided)."""
        kind = message.WhichOneof("request")
        subset = messages.subset_of(message)  # (Envoy attaches metadata to every message)
        if subset is not None:
            self.subset = subset
        if kind == "request_headers":
            return await self._headers(message.request_headers)
        if kind == "request_body":
            part = message.request_body
            if part.body:
                self.body.append(part.body)
                self.size += len(part.body)
                too_large = self.picker.check_size(self.size)
                if too_large is not None:
                    return self._refuse(too_large)
            if part.end_of_stream:
                return await self._decide(has_body=True, trailers=False)
            return []
        if kind == "request_trailers":
            return await self._decide(has_body=True, trailers=True)
        if kind == "response_headers":
            routed = self.routed
            if routed is None:
                return [messages.response_headers_back()]
            return [
                messages.response_headers_back(
                    [
                        (b"x-spec-router-pool", routed.pool.encode()),
                        (b"x-spec-router-reason", routed.reason.encode()),
                    ]
                )
            ]
        if kind == "response_body":  # (only if Envoy is set to send bodies: answer, unchanged)
            return [messages.body_unchanged()]
        if kind == "response_trailers":
            return [messages.response_trailers_back()]
        return []

    async def _headers(self, part: Message) -> list[Message]:
        self.headers = messages.headers_of(part)
        target = b"/"
        for name, value in self.headers:
            if name == b":path":
                target = value
            elif name == b"x-request-id":
                self.request_id = value.decode("latin-1")
        # (the proxy reads ASGI's ``path``: percent-decoded, without the query)
        self.path = unquote(target.split(b"?", 1)[0].decode("latin-1"))
        self.out = Outcome(path=self.path, started=self.picker.clock())
        if part.end_of_stream:  # no body (a GET): decide now
            return await self._decide(has_body=False, trailers=False)
        return []

    async def _decide(self, has_body: bool, trailers: bool) -> list[Message]:
        if self.out is None or self.routed is not None or self.finished:
            return []  # (out of order: nothing to decide)
        body = b"".join(self.body)
        self.body = []
        result = await self.picker.route(
            self.request_id, self.headers, self.path, body, self.subset, self.out, self.source
        )
        if isinstance(result, RouterError):
            self.finished = True
            return [messages.refuse(result)]
        self.routed = result
        answers = [messages.route_to(result.endpoint, result.set_headers, result.remove_headers)]
        if has_body:
            answers += messages.body_back(result.body, end=not trailers)
        if trailers:
            answers.append(messages.trailers_back())
        return answers

    def _refuse(self, error: RouterError) -> list[Message]:
        self.finished = True
        if self.out is not None:
            self.out.answered(error.status)
            self.picker.observe_refusal(self.out)
        return [messages.refuse(error)]
