"""The request path as a chain of filters, one per concern (see api.py for the filter API and chain.py for
the order).  Adding a concern means adding a filter."""

from __future__ import annotations

from .api import Action, Answer, Close, Defer, Filter, Forward, Request, Response, Session, Spliced
from .chain import FilterChain, Route, build_chain

__all__ = [
           "Action",
           "Answer",
           "Close",
           "Defer",
           "Filter",
           "FilterChain",
           "Forward",
           "Request",
           "Response",
           "Route",
           "Session",
           "Spliced",
           "build_chain",
]
