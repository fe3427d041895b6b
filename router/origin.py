"""Where a backend lives: its URL, parsed once (the settings check every URL with it; the
upstream client connects with it)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a backend lives: parsed once from its URL."""

    url: str
    host: str
    port: int
    tls: bool
    host_header: bytes
    base_path: bytes

    @classmethod
    def parse(cls, url: str) -> Origin:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        if any(c.isspace() for c in url):
            raise ValueError(f"a URL has no spaces: {url!r} (separate URLs with commas)")
        tls = parts.scheme == "https"
        try:
            port = parts.port or (443 if tls else 80)
        except ValueError:
            raise ValueError(
                f"bad port in {url!r}: expected http(s)://host:port with a number"
            ) from None
        default = (tls and port == 443) or (not tls and port == 80)
        host = parts.hostname
        shown = f"[{host}]" if ":" in host else host
        header = shown if default else f"{shown}:{port}"
        return cls(
            url=url.rstrip("/"),
            host=host,
            port=port,
            tls=tls,
            host_header=header.encode("ascii"),
            base_path=parts.path.rstrip("/").encode("ascii"),
        )
