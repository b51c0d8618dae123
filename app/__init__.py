"""The cka-atlas service, in layers whose imports point down only::

    cli   the ``cka-atlas`` command line            may import http, jobs, store
    http  FastAPI app, REST routers, web pages      may import jobs, store
    jobs  state machine, submission, handlers       may import store
    store settings, database, ORM, artifacts        imports no other layer

:mod:`app.errors` (exceptions that carry their problem code, and the statuses of the libraries'
errors) and :mod:`app.logs` (structured logs) sit beneath all four and import nothing from
:mod:`app`. The libraries :mod:`models` and :mod:`analysis` never import :mod:`app`, nor does
:mod:`migrations` (app hands it the metadata); ``tests/test_layers.py`` enforces all of this.

The server answers within seconds of its start because nothing it does before listening loads
:mod:`models` (torch's model zoo, timm with torchvision) or matplotlib: the modules it imports
name the light parts of :mod:`analysis` (whose package loads its public names on first use) and
import :mod:`models`, timm and matplotlib inside the functions that need them — the first
training, model page, upload or heatmap. ``tests/app/test_lazy_imports.py`` holds this.
"""

import os

# An idle OpenMP pool thread spins 10,000 rounds, not libgomp's default 300,000, before it sleeps.
# libgomp reads this once, when torch loads, so it is set here, before any layer imports torch;
# an operator's own value (or OMP_WAIT_POLICY) wins. Beside busy neighbours the default spin
# made the demo zoo up to 37× slower than idle; a shorter spin keeps its idle speed
# (BENCHMARKS.md, "The demo zoo's threads").
os.environ.setdefault("GOMP_SPINCOUNT", "10000")
