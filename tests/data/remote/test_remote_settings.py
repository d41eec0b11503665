"""A run config's `data.remote_concurrency` applied to the process's remote reads (olmo_data.remote.settings), as
the data commands apply it: requests in flight at once bounded by it, a repeated setting free, a bad one refused."""

from __future__ import annotations

import pytest

from olmo_data.errors import DataError
from olmo_data.io import file_sizes
from olmo_data.remote import RemoteReader, apply_run_settings, remote_reader
from tests import sim_store as sim
from tests.sim_store import SimServer, SimSpec


def test_the_concurrency_bounds_requests_in_flight(fresh_reader: RemoteReader) -> None:
    spec = SimSpec()
    with SimServer(spec, latency_s=0.05) as server:
        reader = apply_run_settings(3)
        assert reader is remote_reader() and reader.options.concurrency == 3
        assert apply_run_settings(3) is reader and apply_run_settings(None) is reader  # nothing replaced
        assert file_sizes(server.http_urls()) == [4 * int(n) for n in sim.token_counts(spec)]
        assert 2 <= server.stats()["max_in_flight"] <= 3
        server.reset()
        apply_run_settings(16)
        file_sizes([u.replace(".npy", ".csv.gz") for u in server.http_urls()], missing_ok=True)
        assert server.stats()["max_in_flight"] > 3


@pytest.mark.parametrize("bad", [0, -2, True, 2.5])
def test_a_bad_setting_is_refused_by_key(fresh_reader: RemoteReader, bad: object) -> None:
    with pytest.raises(DataError, match=r"data\.remote_concurrency"):
        apply_run_settings(bad)  # type: ignore[arg-type]
