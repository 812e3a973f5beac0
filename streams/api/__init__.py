"""The HTTP API (``/api/v1/...``) and the live dashboard (``/``): served by every worker on its
web port, and by ``costline serve`` without one."""
