"""The ``fairsched:`` metrics: counted in the engine core (``recorder``), handed over as a
snapshot file (``snapshot``), and read in the API server's process for ``/metrics``
(``exporter``) and ``GET /fairsched`` (``live_view``).

The modules are imported by name; this package imports nothing on its own.
"""
