"""uvicorn's HTTP protocol, keeping a request whose client half-closed its side after sending it whole.

A client may send its whole request and then shut down its sending side (`shutdown(SHUT_WR)`: a script, `curl`
ending its input, a phone going to sleep); the request is complete, it only reads the answer. uvicorn's
protocols close the transport on that EOF and mark the request disconnected, and from then on the app's
`receive()` answers `http.disconnect` instead of the body it had already buffered: an upload sent whole was lost
(issue 30). Here an EOF that comes after the whole request was received leaves the connection half open: the
app reads the body and answers. An EOF in the middle of a body is still a disconnect.
"""

from __future__ import annotations

from uvicorn.protocols.http.h11_impl import H11Protocol

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # httptools is optional for uvicorn
    HttpToolsProtocol = None


def _keep_open(protocol) -> bool:
    cycle = getattr(protocol, "cycle", None)
    return bool(cycle is not None and not cycle.more_body and not cycle.response_complete)


class HalfCloseH11(H11Protocol):
    def eof_received(self) -> bool:
        return _keep_open(self)


if HttpToolsProtocol is not None:

    class HalfCloseHttpTools(HttpToolsProtocol):
        def eof_received(self) -> bool:
            return _keep_open(self)

    PROTOCOL = HalfCloseHttpTools
else:
    PROTOCOL = HalfCloseH11


def process_app():
    """The app of one of several uvicorn processes (`GATEWAY_WORKERS` > 1): a spawned process configures its own
    logging (the parent's does not carry over) and reads its settings from the environment it inherited."""
    import os

    from contract.observe import configure
    from gateway.app import create_app

    configure("gateway", os.environ.get("LOG_LEVEL", "info"))
    return create_app()
