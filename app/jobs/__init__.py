"""Jobs: the state machine (:mod:`~app.jobs.queue`: transitions; :mod:`~app.jobs.parking`: a
parent waiting for its children; :mod:`~app.jobs.reaper`: stale jobs back to the queue, lost
messages sent again; :mod:`~app.jobs.control`: what a running job sees; :mod:`~app.jobs.cancel`:
who holds a job and a cancel per requester), submission with up-front validation
(:mod:`~app.jobs.submit`), one handler module per job kind (:mod:`~app.jobs.compare`,
:mod:`~app.jobs.train`, :mod:`~app.jobs.study`, :mod:`~app.jobs.shards`) with what a comparison
reads (:mod:`~app.jobs.inputs`), the dispatcher that runs a claimed job (:mod:`~app.jobs.run`), the
embedded thread-pool worker, the broker (:mod:`~app.jobs.broker`) and the Celery worker, and the
composition root that builds a process's services and worker (:mod:`~app.jobs.runtime`).

May import :mod:`app.store`, :mod:`app.errors`, :mod:`app.logs` and the libraries; never
:mod:`app.http` or :mod:`app.cli`.
"""
