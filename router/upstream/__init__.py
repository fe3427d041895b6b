"""Talking to the engines: the HTTP/1.1 client (``client``), the taps that watch its response
bodies (``stream``), and what a failed attempt means (``verdicts``). Used by the proxy, the fast
path and the health poller alike."""
