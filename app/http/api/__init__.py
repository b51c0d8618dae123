"""The ``/v1`` REST routers, one module per resource, and what they share: request dependencies
(``deps``), reading and acting on rows (``rows``), the rows' views (``views``) and the answers of
the endpoints that register content (``uploads``)."""
