"""The egress rule for fetches the model drives: only public addresses, checked where the connection goes.

BFCL V4's web-search tool ``fetch_url_content(url)`` fetches whatever URL the model names, and the page becomes
the model's observation (sent to the policy, possibly a remote ``openai:`` server, and written to
``results.jsonl``). Unguarded, a model can read the harness machine's own services (``http://127.0.0.1:<port>``)
or a cloud node's metadata service (``http://169.254.169.254/...``, which hands out the instance's credentials).
The scrubber (``seal.redact``) cannot help: it knows only the values of the project's secret variables.

The rule (:class:`EgressRule`), applied to every hop:

1. The host is resolved the way the connection would resolve it (``getaddrinfo``, so ``2130706433``,
   ``0177.0.0.1`` and names that resolve to loopback are judged by the address they mean).
2. If any address it resolves to is loopback, private, link-local, multicast, unspecified, reserved or otherwise
   not globally routable (IPv4 and IPv6; IPv6 forms that embed an IPv4 address, ``::ffff:127.0.0.1``, 6to4,
   Teredo, NAT64, are judged by that address), the fetch is refused: :class:`EgressRefused`, whose text says
   why and which the tool shows the model as its error. No byte is sent.
3. The connection goes to the address that was checked (no second lookup a DNS answer could change in between);
   the URL's host goes in the ``Host`` header and, for https, in SNI and the certificate check.
4. Redirects are followed here, at most ``max_redirects``, each target checked by 1-3 before it is opened.
   Environment proxies are not used: a proxy would resolve the name itself, after our check.

``allowed`` lets named networks through although internal: for tests (a loopback stand-in serving the pages)
and for research on a closed network, where ``python -m seal.evaluate --allow-internal-fetch`` instead turns
the rule off altogether (BFCL's own ``requests.get``).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin, urlsplit

MAX_REDIRECTS = 10  # requests' own default is 30; a page needs few
MAX_BODY_BYTES = 20 * 2**20  # a page bigger than this is not read on (BFCL shows the model the whole text)
REDIRECT_STATUSES = (301, 302, 303, 307, 308)
NAT64 = ipaddress.ip_network("64:ff9b::/96")

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class EgressRefused(Exception):
    """A fetch the egress rule refused (its text is what the model sees)."""


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address embeds for a relay or gateway to reach (6to4, Teredo, NAT64)."""
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]  # the client's address
    if address in NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def internal_kind(address: Address) -> str | None:
    """Why `address` is not a public one ("loopback", "private", ...), or None for a globally routable address."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:  # a socket connects to the IPv4 address itself
            kind = internal_kind(address.ipv4_mapped)
            return f"{kind} (as {address})" if kind else None
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            kind = internal_kind(embedded)
            if kind:
                return f"{kind} (embedded in {address})"
        if address.is_site_local:
            return "site-local"
    checks = (("loopback", address.is_loopback), ("unspecified", address.is_unspecified),
              ("link-local", address.is_link_local), ("multicast", address.is_multicast),
              ("private", address.is_private), ("reserved", address.is_reserved),
              ("not globally routable", not address.is_global))
    return next((kind for kind, flag in checks if flag), None)


def resolve(host: str, port: int) -> list[Address]:
    """Every address `host` resolves to, as a connection would resolve it (numeric spellings included)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise EgressRefused(f"{host} does not resolve ({exc})") from None
    found: list[Address] = []
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])  # an IPv6 scope id is not part of it
        if address not in found:
            found.append(address)
    if not found:
        raise EgressRefused(f"{host} resolves to no address")
    return found


@dataclass(frozen=True)
class Target:
    """One hop: where to connect and what to ask for."""

    scheme: str
    host: str  # as the URL names it: for the Host header, SNI and the certificate
    port: int
    path: str  # path and query
    address: Address  # the checked address the connection goes to

    @property
    def host_header(self) -> str:
        name = f"[{self.host}]" if ":" in self.host else self.host
        return name if self.port == (443 if self.scheme == "https" else 80) else f"{name}:{self.port}"


@dataclass(frozen=True)
class EgressRule:
    """The rule of the module docstring. `allowed`: networks let through although internal (tests, closed
    networks); `max_redirects`: redirects followed per fetch."""

    allowed: Sequence[str] = ()
    max_redirects: int = MAX_REDIRECTS

    def refusal(self, address: Address) -> str | None:
        """Why the rule refuses `address`, or None."""
        if any(address in ipaddress.ip_network(net, strict=False) for net in self.allowed
               if ipaddress.ip_network(net, strict=False).version == address.version):
            return None
        return internal_kind(address)

    def target(self, url: str) -> Target:
        """`url`'s hop, its host resolved and checked; raises :class:`EgressRefused`."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise EgressRefused(f"refused: {url!r} is not an http(s) URL with a host")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise EgressRefused(f"refused: {url!r} has an invalid port") from None
        addresses = resolve(parts.hostname, port)
        for address in addresses:  # every one: a name with one public and one internal address is refused
            kind = self.refusal(address)
            if kind:
                raise EgressRefused(
                    f"refused by the harness's egress rule: {parts.hostname} is an internal address ({kind}); "
                    "only public addresses are fetched")
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        return Target(parts.scheme, parts.hostname, port, path, addresses[0])

    def get(self, url: str, headers: Mapping[str, str] | None = None, timeout: float | None = 20.0) -> Any:
        """``GET url`` under the rule, redirects followed and checked; a ``requests.Response`` (read in full)."""
        seen = 0
        while True:
            target = self.target(url)
            response = _fetch(target, url, dict(headers or {}), timeout)
            location = response.headers.get("Location")
            if response.status_code not in REDIRECT_STATUSES or not location:
                return response
            seen += 1
            if seen > self.max_redirects:
                raise EgressRefused(f"refused: more than {self.max_redirects} redirects from {url}")
            url = urljoin(url, location)


def _fetch(target: Target, url: str, headers: dict[str, str], timeout: float | None) -> Any:
    """One request to the checked address of `target`, as a ``requests.Response`` (no redirect followed)."""
    import requests
    import urllib3
    from requests.structures import CaseInsensitiveDict
    from requests.utils import get_encoding_from_headers

    if target.scheme == "https":
        pool: urllib3.HTTPConnectionPool = urllib3.HTTPSConnectionPool(
            str(target.address), target.port, timeout=timeout, retries=False, cert_reqs="CERT_REQUIRED",
            ca_certs=requests.certs.where(), server_hostname=target.host, assert_hostname=target.host)
    else:
        pool = urllib3.HTTPConnectionPool(str(target.address), target.port, timeout=timeout, retries=False)
    headers = {k: v for k, v in headers.items() if k.lower() != "host"}
    try:
        raw = pool.urlopen("GET", target.path, headers={**headers, "Host": target.host_header}, redirect=False,
                           retries=False, preload_content=False, decode_content=True)
        body, size = [], 0
        for chunk in raw.stream(2**16):
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise EgressRefused(f"refused: {url} sent more than {MAX_BODY_BYTES} bytes")
            body.append(chunk)
        raw.release_conn()
    except urllib3.exceptions.HTTPError as exc:
        raise requests.ConnectionError(f"{type(exc).__name__}: {exc}") from None
    finally:
        pool.close()
    response = requests.Response()
    response.status_code, response.reason, response.url = raw.status, raw.reason or "", url
    response.headers = CaseInsensitiveDict(raw.headers)
    response.encoding = get_encoding_from_headers(response.headers)
    response._content = b"".join(body)  # what requests' own adapter fills in when it reads a body
    return response


PUBLIC_ONLY = EgressRule()  # the default rule: no address let through but public ones
