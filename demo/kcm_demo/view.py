"""The demo's live terminal view: one row per client instance, redrawn as pushes arrive."""

from __future__ import annotations

import math

from rich.table import Table

from kcm_demo.fleet import HEADLINE_METRICS, Fleet


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    if math.isnan(value):
        return "NaN"
    return f"{value:,.0f}" if value >= 100 or value == int(value) else f"{value:.2f}"


def fleet_table(fleet: Fleet, now_s: float, title: str) -> Table:
    """The table of every client instance: identity, headline metrics, how long ago it last pushed."""
    table = Table(title=title, title_justify="left", expand=False)
    table.add_column("client id", style="bold")
    table.add_column("software")
    table.add_column("source")
    for heading in HEADLINE_METRICS:
        table.add_column(heading, justify="right")
    table.add_column("push age s", justify="right")
    table.add_column("metrics", justify="right")
    table.add_column("pushes", justify="right")
    for client in fleet.clients():
        table.add_row(
            client.client_id,
            f"{client.software_name} {client.software_version}",
            client.source,
            *(_number(client.headline(heading)) for heading in HEADLINE_METRICS),
            f"{max(0.0, now_s - client.last_push_s):.1f}",
            str(len(client.values)),
            str(client.pushes),
        )
    return table
