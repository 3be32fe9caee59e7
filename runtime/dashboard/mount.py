"""Mounting the dashboard on the service's app: pages and twins (routes), session and rollback (actions)."""

from __future__ import annotations

from fastapi import FastAPI

from sandforge.runtime.dashboard import actions, routes
from sandforge.runtime.dashboard.common import Dashboard


def install(app: FastAPI, dash: Dashboard) -> None:
    """Add every dashboard route to ``app`` and keep ``dash`` on ``app.state.dashboard``."""
    app.state.dashboard = dash
    routes.install(app, dash)
    actions.install(app, dash)
