"""The demo's live terminal view: one row per client instance, redrawn as pushes arrive."""

from __future__ import annotations

import io
import math

from rich import box
from rich.console import Console
from rich.table import Table

from kcm_demo.fleet import HEADLINE_METRICS, ClientInstance, Fleet


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    if math.isnan(value):
        return "NaN"
    # abs: a negative number reads as a positive one does, and an infinity (a delta sum may add up to one) is "inf"
    # or "-inf", never int() of it, which raises.
    return f"{value:,.0f}" if abs(value) >= 100 or value == int(value) else f"{value:.2f}"


def fleet_table(fleet: Fleet, now_s: float, title: str, width: int | None = None) -> Table:
    """The table of every client instance: identity, headline metrics, how long ago it last pushed.

    When it is wider than `width`, the columns that tell the rows nothing apart go: the source when every client
    pushes from one address (named in the title instead), and rebalances when no client pushes a count."""
    clients = fleet.clients()
    table = _table(clients, now_s, title, show_source=True, show_rebalances=True, compact=False)
    if width is None or _natural_width(table) <= width:
        return table
    addresses = {client.source_address for client in clients}
    one_address = len(addresses) == 1
    if one_address:
        title = f"{title} · all from {next(iter(addresses))}"
    return _table(clients, now_s, title, show_source=not one_address,
                  show_rebalances=any(client.headline("rebalances") is not None for client in clients), compact=True)


def _table(clients: list[ClientInstance], now_s: float, title: str, show_source: bool,
           show_rebalances: bool, compact: bool) -> Table:
    headings = [heading for heading in HEADLINE_METRICS if show_rebalances or heading != "rebalances"]
    # Narrow: no frame and one space between columns, which leaves the width to the cells.
    table = (Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, padding=0) if compact
             else Table(title=title, title_justify="left"))
    # Client ids tell the rows apart: never cut, whatever else has to give.
    table.add_column("client id", style="bold", no_wrap=True,
                     min_width=max((len(client.client_id) for client in clients), default=9))
    table.add_column("software", overflow="ellipsis")
    if show_source:
        table.add_column("source", no_wrap=True, overflow="ellipsis")
    for heading in [*headings, "age s", "metrics", "pushes"]:
        # Numbers and their headings are cut last (narrow, a heading takes a line per word): the software gives way
        # first; only on a terminal narrower than the ids and the numbers together do they shrink too.
        table.add_column(heading.replace(" ", "\n") if compact else heading, justify="right", no_wrap=True)
    for client in clients:
        table.add_row(
            client.client_id,
            client.software_name if compact else f"{client.software_name} {client.software_version}",
            *([client.source] if show_source else []),
            *(_number(client.headline(heading)) for heading in headings),
            f"{max(0.0, now_s - client.last_push_s):.1f}",
            str(len(client.values)),
            str(client.pushes),
        )
    return table


def _natural_width(table: Table) -> int:
    """How wide the table is when nothing has to shrink."""
    console = Console(width=1000, file=io.StringIO())
    return console.measure(table).maximum
