"""Brokered egress (issue 18): sandboxed programs fetch from the web through the host, under policy.

The sandbox never gets a network. A program's request reaches the host as JSON (`FetchRequest`); the
broker normalises the URL, matches it against the policy's ``egress.allow`` entries, resolves the host once,
checks every address against the platform deny list, connects to the checked address (TLS still verifies
the host name), follows redirects itself (each hop checked like a new request), caps bodies after
decompression, counts the execution's budgets, injects credentials the program never sees, and records
provenance for every request. See ``docs/security.md`` ("The egress broker") and ``docs/policies.md``.

```python
broker = EgressBroker(policy.egress)          # once per policy; thread-safe
session = broker.session(deadline=deadline)   # once per execution
response = session.fetch(FetchRequest.of("https://news.example.com/rss"))
session.records                               # provenance, one per request
```

Names load lazily: the policy model imports ``runtime.egress.config`` alone, and loading a policy does not
pay for the HTTP client, TLS and the thread pools.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sandforge.runtime.lazy import lazy_exports

if TYPE_CHECKING:
    from sandforge.runtime.egress.addresses import Verdict, classify, denied_reason
    from sandforge.runtime.egress.broker import EgressBroker, EgressRecord, EgressSession, Resolver, dump_records
    from sandforge.runtime.egress.config import AllowEntry, Credential, EgressLimits, EgressPolicy, EgressSection
    from sandforge.runtime.egress.errors import (
        LIFECYCLE,
        EgressDenied,
        EgressLimit,
        FetchError,
        InvalidFetch,
        MissingCredentials,
        NetworkError,
    )
    from sandforge.runtime.egress.rules import static_check
    from sandforge.runtime.egress.urls import Target, parse_url
    from sandforge.runtime.egress.wire import FetchFailure, FetchReply, FetchRequest, FetchResponse

_WHERE = {
    "addresses": ("Verdict", "classify", "denied_reason"),
    "broker": ("EgressBroker", "EgressRecord", "EgressSession", "Resolver", "dump_records"),
    "config": ("AllowEntry", "Credential", "EgressLimits", "EgressPolicy", "EgressSection"),
    "errors": (
        "LIFECYCLE",
        "EgressDenied",
        "EgressLimit",
        "FetchError",
        "InvalidFetch",
        "MissingCredentials",
        "NetworkError",
    ),
    "rules": ("static_check",),
    "urls": ("Target", "parse_url"),
    "wire": ("FetchFailure", "FetchReply", "FetchRequest", "FetchResponse"),
}
_MODULE_OF = {name: module for module, names in _WHERE.items() for name in names}

__all__ = [
    "LIFECYCLE",
    "AllowEntry",
    "Credential",
    "EgressBroker",
    "EgressDenied",
    "EgressLimit",
    "EgressLimits",
    "EgressPolicy",
    "EgressRecord",
    "EgressSection",
    "EgressSession",
    "FetchError",
    "FetchFailure",
    "FetchReply",
    "FetchRequest",
    "FetchResponse",
    "InvalidFetch",
    "MissingCredentials",
    "NetworkError",
    "Resolver",
    "Target",
    "Verdict",
    "classify",
    "denied_reason",
    "dump_records",
    "parse_url",
    "static_check",
]


__getattr__, __dir__ = lazy_exports(__name__, {name: f".{module}" for name, module in _MODULE_OF.items()})
