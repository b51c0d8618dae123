"""HTTP: the FastAPI application, the ``/v1`` routers (:mod:`~app.http.api`), the web pages
(:mod:`~app.http.web`), operations endpoints, security and problem details.

May import :mod:`app.jobs`, :mod:`app.store` and everything below them; never :mod:`app.cli`.
"""
