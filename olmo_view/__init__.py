"""olmo_view: a local, read-only web view of a run (`olmo-data view RUN`): its curves and spikes, any step's batch,
the spans of a text found in its training data, its stages and data.

A package above the data library: it asks `olmo_data` (through `answers`, its one module that does) and never the
trainer, so it imports without torch. Pages are HTML built escaped (`markup`), charts inline SVG (`svg`), served by
the standard library's HTTP server (`server`); `plot` draws the same curves to a PNG with matplotlib (the `view`
extra).
"""

from olmo_view.answers import RunAnswers
from olmo_view.server import CSP, ViewServer

__all__ = ["CSP", "RunAnswers", "ViewServer"]
