"""The MCP surface (issue 10, items 1-3): management tools and proxy tools.

A surface like ``api``: it authenticates a tenant with the same key check, calls the
same services, and never touches the store. ``tools`` says what is listed,
``server`` answers calls, ``transports`` runs it over stdio or streamable HTTP.
"""
