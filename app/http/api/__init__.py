"""The ``/v1`` REST routers, one module per resource."""
