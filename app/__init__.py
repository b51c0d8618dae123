"""The cka-atlas service, in layers whose imports point down only::

    cli   the ``cka-atlas`` command line            may import http, jobs, store
    http  FastAPI app, REST routers, web pages      may import jobs, store
    jobs  state machine, submission, handlers       may import store
    store settings, database, ORM, artifacts        imports no other layer

:mod:`app.errors` (exceptions that carry their problem code, and the statuses of the libraries'
errors) and :mod:`app.logs` (structured logs) sit beneath all four and import nothing from
:mod:`app`. The libraries :mod:`models` and :mod:`analysis` never import :mod:`app`, nor does
:mod:`migrations` (app hands it the metadata); ``tests/test_layers.py`` enforces all of this.
"""

import os

# Idle OpenMP threads sleep rather than spin. OpenMP reads this once, when torch loads, so it is
# set here, before any layer imports torch; an operator's own value wins. Beside busy
# neighbours spinning pool threads made one training 30× slower (BENCHMARKS.md, issue 38).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
