"""sandforge as a service: the HTTP API and tenants (issue 20), and the MCP server (``mcp/``)."""
